// SPDX-License-Identifier: MIT
// bench/e2e_cpu worker: one training step of examples/train_gpt.cpp's model and recipe with its
// default sizes (nn::Gpt, 4 layers, width 128, 4 heads, context 64, batch 16, byte vocabulary,
// untied head, dropout 0): forward, mean cross-entropy, backward, global-norm clipping to 1.0,
// AdamW (betas 0.9/0.95, weight decay 0.1 except "*.bias" and "*ln_*"), warmup + cosine step.
// Threads: exec::Host() ($TRAINKIT_NUM_THREADS, else every core).
//
// --batches=FILE holds uint8 windows [n, 16, 65] (inputs are the first 64 bytes, targets the
// last 64); step i trains on window i % n. --init=FILE: write the initial weights there
// (safetensors, PyTorch names) before training. --curve=FILE: train --curve-steps steps first and
// write "step,loss" lines there (the schedule is the recipe's for a --curve-steps run: warmup
// curve_steps / 10, cosine to 0.1 lr). Then it serves the case "step" (bench/common/bench.hpp),
// which continues training. --steps=N instead runs N steps after the curve and prints ms/step to
// stderr (for profilers), without serving.
#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

#include "bench.hpp"
#include "trainkit/blas/host_gemm.hpp"
#include "trainkit/ckpt/model.hpp"
#include "trainkit/core/tensor.hpp"
#include "trainkit/exec/host.hpp"
#include "trainkit/nn/cross_entropy.hpp"
#include "trainkit/nn/gpt.hpp"
#include "trainkit/optim/adamw.hpp"
#include "trainkit/optim/lr_schedule.hpp"

namespace tb = trainkit_bench;
namespace tk = trainkit;
namespace nn = trainkit::nn;

int main(int argc, char** argv) try {
  constexpr std::int64_t B = 16, T = 64, V = 256, N = B * T;
  const std::string batches_path = tb::arg(argc, argv, "batches", "");
  const std::string init_path = tb::arg(argc, argv, "init", "");
  const std::string curve_path = tb::arg(argc, argv, "curve", "");
  const std::int64_t curve_steps = std::stoll(tb::arg(argc, argv, "curve-steps", "20"));
  const std::int64_t profile_steps = std::stoll(tb::arg(argc, argv, "steps", "0"));
  const double lr = 3e-3;

  std::ifstream in(batches_path, std::ios::binary);
  const std::vector<unsigned char> raw((std::istreambuf_iterator<char>(in)),
                                       std::istreambuf_iterator<char>());
  const std::int64_t windows = std::int64_t(raw.size()) / (B * (T + 1));
  if (windows < 1 || std::int64_t(raw.size()) != windows * B * (T + 1)) {
    std::fprintf(stderr, "e2e_cpu: --batches=%s is not a whole number of [%lld, %lld] windows\n",
                 batches_path.c_str(), (long long)B, (long long)(T + 1));
    return 2;
  }
  std::vector<std::int32_t> ids(std::size_t(windows * N)), targets(ids.size());
  for (std::int64_t w = 0; w < windows; ++w)
    for (std::int64_t b = 0; b < B; ++b)
      for (std::int64_t t = 0; t < T; ++t) {
        const unsigned char* row = raw.data() + (w * B + b) * (T + 1);
        ids[std::size_t(w * N + b * T + t)] = row[t];
        targets[std::size_t(w * N + b * T + t)] = row[t + 1];
      }

  tk::exec::Host exec;
  nn::ParamArena<> arena;
  nn::Gpt model(arena,
                {.vocab_size = V, .block_size = T, .n_layer = 4, .n_head = 4, .n_embd = 128});
  arena.finalize();
  arena.initialize(1337);
  if (!init_path.empty()) tk::ckpt::save_model(init_path, arena);
  tk::optim::AdamW<> opt(arena, {.lr = lr, .beta1 = 0.9, .beta2 = 0.95, .weight_decay = 0.1},
                         {tk::optim::no_weight_decay({"*.bias", "*ln_*"})});
  const std::int64_t warmup = std::max<std::int64_t>(1, curve_steps / 10);
  auto schedule = tk::optim::warmup_cosine(
      opt.lr_groups(), {.warmup_steps = warmup, .total_steps = curve_steps, .eta_min = 0.1 * lr});

  nn::Gpt<>::Context ctx;
  nn::SoftmaxCrossEntropy<> ce;
  nn::SoftmaxCrossEntropy<>::Context ce_ctx;
  tk::Tensor<float> logits(tk::Shape{N, V}), dlogits(logits.shape());
  std::int64_t step_index = 0;
  float loss = 0.0f;
  auto step = [&] {
    const std::int64_t w = step_index % windows;
    const auto x = tk::make_view(static_cast<const std::int32_t*>(ids.data() + w * N), {B, T});
    const auto y = tk::make_view(static_cast<const std::int32_t*>(targets.data() + w * N), {N});
    arena.zero_grad();
    model.forward(exec, ctx, x, logits.view<2>());
    ce.forward(exec, ce_ctx, logits.view<2>(), y, tk::make_view(&loss, {1}));
    ce.backward(exec, ce_ctx, logits.view<2>(), y, dlogits.view<2>());
    model.backward(exec, ctx, x, dlogits.view<2>());
    opt.step(exec, tk::optim::ClipGradNorm{.max_norm = 1.0});
    schedule->step();
    ++step_index;
  };

  std::vector<float> curve;
  for (std::int64_t s = 0; s < curve_steps; ++s) {
    step();
    curve.push_back(loss);
  }
  if (!curve_path.empty()) {
    std::FILE* f = std::fopen(curve_path.c_str(), "w");
    if (f == nullptr) return 2;
    for (std::size_t s = 0; s < curve.size(); ++s)
      std::fprintf(f, "%zu,%.9g\n", s, double(curve[s]));
    std::fclose(f);
  }
  if (profile_steps > 0) {
    const double t0 = tb::now();
    for (std::int64_t s = 0; s < profile_steps; ++s) step();
    std::fprintf(stderr, "e2e_cpu: %d thread(s): %.2f ms/step over %lld steps\n",
                 exec.num_threads(), 1e3 * (tb::now() - t0) / double(profile_steps),
                 (long long)profile_steps);
    return 0;
  }
  return tb::serve({{"threads", std::to_string(exec.num_threads())},
                    {"params", std::to_string(arena.num_parameters())},
                    {"gemm", tk::blas::detail::gemm_kernel_name()}},
                   {{"step", step}});
} catch (const std::exception& e) {
  std::fprintf(stderr, "e2e_cpu: %s\n", e.what());
  return 1;
}
