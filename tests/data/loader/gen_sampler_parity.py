#!/usr/bin/env python3
# SPDX-License-Identifier: MIT
"""Generates sampler_parity.txt: what torch.utils.data.DistributedSampler yields for a grid of
(N, world, rank, seed, epoch, shuffle, drop_last). tests/loader/test_sampler.cpp checks that
trainkit::data::DistributedSampler yields the same indices. Needs torch (CI does not: the output
is committed). Regenerate with:
    .venv-bench/bin/python tests/data/loader/gen_sampler_parity.py

Line format (one case per line, '#' lines are comments):
    full N world rank seed epoch shuffle drop_last : i0 i1 ...
    hash N world rank seed epoch shuffle drop_last : count first0..first15 checksum
where checksum = sum_k (k+1) * i_k mod (2^61 - 1), used for large N to keep the file small.
"""
import os

import torch
from torch.utils.data import DistributedSampler

HERE = os.path.dirname(os.path.abspath(__file__))
MOD = (1 << 61) - 1


class Sized:
    def __init__(self, n):
        self.n = n

    def __len__(self):
        return self.n


def indices(n, world, rank, seed, epoch, shuffle, drop_last):
    s = DistributedSampler(Sized(n), num_replicas=world, rank=rank, shuffle=shuffle, seed=seed,
                           drop_last=drop_last)
    s.set_epoch(epoch)
    out = list(s)
    assert len(out) == len(s)
    return out


def main():
    lines = [f"# torch {torch.__version__}: torch.utils.data.DistributedSampler reference values"]
    small = [0, 1, 3, 7, 10, 33, 100]
    for n in small:
        for world in [1, 2, 3, 4, 8]:
            for rank in range(world):
                for seed in [0, 42, 2**32 + 5]:
                    for epoch in [0, 1, 7]:
                        for shuffle in [False, True]:
                            for drop_last in [False, True]:
                                idx = indices(n, world, rank, seed, epoch, shuffle, drop_last)
                                head = f"full {n} {world} {rank} {seed} {epoch} {int(shuffle)} {int(drop_last)}"
                                lines.append(head + " : " + " ".join(map(str, idx)))
    for n in [5000, 100003]:
        for world in [1, 3, 8]:
            for rank in sorted({0, world - 1}):
                for seed in [0, 123]:
                    for epoch in [0, 5]:
                        for drop_last in [False, True]:
                            idx = indices(n, world, rank, seed, epoch, True, drop_last)
                            checksum = sum((k + 1) * v for k, v in enumerate(idx)) % MOD
                            head = f"hash {n} {world} {rank} {seed} {epoch} 1 {int(drop_last)}"
                            lines.append(head + " : " + " ".join(map(str, [len(idx)] + idx[:16] + [checksum])))
    with open(os.path.join(HERE, "sampler_parity.txt"), "w") as f:
        f.write("\n".join(lines) + "\n")
    print(f"wrote {len(lines) - 1} cases")


if __name__ == "__main__":
    main()
