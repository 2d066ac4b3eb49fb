# SPDX-License-Identifier: MIT
"""bench/gemm_gpu driver: bf16 gemm (f32 accumulate) through trainkit's cuBLASLt path and through
torch.matmul on the same GPU, sampled alternately. Shapes: 8192^3 and the GPT-2 124M training
gemms at 8 x 1024 tokens (forward, input gradient, weight gradient). Last line: the geometric
mean of torch time / trainkit time (>= 0.95 is the goal)."""
import math
import os

import harness as h

TOKENS, D, V = 8 * 1024, 768, 50304
SHAPES = [
    "sq8192:NN:8192:8192:8192",
    f"qkv_fwd:NT:{TOKENS}:{D}:{3 * D}",        # x @ W_qkv^T
    f"attn_proj_fwd:NT:{TOKENS}:{D}:{D}",
    f"fc_fwd:NT:{TOKENS}:{D}:{4 * D}",
    f"fc_proj_fwd:NT:{TOKENS}:{4 * D}:{D}",
    f"lm_head_fwd:NT:{TOKENS}:{D}:{V}",
    f"fc_dx:NN:{TOKENS}:{4 * D}:{D}",          # dY @ W
    f"fc_dw:TN:{4 * D}:{TOKENS}:{D}",          # dY^T @ X
    f"lm_head_dw:TN:{V}:{TOKENS}:{D}",
]
REPS = int(os.environ.get("BENCH_GEMM_GPU_REPS", 10))
ROUNDS = int(os.environ.get("BENCH_GEMM_GPU_ROUNDS", 7))
spec = ",".join(SHAPES)

with h.Worker("trainkit", [h.binary("gemm_gpu"), f"--reps={REPS}", f"--shapes={spec}"]) as tk, \
     h.Worker("torch", h.python_peer("peer_torch.py", f"--reps={REPS}", f"--shapes={spec}")) as pt:
    print(f"gemm_gpu: bf16 in/out, f32 accumulate, {tk.info['gpu']}, torch {pt.info['torch']}, "
          f"{REPS} gemms per sample, {ROUNDS} alternating rounds, medians")
    print(f"  {'shape':<40} {'trainkit TFLOP/s':>16} {'torch TFLOP/s':>14} {'tk/torch':>9}")
    ratios = []
    for s in SHAPES:
        name, ops, m, k, n = s.split(":")
        samples = h.alternate([("tk", tk, "tk_" + name), ("torch", pt, "torch_" + name)],
                              rounds=ROUNDS, warmup=2)
        t_tk, t_pt = h.median(samples["tk"]) / REPS, h.median(samples["torch"]) / REPS
        flops = 2.0 * int(m) * int(k) * int(n)
        ratios.append(t_pt / t_tk)
        print(f"  {name + ' [' + m + 'x' + k + ']@[' + k + 'x' + n + '] ' + ops:<40} "
              f"{flops / t_tk / 1e12:16.1f} {flops / t_pt / 1e12:14.1f} {t_pt / t_tk:9.3f}")
geo = math.exp(sum(math.log(r) for r in ratios) / len(ratios))
h.result_line("gemm_gpu", geo, "trainkit cuBLASLt bf16 gemm vs torch.matmul on the same GPU "
              "(geomean over 8192^3 and GPT-2 124M shapes; goal >= 0.95)")
