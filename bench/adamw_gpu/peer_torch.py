# SPDX-License-Identifier: MIT
"""torch peer of bench/adamw_gpu: torch.optim.AdamW(fused=True).step() over n f32 CUDA parameters
in 4 tensors, synchronised after each step."""
import argparse

import torch

import harness

p = argparse.ArgumentParser()
p.add_argument("--n", type=int, required=True)
args = p.parse_args()

params = []
for t in range(4):
    x = (torch.rand(args.n // 4, device="cuda") * 0.02 - 0.01).requires_grad_()
    x.grad = torch.rand(args.n // 4, device="cuda") * 2 - 1
    params.append(x)
opt = torch.optim.AdamW(params, lr=1e-4, weight_decay=0.01, fused=True)
opt.step()
torch.cuda.synchronize()


def step():
    opt.step()
    torch.cuda.synchronize()


harness.serve({"torch": torch.__version__, "gpu": torch.cuda.get_device_name()}, {"torch": step})
