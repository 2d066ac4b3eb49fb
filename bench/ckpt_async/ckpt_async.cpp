// SPDX-License-Identifier: MIT
// bench/ckpt_async: how long `Checkpointer::save` blocks the training thread in async mode,
// against a synchronous save of the same TrainState. The state is what a trainer registers: a
// ParamArena of ~`--mib` MiB in transformer-like matrices and biases, its AdamW (exp_avg and
// exp_avg_sq: twice the model again) and a warmup + cosine schedule. Both checkpointers are
// durable (fsync of every file and directory) and keep the last two checkpoints.
//
// Each round, in alternating order: one optimizer step (the state changes between saves, as in
// training); the synchronous save, timed whole; the async save, timed until save() returns
// (the snapshot: what training waits for), then its background write is waited for, untimed,
// so the two writes never overlap. Prints the medians and, last, budget / blocked fraction with
// a 5% budget (> 1: within it).
#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <string>
#include <vector>

#include "bench.hpp"
#include "trainkit/ckpt/checkpointer.hpp"
#include "trainkit/exec/host.hpp"
#include "trainkit/nn/param_arena.hpp"
#include "trainkit/optim/adamw.hpp"
#include "trainkit/optim/lr_schedule.hpp"

namespace tk = trainkit;
namespace tb = trainkit_bench;

namespace {

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0.0 : v[v.size() / 2];
}

std::string loadavg() {
  std::ifstream f("/proc/loadavg");
  std::string one;
  f >> one;
  return one.empty() ? "?" : one;
}

}  // namespace

int main(int argc, char** argv) {
  const char* bin = std::getenv("BENCH_BIN");
  const std::filesystem::path dir =
      tb::arg(argc, argv, "dir", (bin ? std::string(bin) : std::string(".")) + "/data");
  const long mib = std::stol(tb::arg(argc, argv, "mib", "128"));
  const int rounds = std::stoi(tb::arg(argc, argv, "rounds", "7"));
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);

  // Layers of a 1024-wide MLP: 1024x1024 weights (4 MiB) and 1024 biases, until ~mib MiB.
  tk::nn::ParamArena<> arena;
  const long layers = std::max(1L, mib / 4);
  for (long i = 0; i < layers; ++i) {
    const std::string p = "layers." + std::to_string(i) + ".";
    arena.add(p + "weight", tk::Shape{1024, 1024}, tk::nn::Init::normal(0.0f, 0.02f));
    arena.add(p + "bias", tk::Shape{1024}, tk::nn::Init::zeros());
  }
  arena.finalize();
  arena.initialize(1234);
  tk::exec::Host host;
  tk::optim::AdamW opt(arena, {.lr = 1e-3, .weight_decay = 0.1});
  auto schedule =
      tk::optim::warmup_cosine(opt.lr_groups(), {.warmup_steps = 100, .total_steps = 10000});
  std::uint32_t seed = 7;
  const auto train_step = [&] {
    float* g = arena.grads_data();
    for (std::int64_t i = 0; i < arena.buffer_numel(); i += 97) {
      seed = seed * 1664525u + 1013904223u;
      g[i] = static_cast<float>(seed >> 8) * 0x1p-24f - 0.5f;
    }
    opt.step(host);
    schedule->step();
  };

  tk::ckpt::TrainState state;
  state.model(arena).add("optimizer", opt).add("schedule", *schedule);
  tk::ckpt::Checkpointer sync(dir / "sync", {.keep_last = 2});
  tk::ckpt::Checkpointer async(dir / "async", {.keep_last = 2, .async = true});

  std::vector<double> sync_s, blocked_s, write_s;
  std::uint64_t bytes = 0;
  const auto one_round = [&](int r, bool record) {
    const auto sync_save = [&] {
      train_step();
      ++state.step;
      const double t0 = tb::now();
      sync.save(state);
      if (record) sync_s.push_back(tb::now() - t0);
      bytes = sync.last_stats().bytes;
    };
    const auto async_save = [&] {
      train_step();
      ++state.step;
      const double t0 = tb::now();
      async.save(state);
      const double blocked = tb::now() - t0;
      async.wait();
      if (record) {
        blocked_s.push_back(blocked);
        write_s.push_back(async.last_stats().write_seconds);
      }
    };
    if (r % 2 == 0) {
      sync_save();
      async_save();
    } else {
      async_save();
      sync_save();
    }
  };
  const std::string load_before = loadavg();
  one_round(0, false);  // warm-up: the first snapshot allocates its staging memory
  for (int r = 0; r < rounds; ++r) one_round(r, true);

  const double ms = 1e3, sync_med = median(sync_s), blocked_med = median(blocked_s);
  std::printf(
      "ckpt_async: %ld MiB model (%lld parameters in %zu tensors) + AdamW state, %.0f MiB "
      "per checkpoint, %d rounds, load average %s -> %s\n",
      mib, static_cast<long long>(arena.num_parameters()), arena.infos().size(),
      static_cast<double>(bytes) / (1 << 20), rounds, load_before.c_str(), loadavg().c_str());
  std::printf("  %-40s %10s %9s %9s\n", "case", "median ms", "min ms", "max ms");
  const auto row = [&](const char* label, const std::vector<double>& v) {
    std::printf("  %-40s %10.2f %9.2f %9.2f\n", label, median(v) * ms,
                *std::min_element(v.begin(), v.end()) * ms,
                *std::max_element(v.begin(), v.end()) * ms);
  };
  row("sync save (snapshot + write + fsync)", sync_s);
  row("async save: training blocked", blocked_s);
  row("async save: background write", write_s);
  const double fraction = blocked_med / sync_med;
  std::printf("  blocked %.2f%% of a synchronous save\n", 100 * fraction);
  std::filesystem::remove_all(dir);
  std::printf(
      "ckpt_async: %.2fx under the 5%% budget: an async save blocks training %.1f ms = "
      "%.2f%% of a %.0f ms synchronous save\n",
      0.05 / std::max(fraction, 1e-9), blocked_med * ms, 100 * fraction, sync_med * ms);
  return 0;
}
