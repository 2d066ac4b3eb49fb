# SPDX-License-Identifier: MIT
"""torch peer of bench/gemm: torch.matmul(op(A), op(B), out=C) on the CPU, f32, for the same
shapes and thread count as the trainkit worker."""
import argparse

import torch

import harness

p = argparse.ArgumentParser()
p.add_argument("--threads", type=int, required=True)
p.add_argument("--shapes", required=True)
args = p.parse_args()
torch.set_num_threads(args.threads)
torch.manual_seed(0)

cases = {}
for item in args.shapes.split(","):
    name, ops, m, k, n = item.split(":")
    m, k, n = int(m), int(k), int(n)
    a = torch.rand(m, k) * 2 - 1 if ops[0] == "N" else (torch.rand(k, m) * 2 - 1).t()
    b = torch.rand(k, n) * 2 - 1 if ops[1] == "N" else (torch.rand(n, k) * 2 - 1).t()
    c = torch.empty(m, n)
    cases["torch_" + name] = (lambda a=a, b=b, c=c: torch.matmul(a, b, out=c))

harness.serve({"threads": torch.get_num_threads(), "torch": torch.__version__}, cases)
