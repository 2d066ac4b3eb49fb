#!/usr/bin/env python3
# SPDX-License-Identifier: MIT
"""Python side of tests/io/test_safetensors_interop.cpp: the reference safetensors implementation
(the Rust core behind `pip install safetensors`) checks files trainkit wrote, and writes files for
trainkit to read.

  safetensors_interop.py check FILE MANIFEST
      The reference reader must accept FILE, and its tensors (names, dtypes, shapes, bytes) and
      metadata must equal MANIFEST; tensors of numpy dtypes are also loaded through
      safetensors.numpy and compared as arrays. Finally the reference writer, given the same
      tensors, must reproduce FILE byte for byte (MANIFEST has at most one metadata key, since
      the reference writes metadata in hash-map order).
  safetensors_interop.py write FILE MANIFEST SEED
      Writes random tensors of every dtype trainkit supports (random shapes including 0-d and
      empty ones, names with escapes and non-ASCII) to FILE with the reference writer and
      describes them in MANIFEST.

MANIFEST: {"metadata": {k: v}, "tensors": [{"name", "dtype", "shape", "hex"}]}.
Exit status: 0 success, 1 mismatch (explained on stderr), 77 numpy/safetensors not importable.
"""
import json
import random
import sys

try:
    import numpy as np
    import safetensors
    from safetensors import safe_open
except ImportError as e:  # CI installs both; a developer machine may not have them
    print(f"safetensors_interop: skipped: {e}", file=sys.stderr)
    sys.exit(77)

SIZES = {"F64": 8, "F32": 4, "F16": 2, "BF16": 2, "F8_E4M3": 1, "F8_E5M2": 1, "I64": 8,
         "I32": 4, "I16": 2, "I8": 1, "U64": 8, "U32": 4, "U16": 2, "U8": 1, "BOOL": 1}
# Spellings safetensors >= 0.8's TensorSpec takes (torch dtype names).
SPEC_NAMES = {"F64": "float64", "F32": "float32", "F16": "float16", "BF16": "bfloat16",
              "F8_E4M3": "float8_e4m3fn", "F8_E5M2": "float8_e5m2", "I64": "int64",
              "I32": "int32", "I16": "int16", "I8": "int8", "U64": "uint64", "U32": "uint32",
              "U16": "uint16", "U8": "uint8", "BOOL": "bool"}
NUMPY = {"F64": np.float64, "F32": np.float32, "F16": np.float16, "I64": np.int64,
         "I32": np.int32, "I16": np.int16, "I8": np.int8, "U64": np.uint64, "U32": np.uint32,
         "U16": np.uint16, "U8": np.uint8, "BOOL": np.bool_}  # numpy has no BF16 / F8


def serialize(entries, metadata, path=None):
    """entries: [(name, dtype, shape, bytes)]. Runs the reference writer through the low-level
    binding, which takes raw bytes and so covers BF16 and F8 too. Returns bytes when no path."""
    keep_alive = []
    if hasattr(safetensors, "TensorSpec"):  # safetensors >= 0.8
        specs = {}
        for name, dtype, shape, data in entries:
            buf = np.frombuffer(data, dtype=np.uint8).copy() if data else np.zeros(1, np.uint8)
            keep_alive.append(buf)
            specs[name] = safetensors.TensorSpec(dtype=SPEC_NAMES[dtype], shape=list(shape),
                                                 data_ptr=buf.ctypes.data, data_len=len(data))
    else:  # older releases take {"dtype", "shape", "data"} dicts
        specs = {name: {"dtype": dtype, "shape": list(shape), "data": data}
                 for name, dtype, shape, data in entries}
    metadata = metadata or None
    if path is None:
        return bytes(safetensors.serialize(specs, metadata=metadata))
    safetensors.serialize_file(specs, path, metadata=metadata)
    return None


def fail(msg):
    print(f"safetensors_interop: {msg}", file=sys.stderr)
    sys.exit(1)


