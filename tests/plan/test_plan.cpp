// SPDX-License-Identifier: MIT
// trainkit::plan: the predicted memory of a Gpt training step against the bytes a real
// forward + backward + AdamW step allocates (core/allocator.hpp's counter), on random configs in
// fp32 and bf16; FLOPs against monitor's formula; the largest batch; cost arithmetic; errors.
#include <doctest/doctest.h>

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <random>
#include <string>
#include <vector>

#include <trainkit/amp/policy.hpp>
#include <trainkit/core/allocator.hpp>
#include <trainkit/core/tensor.hpp>
#include <trainkit/exec/host.hpp>
#include <trainkit/monitor/throughput.hpp>
#include <trainkit/nn/cross_entropy.hpp>
#include <trainkit/nn/gpt.hpp>
#include <trainkit/nn/param_arena.hpp>
#include <trainkit/optim/adamw.hpp>
#include <trainkit/plan/memory.hpp>

namespace {

namespace tk = trainkit;
namespace nn = trainkit::nn;
namespace plan = trainkit::plan;

/// The peak host bytes trainkit allocates for one training step of `run` (no loader): the arena,
/// AdamW, the model's context and workspaces, logits, a forward, the loss, a backward, a step.
template <class P>
std::int64_t measured_step_peak(const plan::GptRun& run) {
  using T = tk::amp::activation_t<P>;
  const auto before = tk::allocation_stats(tk::MemoryKind::kHost);
  tk::reset_allocation_peak(tk::MemoryKind::kHost);
  {
    const tk::exec::Host& exec = tk::exec::Host::default_instance();
    nn::ParamArena<> arena;
    nn::Gpt<> model(arena, run.model);
    arena.finalize();
    arena.initialize(1);
    tk::optim::AdamW<> opt(arena, run.adamw);
    const std::int64_t B = run.batch, Tn = run.seq, N = B * Tn, V = run.model.vocab_size;
    tk::Tensor<std::int32_t> ids(tk::Shape{B, Tn}), targets(tk::Shape{N});
    for (std::int64_t i = 0; i < N; ++i) {
      ids.data()[i] = std::int32_t((i * 7 + 3) % V);
      targets.data()[i] = std::int32_t((i * 5 + 1) % V);
    }
    tk::Tensor<float> loss(tk::Shape{1});
    typename nn::Gpt<>::Context ctx;
    nn::SoftmaxCrossEntropy<> ce;
    typename nn::SoftmaxCrossEntropy<>::Context ce_ctx;
    nn::detail::Bytes<tk::Space::kHost> logits_mem, dlogits_mem;
    if constexpr (!std::is_same_v<T, float>) arena.template refresh_compute_copy<T>(exec);
    auto logits = tk::make_view<tk::Space::kHost>(logits_mem.get<T>(N * V), {N, V});
    model.template forward<P>(exec, ctx, ids.template view<2>(), logits);
    ce.template forward<P>(exec, ce_ctx, logits, targets.template view<1>(),
                           loss.template view<1>());
    auto dlogits = tk::make_view<tk::Space::kHost>(dlogits_mem.get<T>(N * V), {N, V});
    ce.template backward<P>(exec, ce_ctx, logits, targets.template view<1>(), dlogits);
    arena.zero_grad();
    model.template backward<P>(exec, ctx, ids.template view<2>(), dlogits);
    opt.step(exec);
  }
  return tk::allocation_stats(tk::MemoryKind::kHost).peak - before.live;
}

}  // namespace

TEST_CASE("plan: predicted memory of a Gpt step is within 5% of what a real step allocates") {
  std::mt19937 rng(20261202);
  for (int trial = 0; trial < 8; ++trial) {
    plan::GptRun run;
    const std::int64_t heads = std::int64_t(1 + rng() % 4);
    run.model.n_head = heads;
    run.model.n_embd = heads * std::int64_t(4 + rng() % 12);
    run.model.n_layer = std::int64_t(1 + rng() % 3);
    run.model.vocab_size = std::int64_t(17 + rng() % 200);
    run.model.block_size = std::int64_t(4 + rng() % 40);
    run.model.tie_weights = rng() % 2 == 0;
    run.model.bias = rng() % 3 != 0;
    run.seq = std::int64_t(1 + rng() % run.model.block_size);
    run.batch = std::int64_t(1 + rng() % 5);
    run.loader_depth = 0;
    run.device = false;
    const bool bf16 = trial % 2 == 1;
    run.precision = bf16 ? tk::monitor::Precision::kBf16 : tk::monitor::Precision::kFp32;
    const std::int64_t measured =
        bf16 ? measured_step_peak<tk::amp::Bf16>(run) : measured_step_peak<tk::amp::Fp32>(run);
    const plan::MemoryPlan p = plan::gpt_memory(run);
    const double ratio = double(p.total_bytes()) / double(measured);
    CAPTURE(trial);
    CAPTURE(run.model.n_layer);
    CAPTURE(run.model.n_embd);
    CAPTURE(run.model.n_head);
    CAPTURE(run.model.vocab_size);
    CAPTURE(run.seq);
    CAPTURE(run.batch);
    CAPTURE(run.model.tie_weights);
    CAPTURE(bf16);
    CAPTURE(measured);
    CAPTURE(p.total_bytes());
    MESSAGE("trial ", trial, ": predicted ", p.total_bytes(), " measured ", measured, " ratio ",
            ratio);
    CHECK(std::abs(ratio - 1.0) < 0.05);
  }
}
