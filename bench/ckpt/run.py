# SPDX-License-Identifier: MIT
"""bench/ckpt driver: save and load ~1 GiB of f32 + bf16 tensors with trainkit
(io::save_safetensors, crash-safe with fsync; SafetensorsFile over mmap; io::load_safetensors
with pread), Python safetensors (save_file followed by an fsync; load_file with its mmap and pread
backends) and torch.save (followed by an fsync)/torch.load, plus `dd conv=fsync` copying the same bytes as the disk's
bandwidth (into a new file renamed over the old one, as any crash-safe save must, and in place),
sampled alternately in one run. BENCH_CKPT_EXTRA=1 adds dd in place and a read of every mapped
byte; BENCH_CKPT_MIB (default 1024) and BENCH_CKPT_ROUNDS (default 3) size the run. Files live in
bench/out/ckpt/data (removed at the end). Loads read from the page cache (the file was just
written), as a resume right after a save would, into freshly allocated memory."""
import os
import random
import shutil
import signal
import sys
import time

import harness as h

MIB = int(os.environ.get("BENCH_CKPT_MIB", 1024))
ROUNDS = int(os.environ.get("BENCH_CKPT_ROUNDS", 3))
BUDGET = float(os.environ.get("BENCH_CKPT_BUDGET_S", 75))  # stop adding rounds after this
EXTRA = os.environ.get("BENCH_CKPT_EXTRA", "0") == "1"  # also dd in place, mmap + read all
DATA = os.path.join(h.BIN, "data")
# Every load allocates fresh memory on both sides, as a process resuming from a checkpoint does.
# Without this glibc's dynamic mmap threshold lets the long-lived Python peer recycle the
# already-faulted pages of its previous load, and the comparison measures allocator state.
os.environ.setdefault("MALLOC_MMAP_THRESHOLD_", str(1 << 20))

# bench/run's timeout sends SIGTERM: turn it into an exception so the data folder is removed.
signal.signal(signal.SIGTERM, lambda *_: sys.exit("ckpt: terminated"))


def alternate(slots):
    """harness.alternate with a time budget and shuffled rounds: one warm-up per slot, then up
    to ROUNDS rounds, fewer (at least one) when this shared machine's disk is slow today. Each
    round runs the slots in a fresh (seeded) random order: a fixed rotation would always put the
    same case after the same one, and a write's speed depends on what the previous write left
    (dirty pages, freed blocks)."""
    for _, worker, case in slots:
        worker.time(case, 1)
    samples = {label: [] for label, _, _ in slots}
    start = time.monotonic()
    for r in range(ROUNDS):
        elapsed = time.monotonic() - start
        if r > 0 and elapsed * (r + 1) / r > BUDGET:  # the next round would end past BUDGET
            break
        order = list(slots)
        random.Random(r).shuffle(order)
        for label, worker, case in order:
            samples[label] += worker.time(case, 1)
    return samples


shutil.rmtree(DATA, ignore_errors=True)
os.makedirs(DATA)
try:
    with h.Worker("trainkit", [h.binary("ckpt"), f"--dir={DATA}", f"--mib={MIB}"]) as tk:
        nbytes = int(tk.info["bytes"])
        with h.Worker("python", h.python_peer("peer_torch.py", f"--init={tk.info['init']}",
                                              f"--dir={DATA}")) as py:
            print(f"ckpt: {nbytes / 2**20:.0f} MiB file, {tk.info['tensors']} tensors (f32 + bf16), "
                  f"torch {py.info['torch']}, safetensors {py.info['safetensors']}, "
                  f"{h.machine()}; reference writer gives identical bytes: {py.info['identical']}")
            if py.info["identical"] != "yes":
                raise SystemExit("ckpt: safetensors.save_file and trainkit wrote different bytes")
            slots = [("trainkit save_safetensors (fsync)", tk, "save"),
                     ("dd conv=fsync new file + mv", tk, "dd_new"),
                     ("safetensors save_file + fsync", py, "st_save_fsync"),
                     ("torch.save + fsync", py, "torch_save_fsync"),
                     ("trainkit SafetensorsFile (mmap)", tk, "open"),
                     ("safetensors load_file (mmap)", py, "st_load"),
                     ("trainkit load_safetensors (pread)", tk, "load"),
                     ("safetensors load_file (pread)", py, "st_load_pread"),
                     ("torch.load", py, "torch_load")]
            if EXTRA:
                slots += [("dd conv=fsync in place", tk, "dd_inplace"),
                          ("trainkit mmap + read every byte", tk, "load_mmap")]
            samples = alternate(slots)
finally:
    shutil.rmtree(DATA, ignore_errors=True)

med = h.print_table([(label, secs, nbytes) for label, secs in samples.items()])
save = med["trainkit save_safetensors (fsync)"]
of_dd = med["dd conv=fsync new file + mv"] / save
inplace = f"{100 * med['dd conv=fsync in place'] / save:.0f}%" if EXTRA else "not run"
vs_st_save = med["safetensors save_file + fsync"] / save
vs_st_mmap = med["safetensors load_file (mmap)"] / med["trainkit SafetensorsFile (mmap)"]
vs_st_pread = med["safetensors load_file (pread)"] / med["trainkit load_safetensors (pread)"]
vs_torch_load = med["torch.load"] / med["trainkit load_safetensors (pread)"]
print(f"  save: {100 * of_dd:.0f}% of dd bandwidth writing a new file (goal >= 80%; "
      f"of dd overwriting in place: {inplace}), {vs_st_save:.2f}x safetensors "
      f"save_file + fsync\n  load: {vs_st_mmap:.2f}x load_file (both mmap, lazy), "
      f"{vs_st_pread:.2f}x load_file (both pread copies), {vs_torch_load:.2f}x torch.load "
      f"(goal >= 1)\n  (medians of {len(next(iter(samples.values())))} shuffled rounds; "
      f"> 1: trainkit faster; "
      f"{h.machine()})")
h.result_line("ckpt", min(vs_st_mmap, vs_st_pread),
              f"trainkit load vs safetensors load_file (worse of mmap {vs_st_mmap:.2f}x and pread "
              f"{vs_st_pread:.2f}x); save at {100 * of_dd:.0f}% of dd conv=fsync")
