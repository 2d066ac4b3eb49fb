#!/usr/bin/env python3
# SPDX-License-Identifier: MIT
"""Generates the round-trip fixtures of tests/loader (committed; CI need not run this):
  fixtures/npy/     arrays written by numpy's np.save (every supported dtype, versions 1 and 2,
                    a scalar, an empty array) and files trainkit must refuse (Fortran order,
                    big-endian, complex, object/pickle, structured)
  fixtures/tar/     WebDataset shards written by Python's tarfile the way webdataset's TarWriter
                    does (PAX format, float mtime => a pax 'x' header before every member), a GNU
                    archive with 'L'/'K' long-name headers, a USTAR test vector (four members,
                    written by CPython's tarfile, whose bytes the tar tests pin down), and a
                    shard with a missing member
  fixtures/tokens/  llm.c token shards written by tools/write_token_shard.py
Run with a Python that has numpy:  .venv-bench/bin/python tests/data/loader/gen_fixtures.py
"""
import hashlib
import io
import json
import os
import sys
import tarfile

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
OUT = os.path.join(HERE, "fixtures")
sys.path.insert(0, os.path.join(HERE, "..", "..", "..", "tools"))
from write_token_shard import write_shard  # noqa: E402

DTYPES = ["f2", "f4", "f8", "i1", "i2", "i4", "i8", "u1", "u2", "u4", "u8", "b1"]


def npy_fixtures():
    d = os.path.join(OUT, "npy")
    os.makedirs(d, exist_ok=True)
    np.save(os.path.join(d, "vec_f4.npy"), np.array([1, 2, 3], "<f4"))
    with open(os.path.join(d, "v2_f4.npy"), "wb") as f:
        np.lib.format.write_array(f, np.array([1, 2, 3], "<f4"), version=(2, 0))
    for dt in DTYPES:
        a = (np.arange(6) % 2).astype(bool) if dt == "b1" else (np.arange(6) * 3 - 4 * (dt[0] == "i"))
        np.save(os.path.join(d, f"dt_{dt}.npy"), np.asarray(a).astype(dt).reshape(2, 3))
    np.save(os.path.join(d, "scalar_i8.npy"), np.array(7, "<i8"))
    np.save(os.path.join(d, "empty_u1.npy"), np.zeros((0,), "|u1"))
    np.save(os.path.join(d, "rank3_f4.npy"), np.arange(8, dtype="<f4").reshape(2, 1, 4))
    np.save(os.path.join(d, "fortran_f8.npy"), np.asfortranarray(np.arange(6.0).reshape(2, 3)))
    np.save(os.path.join(d, "big_f4.npy"), np.array([1, 2], ">f4"))
    np.save(os.path.join(d, "complex_c8.npy"), np.array([1 + 2j], "<c8"))
    np.save(os.path.join(d, "object.npy"), np.array([{"a": 1}], dtype=object), allow_pickle=True)
    np.save(os.path.join(d, "structured.npy"), np.zeros(2, dtype=[("x", "<f4"), ("y", "<i4")]))
    n = 37
    np.save(os.path.join(d, "features.npy"), (np.arange(n * 5, dtype="<f4") * 0.5).reshape(n, 5))
    np.save(os.path.join(d, "labels.npy"), np.arange(n, dtype="<i8") % 10)
    np.save(os.path.join(d, "labels_short.npy"), np.arange(n - 1, dtype="<i8") % 10)
    np.save(os.path.join(d, "images_u8.npy"), (np.arange(n * 3 * 4 * 5) % 251).astype("|u1").reshape(n, 3, 4, 5))


def add(tar, name, data, mtime=1700000000.5):
    info = tarfile.TarInfo(name)
    info.size = len(data)
    info.mtime = mtime
    info.mode = 0o444
    info.uname = info.gname = "bigdata"
    tar.addfile(info, io.BytesIO(data))


