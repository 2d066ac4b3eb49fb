#!/usr/bin/env python3
# SPDX-License-Identifier: MIT
"""Generates tests/data/nn/reference.{txt,bin}: PyTorch reference values for the nn/ layer tests.

Run from the repository root with a Python that has torch and numpy (CI never runs it; it reads
the committed output):
    .venv-bench/bin/python tests/data/nn/make_reference.py
Inputs and parameters are drawn with numpy (fixed seed) in float32; torch then runs the modules in
float64 on those values, so the stored outputs and gradients are exact references for f32 code.

Format: reference.txt has one line per tensor, `<key> <dtype> <offset> <rank> <dims...>`, dtype
f4 / f8 / i8 (little-endian float32 / float64 / int64), offset in bytes into reference.bin.
Keys are `<case>/<name>`; parameters and their gradients use PyTorch state-dict names:
`<case>/param/<name>` and `<case>/grad/<name>`.
"""
import math
import os

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F

HERE = os.path.dirname(os.path.abspath(__file__))
rng = np.random.default_rng(20240601)
entries = []  # (key, array)


def put(key, a):
    a = np.ascontiguousarray(a)
    if a.dtype == np.float32 or a.dtype == np.float64 or a.dtype == np.int64:
        entries.append((key, a))
    else:
        raise TypeError(f"{key}: unsupported dtype {a.dtype}")


def f32(*shape, scale=1.0):
    return (rng.standard_normal(shape) * scale).astype(np.float32)


def t64(a):
    return torch.from_numpy(np.asarray(a, dtype=np.float64)).requires_grad_(True)


def load_params(case, module):
    """Draws every parameter of `module` in f32, stores it and loads it (as f64) into the module."""
    module.double()
    for name, p in module.named_parameters():
        v = f32(*p.shape, scale=0.5)
        if name.endswith("ln_1.weight") or name.endswith("ln_2.weight") or name == "weight" and \
                isinstance(module, nn.LayerNorm):
            v = (1.0 + 0.3 * rng.standard_normal(p.shape)).astype(np.float32)
        put(f"{case}/param/{name}", v)
        with torch.no_grad():
            p.copy_(torch.from_numpy(v.astype(np.float64)))


def put_grads(case, module):
    for name, p in module.named_parameters():
        put(f"{case}/grad/{name}", p.grad.detach().numpy())


# ---- linear: y = x W^T + b --------------------------------------------------------------------
lin = nn.Linear(7, 4)
load_params("linear", lin)
x = f32(5, 7)
dy = f32(5, 4)
xt = t64(x)
y = lin(xt)
y.backward(torch.from_numpy(dy.astype(np.float64)))
put("linear/x", x)
put("linear/dy", dy)
put("linear/y", y.detach().numpy())
put("linear/dx", xt.grad.numpy())
put_grads("linear", lin)

# ---- layer_norm -------------------------------------------------------------------------------
ln = nn.LayerNorm(10)
load_params("layer_norm", ln)
x = f32(6, 10, scale=2.0) + 0.5
dy = f32(6, 10)
xt = t64(x)
y = ln(xt)
y.backward(torch.from_numpy(dy.astype(np.float64)))
put("layer_norm/x", x)
put("layer_norm/dy", dy)
put("layer_norm/y", y.detach().numpy())
put("layer_norm/dx", xt.grad.numpy())
put_grads("layer_norm", ln)

# ---- gelu (tanh) and relu ---------------------------------------------------------------------
for name, fn in (("gelu", lambda t: F.gelu(t, approximate="tanh")), ("relu", F.relu)):
    x = f32(3, 17, scale=2.0)
    dy = f32(3, 17)
    xt = t64(x)
    y = fn(xt)
    y.backward(torch.from_numpy(dy.astype(np.float64)))
    put(f"{name}/x", x)
    put(f"{name}/dy", dy)
    put(f"{name}/y", y.detach().numpy())
    put(f"{name}/dx", xt.grad.numpy())

# ---- embedding (repeated ids) -----------------------------------------------------------------
emb = nn.Embedding(6, 4)
load_params("embedding", emb)
ids = np.array([3, 1, 3, 0, 5, 3, 1, 2, 2], dtype=np.int64)
dout = f32(9, 4)
out = emb(torch.from_numpy(ids))
out.backward(torch.from_numpy(dout.astype(np.float64)))
put("embedding/ids", ids)
put("embedding/dout", dout)
put("embedding/out", out.detach().numpy())
put_grads("embedding", emb)

