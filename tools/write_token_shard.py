#!/usr/bin/env python3
# SPDX-License-Identifier: MIT
"""Write llm.c token shards that trainkit's data::TokenShardDataset (and llm.c) read.

Format (llm.c dev/data/data_common.py `write_datafile`): a header of 256 little-endian int32
(magic, version, token count, then zeros), followed by the tokens:
  gpt-2   : magic 20240520, version 1, uint16 tokens
  llama-3 : magic 20240801, version 7, uint32 tokens
Standard library only (no numpy needed).

As a module:
    from write_token_shard import write_shard
    write_shard("train_000000.bin", token_ids)                 # gpt-2 layout
    write_shard("train_000000.bin", token_ids, model="llama-3")
From the shell (tokens as whitespace-separated integers on stdin, or a range for smoke tests):
    python3 tools/write_token_shard.py out.bin < tokens.txt
    python3 tools/write_token_shard.py out.bin --range 0 1000 --modulo 50257
"""
import argparse
import array
import struct
import sys

FORMATS = {
    "gpt-2": (20240520, 1, "H", 2**16),
    "llama-3": (20240801, 7, "I", 2**32),
}


def write_shard(path, tokens, model="gpt-2"):
    """Writes `tokens` (an iterable of non-negative ints) as one shard; returns the byte size."""
    if model not in FORMATS:
        raise ValueError(f"unknown model {model!r}; use one of {sorted(FORMATS)}")
    magic, version, code, limit = FORMATS[model]
    toks = array.array(code, (int(t) for t in tokens)) if not isinstance(tokens, array.array) \
        else tokens
    if toks.typecode != code:
        toks = array.array(code, toks)
    if len(toks) >= 2**31:
        raise ValueError("a shard holds fewer than 2**31 tokens")
    if any(t >= limit for t in toks):
        raise ValueError(f"token id >= {limit} does not fit the {model} format")
    if sys.byteorder != "little":
        toks.byteswap()
    header = struct.pack("<256i", magic, version, len(toks), *([0] * 253))
    with open(path, "wb") as f:
        f.write(header)
        f.write(toks.tobytes())
    return len(header) + len(toks) * toks.itemsize


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("out")
    p.add_argument("--model", default="gpt-2", choices=sorted(FORMATS))
    p.add_argument("--range", nargs=2, type=int, metavar=("START", "STOP"),
                   help="write tokens START..STOP-1 instead of reading stdin")
    p.add_argument("--modulo", type=int, default=0, help="reduce each token modulo this")
    a = p.parse_args()
    toks = range(*a.range) if a.range else (int(t) for t in sys.stdin.read().split())
    if a.modulo:
        toks = (t % a.modulo for t in toks)
    n = write_shard(a.out, toks, a.model)
    print(f"wrote {a.out}: {n} bytes ({a.model})", file=sys.stderr)


if __name__ == "__main__":
    main()
