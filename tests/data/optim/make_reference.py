#!/usr/bin/env python3
# SPDX-License-Identifier: MIT
"""Generates tests/data/optim/reference.{txt,bin}: PyTorch trajectories for the optim/ tests.

Run from the repository root with a Python that has torch and numpy (CI never runs it; the tests
read the committed output):
    .venv-bench/bin/python tests/data/optim/make_reference.py
Every case starts from the same float32 parameters and feeds the same float32 gradient sequence
(numpy, fixed seed) to a torch.optim optimizer in float32 (the single-tensor implementation,
foreach=False), i.e. what a PyTorch user gets. Parameters are stored after steps 1..10 and every
10th step up to 200; the optimizer state after step 200. LR schedules are run on a 2-group SGD
optimizer and store every group's lr after every step (float64). GradScaler cases inject inf/NaN
gradients at chosen steps and store the scale and growth tracker after every update.

Format: reference.txt has one line per tensor, `<key> <dtype> <offset> <rank> <dims...>`, dtype
f4 / f8 / i8 (little-endian float32 / float64 / int64), offset in bytes into reference.bin.
"""
import math
import os

import numpy as np
import torch

HERE = os.path.dirname(os.path.abspath(__file__))
rng = np.random.default_rng(20241130)
entries = []  # (key, array)

STEPS = 200
SNAPSHOTS = list(range(1, 11)) + list(range(20, STEPS + 1, 10))
# The parameters of a tiny "model": names matter for the group patterns.
SHAPES = [("layer.weight", (7, 5)), ("layer.bias", (5,)), ("ln.weight", (6,)), ("head.weight", (3, 4))]


def put(key, a):
    a = np.ascontiguousarray(a)
    if a.dtype not in (np.float32, np.float64, np.int64):
        raise TypeError(f"{key}: unsupported dtype {a.dtype}")
    entries.append((key, a))


P0 = {n: rng.standard_normal(s).astype(np.float32) for n, s in SHAPES}
GRADS = [{n: (rng.standard_normal(s) * 0.5).astype(np.float32) for n, s in SHAPES}
         for _ in range(STEPS)]
for n, _ in SHAPES:
    put(f"init/{n}", P0[n])
    put(f"grads/{n}", np.stack([g[n] for g in GRADS]))
put("snapshots", np.array(SNAPSHOTS, dtype=np.int64))


def make_params():
    return {n: torch.tensor(P0[n], dtype=torch.float32, requires_grad=True) for n, _ in SHAPES}


def groups(params, no_decay):
    """Default group + a no-weight-decay group for names matching no_decay (like GroupRule)."""
    if not no_decay:
        return [params[n] for n, _ in SHAPES]
    nd = [params[n] for n, _ in SHAPES if no_decay(n)]
    d = [params[n] for n, _ in SHAPES if not no_decay(n)]
    return [{"params": d}, {"params": nd, "weight_decay": 0.0}]


def run_optimizer(case, make_opt, no_decay=None, state_names=()):
    params = make_params()
    opt = make_opt(groups(params, no_decay))
    snaps = {n: [] for n, _ in SHAPES}
    for t in range(1, STEPS + 1):
        for n, _ in SHAPES:
            params[n].grad = torch.tensor(GRADS[t - 1][n])
        opt.step()
        if t in SNAPSHOTS:
            for n, _ in SHAPES:
                snaps[n].append(params[n].detach().numpy().copy())
    for n, _ in SHAPES:
        put(f"{case}/param/{n}", np.stack(snaps[n]))
        st = opt.state[params[n]]
        for s in state_names:
            put(f"{case}/state/{n}.{s}", st[s].detach().numpy().copy())


nd_rule = lambda n: n.endswith(".bias") or "ln" in n  # the tests' GroupRule {"*.bias", "*ln*"}

# ---- SGD, every flag -------------------------------------------------------------------------
SGD = torch.optim.SGD
run_optimizer("sgd_plain", lambda g: SGD(g, lr=0.1, foreach=False))
run_optimizer("sgd_momentum", lambda g: SGD(g, lr=0.05, momentum=0.9, foreach=False),
              state_names=["momentum_buffer"])
run_optimizer("sgd_dampening_wd",
              lambda g: SGD(g, lr=0.05, momentum=0.8, dampening=0.3, weight_decay=0.01,
                            foreach=False), state_names=["momentum_buffer"])