def check(path, manifest_path):
    with open(manifest_path, encoding="utf-8") as f:
        manifest = json.load(f)
    with open(path, "rb") as f:
        blob = f.read()
    expected = {t["name"]: t for t in manifest["tensors"]}
    try:
        got = dict(safetensors.deserialize(blob))  # the reference reader, every dtype
    except Exception as e:  # noqa: BLE001 - report whatever the reference says
        fail(f"the reference reader rejected {path}: {e}")
    if set(got) != set(expected):
        fail(f"names differ: file has {sorted(got)}, manifest {sorted(expected)}")
    for name, t in expected.items():
        g = got[name]
        if g["dtype"] != t["dtype"] or list(g["shape"]) != t["shape"]:
            fail(f"{name!r}: file says {g['dtype']}{list(g['shape'])}, "
                 f"manifest {t['dtype']}{t['shape']}")
        if bytes(g["data"]) != bytes.fromhex(t["hex"]):
            fail(f"{name!r}: bytes differ")
    with safe_open(path, framework="numpy") as f:
        meta = f.metadata() or {}
        if meta != manifest["metadata"]:
            fail(f"metadata differs: file {meta}, manifest {manifest['metadata']}")
        for name, t in expected.items():
            if t["dtype"] not in NUMPY:
                continue
            a = f.get_tensor(name)
            if a.dtype != NUMPY[t["dtype"]] or list(a.shape) != t["shape"]:
                fail(f"{name!r}: numpy got {a.dtype}{list(a.shape)}")
            if a.tobytes() != bytes.fromhex(t["hex"]):
                fail(f"{name!r}: numpy values differ")
    entries = [(t["name"], t["dtype"], t["shape"], bytes.fromhex(t["hex"]))
               for t in manifest["tensors"]]
    if len(manifest["metadata"]) <= 1:
        ref = serialize(entries, manifest["metadata"])
        if ref != blob:
            at = next((i for i, (a, b) in enumerate(zip(ref, blob)) if a != b),
                      min(len(ref), len(blob)))
            fail(f"the reference writer's bytes differ from {path} at byte {at} "
                 f"(reference {len(ref)} bytes, file {len(blob)}): {ref[:at + 16][-48:]!r} vs "
                 f"{blob[:at + 16][-48:]!r}")
    print(f"safetensors_interop: {path}: {len(expected)} tensors verified by safetensors "
          f"{safetensors.__version__}", file=sys.stderr)


NAME_POOL = ["embed.weight", "blocks.0.attn.qkv.weight", "blocks.0.mlp.fc1.bias", "ln_f.weight",
             "caf\u00e9.\u00fcber", "quote\"and\\backslash", "tab\tnew\nline", "emoji\U0001F600",
             "ctrl\x01\x1f", "slash/dot.name", ""]


def write(path, manifest_path, seed):
    rng = random.Random(seed)
    entries, used = [], set()
    for round_ in range(2):
        for dtype in SIZES:
            while True:
                base = rng.choice(NAME_POOL)
                name = f"{base}#{dtype.lower()}{round_}" if rng.random() < 0.8 else base
                if name not in used:
                    break
            used.add(name)
            rank = rng.randint(0, 4)
            shape = [rng.choice([0, 1, 2, 3, 5]) if rng.random() < 0.15 else rng.randint(1, 5)
                     for _ in range(rank)]
            if dtype == "F32" and round_ == 0:
                shape = []  # always at least one 0-d tensor
            if dtype == "I16" and round_ == 1:
                shape = [3, 0]  # and an empty one
            numel = 1
            for d in shape:
                numel *= d
            n = numel * SIZES[dtype]
            if dtype == "BOOL":
                data = bytes(rng.randint(0, 1) for _ in range(n))
            else:
                data = bytes(rng.randint(0, 255) for _ in range(n))
            entries.append((name, dtype, shape, data))
    metadata = {"origin": "python \u00e9 \"reference\"\n"}
    serialize(entries, metadata, path)
    manifest = {"metadata": metadata,
                "tensors": [{"name": n, "dtype": d, "shape": s, "hex": b.hex()}
                            for n, d, s, b in entries]}
    with open(manifest_path, "w", encoding="utf-8") as f:
        json.dump(manifest, f)  # ensure_ascii: names arrive as \uXXXX escapes (surrogate pairs)


def main():
    if len(sys.argv) == 4 and sys.argv[1] == "check":
        check(sys.argv[2], sys.argv[3])
    elif len(sys.argv) == 5 and sys.argv[1] == "write":
        write(sys.argv[2], sys.argv[3], int(sys.argv[4]))
    else:
        print(__doc__, file=sys.stderr)
        sys.exit(2)


if __name__ == "__main__":
    main()
