# SPDX-License-Identifier: MIT
"""bench/loader driver: batches/s of trainkit's data::Prefetcher (2 workers) and of
torch.utils.data.DataLoader (num_workers=2, pin_memory=True, persistent_workers=True) over the
same numpy-written dataset (BENCH_LOADER_N x 784 f32 features + int64 labels, default 200k),
shuffled, batch 256; plus a one-thread random-row gather as the memory roofline."""
import os
import platform

import numpy as np

import harness as h

N = int(os.environ.get("BENCH_LOADER_N", 200_000))
D, BATCH, WORKERS = 784, 256, 2
BATCHES = int(os.environ.get("BENCH_LOADER_BATCHES", 40))  # per timed repetition
ROUNDS, WARMUP = 10, 2

data = os.path.join(os.environ.get("BENCH_BIN", "."), "data")
os.makedirs(data, exist_ok=True)
xp, yp = os.path.join(data, f"x_{N}.npy"), os.path.join(data, f"y_{N}.npy")
if not (os.path.exists(xp) and os.path.exists(yp)):
    rng = np.random.default_rng(0)
    np.save(xp + ".tmp.npy", rng.standard_normal((N, D), dtype=np.float32))
    np.save(yp + ".tmp.npy", rng.integers(0, 10, N, dtype=np.int64))
    os.replace(xp + ".tmp.npy", xp)
    os.replace(yp + ".tmp.npy", yp)

args = [f"--x={xp}", f"--y={yp}", f"--batch={BATCH}", f"--workers={WORKERS}", f"--batches={BATCHES}"]
with h.Worker("trainkit", [h.binary("loader"), *args]) as tk, \
        h.Worker("torch", h.python_peer("peer_torch.py", *args)) as pt:
    print(f"loader: {N} x {D} f32 + int64 labels, batch {BATCH}, shuffled, {WORKERS} workers each, "
          f"{BATCHES} batches per sample; torch {pt.info['torch']}, pinned: trainkit "
          f"{tk.info['pinned']} torch {pt.info['pinned']}; {tk.info['hw_threads']} hardware threads, "
          f"{platform.processor() or platform.machine()}")
    samples = h.alternate([("trainkit Prefetcher", tk, "trainkit"),
                           ("torch DataLoader", pt, "torch"),
                           ("probe: 1-thread row gather", tk, "probe_gather")],
                          rounds=ROUNDS, warmup=WARMUP)

batch_bytes = BATCHES * BATCH * (D * 4 + 8)
med = h.print_table([(label, secs, batch_bytes) for label, secs in samples.items()])
t_tk, t_pt = med["trainkit Prefetcher"], med["torch DataLoader"]
print(f"  batches/s: trainkit {BATCHES / t_tk:.0f}, torch {BATCHES / t_pt:.0f}, "
      f"1-thread gather {BATCHES / med['probe: 1-thread row gather']:.0f}")
h.result_line("loader", t_pt / t_tk, f"Prefetcher vs torch DataLoader batches/s ({N}x{D} f32, batch {BATCH}, 2 workers)")