# ---- cross entropy with ignore_index ----------------------------------------------------------
logits = f32(7, 5, scale=3.0)
targets = np.array([1, -100, 4, 0, 4, -100, 2], dtype=np.int64)
lt = t64(logits)
loss = F.cross_entropy(lt, torch.from_numpy(targets), ignore_index=-100)
loss.backward()
put("cross_entropy/logits", logits)
put("cross_entropy/targets", targets)
put("cross_entropy/loss", np.array([loss.item()], dtype=np.float64))
put("cross_entropy/dlogits", lt.grad.numpy())


# ---- nanoGPT modules --------------------------------------------------------------------------
class CausalSelfAttention(nn.Module):
    def __init__(self, n_embd, n_head):
        super().__init__()
        self.c_attn = nn.Linear(n_embd, 3 * n_embd)
        self.c_proj = nn.Linear(n_embd, n_embd)
        self.n_head = n_head

    def forward(self, x):
        B, T, C = x.size()
        q, k, v = self.c_attn(x).split(C, dim=2)
        q = q.view(B, T, self.n_head, C // self.n_head).transpose(1, 2)
        k = k.view(B, T, self.n_head, C // self.n_head).transpose(1, 2)
        v = v.view(B, T, self.n_head, C // self.n_head).transpose(1, 2)
        att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(k.size(-1)))
        mask = torch.tril(torch.ones(T, T, dtype=torch.bool))
        att = att.masked_fill(~mask, float("-inf"))
        att = F.softmax(att, dim=-1)
        y = (att @ v).transpose(1, 2).contiguous().view(B, T, C)
        return self.c_proj(y)


class MLP(nn.Module):
    def __init__(self, n_embd):
        super().__init__()
        self.c_fc = nn.Linear(n_embd, 4 * n_embd)
        self.c_proj = nn.Linear(4 * n_embd, n_embd)

    def forward(self, x):
        return self.c_proj(F.gelu(self.c_fc(x), approximate="tanh"))


class Block(nn.Module):
    def __init__(self, n_embd, n_head):
        super().__init__()
        self.ln_1 = nn.LayerNorm(n_embd)
        self.attn = CausalSelfAttention(n_embd, n_head)
        self.ln_2 = nn.LayerNorm(n_embd)
        self.mlp = MLP(n_embd)

    def forward(self, x):
        x = x + self.attn(self.ln_1(x))
        return x + self.mlp(self.ln_2(x))


for case, module, shape in (("attention", CausalSelfAttention(8, 2), (2, 5, 8)),
                            ("block", Block(8, 2), (2, 4, 8))):
    load_params(case, module)
    x = f32(*shape)
    dy = f32(*shape)
    xt = t64(x)
    y = module(xt)
    y.backward(torch.from_numpy(dy.astype(np.float64)))
    put(f"{case}/x", x)
    put(f"{case}/dy", dy)
    put(f"{case}/y", y.detach().numpy())
    put(f"{case}/dx", xt.grad.numpy())
    put_grads(case, module)

# ---- MLP + cross entropy (Sequential): Linear(6, 9) - ReLU - Linear(9, 4) -----------------------
mlp = nn.Sequential(nn.Linear(6, 9), nn.ReLU(), nn.Linear(9, 4))
load_params("mlp", mlp)
x = f32(8, 6)
targets = np.array([0, 3, 1, 2, 3, 3, 0, 1], dtype=np.int64)
loss = F.cross_entropy(mlp(torch.from_numpy(x.astype(np.float64))), torch.from_numpy(targets))
loss.backward()
put("mlp/x", x)
put("mlp/targets", targets)
put("mlp/loss", np.array([loss.item()], dtype=np.float64))
put_grads("mlp", mlp)

# ---- write ------------------------------------------------------------------------------------
codes = {np.dtype(np.float32): "f4", np.dtype(np.float64): "f8", np.dtype(np.int64): "i8"}
offset = 0
with open(os.path.join(HERE, "reference.bin"), "wb") as blob, \
        open(os.path.join(HERE, "reference.txt"), "w") as index:
    index.write(f"# generated by make_reference.py (torch {torch.__version__}); "
                "key dtype offset rank dims...\n")
    for key, a in entries:
        data = a.astype(a.dtype.newbyteorder("<")).tobytes()
        dims = " ".join(str(d) for d in a.shape)
        index.write(f"{key} {codes[a.dtype]} {offset} {a.ndim} {dims}".rstrip() + "\n")
        blob.write(data)
        offset += len(data)
print(f"wrote {len(entries)} tensors, {offset} bytes")
