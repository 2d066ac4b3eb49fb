#!/usr/bin/env python3
# SPDX-License-Identifier: MIT
"""Writes a small classification dataset as .npy files for examples/mlp_classifier.cpp:
{train,val}_x.npy (float32, [N, features]) and {train,val}_y.npy (int32, [N]). Features are
standard normal; the label is the argmax of a fixed random one-hidden-layer ReLU "teacher"
network, so the classes are not linearly separable (with the defaults a linear classifier
reaches about 68% validation accuracy, a small MLP clearly more). Deterministic per --seed.

  python3 examples/data/make_classification.py --out runs/mlp_data
"""
import argparse
import pathlib

import numpy as np


def make(rng, n, w1, w2):
    x = rng.standard_normal((n, w1.shape[0]))
    y = (np.maximum(x @ w1, 0.0) @ w2).argmax(axis=1)
    return x.astype(np.float32), y.astype(np.int32)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default="runs/mlp_data", help="output directory")
    ap.add_argument("--train", type=int, default=8192, help="training samples")
    ap.add_argument("--val", type=int, default=2048, help="validation samples")
    ap.add_argument("--features", type=int, default=32)
    ap.add_argument("--classes", type=int, default=10)
    ap.add_argument("--seed", type=int, default=0, help="seed of the features and hidden layer")
    ap.add_argument("--head-seed", type=int, default=None,
                    help="separate seed for the teacher's output layer: tasks with the same --seed "
                         "share the hidden features (a transfer-learning pair)")
    a = ap.parse_args()
    rng = np.random.default_rng(a.seed)
    w1 = rng.standard_normal((a.features, 2 * a.features))
    w2 = np.random.default_rng(a.head_seed).standard_normal((2 * a.features, a.classes)) \
        if a.head_seed is not None else rng.standard_normal((2 * a.features, a.classes))
    out = pathlib.Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    for split, n in (("train", a.train), ("val", a.val)):
        x, y = make(rng, n, w1, w2)
        np.save(out / f"{split}_x.npy", x)
        np.save(out / f"{split}_y.npy", y)
    print(f"make_classification: {a.train} train / {a.val} val samples, {a.features} features, "
          f"{a.classes} classes in {out}")


if __name__ == "__main__":
    main()
