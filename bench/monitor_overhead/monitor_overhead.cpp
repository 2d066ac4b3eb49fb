// SPDX-License-Identifier: MIT
// bench/monitor_overhead worker: a calibrated ~1 ms CPU "training step" (data 5%, forward 30%,
// backward 55%, optimizer 10%), run bare or under the full trainkit::monitor::Monitor (phase spans,
// loss to TensorBoard every step, a summary every 50 steps to console/TensorBoard/JSON lines,
// progress lines, Chrome trace ring). Cases (see bench/common/bench.hpp for the protocol):
//   bare          STEPS steps without the monitor
//   monitored     STEPS steps with it
//   monitor_only  MONITOR_STEPS steps of monitor calls with no work: the direct per-step cost
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <filesystem>
#include <string>

#include <trainkit/monitor/monitor.hpp>

#include "bench.hpp"

namespace mon = trainkit::monitor;
using mon::Phase;

namespace {
volatile double g_sink = 0.0;

// A dependent floating-point chain: its time scales linearly with `iters` and it cannot be
// vectorized or removed.
void work(long iters) {
  double x = g_sink + 1.0;
  for (long i = 0; i < iters; ++i) x = x * 0.9999999 + 1e-7;
  g_sink = x;
}

long calibrate_1ms() {
  long iters = 100000;
  for (int attempt = 0; attempt < 5; ++attempt) {
    double best = 1e9;
    for (int r = 0; r < 5; ++r) {
      const double t0 = trainkit_bench::now();
      work(iters);
      best = std::min(best, trainkit_bench::now() - t0);
    }
    iters = static_cast<long>(static_cast<double>(iters) * 1e-3 / best);
  }
  return iters;
}
}  // namespace

int main(int argc, char** argv) {
  const long steps = std::stol(trainkit_bench::arg(argc, argv, "steps", "200"));
  const long monitor_steps = std::stol(trainkit_bench::arg(argc, argv, "monitor-steps", "20000"));
  const long iters = calibrate_1ms();
  const long data = iters * 5 / 100, fwd = iters * 30 / 100, bwd = iters * 55 / 100;
  const long opt = iters - data - fwd - bwd;

  const auto dir = std::filesystem::temp_directory_path() /
                   ("trainkit_monitor_overhead_" + std::to_string(::getpid()));
  std::filesystem::create_directories(dir);
  std::FILE* console = std::fopen((dir / "console.log").c_str(), "w");
  if (console == nullptr) return 1;
  int rc = 0;
  {
    // Everything on: the configuration a real run would use.
    mon::Monitor monitor({.total_steps = 1'000'000'000,
                          .log_every = 50,
                          .log_dir = (dir / "tb").string(),
                          .metrics_file = (dir / "metrics.jsonl").string(),
                          .chrome_trace = (dir / "trace.json").string(),
                          .trace_capacity = 50000,
                          .progress = mon::ProgressStyle::kPlain,
                          .console = console,
                          .samples_per_step = 32,
                          .tokens_per_step = 32 * 1024,
                          .flops_per_step = 1e9,
                          .peak_flops = 1e11});
    std::int64_t step = 0;
    auto bare = [&] {
      for (long s = 0; s < steps; ++s) {
        work(data);
        work(fwd);
        work(bwd);
        work(opt);
      }
    };
    auto monitored_step = [&](bool with_work) {
      monitor.begin_step(step);
      {
        auto sp = monitor.span(Phase::kDataWait);
        if (with_work) work(data);
      }
      {
        auto sp = monitor.span(Phase::kForward);
        if (with_work) work(fwd);
      }
      {
        auto sp = monitor.span(Phase::kBackward);
        if (with_work) work(bwd);
      }
      {
        auto sp = monitor.span(Phase::kOptimizer);
        if (with_work) work(opt);
      }
      monitor.end_step({.loss = 2.0 + 1.0 / static_cast<double>(step + 1)});
      ++step;
    };
    auto monitored = [&] {
      for (long s = 0; s < steps; ++s) monitored_step(true);
    };
    auto monitor_only = [&] {
      for (long s = 0; s < monitor_steps; ++s) monitored_step(false);
    };
    rc = trainkit_bench::serve(
        {{"steps", std::to_string(steps)},
         {"monitor_steps", std::to_string(monitor_steps)},
         {"iters_per_ms", std::to_string(iters)}},
        {{"bare", bare}, {"monitored", monitored}, {"monitor_only", monitor_only}});
    monitor.close();
  }
  std::fclose(console);
  std::error_code ec;
  std::filesystem::remove_all(dir, ec);
  return rc;
}
