# SPDX-License-Identifier: MIT
"""torch peer of bench/loader_overlap: the same loop, `--steps` steps of next(batch) followed by a
sleep of `--compute_us` (time spent in next() is the data-wait; case "last_wait" spins
for the previous loop's data-wait to report it), fed by TensorDataset + DataLoader(shuffle=True, num_workers=2,
pin_memory=True, persistent_workers=True)."""
import argparse
import time

import numpy as np
import torch
from torch.utils.data import DataLoader, TensorDataset

import harness

p = argparse.ArgumentParser()
p.add_argument("--x", required=True)
p.add_argument("--y", required=True)
p.add_argument("--batch", type=int, default=256)
p.add_argument("--workers", type=int, default=2)
p.add_argument("--steps", type=int, default=50)
p.add_argument("--compute_us", type=int, default=5000)
a = p.parse_args()

ds = TensorDataset(torch.from_numpy(np.load(a.x)), torch.from_numpy(np.load(a.y)))
loader = DataLoader(ds, batch_size=a.batch, shuffle=True, num_workers=a.workers,
                    pin_memory=True, persistent_workers=True,
                    generator=torch.Generator().manual_seed(0))
state = {"it": iter(loader), "wait": 0.0}
compute = a.compute_us / 1e6


def train():
    wait = 0.0
    for _ in range(a.steps):
        t0 = time.perf_counter()
        try:
            x, _ = next(state["it"])
        except StopIteration:
            state["it"] = iter(loader)
            x, _ = next(state["it"])
        wait += time.perf_counter() - t0
        _ = float(x[0, 0])
        time.sleep(compute)
    state["wait"] = wait


def report():
    """Spins for the previous loop's data-wait: the protocol's way to return that number."""
    t0 = time.perf_counter()
    while time.perf_counter() - t0 < state["wait"]:
        pass


harness.serve({"torch": torch.__version__}, {"torch": train, "last_wait": report})
