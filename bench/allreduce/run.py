# SPDX-License-Identifier: MIT
"""bench/allreduce driver: all-reduce bandwidth with 2 ranks on this machine, trainkit's ThreadComm
(2 ranks as threads, a pipelined ring over shared memory) vs MPI_Allreduce of Open MPI
(`mpirun -np 2`, shared-memory transport), f32 sum, 1 KiB to 256 MiB per rank, sampled alternately
in one run. algbw = bytes / time and busbw = algbw * 2(n-1)/n (nccl-tests' definitions; n = 2, so
busbw = algbw). The result line is the geometric mean of the busbw ratios from 1 MiB up."""
import math
import os
import shutil
import subprocess
import sys

import harness as h

MIN_BYTES = int(os.environ.get("BENCH_ALLREDUCE_MIN", 1 << 10))
MAX_BYTES = int(os.environ.get("BENCH_ALLREDUCE_MAX", 256 << 20))
TARGET = 32 << 20  # bytes all-reduced per sample (fewer iterations for larger messages)
ROUNDS, WARMUP = int(os.environ.get("BENCH_ALLREDUCE_ROUNDS", 5)), 1
RANKS = 2


def iters_of(nbytes):
    return max(1, min(2000, TARGET // nbytes))


def build_mpi_peer():
    src = os.path.join(os.environ.get("BENCH_DIR", "."), "mpi_peer.cc")
    exe = h.binary("mpi_peer")
    mpicxx = shutil.which("mpicxx")
    if mpicxx is None:
        raise h.BenchError("mpicxx not found: install Open MPI (libopenmpi-dev) for the MPI peer")
    if not os.path.exists(exe) or os.path.getmtime(exe) < os.path.getmtime(src):
        print(f"allreduce: building {exe} with {mpicxx}", file=sys.stderr)
        subprocess.run([mpicxx, "-O3", "-march=native", "-std=c++20", "-o", exe, src], check=True)
    return exe


mpi_env = {
    # Containers run as root; Open MPI refuses that unless told.
    "OMPI_ALLOW_RUN_AS_ROOT": "1", "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM": "1",
    "OMPI_MCA_btl": os.environ.get("OMPI_MCA_btl", "self,vader"),
}
if "OMPI_MCA_btl_vader_single_copy_mechanism" in os.environ:
    mpi_env["OMPI_MCA_btl_vader_single_copy_mechanism"] = os.environ[
        "OMPI_MCA_btl_vader_single_copy_mechanism"]

args = [f"--min-bytes={MIN_BYTES}", f"--max-bytes={MAX_BYTES}", f"--target-bytes={TARGET}"]
mpirun = [shutil.which("mpirun") or "mpirun", "-np", str(RANKS), "--bind-to", "none"]
sizes = []
b = MIN_BYTES
while b <= MAX_BYTES:
    sizes.append(b)
    b *= 4

with h.Worker("trainkit", [h.binary("threadcomm"), *args]) as tk, \
        h.Worker("mpi", [*mpirun, build_mpi_peer(), *args], env=mpi_env) as mp:
    vader = mpi_env.get("OMPI_MCA_btl_vader_single_copy_mechanism", "default (cma)")
    print(f"allreduce: {RANKS} ranks, f32 sum in place, {ROUNDS} alternating rounds of "
          f"{TARGET >> 20} MiB per sample; ThreadComm (threads) vs MPI_Allreduce (Open MPI, "
          f"btl {mpi_env['OMPI_MCA_btl']}, single copy {vader}); {h.machine()}")
    slots = []
    for s in sizes:
        slots.append((f"tc {s}", tk, f"tc_{s}"))
        slots.append((f"mpi {s}", mp, f"mpi_{s}"))
    samples = h.alternate(slots, rounds=ROUNDS, warmup=WARMUP)


def fmt_size(n):
    return f"{n >> 20} MiB" if n >= 1 << 20 else f"{n >> 10} KiB"


factor = 2 * (RANKS - 1) / RANKS
print(f"  {'size':>8} {'ThreadComm us':>14} {'algbw':>7} {'busbw':>7}   {'MPI us':>10} {'algbw':>7} "
      f"{'busbw':>7}   {'ratio':>6}")
ratios = {}
for s in sizes:
    it = iters_of(s)
    t_tc = h.median(samples[f"tc {s}"]) / it
    t_mp = h.median(samples[f"mpi {s}"]) / it
    a_tc, a_mp = s / t_tc / 1e9, s / t_mp / 1e9
    ratios[s] = t_mp / t_tc
    print(f"  {fmt_size(s):>8} {t_tc * 1e6:14.1f} {a_tc:7.2f} {a_tc * factor:7.2f}   {t_mp * 1e6:10.1f} "
          f"{a_mp:7.2f} {a_mp * factor:7.2f}   {ratios[s]:6.2f}x")
print("  (GB/s = 1e9 B/s; medians; ratio = ThreadComm busbw / MPI busbw, > 1: ThreadComm faster)")
big = [r for s, r in ratios.items() if s >= 1 << 20]
geo = math.exp(sum(math.log(r) for r in big) / len(big)) if big else float("nan")
small = [r for s, r in ratios.items() if s < 1 << 20]
small_geo = math.exp(sum(math.log(r) for r in small) / len(small)) if small else float("nan")
small_text = f"; < 1 MiB {small_geo:.2f}x" if small else ""
print(f"  geomean ratio >= 1 MiB: {geo:.2f}x (min {min(big):.2f}x){small_text}")
h.result_line("allreduce", geo, f"ThreadComm vs MPI_Allreduce busbw, 2 ranks, geomean 1-"
              f"{MAX_BYTES >> 20} MiB (min {min(big):.2f}x{small_text})")
