# SPDX-License-Identifier: MIT
"""torch peer of bench/adamw: torch.optim.AdamW.step() over n f32 CPU parameters in 4 tensors,
fused=True when this PyTorch supports it on the CPU, else foreach=True; same thread count."""
import argparse

import torch

import harness

p = argparse.ArgumentParser()
p.add_argument("--n", type=int, required=True)
p.add_argument("--threads", type=int, required=True)
args = p.parse_args()

torch.set_num_threads(args.threads)
params = []
for t in range(4):
    x = (torch.rand(args.n // 4) * 0.02 - 0.01).requires_grad_()
    x.grad = torch.rand(args.n // 4) * 2 - 1
    params.append(x)

mode = "fused"
try:
    opt = torch.optim.AdamW(params, lr=1e-4, weight_decay=0.01, fused=True)
    opt.step()
except (RuntimeError, ValueError):
    mode = "foreach"
    opt = torch.optim.AdamW(params, lr=1e-4, weight_decay=0.01, foreach=True)
    opt.step()
if not all(torch.isfinite(x).all() for x in params):
    raise SystemExit("peer_torch: AdamW produced non-finite parameters")

harness.serve({"threads": torch.get_num_threads(), "torch": torch.__version__, "mode": mode},
              {"torch": opt.step})
