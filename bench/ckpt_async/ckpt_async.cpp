// SPDX-License-Identifier: MIT
// bench/ckpt_async: how long a checkpoint save blocks the training thread, for an async
// Checkpointer, against a synchronous save of the same TrainState. The state is what a trainer
// registers: a ParamArena of ~`--mib` MiB (32 layers of a 1024-wide MLP at the default), its
// AdamW (exp_avg and exp_avg_sq: twice the model again) and a warmup + cosine schedule. Every
// checkpointer is durable (fsync of every file and directory) and keeps the last two
// checkpoints.
//
// A training step is the MLP's forward and backward on `--rows` rows (blas::gemm through every
// layer, gradients into the arena), then AdamW. Each round, for each checkpointer in rotating
// order: a step, save(), the next step's forward and backward, then its AdamW step; the
// background write is waited for (untimed) before the next checkpointer's turn, so writes never
// overlap. Timed: save() (sync: the whole durable save; async: until it returns, the snapshot's
// copies for `async`, bookkeeping only for `overlap`), the forward and backward that follow, and
// for `overlap` the wait for the deferred copies before AdamW (what the optimizer step would
// wait; called explicitly as wait_snapshot() so it is timed apart). Blocked = save() + that
// wait. Prints the medians and, last, budget / blocked fraction of the overlapped save (the
// train::Loop's mode) with a 5% budget (> 1: within it).
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
#include "trainkit/blas/gemm.hpp"
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
  const std::int64_t rows = std::stoll(tb::arg(argc, argv, "rows", "32"));
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);

  // Layers of a 1024-wide MLP: 1024x1024 weights (4 MiB) and 1024 biases, until ~mib MiB.
  constexpr std::int64_t W = 1024;
  tk::nn::ParamArena<> arena;
  const long layers = std::max(1L, mib / 4);
  for (long i = 0; i < layers; ++i) {
    const std::string p = "layers." + std::to_string(i) + ".";
    arena.add(p + "weight", tk::Shape{W, W}, tk::nn::Init::normal(0.0f, 0.02f));
    arena.add(p + "bias", tk::Shape{W}, tk::nn::Init::zeros());
  }
  arena.finalize();
  arena.initialize(1234);
  tk::exec::Host host;
  tk::optim::AdamW opt(arena, {.lr = 1e-3, .weight_decay = 0.1});
  auto schedule =
      tk::optim::warmup_cosine(opt.lr_groups(), {.warmup_steps = 100, .total_steps = 10000});

  // Forward x_{l+1} = x_l W_l^T + b_l through every layer (activations kept), then backward:
  // dx_l = dx_{l+1} W_l, dW_l = dx_{l+1}^T x_l, db_l = column sums (the gemm's bias epilogue).
  std::vector<float> acts(std::size_t((layers + 1) * rows * W)), dacts(acts.size());
  for (std::size_t i = 0; i < std::size_t(rows * W); ++i)
    acts[i] = static_cast<float>((i * 2654435761u) % 1000) * 1e-3f - 0.5f;
  const auto mat = [&](float* p) {
    return tk::TensorView<float, 2>(p, tk::Extents<2>{{rows, W}}, tk::Extents<2>{{W, 1}});
  };
  const auto weight = [&](long l, bool grad) {
    const tk::nn::ParamInfo& info = arena.infos()[std::size_t(2 * l)];
    float* base = grad ? arena.grads_data() : arena.params_data();
    return tk::TensorView<float, 2>(base + info.offset, tk::Extents<2>{{W, W}},
                                    tk::Extents<2>{{W, 1}});
  };
  const auto bias = [&](long l, bool grad) {
    const tk::nn::ParamInfo& info = arena.infos()[std::size_t(2 * l + 1)];
    return (grad ? arena.grads_data() : arena.params_data()) + info.offset;
  };
  const auto forward_backward = [&] {
    namespace blas = tk::blas;
    for (long l = 0; l < layers; ++l) {
      blas::GemmOptions<float> o;
      o.epilogue = blas::Epilogue::kBias;
      o.bias = bias(l, false);
      blas::gemm(host, blas::Op::kN, blas::Op::kT, mat(acts.data() + l * rows * W),
                 weight(l, false), mat(acts.data() + (l + 1) * rows * W), o);
    }
    float* dtop = dacts.data() + layers * rows * W;
    for (std::int64_t i = 0; i < rows * W; ++i) dtop[i] = acts[std::size_t(layers * rows * W + i)];
    for (long l = layers - 1; l >= 0; --l) {
      const auto dy = mat(dacts.data() + (l + 1) * rows * W);
      blas::GemmOptions<float> o;
      o.epilogue = blas::Epilogue::kBiasGrad;
      o.bias_grad = bias(l, true);
      blas::gemm(host, blas::Op::kT, blas::Op::kN, dy, mat(acts.data() + l * rows * W),
                 weight(l, true), o);
      blas::gemm(host, blas::Op::kN, blas::Op::kN, dy, weight(l, false),
                 mat(dacts.data() + l * rows * W));
    }
  };
  const auto optimizer_step = [&] {
    opt.step(host);
    schedule->step();
  };

  tk::ckpt::TrainState state;
  state.model(arena).add("optimizer", opt).add("schedule", *schedule);
  tk::ckpt::Checkpointer sync(dir / "sync", {.keep_last = 2});
  tk::ckpt::Checkpointer async(dir / "async", {.keep_last = 2, .async = true});
  tk::ckpt::Checkpointer overlap(dir / "overlap",
                                 {.keep_last = 2, .async = true, .overlap_snapshot = true});

  struct Series {
    std::vector<double> save, fb, wait, blocked, write, copy;
  };
  Series s_sync, s_async, s_overlap;
  std::uint64_t bytes = 0;
  const auto turn = [&](tk::ckpt::Checkpointer& ck, Series& out, bool record) {
    forward_backward();
    optimizer_step();
    ++state.step;
    const double t0 = tb::now();
    ck.save(state);
    const double t1 = tb::now();
    forward_backward();
    const double t2 = tb::now();
    ck.wait_snapshot();
    const double t3 = tb::now();
    optimizer_step();
    ck.wait();
    if (!record) return;
    out.save.push_back(t1 - t0);
    out.fb.push_back(t2 - t1);
    out.wait.push_back(t3 - t2);
    out.blocked.push_back((t1 - t0) + (t3 - t2));
    out.write.push_back(ck.last_stats().write_seconds);
    out.copy.push_back(ck.last_stats().copy_seconds);
    bytes = ck.last_stats().bytes;
  };
  const auto one_round = [&](int r, bool record) {
    tk::ckpt::Checkpointer* cks[] = {&sync, &async, &overlap};
    Series* series[] = {&s_sync, &s_async, &s_overlap};
    for (int i = 0; i < 3; ++i) turn(*cks[(r + i) % 3], *series[(r + i) % 3], record);
  };
  const std::string load_before = loadavg();
  one_round(0, false);  // warm-up: the first snapshots allocate their staging memory
  for (int r = 0; r < rounds; ++r) one_round(r, true);

  const double ms = 1e3;
  std::printf(
      "ckpt_async: %ld MiB model (%lld parameters in %zu tensors) + AdamW state, %.0f MiB "
      "per checkpoint, steps of %lld rows, %d rounds, load average %s -> %s\n",
      mib, static_cast<long long>(arena.num_parameters()), arena.infos().size(),
      static_cast<double>(bytes) / (1 << 20), static_cast<long long>(rows), rounds,
      load_before.c_str(), loadavg().c_str());
  std::printf("  %-52s %10s %9s %9s\n", "case", "median ms", "min ms", "max ms");
  const auto row = [&](const char* label, const std::vector<double>& v) {
    std::printf("  %-52s %10.2f %9.2f %9.2f\n", label, median(v) * ms,
                *std::min_element(v.begin(), v.end()) * ms,
                *std::max_element(v.begin(), v.end()) * ms);
  };
  row("sync save (snapshot + write + fsync)", s_sync.save);
  row("forward + backward after it (nothing in flight)", s_sync.fb);
  row("async: save() (the snapshot's copies)", s_async.save);
  row("async: forward + backward during the write", s_async.fb);
  row("async: background write", s_async.write);
  row("overlap: save()", s_overlap.save);
  row("overlap: forward + backward during copies + write", s_overlap.fb);
  row("overlap: wait for the copies before AdamW", s_overlap.wait);
  row("overlap: blocked (save() + that wait)", s_overlap.blocked);
  row("overlap: the copies, on the writer thread", s_overlap.copy);
  row("overlap: background write", s_overlap.write);
  const double sync_med = median(s_sync.save);
  const double async_fraction = median(s_async.blocked) / sync_med;
  const double fraction = median(s_overlap.blocked) / sync_med;
  std::printf("  async blocked %.2f%%, overlap blocked %.2f%% of a synchronous save\n",
              100 * async_fraction, 100 * fraction);
  std::filesystem::remove_all(dir);
  std::printf(
      "ckpt_async: %.2fx under the 5%% budget: an overlapped async save blocks training %.1f ms "
      "= %.2f%% of a %.0f ms synchronous save\n",
      0.05 / std::max(fraction, 1e-9), median(s_overlap.blocked) * ms, 100 * fraction,
      sync_med * ms);
  return 0;
}
