// SPDX-License-Identifier: MIT
// bench/mlp_step worker: one training step's forward and backward of an MLP 784-1024-1024-10
// (ReLU, cross-entropy, batch 256, f32) with trainkit's nn::Sequential on exec::Host(--threads).
// It writes its parameters, input and targets to --dump so the torch peer computes the same
// step, and reports the loss in its ready line for the driver to compare.
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <string>
#include <vector>

#include "bench.hpp"
#include "trainkit/exec/host.hpp"
#include "trainkit/nn/activation.hpp"
#include "trainkit/nn/cross_entropy.hpp"
#include "trainkit/nn/linear.hpp"
#include "trainkit/nn/param_arena.hpp"
#include "trainkit/nn/sequential.hpp"

namespace tb = trainkit_bench;
namespace tk = trainkit;
namespace nn = trainkit::nn;

int main(int argc, char** argv) {
  const int threads = std::stoi(tb::arg(argc, argv, "threads", "1"));
  const std::string dump = tb::arg(argc, argv, "dump", "");
  const std::int64_t batch = 256, in = 784, hidden = 1024, classes = 10;
  tk::exec::Host host(threads);

  nn::ParamArena<> arena;
  nn::Sequential net{
      nn::Linear(arena, "0", {.in_features = in, .out_features = hidden}), nn::ReLU{},
      nn::Linear(arena, "2", {.in_features = hidden, .out_features = hidden}), nn::ReLU{},
      nn::Linear(arena, "4", {.in_features = hidden, .out_features = classes})};
  arena.finalize();
  arena.initialize(1);
  nn::SoftmaxCrossEntropy ce;

  tk::Tensor<float> x(tk::Shape{batch, in}), logits(tk::Shape{batch, classes}),
      dlogits(tk::Shape{batch, classes}), loss(tk::Shape{1});
  tk::Tensor<std::int64_t> targets(tk::Shape{batch});
  for (std::int64_t i = 0; i < x.numel(); ++i) x.data()[i] = std::sin(0.37f * float(i % 9973));
  for (std::int64_t i = 0; i < batch; ++i) targets.data()[i] = (i * 7) % classes;

  // Kept across steps: forward refills them without allocating.
  decltype(net)::Context ctx;
  decltype(ce)::Context ce_ctx;
  auto step = [&] {
    arena.zero_grad();
    net.forward(host, ctx, x.view<2>(), logits.view<2>());
    ce.forward(host, ce_ctx, logits.view<2>(), targets.view<1>(), loss.view<1>());
    ce.backward(host, ce_ctx, logits.view<2>(), targets.view<1>(), dlogits.view<2>());
    net.backward(host, ctx, x.view<2>(), dlogits.view<2>(), tk::HostView<float, 2>());
  };
  step();
  double grad_norm = 0.0;
  for (std::int64_t i = 0; i < arena.buffer_numel(); ++i)
    grad_norm += double(arena.grads_data()[i]) * arena.grads_data()[i];

  if (!dump.empty()) {
    // "<name> <numel>" lines in <dump>.txt; parameters, then x, then targets in <dump>.
    std::FILE* names = std::fopen((dump + ".txt").c_str(), "w");
    std::FILE* f = std::fopen(dump.c_str(), "wb");
    if (f == nullptr || names == nullptr) return 2;
    for (const auto& p : arena.infos())
      std::fprintf(names, "%s %lld\n", p.name.c_str(), (long long)p.numel);
    std::fclose(names);
    for (const auto& p : arena.infos())
      std::fwrite(arena.params_data() + p.offset, sizeof(float), std::size_t(p.numel), f);
    std::fwrite(x.data(), sizeof(float), std::size_t(x.numel()), f);
    std::fwrite(targets.data(), sizeof(std::int64_t), std::size_t(batch), f);
    std::fclose(f);
  }
  char info[64];
  std::snprintf(info, sizeof info, "%.7g", double(loss.data()[0]));
  char norm[64];
  std::snprintf(norm, sizeof norm, "%.7g", std::sqrt(grad_norm));
  return tb::serve({{"threads", std::to_string(threads)}, {"loss", info}, {"grad_norm", norm}},
                   {{"step", step}});
}
