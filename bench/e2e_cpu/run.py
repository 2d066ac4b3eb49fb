# SPDX-License-Identifier: MIT
"""bench/e2e_cpu driver: one training step of examples/train_gpt.cpp's default model and recipe
(nn::Gpt 4 x 128, 4 heads, context 64, batch 16, bytes; cross-entropy, backward, clipping, AdamW,
warmup + cosine) in trainkit vs the same model in PyTorch eager (and torch.compile where it
works), on the CPU at 1 and 2 threads, sampled alternately in one run.

trainkit is measured in two builds: bench/run's (-O3 -march=native) and the README's plain
`g++ -std=c++20 -O2` (built here, into the out folder); the README build's ratio is the one a
user gets. All workers start from the weights the first trainkit worker writes (safetensors,
loaded by PyTorch with strict=True) and train on the same windows of a byte corpus (the files
under /usr/share/common-licenses, as train_gpt reads by default; seeded random bytes where that
is missing), so their first loss curves must agree: the driver writes them to
bench/out/e2e_cpu/loss_curves.csv (and a PNG when matplotlib is importable) and stops when they
differ by more than 1e-3. Peak RSS is each worker's VmHWM."""
import glob
import os
import shlex
import subprocess
import sys
import threading

import numpy as np

import harness as h

B, T = 16, 64
TOKENS = B * T
WINDOWS, CURVE_STEPS, SEED = 20, 20, 1337
ROUNDS, WARMUP = 25, 3
COMPILE_CAP_S = 240  # torch.compile gets this long for its first steps, then it is skipped
CURVE_TOL = 1e-3
ROOT, OUT = h.ROOT, h.BIN
os.makedirs(OUT, exist_ok=True)


def readme_build():
    """The worker built the way the README builds programs: g++ -std=c++20 -O2 (no -march)."""
    src = os.path.join(ROOT, "bench", "e2e_cpu", "e2e_cpu.cpp")
    exe = os.path.join(OUT, "e2e_cpu_readme")
    cxx = shlex.split(os.environ.get("CXX", "g++"))
    cmd = cxx + ["-std=c++20", "-O2", "-I", os.path.join(ROOT, "include"), "-I",
                 os.path.join(ROOT, "bench", "common"), src, "-pthread", "-o", exe]
    stamp = " ".join(cmd)
    inputs = [src] + glob.glob(os.path.join(ROOT, "include", "**", "*.hpp"), recursive=True) + \
        glob.glob(os.path.join(ROOT, "bench", "common", "*"))
    fresh = os.path.exists(exe) and os.path.exists(exe + ".cmd") and \
        open(exe + ".cmd").read() == stamp and \
        all(os.path.getmtime(f) <= os.path.getmtime(exe) for f in inputs)
    if not fresh:
        print(f"e2e_cpu: building the README-build worker: {stamp}", file=sys.stderr, flush=True)
        subprocess.run(cmd, check=True)
        with open(exe + ".cmd", "w") as f:
            f.write(stamp)
    return exe, "g++ -std=c++20 -O2"


def corpus_windows():
    """WINDOWS batches of B windows of T + 1 bytes, drawn with a seeded generator."""
    rng = np.random.default_rng(SEED)
    files = sorted(f for f in glob.glob("/usr/share/common-licenses/**", recursive=True)
                   if os.path.isfile(f) and not os.path.islink(f))
    text = b"".join(open(f, "rb").read() for f in files)
    if len(text) < 100 * (T + 1):
        return rng.integers(0, 256, size=(WINDOWS, B, T + 1), dtype=np.uint8), "random bytes"
    data = np.frombuffer(text, dtype=np.uint8)
    starts = rng.integers(0, len(data) - T - 1, size=(WINDOWS, B))
    windows = np.stack([np.stack([data[s:s + T + 1] for s in row]) for row in starts])
    return windows, f"{len(files)} files of /usr/share/common-licenses ({len(text)} bytes)"


def read_curve(path):
    with open(path) as f:
        return [float(line.split(",")[1]) for line in f if line.strip()]


def vmhwm_mib(worker):
    with open(f"/proc/{worker.proc.pid}/status") as f:
        for line in f:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024.0
    return float("nan")


class CpuMetered:
    """A worker whose time() also sums the CPU time (user + system, all its threads, from
    /proc/<pid>/stat) the requested repetitions took: at 1 thread the CPU time per step hardly
    moves with other work on the machine, where the wall time does."""

    def __init__(self, worker):
        self.worker, self.cpu_s, self.reps = worker, 0.0, 0

    def _cpu(self):
        with open(f"/proc/{self.worker.proc.pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")

    def time(self, case, reps=1):
        c0 = self._cpu()
        secs = self.worker.time(case, reps)
        self.cpu_s += self._cpu() - c0
        self.reps += reps
        return secs


