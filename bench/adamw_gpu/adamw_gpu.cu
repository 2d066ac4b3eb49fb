// SPDX-License-Identifier: MIT
// bench/adamw_gpu worker: one optim::AdamW step over a device ParamArena of n f32 parameters
// (4 tensors) on a CUDA stream, against the device's copy bandwidth measured in the same run
// (cudaMemcpyAsync device to device, 8 B per element copied) and a kernel with AdamW's traffic
// (read p, g, m, v; write p, m, v: 28 B/param). Each repetition ends with a stream sync.
// Driven by run.py (protocol: bench/common/bench.hpp).
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <string>

#include "bench.hpp"
#include "trainkit/core/tensor.hpp"
#include "trainkit/cuda/stream.hpp"
#include "trainkit/exec/cuda.hpp"
#include "trainkit/exec/launch.hpp"
#include "trainkit/nn/param_arena.hpp"
#include "trainkit/optim/adamw.hpp"

namespace tb = trainkit_bench;
namespace tk = trainkit;

namespace {
struct Init {
  float* p;
  float* g;
  __device__ void operator()(std::int64_t i) const {
    p[i] = 0.02f * static_cast<float>((i * 2654435761u) % 1000) / 1000.0f - 0.01f;
    g[i] = static_cast<float>((i * 40503u) % 2001) / 1000.0f - 1.0f;
  }
};
struct Probe28 {
  float* p;
  const float* g;
  float* m;
  float* v;
  __device__ void operator()(std::int64_t i) const {
    const float gi = g[i];
    const float mi = 0.9f * m[i] + 0.1f * gi;
    m[i] = mi;
    v[i] = 0.999f * v[i] + 0.001f * gi;
    p[i] = p[i] - 1e-7f * mi;
  }
};
}  // namespace

int main(int argc, char** argv) {
  const std::int64_t n = std::stoll(tb::arg(argc, argv, "n", "268435456"));
  const tk::cuda::Stream stream;
  const tk::exec::Cuda gpu(stream);

  tk::nn::ParamArena<tk::Space::kDevice> arena;
  for (int t = 0; t < 4; ++t) {
    std::string name = "blocks.";
    name += std::to_string(t);
    arena.add(name, tk::Shape{n / 4});
  }
  arena.finalize();
  tk::exec::launch(gpu, arena.buffer_numel(), Init{arena.params_data(), arena.grads_data()});
  tk::optim::AdamW opt(arena, {.lr = 1e-4, .weight_decay = 0.01});
  float* m = arena.state("exp_avg").data();
  float* v = arena.state("exp_avg_sq").data();
  tk::Tensor<float, tk::Space::kDevice> scratch(tk::Shape{arena.buffer_numel()});
  const std::size_t bytes = static_cast<std::size_t>(arena.buffer_numel()) * sizeof(float);

  opt.step(gpu);
  stream.synchronize();
  if (opt.step_count() != 1) {
    std::fprintf(stderr, "adamw_gpu: the step did not run\n");
    return 1;
  }
  const Probe28 probe{arena.params_data(), arena.grads_data(), m, v};
  return tb::serve(
      {{"n", std::to_string(n)}, {"buffer", std::to_string(arena.buffer_numel())}},
      {{"trainkit",
        [&] {
          opt.step(gpu);
          stream.synchronize();
        }},
       {"probe28",
        [&] {
          tk::exec::launch(gpu, arena.buffer_numel(), probe);
          stream.synchronize();
        }},
       {"copy", [&] {
          TRAINKIT_CUDA_CHECK(cudaMemcpyAsync(scratch.data(), arena.grads_data(), bytes,
                                              cudaMemcpyDeviceToDevice, stream.get()));
          stream.synchronize();
        }}});
}
