// SPDX-License-Identifier: MIT
// bench/gpt_block_step worker: forward and backward (dx and every parameter gradient) of one
// GPT-2 transformer block, d=256, 4 heads, T=128, B=8, f32, with trainkit's nn::TransformerBlock
// on exec::Host(--threads). Dumps its parameters, x and dy to --dump (names in <dump>.txt) so the
// torch peer runs the same computation; reports output and gradient norms for the driver to check.
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <string>

#include "bench.hpp"
#include "trainkit/exec/host.hpp"
#include "trainkit/nn/param_arena.hpp"
#include "trainkit/nn/transformer_block.hpp"

namespace tb = trainkit_bench;
namespace tk = trainkit;
namespace nn = trainkit::nn;

int main(int argc, char** argv) {
  const int threads = std::stoi(tb::arg(argc, argv, "threads", "1"));
  const std::string dump = tb::arg(argc, argv, "dump", "");
  const std::int64_t B = 8, T = 128, C = 256, H = 4;
  tk::exec::Host host(threads);

  nn::ParamArena<> arena;
  nn::TransformerBlock block(arena, "", {.n_embd = C, .n_head = H, .n_layer = 12});
  arena.finalize();
  arena.initialize(1);
  // Non-trivial LayerNorm parameters and biases, so every term of the backward matters.
  for (const auto& p : arena.infos()) {
    if (p.shape.rank() != 1) continue;
    nn::Init init =
        p.name.find("ln_") != std::string::npos && p.name.find("weight") != std::string::npos
            ? nn::Init::uniform(0.5f, 1.5f)
            : nn::Init::uniform(-0.1f, 0.1f);
    arena.initialize(*arena.find(p.name), init, 2);
  }
  tk::Tensor<float> x(tk::Shape{B, T, C}), y(tk::Shape{B, T, C}), dy(tk::Shape{B, T, C}),
      dx(tk::Shape{B, T, C});
  for (std::int64_t i = 0; i < x.numel(); ++i) {
    x.data()[i] = std::sin(0.37f * float(i % 9973));
    dy.data()[i] = 1e-3f * std::cos(0.11f * float(i % 7919));
  }
  decltype(block)::Context ctx;  // kept across steps: forward refills it without allocating
  auto step = [&] {
    arena.zero_grad();
    block.forward(host, ctx, x.view<3>(), y.view<3>());
    block.backward(host, ctx, x.view<3>(), dy.view<3>(), dx.view<3>());
  };
  step();
  double ny = 0.0, ndx = 0.0, ng = 0.0;
  for (std::int64_t i = 0; i < y.numel(); ++i) {
    ny += double(y.data()[i]) * y.data()[i];
    ndx += double(dx.data()[i]) * dx.data()[i];
  }
  for (std::int64_t i = 0; i < arena.buffer_numel(); ++i)
    ng += double(arena.grads_data()[i]) * arena.grads_data()[i];

  if (!dump.empty()) {
    std::FILE* names = std::fopen((dump + ".txt").c_str(), "w");
    std::FILE* f = std::fopen(dump.c_str(), "wb");
    if (f == nullptr || names == nullptr) return 2;
    for (const auto& p : arena.infos()) {
      std::fprintf(names, "%s %lld\n", p.name.c_str(), static_cast<long long>(p.numel));
      std::fwrite(arena.params_data() + p.offset, sizeof(float), std::size_t(p.numel), f);
    }
    std::fwrite(x.data(), sizeof(float), std::size_t(x.numel()), f);
    std::fwrite(dy.data(), sizeof(float), std::size_t(dy.numel()), f);
    std::fclose(names);
    std::fclose(f);
  }
  auto fmt = [](double v) {
    char s[64];
    std::snprintf(s, sizeof s, "%.7g", std::sqrt(v));
    return std::string(s);
  };
  return tb::serve({{"threads", std::to_string(threads)},
                    {"y_norm", fmt(ny)},
                    {"dx_norm", fmt(ndx)},
                    {"grad_norm", fmt(ng)}},
                   {{"step", step}});
}
