# SPDX-License-Identifier: MIT
"""bench/mlp_step driver: forward+backward(+CE, zero_grad) of an MLP 784-1024-1024-10, batch 256,
f32, trainkit vs torch on CPU at 1 and 2 threads, sampled alternately in one run. Checks first
that both compute the same step (loss and gradient norm agree on shared weights)."""
import os

import harness as h

ROUNDS, WARMUP = 15, 3
dump = os.path.join(h.BIN, "mlp_step_state.bin")
workers = {}
try:
    for t in (1, 2):
        workers[("tk", t)] = h.Worker(f"trainkit {t}t", [h.binary("mlp_step"), f"--threads={t}",
                                                          f"--dump={dump}"])
        workers[("pt", t)] = h.Worker(f"torch {t}t", h.python_peer(
            "peer_torch.py", f"--threads={t}", f"--dump={dump}"))
    for t in (1, 2):
        tk, pt = workers[("tk", t)], workers[("pt", t)]
        for key in ("loss", "grad_norm"):
            a, b = float(tk.info[key]), float(pt.info[key])
            if abs(a - b) > 1e-4 * max(abs(b), 1e-6):
                raise SystemExit(f"mlp_step: trainkit and torch disagree on {key}: {a} vs {b}")
    pt1 = workers[("pt", 1)]
    print(f"mlp_step: MLP 784-1024-1024-10, batch 256, f32; loss {pt1.info['loss']} (both); "
          f"torch {pt1.info['torch']}; {h.machine()}")
    slots = []
    for t in (1, 2):
        slots.append((f"trainkit {t} thread(s)", workers[("tk", t)], "step"))
        slots.append((f"torch {t} thread(s)", workers[("pt", t)], "step"))
    samples = h.alternate(slots, rounds=ROUNDS, warmup=WARMUP)
finally:
    for w in workers.values():
        w.close()

flops = 3 * 2 * 256 * (784 * 1024 + 1024 * 1024 + 1024 * 10) - 2 * 256 * 784 * 1024
med = h.print_table([(k, v, None) for k, v in samples.items()])
ratios = {}
for t in (1, 2):
    tk_s, pt_s = med[f"trainkit {t} thread(s)"], med[f"torch {t} thread(s)"]
    ratios[t] = pt_s / tk_s
    print(f"  {t} thread(s): trainkit {flops / tk_s / 1e9:.1f} GFLOP/s, torch "
          f"{flops / pt_s / 1e9:.1f} GFLOP/s, ratio {ratios[t]:.2f}x")
worst = min(ratios.values())
h.result_line("mlp_step", worst, f"trainkit vs torch MLP fwd+bwd (worse of 1 thread "
              f"{ratios[1]:.2f}x and 2 threads {ratios[2]:.2f}x; goal >= 1.0x)")
