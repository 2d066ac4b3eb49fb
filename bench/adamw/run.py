# SPDX-License-Identifier: MIT
"""bench/adamw driver: one AdamW step over 16M and 64M f32 parameters in trainkit (optim::AdamW,
one fused pass on the default Host), torch.optim.AdamW (fused=True on CPU if supported, else
foreach=True; same threads) and two bandwidth probes measured in the same run: a triad-style loop
with AdamW's 28 B/param traffic and the classic STREAM triad (12 B/elt). Samples alternate."""
import os

import harness as h

SIZES = [int(s) for s in os.environ.get("BENCH_ADAMW_SIZES", f"{16 << 20},{64 << 20}").split(",")]
ROUNDS = {16 << 20: 21, 64 << 20: 11}
WARMUP = 2

results = []
for n in SIZES:
    with h.Worker("trainkit", [h.binary("adamw"), f"--n={n}"]) as tk:
        threads = int(tk.info["threads"])
        with h.Worker("torch", h.python_peer("peer_torch.py", f"--n={n}",
                                             f"--threads={threads}")) as pt:
            mode = pt.info["mode"]
            TK, TORCH = "trainkit optim::AdamW", f"torch AdamW({mode}=True)"
            PROBE, TRIAD = "probe: 28 B/param loop", "probe: STREAM triad (12 B)"
            print(f"adamw: n={n} ({n >> 20}M) f32 params, {threads} threads, torch "
                  f"{pt.info['torch']} ({mode}, threads={pt.info['threads']}), {h.machine()}")
            samples = h.alternate([(TK, tk, "trainkit"), (TORCH, pt, "torch"),
                                   (PROBE, tk, "probe28"), (TRIAD, tk, "triad")],
                                  rounds=ROUNDS.get(n, 11), warmup=WARMUP)
    med = h.print_table([(label, secs, (12 if label == TRIAD else 28) * n)
                         for label, secs in samples.items()])
    vs_torch = med[TORCH] / med[TK]
    of_probe = med[PROBE] / med[TK]
    of_triad = (28 * n / med[TK]) / (12 * n / med[TRIAD])
    print(f"  {n >> 20}M: trainkit vs torch {vs_torch:.2f}x, {100 * of_probe:.0f}% of the 28 B/param "
          f"probe, {100 * of_triad:.0f}% of the triad's GB/s")
    results.append((n, vs_torch, of_probe, mode))

worst = min(results, key=lambda r: r[1])
detail = ", ".join(f"{n >> 20}M {r:.2f}x ({100 * b:.0f}% of probe)" for n, r, b, _ in results)
h.result_line("adamw", worst[1],
              f"trainkit AdamW vs torch AdamW({worst[3]}) CPU, lowest of {detail}")
