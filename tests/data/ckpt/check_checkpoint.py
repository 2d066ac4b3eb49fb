"""Checks a trainkit checkpoint directory from Python (run by tests/ckpt/test_interop.cpp):
the model file loads with safetensors.numpy under the expected names, shapes and values; every
file's trainkit.xxh64 checksum and the manifest agree (pure-Python XXH64); the training state's
metadata holds the step; and, when torch is importable, safetensors.torch.load_file +
model.load_state_dict(strict=True) work on the equivalent torch module and reproduce the
output trainkit computed.

    python check_checkpoint.py CHECKPOINT_DIR EXPECTED_JSON

Exit codes: 0 ok, 1 a check failed, 77 numpy or safetensors are not installed (test skipped).
"""
import json
import os
import sys

try:
    import numpy as np
    from safetensors.numpy import load_file
except ImportError as e:  # pragma: no cover
    print("skipping: %s" % e)
    sys.exit(77)

M64 = (1 << 64) - 1
P1, P2, P3, P4, P5 = (0x9E3779B185EBCA87, 0xC2B2AE3D27D4EB4F, 0x165667B19E3779F9,
                      0x85EBCA77C2B2AE63, 0x27D4EB2F165667C5)


def rotl(x, r):
    return ((x << r) | (x >> (64 - r))) & M64


def rnd(acc, v):
    return (rotl((acc + v * P2) & M64, 31) * P1) & M64


def xxh64(data, seed=0):
    """XXH64 in pure Python (the reference algorithm); fine for small test files."""
    n = len(data)
    i = 0
    if n >= 32:
        v = [(seed + P1 + P2) & M64, (seed + P2) & M64, seed, (seed - P1) & M64]
        w = np.frombuffer(data, dtype="<u8", count=(n // 32) * 4).tolist()
        for k in range(0, len(w), 4):
            v = [rnd(v[j], w[k + j]) for j in range(4)]
        i = (n // 32) * 32
        h = (rotl(v[0], 1) + rotl(v[1], 7) + rotl(v[2], 12) + rotl(v[3], 18)) & M64
        for x in v:
            h = ((h ^ rnd(0, x)) * P1 + P4) & M64
    else:
        h = (seed + P5) & M64
    h = (h + n) & M64
    while i + 8 <= n:
        h ^= rnd(0, int.from_bytes(data[i:i + 8], "little"))
        h = (rotl(h, 27) * P1 + P4) & M64
        i += 8
    if i + 4 <= n:
        h ^= (int.from_bytes(data[i:i + 4], "little") * P1) & M64
        h = (rotl(h, 23) * P2 + P3) & M64
        i += 4
    while i < n:
        h ^= (data[i] * P5) & M64
        h = (rotl(h, 11) * P1) & M64
        i += 1
    h ^= h >> 33
    h = (h * P2) & M64
    h ^= h >> 29
    h = (h * P3) & M64
    h ^= h >> 32
    return h


def embedded_checksum_ok(path):
    data = bytearray(open(path, "rb").read())
    key = b'"trainkit.xxh64":"'
    n = int.from_bytes(data[:8], "little")
    at = data.find(key, 8, 8 + n)
    assert at >= 0, "%s has no trainkit checksum" % path
    at += len(key)
    stored = int(data[at:at + 16].decode(), 16)
    data[at:at + 16] = b"0" * 16
    return xxh64(bytes(data)) == stored, stored


def main():
    ckpt_dir, expected_path = sys.argv[1], sys.argv[2]
    expected = json.load(open(expected_path))
    failures = []

    def check(cond, what):
        if not cond:
            failures.append(what)

    manifest = json.load(open(os.path.join(ckpt_dir, "checkpoint.json")))
    check(manifest["format"] == "trainkit.checkpoint", "manifest format")
    check(manifest["step"] == expected["step"], "manifest step")
    for name, entry in manifest["files"].items():
        path = os.path.join(ckpt_dir, name)
        check(os.path.getsize(path) == entry["bytes"], "size of " + name)
        if name.endswith(".safetensors"):
            ok, stored = embedded_checksum_ok(path)
            check(ok, "checksum of " + name)
            check("%016x" % stored == entry["xxh64"], "manifest checksum of " + name)

    model = load_file(os.path.join(ckpt_dir, manifest["model"]))
    check(sorted(model) == sorted(expected["params"]), "names %s" % sorted(model))
    for name, spec in expected["params"].items():
        t = model.get(name)
        if t is None:
            continue
        check(t.dtype == np.float32, name + " dtype")
        check(list(t.shape) == spec["shape"], name + " shape %s" % (t.shape,))
        want = np.array(spec["values"], dtype=np.float32).reshape(spec["shape"])
        check(np.array_equal(t, want), name + " values")

    from safetensors import safe_open
    with safe_open(os.path.join(ckpt_dir, "train_state.safetensors"), "numpy") as f:
        meta = f.metadata()
        check(meta.get("trainer.step") == str(expected["step"]), "trainer.step")
        check("optimizer.0.weight.exp_avg" in f.keys(), "optimizer state tensor names")

    try:
        import torch
        from safetensors.torch import load_file as torch_load
    except ImportError as e:
        print("torch not available (%s): skipping the load_state_dict check" % e)
        torch = None
    if torch is not None:
        net = torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.ReLU(), torch.nn.Linear(4, 2))
        net.load_state_dict(torch_load(os.path.join(ckpt_dir, manifest["model"])), strict=True)
        x = torch.tensor(expected["input"], dtype=torch.float32).reshape(-1, 3)
        with torch.no_grad():
            y = net(x).flatten().tolist()
        check(np.allclose(y, expected["output"], rtol=1e-5, atol=1e-6), "torch output %s" % y)
        print("torch", torch.__version__, "load_state_dict(strict=True): ok")

    if failures:
        print("FAILED:", "; ".join(failures))
        return 1
    print("ok:", len(manifest["files"]), "files")
    return 0


if __name__ == "__main__":
    sys.exit(main())
