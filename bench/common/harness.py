# SPDX-License-Identifier: MIT
"""Python side of trainkit's benchmark harness (stdlib only; imported by bench/<name>/run.py).

Workers are long-lived processes (a C++ binary using bench/common/bench.hpp, or a Python peer
using `serve` below) that set their data up once and then time cases on request. The driver
alternates the cases sample by sample (`alternate`), so trainkit, its peer and the bandwidth
probe all see the same minute of this noisy machine, and reports medians and ratios.

Protocol, one line per message (the C++ twin is trainkit_bench::serve):
  worker -> driver, once:  "ready key=value ..."  then  "cases a,b,c"
  driver -> worker:        "time <case> <reps>"  ->  "ok <seconds> ..."  |  "error <message>"
                           "quit"
"""

import os
import platform
import statistics
import subprocess
import sys
import time

ROOT = os.environ.get("TRAINKIT_ROOT", os.path.abspath(os.path.join(__file__, "..", "..", "..")))
BIN = os.environ.get("BENCH_BIN", os.path.join(ROOT, "bench", "out"))
PYTHON = os.environ.get("BENCH_PYTHON", sys.executable)


class BenchError(RuntimeError):
    pass


def binary(stem):
    """Path of the executable bench/run built from bench/<name>/<stem>.cpp (or .cu)."""
    return os.path.join(BIN, stem)


def python_peer(script, *args):
    """argv that runs bench/<name>/<script> with the benchmark Python (the one that has torch)."""
    here = os.environ.get("BENCH_DIR", os.getcwd())
    return [PYTHON, os.path.join(here, script), *args]


class Worker:
    """A worker process; `info` holds its ready line (strings), `cases` its case names."""

    def __init__(self, label, argv, env=None):
        self.label = label
        full_env = dict(os.environ)
        full_env.update(env or {})
        full_env["PYTHONPATH"] = os.pathsep.join(
            [os.path.dirname(os.path.abspath(__file__)), full_env.get("PYTHONPATH", "")])
        try:
            self.proc = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                         text=True, bufsize=1, env=full_env)
        except OSError as e:
            raise BenchError(f"{label}: cannot start {argv[0]}: {e}") from e
        ready = self._read()
        if not ready.startswith("ready"):
            raise BenchError(f"{label}: expected 'ready ...', got {ready!r}")
        self.info = dict(kv.split("=", 1) for kv in ready.split()[1:])
        cases = self._read()
        if not cases.startswith("cases "):
            raise BenchError(f"{label}: expected 'cases ...', got {cases!r}")
        self.cases = cases.split()[1].split(",")

    def _read(self):
        line = self.proc.stdout.readline()
        if not line:
            code = self.proc.wait()
            raise BenchError(f"{self.label}: worker exited (status {code}) before answering; "
                             "its stderr is above")
        return line.strip()

    def time(self, case, reps=1):
        """Runs `case` `reps` times back to back; returns the seconds of each repetition."""
        self.proc.stdin.write(f"time {case} {reps}\n")
        self.proc.stdin.flush()
        reply = self._read()
        if not reply.startswith("ok"):
            raise BenchError(f"{self.label}: {reply}")
        return [float(s) for s in reply.split()[1:]]

    def close(self):
        if self.proc.poll() is None:
            try:
                self.proc.stdin.write("quit\n")
                self.proc.stdin.flush()
            except BrokenPipeError:
                pass
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


def serve(info, cases):
    """Worker loop for a Python peer. `info`: dict for the ready line; `cases`: name -> callable
    doing one repetition (it must finish its work before returning, e.g. synchronize a device)."""
    out = sys.stdout
    sys.stdout = sys.stderr  # anything the peer prints must not corrupt the protocol
    # one token per value: spaces (a GPU's name) become underscores
    out.write("ready " + " ".join(f"{k}={str(v).replace(' ', '_')}" for k, v in info.items())
              + "\n")
    out.write("cases " + ",".join(cases) + "\n")
    out.flush()
    for line in sys.stdin:
        parts = line.split()
        if not parts or parts[0] == "quit":
            break
        if parts[0] != "time" or len(parts) != 3 or parts[1] not in cases:
            out.write(f"error bad request {line.strip()!r}\n")
            out.flush()
            continue
        fn, reps = cases[parts[1]], int(parts[2])
        try:
            secs = []
            for _ in range(reps):
                t0 = time.perf_counter()
                fn()
                secs.append(time.perf_counter() - t0)
            out.write("ok " + " ".join(repr(s) for s in secs) + "\n")
        except Exception as e:  # report, keep serving: the driver decides
            out.write(f"error case {parts[1]} raised {type(e).__name__}: {e}\n")
        out.flush()


def alternate(slots, rounds=10, warmup=2):
    """slots: list of (label, worker, case). Warms each slot up, then takes `rounds` samples of
    each, one at a time, rotating the order every round so no slot always follows the same one.
    Returns {label: [seconds, ...]}."""
    for _, worker, case in slots:
        worker.time(case, warmup)
    samples = {label: [] for label, _, _ in slots}
    for r in range(rounds):
        k = r % len(slots)
        for label, worker, case in slots[k:] + slots[:k]:
            samples[label] += worker.time(case, 1)
    return samples


def machine():
    """'<cpu model>, <n> cpus' (from /proc/cpuinfo where there is one), for report headers."""
    model = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo") as f:
            model = next(l.split(":", 1)[1].strip() for l in f if l.startswith("model name"))
    except (OSError, StopIteration):
        pass
    return f"{model}, {os.cpu_count()} cpus"


def median(xs):
    return statistics.median(xs)


def print_table(rows):
    """rows: list of (label, seconds list, bytes moved per repetition or None). Prints median,
    min and max in ms and median GB/s (1e9 bytes/s); returns {label: median seconds}."""
    print(f"  {'case':<34} {'median ms':>10} {'min ms':>9} {'max ms':>9} {'GB/s':>8}")
    medians = {}
    for label, secs, nbytes in rows:
        m = median(secs)
        medians[label] = m
        gbs = f"{nbytes / m / 1e9:8.2f}" if nbytes else f"{'-':>8}"
        print(f"  {label:<34} {m * 1e3:10.3f} {min(secs) * 1e3:9.3f} {max(secs) * 1e3:9.3f} {gbs}")
    return medians


def result_line(name, ratio, what):
    """The contract's last line: `NAME: <ratio>x <what>` (ratio > 1: trainkit is better)."""
    print(f"{name}: {ratio:.2f}x {what}", flush=True)
