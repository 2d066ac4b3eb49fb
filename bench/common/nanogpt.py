# SPDX-License-Identifier: MIT
"""nanoGPT's GPT-2 model in PyTorch, the peer of trainkit's nn::Gpt in the benchmarks: Block =
LayerNorm, CausalSelfAttention with F.scaled_dot_product_attention(is_causal=True), LayerNorm, MLP
with F.gelu(approximate="tanh"); GPT = wte + wpe (dropout 0), the blocks, ln_f and an lm_head
without bias, untied unless asked. State-dict names are nanoGPT's, which are nn::Gpt's."""
import torch
import torch.nn as nn
import torch.nn.functional as F


class CausalSelfAttention(nn.Module):
    def __init__(self, dim, heads):
        super().__init__()
        self.heads = heads
        self.c_attn = nn.Linear(dim, 3 * dim)
        self.c_proj = nn.Linear(dim, dim)

    def forward(self, x):
        b, t, c = x.size()
        q, k, v = self.c_attn(x).split(c, dim=2)
        q = q.view(b, t, self.heads, c // self.heads).transpose(1, 2)
        k = k.view(b, t, self.heads, c // self.heads).transpose(1, 2)
        v = v.view(b, t, self.heads, c // self.heads).transpose(1, 2)
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.c_proj(y.transpose(1, 2).contiguous().view(b, t, c))


class MLP(nn.Module):
    def __init__(self, dim):
        super().__init__()
        self.c_fc = nn.Linear(dim, 4 * dim)
        self.c_proj = nn.Linear(4 * dim, dim)

    def forward(self, x):
        return self.c_proj(F.gelu(self.c_fc(x), approximate="tanh"))


class Block(nn.Module):
    def __init__(self, dim, heads):
        super().__init__()
        self.ln_1 = nn.LayerNorm(dim)
        self.attn = CausalSelfAttention(dim, heads)
        self.ln_2 = nn.LayerNorm(dim)
        self.mlp = MLP(dim)

    def forward(self, x):
        x = x + self.attn(self.ln_1(x))
        return x + self.mlp(self.ln_2(x))


class GPT(nn.Module):
    """forward(idx, targets) returns the mean cross-entropy (f32 logits)."""

    def __init__(self, vocab, block_size, layers, dim, heads, tie=False):
        super().__init__()
        self.transformer = nn.ModuleDict(dict(
            wte=nn.Embedding(vocab, dim), wpe=nn.Embedding(block_size, dim), drop=nn.Dropout(0.0),
            h=nn.ModuleList([Block(dim, heads) for _ in range(layers)]), ln_f=nn.LayerNorm(dim)))
        self.lm_head = nn.Linear(dim, vocab, bias=False)
        if tie:
            self.transformer.wte.weight = self.lm_head.weight  # GPT-2's tied head

    def init_gpt2(self):
        """GPT-2's initialisation: N(0, 0.02) weights and embeddings, zero biases."""
        for m in self.modules():
            if isinstance(m, (nn.Linear, nn.Embedding)):
                nn.init.normal_(m.weight, 0.0, 0.02)
            if isinstance(m, nn.Linear) and m.bias is not None:
                nn.init.zeros_(m.bias)
        return self

    def forward(self, idx, targets):
        pos = torch.arange(0, idx.size(1), dtype=torch.long, device=idx.device)
        x = self.transformer.drop(self.transformer.wte(idx) + self.transformer.wpe(pos))
        for block in self.transformer.h:
            x = block(x)
        logits = self.lm_head(self.transformer.ln_f(x))
        return F.cross_entropy(logits.view(-1, logits.size(-1)).float(), targets.reshape(-1))


def adamw_groups(model, weight_decay):
    """nanoGPT's rule here: weight decay except on biases and LayerNorms (trainkit's
    no_weight_decay({"*.bias", "*ln_*"})); a tied weight appears once."""
    named = list(model.named_parameters())
    decay = [q for n, q in named if not (n.endswith(".bias") or "ln_" in n)]
    no_decay = [q for n, q in named if n.endswith(".bias") or "ln_" in n]
    return [{"params": decay, "weight_decay": weight_decay},
            {"params": no_decay, "weight_decay": 0.0}]
