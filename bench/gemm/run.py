# SPDX-License-Identifier: MIT
"""bench/gemm driver: f32 gemm through trainkit's built-in host kernel, torch.matmul (CPU) and
OpenBLAS (cblas_sgemm), 1 and 2 threads, sampled alternately with a single-thread FMA-throughput
probe (the measured per-core peak). Reports GFLOP/s, trainkit/torch speed ratios and the share
of peak; the last line is the geometric-mean speed ratio vs torch over the issue's three shapes."""
import math
import os

import harness as h

# name:ops:m:k:n  (op(A) is [m, k], op(B) is [k, n]; ops: N/T per operand as stored)
MAIN = ["sq512:NN:512:512:512", "sq1024:NN:1024:1024:1024", "mlp4096:NN:4096:768:3072"]
TRAIN = ["mlp_fc1_fwd:NT:256:784:1024", "mlp_fc1_dw:TN:1024:256:784",
         "gpt_qkv_fwd:NT:1024:256:768", "gpt_fc2_dx:NN:1024:1024:256"]
SHAPES = ",".join(MAIN + TRAIN)
THREADS = [1, 2]
ROUNDS = int(os.environ.get("BENCH_GEMM_ROUNDS", 7))


def flops(spec):
    _, _, m, k, n = spec.split(":")
    return 2.0 * int(m) * int(k) * int(n)


def label(spec):
    name, ops, m, k, n = spec.split(":")
    return f"{name} [{m}x{k}]@[{k}x{n}] {ops}"


rows = {}  # (spec, threads) -> {impl: median seconds}
peaks = []
info = {}
for threads in THREADS:
    env = {"OPENBLAS_NUM_THREADS": str(threads)}
    with h.Worker(f"trainkit{threads}", [h.binary("gemm"), f"--threads={threads}", f"--shapes={SHAPES}"],
                  env=env) as tk, \
         h.Worker(f"torch{threads}", h.python_peer("peer_torch.py", f"--threads={threads}",
                                                   f"--shapes={SHAPES}")) as pt:
        info = dict(tk.info, torch=pt.info["torch"], torch_threads=pt.info["threads"])
        probe_flops = float(tk.info["probe_flops"])
        for spec in MAIN + TRAIN:
            name = spec.split(":")[0]
            slots = [("trainkit", tk, "tk_" + name), ("torch", pt, "torch_" + name),
                     ("openblas", tk, "openblas_" + name), ("probe", tk, "probe_fma")]
            samples = h.alternate(slots, rounds=ROUNDS, warmup=2)
            med = {k: h.median(v) for k, v in samples.items()}
            rows[(spec, threads)] = med
            peaks.append(probe_flops / med["probe"])

print(f"gemm: f32, {h.machine()}, torch {info['torch']}, trainkit micro-kernel {info['kernel']}, "
      f"{ROUNDS} alternating rounds per shape, medians")
peak = h.median(peaks)
print(f"  measured per-core FMA peak (AVX2, 12 chains, 1 thread): {peak / 1e9:.1f} GFLOP/s"
      + ("  (this CPU also has AVX-512; the kernel uses AVX2)" if info.get("avx512") == "1" else ""))
print(f"  {'shape':<44} {'thr':>3} {'trainkit':>9} {'torch':>9} {'openblas':>9}  {'tk/torch':>8} {'tk/oblas':>8} {'%peak':>6}")
main_ratios = []
for spec in MAIN + TRAIN:
    for threads in THREADS:
        med = rows[(spec, threads)]
        f = flops(spec)
        g = {k: f / med[k] / 1e9 for k in ("trainkit", "torch", "openblas")}
        r_torch = med["torch"] / med["trainkit"]
        r_oblas = med["openblas"] / med["trainkit"]
        pct = 100 * f / med["trainkit"] / (peak * threads)
        if spec in MAIN:
            main_ratios.append(r_torch)
        print(f"  {label(spec):<44} {threads:>3} {g['trainkit']:9.1f} {g['torch']:9.1f} "
              f"{g['openblas']:9.1f}  {r_torch:8.2f} {r_oblas:8.2f} {pct:6.1f}")
print("  (GFLOP/s; ratios > 1: trainkit faster; %peak = trainkit / (per-core peak x threads))")
geo = math.exp(sum(math.log(r) for r in main_ratios) / len(main_ratios))
sq = rows[(MAIN[1], 1)]
pct1024 = 100 * flops(MAIN[1]) / sq["trainkit"] / peak
h.result_line("gemm", geo, f"trainkit host gemm vs torch.matmul CPU f32 (geomean of 512^2, 1024^2, "
              f"4096x768x3072 at 1 and 2 threads; 1024^2 1-thread at {pct1024:.0f}% of measured peak)")
