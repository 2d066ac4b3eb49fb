# SPDX-License-Identifier: MIT
"""bench/adamw_gpu driver: one AdamW step over 256M f32 parameters on the GPU in trainkit
(optim::AdamW: prologue + one multi_tensor_apply), torch.optim.AdamW(fused=True), a kernel with
AdamW's 28 B/param traffic and cudaMemcpyAsync device-to-device (the bandwidth denominator),
sampled alternately. Goal: >= 80% of the copy bandwidth."""
import os

import harness as h

N = int(os.environ.get("BENCH_ADAMW_GPU_N", 256 << 20))
ROUNDS, WARMUP = 15, 3

TK, TORCH = "trainkit optim::AdamW", "torch AdamW(fused=True)"
PROBE, COPY = "probe: 28 B/param kernel", "cudaMemcpy D2D (8 B/elt)"
with h.Worker("trainkit", [h.binary("adamw_gpu"), f"--n={N}"]) as tk:
    with h.Worker("torch", h.python_peer("peer_torch.py", f"--n={N}")) as pt:
        print(f"adamw_gpu: n={N} ({N >> 20}M) f32 params, torch {pt.info['torch']}, "
              f"{pt.info['gpu']}")
        samples = h.alternate([(TK, tk, "trainkit"), (TORCH, pt, "torch"),
                               (PROBE, tk, "probe28"), (COPY, tk, "copy")],
                              rounds=ROUNDS, warmup=WARMUP)
med = h.print_table([(label, secs, (8 if label == COPY else 28) * N)
                     for label, secs in samples.items()])
vs_torch = med[TORCH] / med[TK]
of_copy = (28 * N / med[TK]) / (8 * N / med[COPY])
print(f"  trainkit vs torch {vs_torch:.2f}x; AdamW at {100 * of_copy:.0f}% of the D2D copy GB/s "
      f"(goal >= 80%)")
h.result_line("adamw_gpu", vs_torch,
              f"trainkit AdamW vs torch AdamW(fused) on the GPU, {100 * of_copy:.0f}% of D2D copy "
              "bandwidth")
