# SPDX-License-Identifier: MIT
"""torch peer of bench/gpt_block_step: nanoGPT's Block (LayerNorm, CausalSelfAttention with
F.scaled_dot_product_attention(is_causal=True), tanh-GELU MLP), forward + y.backward(dy) with
x.requires_grad (a block inside a model needs dx), zero_grad(set_to_none=True) per step, CPU,
--threads threads, on the parameters and inputs the trainkit worker dumped."""
import argparse

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F

import harness

p = argparse.ArgumentParser()
p.add_argument("--threads", type=int, required=True)
p.add_argument("--dump", required=True)
args = p.parse_args()
torch.set_num_threads(args.threads)
B, T, C, NH = 8, 128, 256, 4


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


block = Block()
params = dict(block.named_parameters())
blob = np.fromfile(args.dump, dtype=np.uint8)
pos = 0
with torch.no_grad(), open(args.dump + ".txt") as names:
    for line in names:
        name, n = line.split()[0], int(line.split()[1])
        prm = params.pop(name)
        prm.copy_(torch.from_numpy(blob[pos:pos + 4 * n].view(np.float32).reshape(prm.shape)))
        pos += 4 * n
if params:
    raise SystemExit(f"peer_torch: trainkit did not dump {sorted(params)}")
x = torch.from_numpy(blob[pos:pos + 4 * B * T * C].view(np.float32).reshape(B, T, C).copy())
pos += 4 * B * T * C
dy = torch.from_numpy(blob[pos:pos + 4 * B * T * C].view(np.float32).reshape(B, T, C).copy())
x.requires_grad_(True)


def step():
    block.zero_grad(set_to_none=True)
    x.grad = None
    y = block(x)
    y.backward(dy)
    return y


y = step()
gn = torch.sqrt(sum((q.grad.double() ** 2).sum() for q in block.parameters())).item()
harness.serve({"threads": torch.get_num_threads(), "torch": torch.__version__,
               "y_norm": f"{y.detach().double().norm().item():.7g}",
               "dx_norm": f"{x.grad.double().norm().item():.7g}", "grad_norm": f"{gn:.7g}"},
              {"step": step})
