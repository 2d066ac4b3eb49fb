#!/usr/bin/env python3
# SPDX-License-Identifier: MIT
"""Regenerates the safetensors fixtures in this folder with the reference writer
(`pip install safetensors numpy`; run: python3 tests/data/safetensors/generate.py).

  vec_*.safetensors          the writer test vectors of the safetensors crate's own tests
                             (test_serialization, test_serialization_forced_alignement,
                             test_empty), a metadata-only file and a two-dtype file with
                             metadata; each is also checked here against the hex bytes in VECTORS
  python_all_dtypes.safetensors
                             one tensor of every dtype trainkit supports, shapes cycling through
                             0-d, empty and multi-dimensional, metadata {"format": "pt"}; tensor k
                             (k = index in ALL_DTYPES) is named "layer.<(7k) mod 15>.<dtype>",
                             has shape SHAPES[k % 7] and byte j = (37 j + 11 k + 5) mod 256
                             (BOOL: (j + k) mod 2). tests/io/test_safetensors.cpp rebuilds the
                             same tensors, compares its own writer's bytes with this file and
                             reads the file back.
"""
import os
import struct
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "..", "io"))
import safetensors_interop as st  # noqa: E402  (shares the reference-writer wrapper)

ALL_DTYPES = ["F64", "F32", "F16", "BF16", "F8_E4M3", "F8_E5M2", "I64", "I32", "I16", "I8",
              "U64", "U32", "U16", "U8", "BOOL"]
SHAPES = [[], [0], [3], [2, 3], [2, 0, 4], [1, 2, 3, 2], [5, 1]]


def f32(*xs):
    return struct.pack(f"<{len(xs)}f", *xs)


def f16(*xs):
    return struct.pack(f"<{len(xs)}e", *xs)


VECTORS = {
    "vec_serialization": (
        [("attn.0", "F32", [1, 2, 3], f32(0, 1, 2, 3, 4, 5))], None,
        "4000000000000000" + b'{"attn.0":{"dtype":"F32","shape":[1,2,3],"data_offsets":[0,24]}}'
        .hex() + "000000000000803f0000004000004040000080400000a040"),
    "vec_forced_alignment": (
        [("attn0", "F32", [1, 1, 2, 3], f32(0, 1, 2, 3, 4, 5))], None, None),
    "vec_empty": ([], None, "0800000000000000" + "7b7d202020202020"),
    "vec_metadata_only": (
        [], {"framework": "pt"},
        "2800000000000000" + b'{"__metadata__":{"framework":"pt"}}'.hex() + "20" * 5),
    "vec_f32_f16_metadata": (
        [("b", "F16", [2], f16(1, 2)), ("a", "F32", [1], f32(3))], {"format": "pt"},
        "9000000000000000" + (b'{"__metadata__":{"format":"pt"},"a":{"dtype":"F32","shape":[1],'
                              b'"data_offsets":[0,4]},"b":{"dtype":"F16","shape":[2],'
                              b'"data_offsets":[4,8]}}').hex() + "20" * 6 + "00004040003c0040"),
}


def all_dtypes():
    entries = []
    for k, dtype in enumerate(ALL_DTYPES):
        shape = SHAPES[k % len(SHAPES)]
        numel = 1
        for d in shape:
            numel *= d
        n = numel * st.SIZES[dtype]
        if dtype == "BOOL":
            data = bytes((j + k) % 2 for j in range(n))
        else:
            data = bytes((37 * j + 11 * k + 5) % 256 for j in range(n))
        entries.append((f"layer.{(7 * k) % 15}.{dtype.lower()}", dtype, shape, data))
    return entries


def main():
    for name, (entries, metadata, hexbytes) in VECTORS.items():
        blob = st.serialize(entries, metadata)
        if hexbytes is not None and blob != bytes.fromhex(hexbytes):
            sys.exit(f"{name}: the reference writer disagrees with VECTORS: {blob!r}")
        if name == "vec_forced_alignment":
            assert struct.unpack("<Q", blob[:8])[0] == 72 and blob[8 + 65:8 + 72] == b" " * 7
        with open(os.path.join(HERE, name + ".safetensors"), "wb") as f:
            f.write(blob)
    with open(os.path.join(HERE, "python_all_dtypes.safetensors"), "wb") as f:
        f.write(st.serialize(all_dtypes(), {"format": "pt"}))
    print(f"fixtures written with safetensors {st.safetensors.__version__}")


if __name__ == "__main__":
    main()
