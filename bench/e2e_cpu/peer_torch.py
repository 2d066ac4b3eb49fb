# SPDX-License-Identifier: MIT
"""torch peer of bench/e2e_cpu: the same training step in PyTorch on the CPU. The model is
nanoGPT's GPT (Block = LayerNorm, CausalSelfAttention with F.scaled_dot_product_attention
(is_causal=True), MLP with F.gelu(approximate='tanh')), untied lm_head without bias, dropout 0,
4 layers, width 128, 4 heads, context 64, vocabulary 256, loaded with load_state_dict(strict=True)
from the safetensors file the trainkit worker wrote. The recipe: F.cross_entropy (mean),
backward, torch.nn.utils.clip_grad_norm_(1.0), torch.optim.AdamW(lr 3e-3, betas (0.9, 0.95),
weight decay 0.1 except on "*.bias" and "*ln_*", which is nanoGPT's 2-D rule here), then
SequentialLR([LinearLR(1e-3, 1, warmup), CosineAnnealingLR(curve_steps - warmup, 0.1 lr)]),
warmup = curve_steps // 10. --compile wraps the model in torch.compile (inductor; forward and
backward compiled, optimizer eager)."""
import argparse
import json
import os
import struct
import sys
import time

import numpy as np
import torch

import harness
import nanogpt

p = argparse.ArgumentParser()
p.add_argument("--threads", type=int, required=True)
p.add_argument("--init", required=True)
p.add_argument("--batches", required=True)
p.add_argument("--curve", default="")
p.add_argument("--curve-steps", type=int, default=20)
p.add_argument("--compile", action="store_true")
args = p.parse_args()
torch.set_num_threads(args.threads)
B, T, V, L, C, NH = 16, 64, 256, 4, 128, 4
LR = 3e-3


def load_safetensors(path):
    """name -> tensor of an F32 safetensors file (the format: u64 header size, JSON, data)."""
    with open(path, "rb") as f:
        blob = f.read()
    (n,) = struct.unpack("<Q", blob[:8])
    header = json.loads(blob[8:8 + n])
    out = {}
    for name, meta in header.items():
        if name == "__metadata__":
            continue
        if meta["dtype"] != "F32":
            raise SystemExit(f"peer_torch: {name} is {meta['dtype']}, expected F32")
        b0, b1 = meta["data_offsets"]
        a = np.frombuffer(blob, dtype=np.float32, count=(b1 - b0) // 4, offset=8 + n + b0)
        out[name] = torch.from_numpy(a.reshape(meta["shape"]).copy())
    return out


model = nanogpt.GPT(V, T, L, C, NH)
model.load_state_dict(load_safetensors(args.init), strict=True)
raw = np.fromfile(args.batches, dtype=np.uint8).reshape(-1, B, T + 1).astype(np.int64)
windows = [(torch.from_numpy(w[:, :T].copy()), torch.from_numpy(w[:, 1:].copy())) for w in raw]

opt = torch.optim.AdamW(nanogpt.adamw_groups(model, 0.1),
                        lr=LR, betas=(0.9, 0.95), eps=1e-8)
warmup = max(1, args.curve_steps // 10)
sched = torch.optim.lr_scheduler.SequentialLR(opt, [
    torch.optim.lr_scheduler.LinearLR(opt, 1e-3, 1.0, warmup),
    torch.optim.lr_scheduler.CosineAnnealingLR(opt, args.curve_steps - warmup, 0.1 * LR)],
    milestones=[warmup])

forward = model
compile_seconds = 0.0
if args.compile:
    forward = torch.compile(model)
state = {"i": 0}


def step():
    x, y = windows[state["i"] % len(windows)]
    state["i"] += 1
    opt.zero_grad(set_to_none=True)
    loss = forward(x, y)
    loss.backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    opt.step()
    sched.step()
    return loss.item()


t0 = time.perf_counter()
curve = [step() for _ in range(args.curve_steps)]
if args.compile:
    compile_seconds = time.perf_counter() - t0  # the first step compiles forward and backward
if args.curve:
    with open(args.curve, "w") as f:
        f.writelines(f"{s},{v:.9g}\n" for s, v in enumerate(curve))
harness.serve({"threads": torch.get_num_threads(), "torch": torch.__version__,
               "compile_s": f"{compile_seconds:.1f}"}, {"step": step})
