# SPDX-License-Identifier: MIT
"""bench/gpt_block_step driver: forward+backward of one GPT-2 block (d=256, 4 heads, T=128, B=8,
f32), trainkit nn::TransformerBlock vs nanoGPT's Block in torch eager (SDPA attention), on CPU at 1
and 2 threads, sampled alternately in one run. Checks first that both compute the same step
(norms of y, dx and the parameter gradients agree on shared weights and inputs)."""
import os

import harness as h

ROUNDS, WARMUP = 15, 3
dump = os.path.join(h.BIN, "gpt_block_state.bin")
workers = {}
try:
    for t in (1, 2):
        workers[("tk", t)] = h.Worker(f"trainkit {t}t", [h.binary("gpt_block_step"),
                                                          f"--threads={t}", f"--dump={dump}"])
        workers[("pt", t)] = h.Worker(f"torch {t}t", h.python_peer(
            "peer_torch.py", f"--threads={t}", f"--dump={dump}"))
    for t in (1, 2):
        tk, pt = workers[("tk", t)], workers[("pt", t)]
        for key in ("y_norm", "dx_norm", "grad_norm"):
            a, b = float(tk.info[key]), float(pt.info[key])
            if abs(a - b) > 1e-4 * max(abs(b), 1e-12):
                raise SystemExit(f"gpt_block_step: trainkit and torch disagree on {key}: {a} vs {b}")
    pt1 = workers[("pt", 1)]
    print(f"gpt_block_step: GPT-2 block d=256 h=4 T=128 B=8, f32; |dx| {pt1.info['dx_norm']} "
          f"(both); torch {pt1.info['torch']}; {h.machine()}")
    slots = []
    for t in (1, 2):
        slots.append((f"trainkit {t} thread(s)", workers[("tk", t)], "step"))
        slots.append((f"torch {t} thread(s)", workers[("pt", t)], "step"))
    samples = h.alternate(slots, rounds=ROUNDS, warmup=WARMUP)
finally:
    for w in workers.values():
        w.close()

med = h.print_table([(k, v, None) for k, v in samples.items()])
ratios = {}
for t in (1, 2):
    ratios[t] = med[f"torch {t} thread(s)"] / med[f"trainkit {t} thread(s)"]
    print(f"  {t} thread(s): ratio {ratios[t]:.2f}x (torch time / trainkit time)")
worst = min(ratios.values())
h.result_line("gpt_block_step", worst, f"trainkit vs torch GPT-2 block fwd+bwd (worse of 1 thread "
              f"{ratios[1]:.2f}x and 2 threads {ratios[2]:.2f}x; goal >= 1.5x)")
