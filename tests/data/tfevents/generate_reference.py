#!/usr/bin/env python3
# Writes tests/data/tfevents/pytorch_reference.tfevents with PyTorch's SummaryWriter. The C++ test
# (tests/monitor/test_tfevents.cpp, "records are byte-identical to PyTorch SummaryWriter") encodes
# the same inputs and compares every record after the first (whose wall_time is "now") byte by byte.
# Keep the two lists of inputs in sync. Run with a Python that has torch, tensorboard and numpy:
#   .venv-bench/bin/python tests/data/tfevents/generate_reference.py   (from the repository root)
import glob
import os
import shutil
import tempfile

import numpy as np
import torch
import tensorboard
from torch.utils.tensorboard import SummaryWriter
from torch.utils.tensorboard.summary import hparams

HERE = os.path.dirname(os.path.abspath(__file__))
OUT = os.path.join(HERE, "pytorch_reference.tfevents")
WALL = 1700000000.0


def main():
    with tempfile.TemporaryDirectory() as tmp:
        w = SummaryWriter(log_dir=tmp)
        # 1-4: scalars (simple_value, float32)
        w.add_scalar("loss", 0.5, 10, walltime=WALL + 1)
        w.add_scalar("lr", 3e-4, 0, walltime=WALL + 2)
        w.add_scalar("train/accuracy", 0.123456789, 7, walltime=WALL + 3)
        w.add_scalar("grad_norm", -2.75, 123456789012, walltime=WALL + 4)
        # 5-7: histograms with the default 'tensorflow' bins. Values are dyadic so sums are exact.
        w.add_histogram("dense", np.arange(1024, dtype=np.float64) / 64.0 - 8.0, 4,
                        walltime=WALL + 5)
        w.add_histogram("small",
                        torch.tensor([-1.5, -0.25, 0.0, 0.125, 0.5, 0.5, 2.0, 3.75],
                                     dtype=torch.float32), 5, walltime=WALL + 6)
        w.add_histogram("zero", np.zeros(3), 6, walltime=WALL + 7)
        # 8-9: text
        w.add_text("note", "hello **world**", 3, walltime=WALL + 8)
        w.add_text("unicode", "\u00fcn\u00efc\u00f6d\u00e9 \u2713", 0, walltime=WALL + 9)
        # 10-12: hparams, one key each (multi-key maps have no fixed byte order in protobuf)
        exp, ssi, sei = hparams({"lr": 0.001}, {"loss": 0.0})
        for i, s in enumerate((exp, ssi, sei)):
            w.file_writer.add_summary(s, None, WALL + 10 + i)
        # 13-14: a string hyper-parameter
        exp, ssi, _ = hparams({"optimizer": "adamw"}, {"loss": 0.0, "accuracy": 0.0})
        w.file_writer.add_summary(exp, 2, WALL + 13)
        w.file_writer.add_summary(ssi, 2, WALL + 14)
        # 15: a zero scalar at step 0 (simple_value is a oneof member: written even when 0)
        w.add_scalar("zero", 0.0, 0, walltime=WALL + 15)
        w.close()
        files = glob.glob(os.path.join(tmp, "events.out.tfevents.*"))
        assert len(files) == 1, files
        shutil.copyfile(files[0], OUT)
    print(f"wrote {OUT} ({os.path.getsize(OUT)} bytes) with torch {torch.__version__}, "
          f"tensorboard {tensorboard.__version__}, numpy {np.__version__}")


if __name__ == "__main__":
    main()
