# SPDX-License-Identifier: MIT
"""bench/axpy driver: y = a*x + y over the same element count in trainkit (exec::launch on the
default Host), torch (y.add_(x, alpha=a), CPU, same thread count) and two bandwidth probes (a
std::thread loop doing the same axpy, and a parallel memcpy), sampled alternately in one run."""
import os

import harness as h

N = int(os.environ.get("BENCH_AXPY_N", 64 << 20))  # 64M f32: 256 MiB per array
ROUNDS, WARMUP = 25, 2

TK, TORCH = "trainkit exec::launch", "torch y.add_(x, alpha=a)"
PROBE, MEMCPY = "probe: std::thread axpy loop", "probe: memcpy x->y (8 B/elt)"

with h.Worker("trainkit", [h.binary("axpy"), f"--n={N}"]) as tk:
    threads = int(tk.info["threads"])
    with h.Worker("torch", h.python_peer("peer_torch.py", f"--n={N}", f"--threads={threads}")) as pt:
        print(f"axpy: n={N} f32 ({N * 4 >> 20} MiB per array), {threads} threads, "
              f"torch {pt.info['torch']} (threads={pt.info['threads']}), {h.machine()}")
        samples = h.alternate([(TK, tk, "trainkit"), (TORCH, pt, "torch"),
                               (PROBE, tk, "probe_axpy"), (MEMCPY, tk, "probe_memcpy")],
                              rounds=ROUNDS, warmup=WARMUP)

# Bytes moved per repetition: axpy reads x and y and writes y; memcpy reads x and writes y.
med = h.print_table([(label, secs, (8 if label == MEMCPY else 12) * N)
                     for label, secs in samples.items()])
vs_torch = med[TORCH] / med[TK]
vs_probe = med[PROBE] / med[TK]
print(f"  trainkit vs torch: {vs_torch:.2f}x   trainkit vs probe: {vs_probe:.2f}x "
      f"(ratios of median times over {ROUNDS} alternating rounds; > 1: trainkit faster)")
h.result_line("axpy", vs_torch,
              f"trainkit launch vs torch.add_ ({100 * vs_probe:.0f}% of probe bandwidth)")
