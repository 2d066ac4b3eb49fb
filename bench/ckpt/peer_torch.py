# SPDX-License-Identifier: MIT
"""Python peers of bench/ckpt: safetensors.torch save_file/load_file and torch.save/torch.load on
the tensors of the file trainkit wrote (so both sides move the same bytes). Saves are followed by
an fsync of the file and its directory, which trainkit always does and neither save_file nor
torch.save does: the durable save is what a checkpoint needs, and unsynced dirty pages would be
flushed during whichever case runs next. Loads use load_file's default mmap backend and its
"pread" backend."""
import argparse
import os

import torch
import safetensors
from safetensors.torch import load_file, save_file

import harness

p = argparse.ArgumentParser()
p.add_argument("--init", required=True)
p.add_argument("--dir", required=True)
args = p.parse_args()

tensors = load_file(args.init)
st_path = os.path.join(args.dir, "st.safetensors")
pt_path = os.path.join(args.dir, "pt.bin")


def fsync_path(path):
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
    dfd = os.open(os.path.dirname(path), os.O_RDONLY)
    try:
        os.fsync(dfd)
    finally:
        os.close(dfd)


def st_save_fsync():
    save_file(tensors, st_path)
    fsync_path(st_path)


def torch_save_fsync():
    torch.save(tensors, pt_path)
    fsync_path(pt_path)


save_file(tensors, st_path)
torch.save(tensors, pt_path)
# The reference writer and trainkit's must have produced the same bytes.
with open(st_path, "rb") as a, open(args.init, "rb") as b:
    identical = a.read() == b.read()

harness.serve({"torch": torch.__version__, "safetensors": safetensors.__version__,
               "identical": "yes" if identical else "NO"},
              {"st_save_fsync": st_save_fsync,
               "st_load": lambda: load_file(st_path),
               "st_load_pread": lambda: load_file(st_path, backend="pread"),
               "torch_save_fsync": torch_save_fsync,
               "torch_load": lambda: torch.load(pt_path, weights_only=True)})
