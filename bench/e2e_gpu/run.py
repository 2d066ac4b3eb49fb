# SPDX-License-Identifier: MIT
"""bench/e2e_gpu driver: the flagship's training step at GPT-2 124M shapes on one GPU, trainkit
(examples/train_gpt.cpp built by nvcc: train_gpt_cuda) vs nanoGPT's GPT in PyTorch eager and
torch.compile (peer_torch.py), one after the other on the same GPU.

Both train 12 layers x 768, 12 heads, context 1024, vocabulary 50257 with a tied head, bf16
(f32 master weights and AdamW state), clipping 1.0, B x 1024 tokens per step, the loss read every
5 steps; 10 warm-up steps (cuBLASLt heuristics, torch.compile), then 20 timed steps: the median of
the 5-step windows. trainkit's time is the step_time_s that train::Loop's monitor writes to
metrics.jsonl (host clock between two loss reads, so it covers everything the loop does). FLOPs
per token are 6 N + 12 L H Q T with N the matmul parameters (the tied head counted once, as a
matmul), the same figure for both; MFU is over the GPU's dense bf16 peak (trainkit's table).

The executable: $TRAINKIT_TRAIN_GPT_CUDA, else build*/examples/train_gpt_cuda, else nvcc builds the
single-header command of the README into the out folder. Environment: E2E_GPU_BATCH (default 16),
E2E_GPU_STEPS (timed steps, default 20). Last line: trainkit tokens/s over torch.compile's."""
import glob
import json
import os
import random
import shutil
import statistics
import subprocess
import sys

