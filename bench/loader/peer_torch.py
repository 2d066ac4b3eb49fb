# SPDX-License-Identifier: MIT
"""torch peer of bench/loader: the DataLoader a PyTorch user would write for a .npy dataset held in
memory: TensorDataset + DataLoader(shuffle=True, num_workers=2, pin_memory=True,
persistent_workers=True). Case "torch" takes --batches batches from one long-lived iterator."""
import argparse

import numpy as np
import torch
from torch.utils.data import DataLoader, TensorDataset

import harness

p = argparse.ArgumentParser()
p.add_argument("--x", required=True)
p.add_argument("--y", required=True)
p.add_argument("--batch", type=int, default=256)
p.add_argument("--workers", type=int, default=2)
p.add_argument("--batches", type=int, default=40)
a = p.parse_args()

ds = TensorDataset(torch.from_numpy(np.load(a.x)), torch.from_numpy(np.load(a.y)))
loader = DataLoader(ds, batch_size=a.batch, shuffle=True, num_workers=a.workers,
                    pin_memory=True, persistent_workers=True,
                    generator=torch.Generator().manual_seed(0))
state = {"it": iter(loader)}


def take():
    for _ in range(a.batches):
        try:
            x, y = next(state["it"])
        except StopIteration:
            state["it"] = iter(loader)
            x, y = next(state["it"])
        _ = float(x[0, 0]) + float(x[-1, -1]) + int(y[0])


harness.serve({"torch": torch.__version__, "pinned": int(torch.cuda.is_available())},
              {"torch": take})