run_optimizer("sgd_nesterov_wd_groups",
              lambda g: SGD(g, lr=0.03, momentum=0.9, nesterov=True, weight_decay=0.05,
                            foreach=False), no_decay=nd_rule, state_names=["momentum_buffer"])

# ---- AdamW ------------------------------------------------------------------------------------
AdamW = torch.optim.AdamW
run_optimizer("adamw_default", lambda g: AdamW(g, lr=1e-3, foreach=False),
              state_names=["exp_avg", "exp_avg_sq"])
run_optimizer("adamw_amsgrad", lambda g: AdamW(g, lr=1e-2, amsgrad=True, foreach=False),
              state_names=["exp_avg", "exp_avg_sq", "max_exp_avg_sq"])
run_optimizer("adamw_groups",
              lambda g: AdamW(g, lr=3e-3, betas=(0.8, 0.99), eps=1e-6, weight_decay=0.1,
                              foreach=False), no_decay=nd_rule,
              state_names=["exp_avg", "exp_avg_sq"])
run_optimizer("adamw_beta1_small", lambda g: AdamW(g, lr=1e-2, betas=(0.3, 0.9), weight_decay=0.02,
                                                   foreach=False),
              state_names=["exp_avg", "exp_avg_sq"])

# ---- GradScaler (+ AdamW / SGD, + clipping) ---------------------------------------------------
INF_STEPS = {4: math.inf, 5: -math.inf, 17: math.nan, 60: math.inf, 61: math.nan, 62: math.inf,
             150: math.nan}


def run_scaled(case, make_opt, growth_interval, clip=None, state_names=()):
    params = make_params()
    opt = make_opt([params[n] for n, _ in SHAPES])
    scaler = torch.amp.GradScaler("cpu", init_scale=2.0 ** 16, growth_interval=growth_interval)
    snaps = {n: [] for n, _ in SHAPES}
    scales, trackers, skipped = [], [], []
    for t in range(1, STEPS + 1):
        scaler.scale(torch.ones(()))  # creates the scale tensor, as scaling the loss does
        s = scaler.get_scale()
        for n, _ in SHAPES:
            g = GRADS[t - 1][n] * np.float32(s)  # what backward of the scaled loss produces (f32)
            g = g.astype(np.float32)
            if t in INF_STEPS and n == "layer.bias":
                g[1] = INF_STEPS[t]
            params[n].grad = torch.tensor(g)
        if clip is not None:
            scaler.unscale_(opt)
            torch.nn.utils.clip_grad_norm_([params[n] for n, _ in SHAPES], clip)
        before = [params[n].detach().clone() for n, _ in SHAPES]
        scaler.step(opt)
        skipped.append(int(all(torch.equal(b, params[n]) for b, (n, _) in zip(before, SHAPES))))
        scaler.update()
        sd = scaler.state_dict()
        scales.append(sd["scale"])
        trackers.append(sd["_growth_tracker"])
        if t in SNAPSHOTS:
            for n, _ in SHAPES:
                snaps[n].append(params[n].detach().numpy().copy())
    for n, _ in SHAPES:
        put(f"{case}/param/{n}", np.stack(snaps[n]))
        st = opt.state[params[n]]
        for sn in state_names:
            put(f"{case}/state/{n}.{sn}", st[sn].detach().numpy().copy())
    put(f"{case}/scale", np.array(scales, dtype=np.float64))
    put(f"{case}/growth_tracker", np.array(trackers, dtype=np.int64))
    put(f"{case}/skipped", np.array(skipped, dtype=np.int64))
    put(f"{case}/inf_steps", np.array(sorted(INF_STEPS), dtype=np.int64))


run_scaled("scaler_adamw", lambda g: AdamW(g, lr=1e-3, weight_decay=0.05, foreach=False),
           growth_interval=5, state_names=["exp_avg", "exp_avg_sq"])
run_scaled("scaler_sgd_clip", lambda g: SGD(g, lr=0.02, momentum=0.9, foreach=False),
           growth_interval=7, clip=1.0, state_names=["momentum_buffer"])
run_scaled("scaler_adamw_clip", lambda g: AdamW(g, lr=1e-3, foreach=False), growth_interval=3,
           clip=0.5)

# ---- LR schedules -----------------------------------------------------------------------------
LRS = torch.optim.lr_scheduler
BASE_LRS = [0.1, 0.05]


