# SPDX-License-Identifier: MIT
"""bench/monitor_overhead driver: the per-step cost of trainkit's full monitor on a ~1 ms CPU step.

Two measurements, sampled alternately in one worker process:
  direct: `monitor_only` runs the monitor's per-step calls (5 spans, begin/end step, loss to
          TensorBoard, a summary every 50 steps, progress) with no work in between; its time per
          step divided by the bare step time is the overhead fraction. Precise (microseconds).
  A/B:    `monitored` vs `bare` over the same 1 ms steps: confirms the direct figure, but on this
          noisy shared machine it is only good to about +-1%.
Ratio printed: budget / overhead, with budget = 1% of the step (the monitor's cost target); > 1 =
within budget."""
import harness as h

ROUNDS, WARMUP = 15, 2

with h.Worker("trainkit", [h.binary("monitor_overhead")]) as tk:
    steps = int(tk.info["steps"])
    monitor_steps = int(tk.info["monitor_steps"])
    print(f"monitor_overhead: {steps} steps of ~1 ms per sample (calibrated "
          f"{tk.info['iters_per_ms']} iterations/ms), {monitor_steps} monitor-only steps, "
          f"{h.machine()}")
    samples = h.alternate([("bare 1 ms steps", tk, "bare"),
                           ("monitored 1 ms steps", tk, "monitored"),
                           ("monitor calls only", tk, "monitor_only")],
                          rounds=ROUNDS, warmup=WARMUP)

med = h.print_table([(label, secs, None) for label, secs in samples.items()])
bare_step = med["bare 1 ms steps"] / steps
mon_step = med["monitored 1 ms steps"] / steps
direct = med["monitor calls only"] / monitor_steps
overhead = direct / bare_step
ab = mon_step / bare_step - 1.0
print(f"  bare step {bare_step * 1e3:.3f} ms; monitor {direct * 1e6:.3f} us/step = "
      f"{100 * overhead:.4f}% of the step; A/B interleaved medians: {100 * ab:+.2f}% "
      f"(noise-limited)")
h.result_line("monitor_overhead", 0.01 / max(overhead, 1e-12),
              f"under the 1% budget: full monitor costs {direct * 1e6:.2f} us/step = "
              f"{100 * overhead:.3f}% of a {bare_step * 1e3:.2f} ms CPU step "
              f"(A/B {100 * ab:+.2f}%)")