ROOT = os.environ.get("TRAINKIT_ROOT", os.path.abspath(os.path.join(__file__, "..", "..", "..")))
BIN = os.environ.get("BENCH_BIN", os.path.join(ROOT, "bench", "out", "e2e_gpu"))
PY = os.environ.get("BENCH_PYTHON", sys.executable)
B = int(os.environ.get("E2E_GPU_BATCH", 16))
STEPS = int(os.environ.get("E2E_GPU_STEPS", 20))
WARMUP, LOG_EVERY = 10, 5
T, L, C, H, V = 1024, 12, 768, 12, 50257
SHAPE = dict(batch=B, seq=T, layers=L, dim=C, heads=H, vocab=V)
N_MATMUL = L * 12 * C * C + V * C
FLOPS_PER_TOKEN = 6.0 * N_MATMUL + 12.0 * L * H * (C // H) * T
os.makedirs(BIN, exist_ok=True)


def train_gpt_cuda():
    exe = os.environ.get("TRAINKIT_TRAIN_GPT_CUDA", "")
    if exe:
        return exe
    found = sorted(glob.glob(os.path.join(ROOT, "build*", "examples", "train_gpt_cuda")),
                   key=os.path.getmtime)
    if found:
        return found[-1]
    exe = os.path.join(BIN, "train_gpt_cuda")
    cmd = ["nvcc", "-std=c++20", "-O3", "-arch=sm_90", "-x", "cu", "-DTRAINKIT_WITH_CUBLASLT=1",
           "-I", os.path.join(ROOT, "single_include"), os.path.join(ROOT, "examples", "train_gpt.cpp"),
           "-o", exe, "-lcublasLt"]
    print("e2e_gpu: building " + " ".join(cmd), file=sys.stderr)
    subprocess.run(cmd, check=True)
    return exe


def corpus():
    """4 MiB of printable bytes (seeded): the flagship's input; the speed does not depend on it."""
    path = os.path.join(BIN, "corpus.txt")
    if not os.path.exists(path):
        rnd = random.Random(5)
        alphabet = b"abcdefghijklmnopqrstuvwxyz      ,.\n"
        with open(path, "wb") as f:
            f.write(bytes(rnd.choice(alphabet) for _ in range(4 << 20)))
    return path


def run_trainkit():
    out = os.path.join(BIN, "run")
    shutil.rmtree(out, ignore_errors=True)
    total = WARMUP + STEPS
    cmd = [train_gpt_cuda(), "--device", "cuda", "--precision", "bf16", "--tie-weights",
           "--batch", str(B), "--seq", str(T), "--layers", str(L), "--dim", str(C), "--heads", str(H),
           "--vocab", str(V), "--steps", str(total), "--log-every", str(LOG_EVERY),
           "--eval-every", str(total), "--eval-batches", "1", "--ckpt-every", str(total),
           "--keep", "0", "--sample-chars", "0", "--lr", "6e-4", "--data", corpus(), "--out", out]
    p = subprocess.run(cmd, capture_output=True, text=True)
    if p.returncode != 0:
        sys.stderr.write(p.stdout[-3000:] + p.stderr[-3000:])
        raise SystemExit(f"e2e_gpu: train_gpt_cuda failed (status {p.returncode})")
    rows = [json.loads(line) for line in open(os.path.join(out, "metrics.jsonl"))]
    # the last window also holds the final checkpoint: left out
    rows = [r for r in rows if "step_time_s" in r and WARMUP < r["step"] < total]
    if not rows:
        raise SystemExit("e2e_gpu: train_gpt_cuda wrote no step timings")
    with open(os.path.join(out, "stdout.txt"), "w") as f:
        f.write(p.stdout)
    info = next((ln for ln in p.stdout.splitlines() if "parameters" in ln), "")
    summary = [ln for ln in p.stdout.splitlines() if ln.startswith("[trainkit] step")]
    info += "\n  " + (summary[-2] if len(summary) > 1 else "")
    return {"step_s": statistics.median(r["step_time_s"] for r in rows),
            "losses": [r["loss"] for r in rows], "peak": rows[-1].get("peak_tflops", 0.0),
            "mem_gib": rows[-1].get("device_used_bytes", 0) / 2**30, "info": info}


def run_torch(compiled):
    cmd = [PY, os.path.join(os.path.dirname(os.path.abspath(__file__)), "peer_torch.py"),
           "--warmup-steps", str(WARMUP), "--steps", str(STEPS), "--log-every", str(LOG_EVERY)]
    cmd += [f"--{k}={v}" for k, v in SHAPE.items()] + (["--compile"] if compiled else [])
    p = subprocess.run(cmd, capture_output=True, text=True)
    if p.returncode != 0:
        sys.stderr.write(p.stdout[-3000:] + p.stderr[-3000:])
        raise SystemExit(f"e2e_gpu: the torch peer failed (status {p.returncode})")
    return json.loads(p.stdout.strip().splitlines()[-1])


def attempt(label, f, *a):
    try:
        return f(*a)
    except (SystemExit, OSError, ValueError, subprocess.SubprocessError) as e:
        print(f"e2e_gpu: {label}: {e}", file=sys.stderr)
        return None


tk = attempt("trainkit", run_trainkit)
eager = attempt("torch eager", run_torch, False)
comp = attempt("torch.compile", run_torch, True)
peak = 1e12 * ((tk or {}).get("peak") or 989.4)
tokens = B * T
ref = eager or comp or {}
print(f"e2e_gpu: GPT-2 124M shapes ({L} x {C}, {H} heads, T {T}, vocab {V}, tied), batch {B} "
      f"({tokens} tokens/step), bf16; {ref.get('gpu', '?')}, torch {ref.get('torch', '?')}; "
      f"{FLOPS_PER_TOKEN / 1e6:.0f} MFLOP/token, peak {peak / 1e12:.0f} TFLOP/s")
if tk:
    print(f"  trainkit: {tk['info'].strip()}")
print(f"  {'':<16} {'ms/step':>9} {'tokens/s':>10} {'MFU':>6}  losses (every {LOG_EVERY} steps)")
for name, r in (("trainkit", tk), ("torch eager", eager), ("torch.compile", comp)):
    if r is None:
        print(f"  {name:<16} failed")
        continue
    s = r["step_s"]
    print(f"  {name:<16} {1e3 * s:9.1f} {tokens / s:10.0f} {100 * FLOPS_PER_TOKEN * tokens / s / peak:5.1f}%"
          f"  {' '.join(f'{x:.3f}' for x in r['losses'])}")
if comp and eager:
    print(f"  torch.compile warm-up (compilation) {comp['warmup_s']:.0f} s; peak memory torch "
          f"eager {eager['peak_mem_gib']:.1f} GiB, compile {comp['peak_mem_gib']:.1f} GiB")
if tk:
    print(f"  trainkit device memory in use {tk['mem_gib']:.1f} GiB")
if not (tk and eager and comp):
    raise SystemExit("e2e_gpu: a run failed (above)")
print(f"e2e_gpu: {comp['step_s'] / tk['step_s']:.2f}x trainkit vs torch.compile tokens/s "
      f"({eager['step_s'] / tk['step_s']:.2f}x vs eager; trainkit MFU "
      f"{100 * FLOPS_PER_TOKEN * tokens / tk['step_s'] / peak:.1f}%)")