def sample_members(key):
    """The members webdataset's TarWriter would write for sample `key` (sorted extensions)."""
    k = int(key)
    buf = io.BytesIO()
    np.save(buf, (k * 10 + np.arange(4)).astype("<f4"))
    return {
        "bin": bytes((k + j) % 256 for j in range(8)),
        "cls": str(k % 10).encode(),
        "json": json.dumps([k, -k]).encode(),
        "npy": buf.getvalue(),
        "txt": f"sample {k}".encode(),
    }


def tar_fixtures():
    d = os.path.join(OUT, "tar")
    os.makedirs(d, exist_ok=True)
    # Three WebDataset shards of 7 samples each; keys sNNNN (shard s, sample i) as 6 digits.
    for s in range(3):
        with tarfile.open(os.path.join(d, f"wds-{s:06d}.tar"), "w", format=tarfile.PAX_FORMAT) as t:
            if s == 1:  # a directory entry and a metadata file, both skipped by readers
                info = tarfile.TarInfo("subdir")
                info.type = tarfile.DIRTYPE
                info.mtime = 1700000000
                t.addfile(info)
                add(t, "__meta__", b"ignore me")
            for i in range(7):
                key = f"{s * 100 + i:06d}"
                for ext, data in sorted(sample_members(key).items()):
                    add(t, f"{key}.{ext}", data)
    # GNU format with long names ('L') and a long symlink target ('K').
    long_dir = "a_rather_long_directory_name_" * 4
    with tarfile.open(os.path.join(d, "gnu_long.tar"), "w", format=tarfile.GNU_FORMAT) as t:
        for i in range(3):
            key = f"{long_dir}/{i:06d}"
            for ext, data in sorted(sample_members(f"{i:06d}").items()):
                add(t, f"{key}.{ext}", data, mtime=1700000000)
        link = tarfile.TarInfo("link.txt")
        link.type = tarfile.SYMTYPE
        link.linkname = long_dir + "/target.txt"
        t.addfile(link)
    # The USTAR test vector: two samples (.cls + .json), mtime 1700000000, mode 0o444, owner
    # bigdata, uid/gid 0; CPython pads the archive to one 10240-byte record.
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.USTAR_FORMAT) as t:
        for key, cls, js in [("000000", b"3", b'{"a":1}'), ("000001", b"7", b'{"a":2}')]:
            for ext, data in [("cls", cls), ("json", js)]:
                info = tarfile.TarInfo(f"{key}.{ext}")
                info.size, info.mtime, info.mode = len(data), 1700000000, 0o444
                info.uid = info.gid = 0
                info.uname = info.gname = "bigdata"
                t.addfile(info, io.BytesIO(data))
    vector = buf.getvalue()
    digest = hashlib.sha256(vector).hexdigest()
    assert digest == "b02790f90819454108a1ee32797d363e39d5d8a9ba03fb8f0a0fe2fb6f95df76", digest
    with open(os.path.join(d, "ustar_vector.tar"), "wb") as f:
        f.write(vector)
    # A shard whose second sample lacks its .cls member.
    with tarfile.open(os.path.join(d, "missing_member.tar"), "w", format=tarfile.PAX_FORMAT) as t:
        for i in range(3):
            key = f"{i:06d}"
            for ext, data in sorted(sample_members(key).items()):
                if not (i == 1 and ext == "cls"):
                    add(t, f"{key}.{ext}", data)


def token_fixtures():
    d = os.path.join(OUT, "tokens")
    os.makedirs(d, exist_ok=True)
    write_shard(os.path.join(d, "tok_000000.bin"), [(i * 7) % 50257 for i in range(1000)])
    write_shard(os.path.join(d, "tok_000001.bin"), [(i * 13 + 5) % 50257 for i in range(517)])
    write_shard(os.path.join(d, "tok_llama.bin"), [70000 + i for i in range(300)], model="llama-3")


if __name__ == "__main__":
    npy_fixtures()
    tar_fixtures()
    token_fixtures()
    print("fixtures written to", OUT)
