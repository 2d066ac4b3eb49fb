# SPDX-License-Identifier: MIT
"""bench/ddp_overlap driver: step time of a 2-rank data-parallel MLP (ThreadComm, one compute
thread per rank) with GradBucketer's all-reduces overlapped with backward vs issued after it, and
the communication each exposes (step time minus the step without communication), alternating
samples in one run. The result line is step(no overlap) / step(overlap)."""
import os

import harness as h

ROUNDS, WARMUP = int(os.environ.get("BENCH_DDP_ROUNDS", 12)), 2
args = [f"--layers={os.environ.get('BENCH_DDP_LAYERS', 6)}",
        f"--width={os.environ.get('BENCH_DDP_WIDTH', 1024)}",
        f"--batch={os.environ.get('BENCH_DDP_BATCH', 32)}"]

with h.Worker("trainkit", [h.binary("ddp_overlap"), *args]) as tk:
    print(f"ddp_overlap: 2 ranks (threads), {tk.info['params']} parameters = {tk.info['grad_mib']} "
          f"MiB of f32 gradients, buckets 1 MiB then {tk.info['buckets_mib']} MiB, "
          f"{' '.join(args)}; {h.machine()}")
    samples = h.alternate([("compute only (no all-reduce)", tk, "compute"),
                           ("overlap (mark_ready per layer)", tk, "overlap"),
                           ("no overlap (all-reduce after)", tk, "no_overlap")],
                          rounds=ROUNDS, warmup=WARMUP)

med = h.print_table([(label, secs, None) for label, secs in samples.items()])
compute = med["compute only (no all-reduce)"]
over = med["overlap (mark_ready per layer)"]
after = med["no overlap (all-reduce after)"]
print(f"  exposed communication: overlap {1e3 * (over - compute):.1f} ms, no overlap "
      f"{1e3 * (after - compute):.1f} ms (step minus compute-only step, medians)")
h.result_line("ddp_overlap", after / over,
              f"step time without / with overlap (exposed comm {1e3 * (after - compute):.1f} -> "
              f"{1e3 * (over - compute):.1f} ms, compute {1e3 * compute:.1f} ms)")