def lr_case(case, make_sched, metrics=None):
    ps = [torch.zeros(1, requires_grad=True), torch.zeros(1, requires_grad=True)]
    opt = SGD([{"params": [ps[0]], "lr": BASE_LRS[0]}, {"params": [ps[1]], "lr": BASE_LRS[1]}])
    sched = make_sched(opt)
    out = [[g["lr"] for g in opt.param_groups]]  # after construction (step 0)
    for t in range(STEPS):
        opt.step()
        if metrics is None:
            sched.step()
        else:
            sched.step(float(metrics[t]))
        out.append([g["lr"] for g in opt.param_groups])
    put(f"lr/{case}", np.array(out, dtype=np.float64))


import warnings
warnings.filterwarnings("ignore")
lr_case("constant", lambda o: LRS.ConstantLR(o, factor=1.0, total_iters=10))
lr_case("constant_factor", lambda o: LRS.ConstantLR(o, factor=0.5, total_iters=10))
lr_case("linear", lambda o: LRS.LinearLR(o, start_factor=0.1, end_factor=1.0, total_iters=20))
lr_case("linear_decay", lambda o: LRS.LinearLR(o, start_factor=1.0, end_factor=0.05, total_iters=150))
lr_case("cosine", lambda o: LRS.CosineAnnealingLR(o, T_max=50, eta_min=0.001))
lr_case("step", lambda o: LRS.StepLR(o, step_size=30, gamma=0.5))
lr_case("multistep", lambda o: LRS.MultiStepLR(o, milestones=[20, 50, 50, 120], gamma=0.3))
lr_case("exponential", lambda o: LRS.ExponentialLR(o, gamma=0.98))
lr_case("warmup_cosine", lambda o: LRS.SequentialLR(
    o, [LRS.LinearLR(o, start_factor=1e-3, end_factor=1.0, total_iters=10),
        LRS.CosineAnnealingLR(o, T_max=190, eta_min=1e-4)], milestones=[10]))
lr_case("sequential3", lambda o: LRS.SequentialLR(
    o, [LRS.ConstantLR(o, factor=0.25, total_iters=3), LRS.ExponentialLR(o, gamma=0.97),
        LRS.StepLR(o, step_size=25, gamma=0.5)], milestones=[5, 60]))
# A noisy, mostly decreasing metric with plateaus, and a rising one for mode="max".
METRIC = np.concatenate([np.linspace(10, 5, 40), np.full(30, 5.0), np.linspace(5, 4.99, 30),
                         np.linspace(4.99, 3, 50), np.full(50, 3.0)])
METRIC = METRIC + rng.standard_normal(STEPS) * 0.01
put("lr/metric", METRIC.astype(np.float64))
lr_case("plateau_min_rel", lambda o: LRS.ReduceLROnPlateau(
    o, mode="min", factor=0.5, patience=3, threshold=1e-3, threshold_mode="rel", cooldown=2,
    min_lr=0.01), metrics=METRIC)
lr_case("plateau_max_abs", lambda o: LRS.ReduceLROnPlateau(
    o, mode="max", factor=0.7, patience=0, threshold=0.05, threshold_mode="abs", cooldown=0,
    min_lr=[0.02, 0.001], eps=1e-3), metrics=-METRIC)
lr_case("plateau_min_abs", lambda o: LRS.ReduceLROnPlateau(
    o, mode="min", factor=0.1, patience=10, threshold=0.01, threshold_mode="abs", cooldown=5),
    metrics=METRIC)
lr_case("plateau_max_rel", lambda o: LRS.ReduceLROnPlateau(
    o, mode="max", factor=0.5, patience=5, threshold=1e-4, threshold_mode="rel"),
    metrics=-METRIC)

# ---- write ------------------------------------------------------------------------------------
codes = {np.dtype(np.float32): "f4", np.dtype(np.float64): "f8", np.dtype(np.int64): "i8"}
offset = 0
with open(os.path.join(HERE, "reference.bin"), "wb") as blob, \
        open(os.path.join(HERE, "reference.txt"), "w") as index:
    index.write(f"# generated by make_reference.py (torch {torch.__version__}); "
                "key dtype offset rank dims...\n")
    for key, a in entries:
        data = a.astype(a.dtype.newbyteorder("<")).tobytes()
        dims = " ".join(str(d) for d in a.shape)
        index.write(f"{key} {codes[a.dtype]} {offset} {a.ndim} {dims}".rstrip() + "\n")
        blob.write(data)
        offset += len(data)
print(f"wrote {len(entries)} tensors, {offset} bytes")
