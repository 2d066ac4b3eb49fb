#!/usr/bin/env python3
# SPDX-License-Identifier: MIT
"""tools/kernel_times.py NCU_CSV [--per N] [--top K]: the GPU time of each kernel of a run that
Nsight Compute measured with one metric (tools/gpu_profile.sh writes such a CSV), summed by kernel
name and sorted by total: launches, total ms (divided by N with --per N, e.g. the steps profiled),
mean us per launch, share of all kernel time. Standard library only."""
import argparse
import collections
import csv
import sys

p = argparse.ArgumentParser()
p.add_argument("csv")
p.add_argument("--per", type=float, default=1.0, help="divide totals by this (steps profiled)")
p.add_argument("--top", type=int, default=40)
a = p.parse_args()

scale = {"nsecond": 1e-6, "ns": 1e-6, "usecond": 1e-3, "us": 1e-3, "msecond": 1.0, "ms": 1.0,
         "second": 1e3, "s": 1e3}
total = collections.defaultdict(float)
count = collections.Counter()
with open(a.csv, newline="") as f:
    lines = [ln for ln in f if ln.startswith('"')]  # ncu's own messages start with ==PROF==
for row in csv.DictReader(lines):
    if row.get("Metric Name") != "gpu__time_duration.sum":
        continue
    name = row["Kernel Name"]
    value = float(row["Metric Value"].replace(",", ""))
    total[name] += value * scale.get(row.get("Metric Unit", "nsecond"), 1e-6)
    count[name] += 1
if not total:
    sys.exit(f"kernel_times: no gpu__time_duration.sum rows in {a.csv}")
grand = sum(total.values())
print(f"{sum(count.values()) / a.per:.0f} launches, {grand / a.per:.2f} ms of kernel time"
      f"{' per step' if a.per != 1 else ''}")
print(f"{'ms':>9} {'share':>6} {'launches':>8} {'us/launch':>10}  kernel")
for name, t in sorted(total.items(), key=lambda kv: -kv[1])[:a.top]:
    print(f"{t / a.per:9.3f} {100 * t / grand:5.1f}% {count[name] / a.per:8.1f} "
          f"{1e3 * t / count[name]:10.1f}  {name[:110]}")
