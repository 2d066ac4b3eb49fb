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
import torch.nn as nn
import torch.nn.functional as F

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
args = p.parse_args()
B, T, L, C, NH, V = args.batch, args.seq, args.layers, args.dim, args.heads, args.vocab
torch.manual_seed(1337)
torch.backends.cuda.matmul.allow_tf32 = True
torch.backends.cudnn.allow_tf32 = True
dev = "cuda"


class CausalSelfAttention(nn.Module):
    def __init__(self):
        super().__init__()
        self.c_attn = nn.Linear(C, 3 * C)
        self.c_proj = nn.Linear(C, C)

    def forward(self, x):
        b, t, c = x.size()
        q, k, v = self.c_attn(x).split(c, dim=2)
        q = q.view(b, t, NH, c // NH).transpose(1, 2)
        k = k.view(b, t, NH, c // NH).transpose(1, 2)
        v = v.view(b, t, NH, c // NH).transpose(1, 2)
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.c_proj(y.transpose(1, 2).contiguous().view(b, t, c))


class MLP(nn.Module):
    def __init__(self):
        super().__init__()
        self.c_fc = nn.Linear(C, 4 * C)
        self.c_proj = nn.Linear(4 * C, C)

    def forward(self, x):
        return self.c_proj(F.gelu(self.c_fc(x), approximate="tanh"))


class Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.ln_1 = nn.LayerNorm(C)
        self.attn = CausalSelfAttention()
        self.ln_2 = nn.LayerNorm(C)
        self.mlp = MLP()

    def forward(self, x):
        x = x + self.attn(self.ln_1(x))
        return x + self.mlp(self.ln_2(x))


class GPT(nn.Module):
    def __init__(self):
        super().__init__()
        self.transformer = nn.ModuleDict(dict(
            wte=nn.Embedding(V, C), wpe=nn.Embedding(T, C), drop=nn.Dropout(0.0),
            h=nn.ModuleList([Block() for _ in range(L)]), ln_f=nn.LayerNorm(C)))
        self.lm_head = nn.Linear(C, V, bias=False)
        self.transformer.wte.weight = self.lm_head.weight  # tied, as GPT-2
        self.apply(self._init)

    @staticmethod
    def _init(m):
        if isinstance(m, nn.Linear):
            nn.init.normal_(m.weight, 0.0, 0.02)
            if m.bias is not None:
                nn.init.zeros_(m.bias)
        elif isinstance(m, nn.Embedding):
            nn.init.normal_(m.weight, 0.0, 0.02)

    def forward(self, idx, targets):
        pos = torch.arange(0, idx.size(1), dtype=torch.long, device=idx.device)
        x = self.transformer.drop(self.transformer.wte(idx) + self.transformer.wpe(pos))
        for block in self.transformer.h:
            x = block(x)
        logits = self.lm_head(self.transformer.ln_f(x))
        return F.cross_entropy(logits.view(-1, logits.size(-1)).float(), targets.view(-1))


model = GPT().to(dev)
named = list(model.named_parameters())  # the tied weight once
decay = [q for n, q in named if not (n.endswith(".bias") or "ln_" in n)]
no_decay = [q for n, q in named if n.endswith(".bias") or "ln_" in n]
opt = torch.optim.AdamW([{"params": decay, "weight_decay": 0.1},
                         {"params": no_decay, "weight_decay": 0.0}],
                        lr=6e-4, betas=(0.9, 0.95), eps=1e-8, fused=True)
forward = torch.compile(model) if args.compile else model

g = torch.Generator().manual_seed(7)
host = [torch.randint(0, V, (B, T + 1), generator=g).pin_memory() for _ in range(4)]


def step(i):
    w = host[i % len(host)].to(dev, non_blocking=True)
    x, y = w[:, :-1].contiguous(), w[:, 1:].contiguous()  # two arrays, as trainkit's batches
    opt.zero_grad(set_to_none=True)
    with torch.autocast(device_type="cuda", dtype=torch.bfloat16):
        loss = forward(x, y)
    loss.backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    opt.step()
    return loss


t0 = time.perf_counter()
for i in range(args.warmup_steps):
    step(i)
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
                  "params": sum(q.numel() for _, q in named), "torch": torch.__version__,
                  "gpu": torch.cuda.get_device_name(),
                  "peak_mem_gib": torch.cuda.max_memory_allocated() / 2**30}))
