# SPDX-License-Identifier: MIT
"""torch peer of bench/axpy: y.add_(x, alpha=a) on CPU with the thread count trainkit uses."""
import argparse

import torch

import harness

p = argparse.ArgumentParser()
p.add_argument("--n", type=int, required=True)
p.add_argument("--threads", type=int, required=True)
p.add_argument("--a", type=float, default=0.5)
args = p.parse_args()

torch.set_num_threads(args.threads)
# Same values as axpy.cpp: small integers, so a*x + y is exact in f32 and can be checked with ==.
# The arrays are created by torch's parallel kernels, i.e. first touched by its own threads.
idx = torch.arange(args.n, dtype=torch.int32)
x = (idx % 1024).to(torch.float32)
y = (idx % 7).to(torch.float32)
del idx
expected = y + args.a * x
y.add_(x, alpha=args.a)
if not torch.equal(y, expected):
    raise SystemExit("peer_torch: y.add_(x, alpha=a) gave a wrong result")
del expected

harness.serve({"threads": torch.get_num_threads(), "torch": torch.__version__},
              {"torch": lambda: y.add_(x, alpha=args.a)})
