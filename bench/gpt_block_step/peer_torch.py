# SPDX-License-Identifier: MIT
"""torch peer of bench/gpt_block_step: nanoGPT's Block (LayerNorm, CausalSelfAttention with
F.scaled_dot_product_attention(is_causal=True), tanh-GELU MLP), forward + y.backward(dy) with
x.requires_grad (a block inside a model needs dx), zero_grad(set_to_none=True) per step, CPU,
--threads threads, on the parameters and inputs the trainkit worker dumped."""
import argparse

import numpy as np
import torch

import harness
import nanogpt

p = argparse.ArgumentParser()
p.add_argument("--threads", type=int, required=True)
p.add_argument("--dump", required=True)
args = p.parse_args()
torch.set_num_threads(args.threads)
B, T, C, NH = 8, 128, 256, 4


block = nanogpt.Block(C, NH)
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
