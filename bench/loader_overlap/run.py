# SPDX-License-Identifier: MIT
"""bench/loader_overlap driver: a training loop with a fixed compute time per step (a sleep, as
when the host waits for a GPU), fed by trainkit's Prefetcher or by torch's DataLoader (both 2
workers, batch 256, shuffled, the bench/loader dataset). data-wait = time the loop spent blocked
in next() (Prefetcher::stats(); around next(it) in Python), as a % of the loop time. The ratio
is torch's loop time over trainkit's (> 1: trainkit's loop finishes sooner)."""
import os

import numpy as np

import harness as h

N = int(os.environ.get("BENCH_LOADER_N", 200_000))
D, BATCH, WORKERS = 784, 256, 2
STEPS = int(os.environ.get("BENCH_OVERLAP_STEPS", 40))
COMPUTE_US = int(os.environ.get("BENCH_OVERLAP_COMPUTE_US", 5000))
ROUNDS, WARMUP = 8, 1

data = os.path.join(os.environ.get("BENCH_BIN", "."), "..", "loader", "data")
os.makedirs(data, exist_ok=True)
xp, yp = os.path.join(data, f"x_{N}.npy"), os.path.join(data, f"y_{N}.npy")
if not (os.path.exists(xp) and os.path.exists(yp)):  # the same files bench/loader writes
    rng = np.random.default_rng(0)
    np.save(xp + ".tmp.npy", rng.standard_normal((N, D), dtype=np.float32))
    np.save(yp + ".tmp.npy", rng.integers(0, 10, N, dtype=np.int64))
    os.replace(xp + ".tmp.npy", xp)
    os.replace(yp + ".tmp.npy", yp)

args = [f"--x={xp}", f"--y={yp}", f"--batch={BATCH}", f"--workers={WORKERS}", f"--steps={STEPS}",
        f"--compute_us={COMPUTE_US}"]
with h.Worker("trainkit", [h.binary("overlap"), *args]) as tk, \
        h.Worker("torch", h.python_peer("peer_torch.py", *args)) as pt:
    print(f"loader_overlap: {STEPS} steps of {COMPUTE_US / 1000:.1f} ms compute (sleep), batch {BATCH}, "
          f"{N} x {D} f32, {WORKERS} workers each; torch {pt.info['torch']}")
    slots = [("trainkit Prefetcher loop", tk, "trainkit"), ("torch DataLoader loop", pt, "torch"),
             ("compute only (no loader)", tk, "compute_only")]
    for _, w, case in slots:
        w.time(case, WARMUP)
    loops = {label: [] for label, _, _ in slots}
    waits = {label: [] for label, _, _ in slots[:2]}
    for r in range(ROUNDS):  # alternate, rotating the order; read each loop's data-wait right after it
        k = r % len(slots)
        for label, w, case in slots[k:] + slots[:k]:
            loops[label] += w.time(case)
            if label in waits:
                waits[label] += w.time("last_wait")

med = h.print_table([(label, secs, None) for label, secs in loops.items()])
pct = {label: 100 * sum(waits[label]) / sum(loops[label]) for label in waits}
t_tk, t_pt = med["trainkit Prefetcher loop"], med["torch DataLoader loop"]
w_tk, w_pt = pct["trainkit Prefetcher loop"], pct["torch DataLoader loop"]
print(f"  data-wait (% of loop time, all rounds): trainkit {w_tk:.2f}%, torch {w_pt:.2f}%; "
      f"compute alone {med['compute only (no loader)'] * 1e3:.1f} ms per loop")
h.result_line("loader_overlap", t_pt / t_tk,
              f"torch/trainkit loop time at {COMPUTE_US / 1000:.1f} ms compute per step "
              f"(data-wait: trainkit {w_tk:.2f}%, torch {w_pt:.2f}%)")
