# SPDX-License-Identifier: MIT
"""torch peer of bench/mlp_step: the same MLP step (torch.nn.Sequential, F.cross_entropy,
zero_grad(set_to_none=True), loss.backward()) on CPU with --threads threads, on the parameters,
input and targets the trainkit worker dumped."""
import argparse

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F

import harness

p = argparse.ArgumentParser()
p.add_argument("--threads", type=int, required=True)
p.add_argument("--dump", required=True)
args = p.parse_args()
torch.set_num_threads(args.threads)

B, IN, H, C = 256, 784, 1024, 10
model = nn.Sequential(nn.Linear(IN, H), nn.ReLU(), nn.Linear(H, H), nn.ReLU(), nn.Linear(H, C))
blob = np.fromfile(args.dump, dtype=np.uint8)
params = dict(model.named_parameters())
pos = 0
with torch.no_grad(), open(args.dump + ".txt") as names:
    for line in names:  # the trainkit arena's registration order, by state-dict name
        name, n = line.split()[0], int(line.split()[1])
        prm = params.pop(name)
        prm.copy_(torch.from_numpy(blob[pos:pos + 4 * n].view(np.float32).reshape(prm.shape)))
        pos += 4 * n
if params:
    raise SystemExit(f"peer_torch: trainkit did not dump {sorted(params)}")
x = torch.from_numpy(blob[pos:pos + 4 * B * IN].view(np.float32).reshape(B, IN).copy())
pos += 4 * B * IN
targets = torch.from_numpy(blob[pos:pos + 8 * B].view(np.int64).copy())


def step():
    model.zero_grad(set_to_none=True)
    loss = F.cross_entropy(model(x), targets)
    loss.backward()
    return loss


loss = step()
norm = torch.sqrt(sum((q.grad.double() ** 2).sum() for q in model.parameters())).item()
harness.serve({"threads": torch.get_num_threads(), "torch": torch.__version__,
               "loss": f"{loss.item():.7g}", "grad_norm": f"{norm:.7g}"}, {"step": step})
