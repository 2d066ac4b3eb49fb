// SPDX-License-Identifier: MIT
// bench/adamw worker: one optim::AdamW step over a ParamArena of n f32 parameters (4 tensors) on
// the default Host, and two bandwidth probes on the same buffers with the same thread count: a
// STREAM-triad-style loop with AdamW's traffic (read p, g, m, v; write p, m, v: 28 B/param) and
// the classic triad a = b + s * c (12 B/elt). Driven by run.py (protocol: bench/common/bench.hpp).
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <string>

#include "bench.hpp"
#include "trainkit/exec/host.hpp"
#include "trainkit/exec/launch.hpp"
#include "trainkit/nn/param_arena.hpp"
#include "trainkit/optim/adamw.hpp"

namespace tb = trainkit_bench;
namespace tk = trainkit;

int main(int argc, char** argv) {
  const std::int64_t n = std::stoll(tb::arg(argc, argv, "n", "16777216"));
  const auto& host = tk::exec::Host::default_instance();
  const auto threads = static_cast<unsigned>(host.num_threads());

  tk::nn::ParamArena<> arena;
  for (int t = 0; t < 4; ++t) {
    std::string name = "blocks.";
    name += std::to_string(t);
    arena.add(name, tk::Shape{n / 4});
  }
  arena.finalize();
  float* p = arena.params_data();
  float* g = arena.grads_data();
  tk::exec::launch(host, arena.buffer_numel(), [=](std::int64_t i) {
    p[i] = 0.02f * static_cast<float>((i * 2654435761u) % 1000) / 1000.0f - 0.01f;
    g[i] = static_cast<float>((i * 40503u) % 2001) / 1000.0f - 1.0f;
  });
  tk::optim::AdamW opt(arena, {.lr = 1e-4, .weight_decay = 0.01});
  float* m = arena.state("exp_avg").data();
  float* v = arena.state("exp_avg_sq").data();
  const auto count = static_cast<std::size_t>(arena.buffer_numel());

  // Sanity: one step from zero state moves every parameter by about lr (Adam's first step).
  const float before = p[12345];
  opt.step(host);
  const float moved = std::abs(p[12345] - before * (1.0f - 1e-4f * 0.01f));
  if (!(moved > 0.9e-4f && moved < 1.1e-4f)) {
    std::fprintf(stderr, "adamw: the first step moved p[12345] by %g, expected ~1e-4\n", moved);
    return 1;
  }

  // 28 B/param, vectorisable, no sqrt/div: what AdamW's memory traffic costs at best.
  auto probe28 = [=] {
    tb::split_threads(threads, count, [=](std::size_t b, std::size_t e) {
      for (std::size_t i = b; i < e; ++i) {
        const float gi = g[i];
        m[i] = 0.9f * m[i] + 0.1f * gi;
        v[i] = 0.999f * v[i] + 0.001f * gi;
        p[i] = p[i] - 1e-7f * m[i];
      }
    });
  };
  auto triad = [=] {
    tb::split_threads(threads, count, [=](std::size_t b, std::size_t e) {
      for (std::size_t i = b; i < e; ++i) m[i] = g[i] + 0.5f * v[i];
    });
  };
  return tb::serve({{"threads", std::to_string(threads)},
                    {"n", std::to_string(n)},
                    {"buffer", std::to_string(arena.buffer_numel())}},
                   {{"trainkit", [&] { opt.step(host); }}, {"probe28", probe28}, {"triad", triad}});
}
