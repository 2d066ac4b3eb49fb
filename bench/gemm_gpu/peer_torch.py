# SPDX-License-Identifier: MIT
"""torch peer of bench/gemm_gpu: torch.matmul(op(A), op(B), out=C) in bf16 on the GPU, --reps
back to back then torch.cuda.synchronize(), for the same shapes as the trainkit worker."""
import argparse

import torch

import harness

p = argparse.ArgumentParser()
p.add_argument("--reps", type=int, required=True)
p.add_argument("--shapes", required=True)
args = p.parse_args()
dev = torch.device("cuda")
torch.manual_seed(0)

cases = {}
for item in args.shapes.split(","):
    name, ops, m, k, n = item.split(":")
    m, k, n = int(m), int(k), int(n)
    mk = lambda r, c: torch.rand(r, c, device=dev, dtype=torch.bfloat16) * 2 - 1
    a = mk(m, k) if ops[0] == "N" else mk(k, m).t()
    b = mk(k, n) if ops[1] == "N" else mk(n, k).t()
    c = torch.empty(m, n, device=dev, dtype=torch.bfloat16)

    def run(a=a, b=b, c=c):
        for _ in range(args.reps):
            torch.matmul(a, b, out=c)
        torch.cuda.synchronize()

    cases["torch_" + name] = run

harness.serve({"torch": torch.__version__, "gpu": torch.cuda.get_device_name().replace(" ", "_")}, cases)
