# SPDX-License-Identifier: MIT
"""torch peer of bench/e2e_gpu: nanoGPT's GPT (LayerNorm, CausalSelfAttention with
F.scaled_dot_product_attention(is_causal=True), MLP with F.gelu(approximate='tanh'), lm_head tied to
transformer.wte, biases, dropout 0) at the shapes given, trained on the GPU with the recipe of
train_gpt: bf16 autocast (weights and optimizer state f32), mean cross-entropy, backward,
clip_grad_norm_(1.0), torch.optim.AdamW(fused=True, betas (0.9, 0.95), weight decay 0.1 except on
biases and LayerNorms). Batches are random tokens in pinned host memory copied with
non_blocking=True; the loss is read every --log-every steps, as train_gpt does. --compile wraps the
model in torch.compile. Prints one JSON line: median step seconds over the timed steps."""
import argparse
import json
import statistics
import time

import torch

import nanogpt

p = argparse.ArgumentParser()
p.add_argument("--batch", type=int, required=True)
p.add_argument("--seq", type=int, required=True)
p.add_argument("--layers", type=int, required=True)
p.add_argument("--dim", type=int, required=True)
p.add_argument("--heads", type=int, required=True)
p.add_argument("--vocab", type=int, required=True)
p.add_argument("--warmup-steps", type=int, default=10)
p.add_argument("--steps", type=int, default=20)
p.add_argument("--log-every", type=int, default=5)
p.add_argument("--compile", action="store_true")
p.add_argument("--device", default="cuda", help="cuda; cpu only to try the script")
args = p.parse_args()
B, T, L, C, NH, V = args.batch, args.seq, args.layers, args.dim, args.heads, args.vocab
torch.manual_seed(1337)
torch.backends.cuda.matmul.allow_tf32 = True
torch.backends.cudnn.allow_tf32 = True
dev = args.device
cuda = dev.startswith("cuda")


model = nanogpt.GPT(V, T, L, C, NH, tie=True).init_gpt2().to(dev)
n_params = sum(q.numel() for q in model.parameters())  # the tied weight once
opt = torch.optim.AdamW(nanogpt.adamw_groups(model, 0.1), lr=6e-4, betas=(0.9, 0.95), eps=1e-8,
                        fused=True)
forward = torch.compile(model) if args.compile else model

g = torch.Generator().manual_seed(7)
host = [torch.randint(0, V, (B, T + 1), generator=g) for _ in range(4)]
if cuda:
    host = [h.pin_memory() for h in host]


def step(i):
    w = host[i % len(host)].to(dev, non_blocking=True)
    x, y = w[:, :-1].contiguous(), w[:, 1:].contiguous()  # two arrays, as trainkit's batches
    opt.zero_grad(set_to_none=True)
    with torch.autocast(device_type=dev.split(":")[0], dtype=torch.bfloat16):
        loss = forward(x, y)
    loss.backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    opt.step()
    return loss


t0 = time.perf_counter()
for i in range(args.warmup_steps):
    step(i)
if cuda:
    torch.cuda.synchronize()
warmup_s = time.perf_counter() - t0
times, losses = [], []
last = time.perf_counter()
for i in range(args.steps):
    loss = step(args.warmup_steps + i)
    if (i + 1) % args.log_every == 0:
        losses.append(loss.item())  # synchronises, as train_gpt's log steps do
        now = time.perf_counter()
        times.append((now - last) / args.log_every)
        last = now
print(json.dumps({"step_s": statistics.median(times), "warmup_s": warmup_s, "losses": losses,
                  "params": n_params, "torch": torch.__version__,
                  "gpu": torch.cuda.get_device_name() if cuda else dev,
                  "peak_mem_gib": torch.cuda.max_memory_allocated() / 2**30 if cuda else 0.0}))