def start_capped(label, argv, env, cap_s):
    """A Worker whose ready line must come within cap_s seconds; (worker, None) or (None, why)."""
    w = h.Worker.__new__(h.Worker)
    box = {}

    def init():
        try:
            h.Worker.__init__(w, label, argv, env)
        except Exception as e:  # reported below
            box["error"] = e

    th = threading.Thread(target=init, daemon=True)
    th.start()
    th.join(cap_s)
    if th.is_alive():
        if getattr(w, "proc", None) is not None:
            w.proc.kill()
            w.proc.wait()
        th.join(10)
        return None, f"no ready line within {cap_s} s (compile time cap)"
    if "error" in box:
        return None, str(box["error"])
    return w, None


def load():
    with open("/proc/loadavg") as f:
        return " ".join(f.read().split()[:3])


readme_exe, readme_flags = readme_build()
batches, source = corpus_windows()
batches_path = os.path.join(OUT, "batches.bin")
batches.tofile(batches_path)
init_path = os.path.join(OUT, "init.safetensors")
curve_dir = os.path.join(OUT, "curves")
os.makedirs(curve_dir, exist_ok=True)
load_start = load()

builds = {"O3": (h.binary("e2e_cpu"), "-O3 -march=native"), "readme": (readme_exe, readme_flags)}
workers, curves, skipped = {}, {}, {}
try:
    first = True
    for t in (1, 2):
        for b, (exe, _) in builds.items():
            curve = os.path.join(curve_dir, f"trainkit_{b}_{t}t.csv")
            argv = [exe, f"--batches={batches_path}", f"--curve={curve}",
                    f"--curve-steps={CURVE_STEPS}"] + ([f"--init={init_path}"] if first else [])
            first = False
            workers[(b, t)] = h.Worker(f"trainkit {b} {t}t", argv,
                                       env={"TRAINKIT_NUM_THREADS": str(t)})
            curves[(b, t)] = read_curve(curve)
        curve = os.path.join(curve_dir, f"torch_eager_{t}t.csv")
        workers[("eager", t)] = h.Worker(f"torch {t}t", h.python_peer(
            "peer_torch.py", f"--threads={t}", f"--init={init_path}", f"--batches={batches_path}",
            f"--curve={curve}", f"--curve-steps={CURVE_STEPS}"))
        curves[("eager", t)] = read_curve(curve)
    for t in (1, 2):
        if "compile" in skipped:
            break
        curve = os.path.join(curve_dir, f"torch_compile_{t}t.csv")
        w, why = start_capped(f"torch.compile {t}t", h.python_peer(
            "peer_torch.py", f"--threads={t}", f"--init={init_path}", f"--batches={batches_path}",
            f"--curve={curve}", f"--curve-steps={CURVE_STEPS}", "--compile"),
            {"TORCHINDUCTOR_COMPILE_THREADS": "1"}, COMPILE_CAP_S)
        if w is None:
            skipped["compile"] = why
            break
        workers[("compile", t)] = w
        curves[("compile", t)] = read_curve(curve)

    # Same math: every curve against torch eager's (1 thread).
    ref = curves[("eager", 1)]
    diffs = {k: max(abs(a - b) for a, b in zip(c, ref)) for k, c in curves.items()}
    same_threads = all(curves[(b, 1)] == curves[(b, 2)] for b in builds)
    same_builds = curves[("O3", 1)] == curves[("readme", 1)]
    typical = sorted(abs(a - b) for a, b in zip(curves[("readme", 1)], ref))[CURVE_STEPS // 2]
    tk0, pt0 = workers[("readme", 1)], workers[("eager", 1)]
    print(f"e2e_cpu: train_gpt's model (nn::Gpt 4 layers x 128, 4 heads, T={T}, B={B}, V=256, "
          f"{tk0.info['params']} parameters) and recipe, f32; torch {pt0.info['torch']} "
          f"(attention: F.scaled_dot_product_attention, GELU approximate='tanh'); gemm kernel "
          f"{tk0.info['gemm']}; {h.machine()}; load average at start {load_start}")
    print(f"  data: {WINDOWS} batches from {source}, seed {SEED}")
    print(f"  loss curves of the first {CURVE_STEPS} steps from the same weights: "
          f"{ref[0]:.5f} -> {ref[-1]:.5f} (torch eager); max |trainkit - torch eager| "
          + ", ".join(f"{b} {t}t {diffs[(b, t)]:.2e}" for b in builds for t in (1, 2))
          + f" (median over the steps, README build: {typical:.1e})"
          + "; trainkit curves " + ("the same bits" if same_threads else "DIFFERENT")
          + " at 1 and 2 threads in each build, " + ("the same" if same_builds else "not the same")
          + " bits in the two builds"
          + "".join(f"; torch.compile {t}t {diffs[('compile', t)]:.2e}" for t in (1, 2)
                    if ("compile", t) in diffs)
          + f"; torch eager 2t vs 1t {diffs[('eager', 2)]:.2e} (the spread of f32 rounding "
          "alone)")
    csv = os.path.join(OUT, "loss_curves.csv")
    keys = sorted(curves, key=lambda k: (k[0], k[1]))
    with open(csv, "w") as f:
        f.write("step," + ",".join(f"{k[0]}_{k[1]}t" for k in keys) + "\n")
        for s in range(CURVE_STEPS):
            f.write(f"{s}," + ",".join(f"{curves[k][s]:.9g}" for k in keys) + "\n")
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
        fig, ax = plt.subplots(figsize=(6, 4))
        ax.plot(curves[("readme", 1)], label="trainkit")
        ax.plot(ref, "--", label="PyTorch eager")
        ax.set_xlabel("step")
        ax.set_ylabel("train loss (nats/byte)")
        ax.legend()
        fig.savefig(os.path.join(OUT, "loss_curves.png"), dpi=100)
        print(f"  curves: {csv} and loss_curves.png")
    except ImportError:
        print(f"  curves: {csv} (no PNG: matplotlib is not importable)")
    bad = {k: d for k, d in diffs.items() if k[0] != "compile" and d > CURVE_TOL}
    if not same_threads:
        raise SystemExit("e2e_cpu: trainkit's loss curve depends on the thread count")
    if bad:
        raise SystemExit(f"e2e_cpu: loss curves differ by more than {CURVE_TOL}: {bad}")
    if "compile" in skipped:
        print(f"  torch.compile skipped: {skipped['compile']}")
    else:
        print(f"  torch.compile: first {CURVE_STEPS} steps (compilation included) took "
              + ", ".join(f"{workers[('compile', t)].info['compile_s']} s at {t}t"
                          for t in (1, 2) if ("compile", t) in workers))

    labels = {"O3": "trainkit -O3 -march=native", "readme": "trainkit g++ -O2 (README)",
              "eager": "torch eager", "compile": "torch.compile"}
    metered = {f"{labels[k[0]]} {k[1]}t": CpuMetered(w) for k, w in workers.items()}
    slots = [(label, metered[label], "step") for label in
             sorted(metered, key=lambda lb: (lb[-2:], lb))]
    samples = h.alternate(slots, rounds=ROUNDS, warmup=WARMUP)
    cpu_ms = {label: 1e3 * m.cpu_s / m.reps for label, m in metered.items()}
    rss = {f"{labels[k[0]]} {k[1]}t": vmhwm_mib(w) for k, w in workers.items()}
finally:
    for w in workers.values():
        w.close()

load_end = load()
med = h.print_table([(k, v, None) for k, v in samples.items()])
print(f"  {'case':<34} {'tokens/s':>10} {'peak RSS MiB':>13} {'CPU ms/step':>12}")
for k in samples:
    print(f"  {k:<34} {TOKENS / med[k]:10.0f} {rss[k]:13.1f} {cpu_ms[k]:12.1f}")
print(f"  load average at start {load_start}, at end {load_end}")
if max(float(load_start.split()[0]), float(load_end.split()[0])) > 1.5:
    print(f"  note: other work ran on these {os.cpu_count()} cpus (load > 1.5): 2-thread figures "
          "are contended (a descheduled thread stalls every fork/join), 1-thread ones less so")


def ratio(b, peer, t):
    """trainkit tokens/s over the peer's (= peer time / trainkit time), from the medians."""
    return med[f"{labels[peer]} {t}t"] / med[f"{labels[b]} {t}t"]


def min_ratio(b, peer, t):
    """The same from each case's fastest sample: less sensitive to other work on the machine."""
    return min(samples[f"{labels[peer]} {t}t"]) / min(samples[f"{labels[b]} {t}t"])


for t in (1, 2):
    for b in builds:
        line = (f"  {t} thread(s), {labels[b]}: {ratio(b, 'eager', t):.2f}x torch eager "
                f"(fastest samples: {min_ratio(b, 'eager', t):.2f}x)")
        if f"{labels['compile']} {t}t" in med:
            line += (f", {ratio(b, 'compile', t):.2f}x torch.compile (fastest samples: "
                     f"{min_ratio(b, 'compile', t):.2f}x)")
        print(line)
for b in builds:
    print(f"  1 thread, CPU time per step (steadier under load): {labels[b]} "
          f"{cpu_ms[labels[b] + ' 1t']:.1f} ms vs torch eager {cpu_ms['torch eager 1t']:.1f} ms: "
          f"{cpu_ms['torch eager 1t'] / cpu_ms[labels[b] + ' 1t']:.2f}x")
if "compile" in skipped:
    print(f"  torch.compile ratios: none (skipped: {skipped['compile']})")
print(f"  1-thread eager ratio, README build: {ratio('readme', 'eager', 1):.2f}x; "
      f"-O3 -march=native build: {ratio('O3', 'eager', 1):.2f}x (goal >= 1.5x)")
h.result_line("e2e_cpu", ratio("readme", "eager", 2),
              f"trainkit vs torch eager train_gpt step, 2 threads, README build g++ -O2 "
              f"(-O3 -march=native build: {ratio('O3', 'eager', 2):.2f}x; 1 thread: README "
              f"{ratio('readme', 'eager', 1):.2f}x, -O3 {ratio('O3', 'eager', 1):.2f}x; "
              f"goal >= 1.5x)")
