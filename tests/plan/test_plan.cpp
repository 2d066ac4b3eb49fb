// SPDX-License-Identifier: MIT
// trainkit::plan: the predicted memory of a Gpt training step against the bytes a real
// forward + backward + AdamW step allocates (core/allocator.hpp's counter), on random configs in
// every precision, and of a CausalLmTask run with its loaders and evaluation; FLOPs against
// monitor's formula; the largest batch; cost arithmetic; errors naming the flag.
#include <doctest/doctest.h>

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <random>
#include <string>
#include <type_traits>
#include <vector>

#include <trainkit/amp/policy.hpp>
#include <trainkit/core/allocator.hpp>
#include <trainkit/core/tensor.hpp>
#include <trainkit/data/prefetcher.hpp>
#include <trainkit/data/sampler.hpp>
#include <trainkit/data/token_shards.hpp>
#include <trainkit/dist/bucketer.hpp>
#include <trainkit/dist/thread_comm.hpp>
#include <trainkit/exec/host.hpp>
#include <trainkit/monitor/throughput.hpp>
#include <trainkit/nn/cross_entropy.hpp>
#include <trainkit/nn/gpt.hpp>
#include <trainkit/nn/param_arena.hpp>
#include <trainkit/optim/adamw.hpp>
#include <trainkit/optim/grad_scaler.hpp>
#include <trainkit/plan/memory.hpp>
#include <trainkit/plan/planner.hpp>
#include <trainkit/train/causal_lm.hpp>
#include <trainkit/train/loop.hpp>

#include "support/temp_dir.hpp"
#include "train/lm_test_util.hpp"

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
    // Rows padded to 64 elements, as train::CausalLmTask lays them out.
    const std::int64_t ld = nn::logits_row_stride(V);
    const auto padded = [&](nn::detail::Bytes<tk::Space::kHost>& mem) {
      return tk::TensorView<T, 2>(mem.get<T>(N * ld), tk::Extents<2>{{N, V}},
                                  tk::Extents<2>{{ld, 1}});
    };
    auto logits = padded(logits_mem);
    model.template forward<P>(exec, ctx, ids.template view<2>(), logits);
    ce.template forward<P>(exec, ce_ctx, logits, targets.template view<1>(),
                           loss.template view<1>());
    auto dlogits = padded(dlogits_mem);
    ce.template backward<P>(exec, ce_ctx, logits, targets.template view<1>(), dlogits);
    arena.zero_grad();
    model.template backward<P>(exec, ctx, ids.template view<2>(), dlogits);
    if constexpr (std::is_same_v<P, tk::amp::Fp16>) {
      tk::optim::DynamicScaler scaler(exec);
      opt.step(exec, scaler);
    } else {
      opt.step(exec);
    }
  }
  return tk::allocation_stats(tk::MemoryKind::kHost).peak - before.live;
}

}  // namespace

TEST_CASE("plan: predicted memory of a Gpt step is within 5% of what a real step allocates") {
  std::mt19937 rng(20261202);
  for (int trial = 0; trial < 12; ++trial) {
    plan::GptRun run;
    const std::int64_t heads = std::int64_t(1 + rng() % 4);
    run.model.n_head = heads;
    run.model.n_embd = heads * std::int64_t(4 + rng() % 12);
    run.model.n_layer = std::int64_t(1 + rng() % 3);
    run.model.vocab_size = std::int64_t(17 + rng() % 200);
    run.model.block_size = std::int64_t(4 + rng() % 40);
    run.model.tie_weights = rng() % 2 == 0;
    run.model.bias = rng() % 3 != 0;
    run.model.dropout = trial % 3 == 0 ? 0.1f : 0.0f;  // one more saved activation
    run.seq = std::int64_t(1 + rng() % run.model.block_size);
    run.batch = std::int64_t(1 + rng() % 5);
    run.loader_depth = 0;
    run.device = false;
    run.precision = tk::monitor::Precision(trial % 4);  // fp32, tf32, bf16, fp16
    const std::int64_t measured =
        tk::amp::visit_policy(tk::monitor::precision_name(run.precision),
                              [&]<class P>() { return measured_step_peak<P>(run); });
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
    CAPTURE(tk::monitor::precision_name(run.precision));
    CAPTURE(measured);
    CAPTURE(p.total_bytes());
    CHECK(std::abs(ratio - 1.0) < 0.05);
  }
}

namespace {

/// GPT-2 small (untied) at batch 8 x 1024, bf16.
plan::GptRun gpt2_small() {
  plan::GptRun run;
  run.model = {.vocab_size = 50257, .block_size = 1024, .n_layer = 12, .n_head = 12, .n_embd = 768};
  run.seq = 1024;
  run.batch = 8;
  run.precision = tk::monitor::Precision::kBf16;
  return run;
}

/// Options without the machine-dependent rows (no detected GPU, a fixed CPU peak).
plan::PlanOptions fixed_options() {
  plan::PlanOptions o;
  o.detect_gpu = false;
  o.include_cpu = false;
  return o;
}

std::string error_of(const auto& f) {
  try {
    f();
  } catch (const tk::Error& e) {
    return e.what();
  }
  return "(no error)";
}

}  // namespace

namespace {

/// The peak host bytes of a train_gpt-shaped run: token-shard loaders for training and
/// validation (depth 4), the arena, AdamW, a CausalLmTask, two steps and one evaluation.
template <class P>
std::int64_t measured_task_peak(const plan::GptRun& run, const trainkit_test::TempDir& dir) {
  namespace data = tk::data;
  const auto before = tk::allocation_stats(tk::MemoryKind::kHost);
  tk::reset_allocation_peak(tk::MemoryKind::kHost);
  {
    const tk::exec::Host& exec = tk::exec::Host::default_instance();
    const auto T = std::size_t(run.seq);
    const data::TokenShardDataset train_set(
        std::vector{trainkit_test::write_lm_shard(dir, "train.bin", 1, 256)}, {.seq_len = T});
    const data::TokenShardDataset val_set(
        std::vector{trainkit_test::write_lm_shard(dir, "val.bin", 2, 256)}, {.seq_len = T});
    tk::monitor::Monitor monitor({.console = nullptr});
    nn::ParamArena<> arena;
    nn::Gpt<> model(arena, run.model);
    arena.finalize();
    arena.initialize(3);
    tk::optim::AdamW<> opt(arena, run.adamw);
    data::RandomSampler sampler(train_set.size(), 5);
    data::Prefetcher loader(train_set, sampler,
                            {.batch_size = std::size_t(run.batch), .drop_last = true});
    data::SequentialSampler in_order(val_set.size());
    data::Prefetcher val(val_set, in_order, {.batch_size = std::size_t(run.batch)});
    tk::train::CausalLmTask<nn::Gpt<>, P> task(exec, model, arena, {.train = &loader, .val = &val});
    for (std::int64_t step = 0; step < 2; ++step) {
      tk::train::StepContext ctx{step, &monitor};
      arena.zero_grad();
      (void)task.step(ctx);
      opt.step(exec);
    }
    (void)task.evaluate();
  }
  return tk::allocation_stats(tk::MemoryKind::kHost).peak - before.live;
}

}  // namespace

TEST_CASE("plan: train_gpt_run predicts a real CausalLmTask run with its loaders and evaluation") {
  const trainkit_test::TempDir dir;
  for (const char* precision : {"fp32", "bf16"}) {
    const plan::GptRun run = plan::train_gpt_run(2, 32, 4, 16, 6, false, precision, 0.1);
    const std::int64_t measured = std::string(precision) == "bf16"
                                      ? measured_task_peak<tk::amp::Bf16>(run, dir)
                                      : measured_task_peak<tk::amp::Fp32>(run, dir);
    const std::int64_t predicted = plan::gpt_memory(run).total_bytes();
    CAPTURE(precision);
    CAPTURE(measured);
    CAPTURE(predicted);
    CHECK(std::abs(double(predicted) / double(measured) - 1.0) < 0.05);
    // Without the evaluation and loader lines the prediction falls short by more than 5%.
    plan::GptRun bare = run;
    bare.evaluation = false;
    bare.loader_depth = 0;
    CHECK(double(plan::gpt_memory(bare).total_bytes()) / double(measured) < 0.95);
  }
}

TEST_CASE("plan: the memory lines follow the arena, the optimizer rule and the policy") {
  plan::GptRun run = gpt2_small();
  nn::ParamArena<> arena;
  nn::Gpt<> model(arena, run.model);
  const plan::MemoryPlan p = plan::gpt_memory(run);
  CHECK(p.parameters == arena.num_parameters());
  CHECK(p.buffer_numel == arena.buffer_numel());
  CHECK(p.matmul_params == model.matmul_parameters());
  arena.finalize();
  const plan::GptSizes real = plan::gpt_sizes(arena, model);
  CHECK(real.buffer_numel == p.buffer_numel);
  CHECK(plan::gpt_memory(run, real).total_bytes() == p.total_bytes());
  CHECK(p.line("gradients").bytes == 4 * arena.buffer_numel());
  CHECK(p.line("compute copy").bytes == 2 * arena.buffer_numel());
  const std::int64_t f32_state = p.line("optimizer state").bytes;
  CHECK(f32_state >= 8 * arena.buffer_numel());
  CHECK(f32_state < 8 * arena.buffer_numel() + 4096);
  run.adamw.bf16_state = true;
  CHECK(plan::gpt_memory(run).line("optimizer state").bytes - 4 * arena.buffer_numel() ==
        f32_state - 8 * arena.buffer_numel());
  run.adamw = {.amsgrad = true};
  CHECK(plan::gpt_memory(run).line("optimizer state").bytes - 12 * arena.buffer_numel() ==
        f32_state - 8 * arena.buffer_numel());
  // fp32: no compute copy, activations twice bf16's (up to the f32 statistics), no dS scratch.
  run = gpt2_small();
  run.precision = tk::monitor::Precision::kFp32;
  const plan::MemoryPlan f = plan::gpt_memory(run);
  CHECK_THROWS(f.line("compute copy"));
  CHECK(f.line("activations").bytes > 19 * p.line("activations").bytes / 10);
  // Data parallel: a bf16 staging buffer only with compression and more than one rank.
  run.ranks = 8;
  CHECK_THROWS(plan::gpt_memory(run).line("gradient staging"));
  run.bf16_compression = true;
  CHECK(plan::gpt_memory(run).line("gradient staging").bytes == 2 * arena.buffer_numel());
  run.ranks = 1;
  CHECK_THROWS(plan::gpt_memory(run).line("gradient staging"));
  // A GPU run keeps the loader's slots twice: on the device and pinned on the host.
  run = gpt2_small();
  const plan::MemoryPlan gpu = plan::gpt_memory(run);
  CHECK(gpu.total_bytes() - gpu.device_bytes() == gpu.line("loader host slots").bytes);
  run.device = false;
  CHECK_THROWS(plan::gpt_memory(run).line("loader host slots"));
}

TEST_CASE("plan: the GPU's fused attention core keeps one f32 per row instead of [B, H, T, T]") {
  for (const tk::monitor::Precision precision :
       {tk::monitor::Precision::kFp32, tk::monitor::Precision::kBf16}) {
    plan::GptRun run = gpt2_small();
    run.precision = precision;
    const std::int64_t a = precision == tk::monitor::Precision::kBf16 ? 2 : 4;
    const std::int64_t B = run.batch, T = run.seq, H = run.model.n_head, L = run.model.n_layer;
    run.model.fused_attention = true;
    const plan::MemoryPlan fused = plan::gpt_memory(run);
    run.model.fused_attention = false;
    const plan::MemoryPlan full = plan::gpt_memory(run);
    CAPTURE(a);
    CHECK(full.line("activations").bytes - fused.line("activations").bytes ==
          L * (B * H * T * T * a - B * H * T * 4));
    // The f32 scores (and, for 16-bit operands, dS) against the fused core's row sums.
    CHECK(full.line("backward workspaces").bytes - fused.line("backward workspaces").bytes ==
          L * (B * H * T * T * (a == 2 ? 6 : 4) - B * H * T * 4));
    // Only a GPU run, and only head sizes up to 128, take the fused core.
    run.model.fused_attention = true;
    run.device = false;
    plan::GptRun host_full = run;
    host_full.model.fused_attention = false;
    CHECK(plan::gpt_memory(run).line("activations").bytes ==
          plan::gpt_memory(host_full).line("activations").bytes);
    run.device = true;
    run.model.n_head = 4;  // head size 192
    const std::int64_t wide = plan::gpt_memory(run).line("activations").bytes;
    run.model.fused_attention = false;
    CHECK(plan::gpt_memory(run).line("activations").bytes == wide);
  }
}

TEST_CASE("plan: the loader line is what a real Prefetcher slot ring allocates") {
  const trainkit_test::TempDir dir;
  const tk::data::TokenShardDataset ds(
      std::vector{trainkit_test::write_lm_shard(dir, "loader.bin", 1, 256)}, {.seq_len = 37});
  for (const std::int64_t B : {1, 3, 17}) {
    for (const std::size_t depth : {2, 4, 7}) {
      plan::GptRun run = gpt2_small();
      run.device = false;
      run.batch = B;
      run.seq = 37;
      run.loader_depth = std::int64_t(depth);
      const auto before = tk::allocation_stats(tk::MemoryKind::kHost).live;
      tk::data::SequentialSampler in_order(ds.size());
      tk::data::Prefetcher loader(ds, in_order, {.batch_size = std::size_t(B), .depth = depth});
      const std::int64_t allocated = tk::allocation_stats(tk::MemoryKind::kHost).live - before;
      CAPTURE(B);
      CAPTURE(depth);
      CHECK(plan::gpt_memory(run).line("loader slots").bytes == allocated);
      run.evaluation = true;  // a validation loader of the same shape
      CHECK(plan::gpt_memory(run).line("loader slots").bytes == 2 * allocated);
    }
  }
}

TEST_CASE("plan: the gradient staging line is what a bf16-compressing GradBucketer allocates") {
  plan::GptRun run;
  run.model = {.vocab_size = 97, .block_size = 8, .n_layer = 2, .n_head = 2, .n_embd = 24};
  run.ranks = 4;
  run.bf16_compression = true;
  std::int64_t allocated = -1;
  tk::dist::ThreadComm::run(1, [&](tk::dist::ThreadComm& comm) {
    nn::ParamArena<> arena;
    nn::Gpt<> model(arena, run.model);
    arena.finalize();
    const auto before = tk::allocation_stats(tk::MemoryKind::kHost).live;
    tk::dist::GradBucketer<> bucketer(arena, comm, {.bf16_compression = true});
    allocated = tk::allocation_stats(tk::MemoryKind::kHost).live - before;
  });
  CHECK(plan::gpt_memory(run).line("gradient staging").bytes == allocated);
}

TEST_CASE("plan: FLOPs per step are monitor's transformer formula") {
  std::mt19937 rng(7);
  for (int trial = 0; trial < 20; ++trial) {
    plan::GptRun run;
    run.model.n_head = std::int64_t(1 + rng() % 16);
    run.model.n_embd = run.model.n_head * std::int64_t(8 + rng() % 64);
    run.model.n_layer = std::int64_t(1 + rng() % 48);
    run.model.vocab_size = std::int64_t(100 + rng() % 60000);
    run.model.block_size = std::int64_t(16 + rng() % 4096);
    run.seq = std::int64_t(1 + rng() % run.model.block_size);
    run.batch = std::int64_t(1 + rng() % 64);
    run.model.tie_weights = rng() % 2 == 0;
    const plan::GptSizes sizes = plan::gpt_sizes(run.model);
    const double C = double(run.model.n_embd), L = double(run.model.n_layer);
    const double N = 12.0 * L * C * C + double(run.model.vocab_size) * C;
    CHECK(double(sizes.matmul_params) == N);
    const double tokens = double(run.batch * run.seq);
    const double expected = (6.0 * N + 12.0 * L * double(run.model.n_head) *
                                           (C / double(run.model.n_head)) * double(run.seq)) *
                            tokens;
    CHECK(plan::gpt_flops_per_step(run, sizes.matmul_params) ==
          doctest::Approx(expected).epsilon(1e-12));
    CHECK(plan::gpt_flops_per_step(run, sizes.matmul_params) ==
          tk::monitor::transformer_flops_per_step(N, int(L), int(run.model.n_head),
                                                  int(run.model.n_embd / run.model.n_head),
                                                  int(run.seq), tokens));
  }
}

TEST_CASE("plan: the largest batch is monotone in memory and really the largest") {
  const plan::GptRun run = gpt2_small();
  const plan::GptSizes sizes = plan::gpt_sizes(run.model);
  std::int64_t last = -1;
  for (const std::int64_t gib : {1, 2, 3, 5, 8, 13, 24, 40, 80, 141, 1000}) {
    const std::int64_t usable = gib * plan::kGiB;
    const std::int64_t b = plan::largest_batch(run, sizes, usable, true);
    CHECK(b >= last);
    last = b;
    plan::GptRun r = run;
    if (b > 0) {
      r.batch = b;
      CHECK(plan::needed_bytes(r, sizes, true) <= usable);
    }
    r.batch = b + 1;
    CHECK(plan::needed_bytes(r, sizes, true) > usable);
  }
  CHECK(plan::largest_batch(run, sizes, 1024, true) == 0);  // not even the weights fit
  // The table agrees: a device fits the run's batch exactly when its largest batch is >= it.
  const plan::Report report = plan::gpt(run, fixed_options());
  REQUIRE(report.rows.size() == 6);
  for (const plan::DeviceRow& row : report.rows) {
    CAPTURE(row.device.label);
    CHECK(row.fits == (row.max_batch >= run.batch));
    CHECK(row.usable == std::int64_t(double(row.device.memory_bytes) * 0.9));
  }
}

TEST_CASE("plan: step time, tokens/s, time and cost arithmetic") {
  plan::GptRun run = gpt2_small();
  run.ranks = 8;
  plan::PlanOptions o = fixed_options();
  o.tokens = 10e9;
  o.mfu = 0.5;
  o.prices = plan::parse_prices("H100=2.5,h200=3.5,A100=1.5", o.devices);
  CHECK(o.prices.size() == 4);
  CHECK(o.prices.at("A100-40GB") == 1.5);
  CHECK(o.prices.at("A100-80GB") == 1.5);
  const plan::Report r = plan::gpt(run, o);
  const plan::DeviceRow& h100 = r.rows[1];
  REQUIRE(h100.device.id == "H100");
  CHECK(h100.peak == 989e12);  // monitor's table
  const double flops = plan::gpt_flops_per_step(run, r.memory.matmul_params);
  const double step = flops / (989e12 * 0.5);
  CHECK(h100.compute.step_seconds == doctest::Approx(step).epsilon(1e-12));
  const double per_step = 8.0 * 8 * 1024;
  CHECK(h100.compute.tokens_per_s == doctest::Approx(per_step / step).epsilon(1e-12));
  const double steps = std::ceil(10e9 / per_step);  // 152588.xx -> 152589
  CHECK(h100.compute.steps == steps);
  CHECK(h100.compute.seconds == doctest::Approx(steps * step).epsilon(1e-12));
  CHECK(h100.compute.cost == doctest::Approx(steps * step / 3600.0 * 8 * 2.5).epsilon(1e-12));
  CHECK(std::isnan(r.rows[4].compute.cost));  // L40S: no price
  CHECK(r.rows[4].compute.seconds > 0.0);
  // The MFU of a finished run: the last finite value of its metrics.jsonl.
  const auto dir = std::filesystem::temp_directory_path() / "trainkit_plan_mfu";
  std::filesystem::create_directories(dir);
  {
    std::ofstream out(dir / "metrics.jsonl");
    out << "{\"step\":25,\"mfu\":0.31,\"peak\":\"x\"}\n{\"step\":50,\"mfu\":null}\n"
           "{\"step\":75,\"mfu\":0.275,\"tflops\":1}\n{\"step\":100}\n";
  }
  o.mfu = 0.0;
  o.run_dir = dir;
  const plan::Report measured = plan::gpt(run, o);
  CHECK(measured.mfu == 0.275);
  CHECK(measured.rows[1].compute.step_seconds == doctest::Approx(flops / (989e12 * 0.275)));
  {
    std::ofstream out(dir / "metrics.jsonl");
    out << "{\"step\":25,\"mfu\":null}\n";
  }
  CHECK(error_of([&] { plan::gpt(run, o); }).find("--run-dir") != std::string::npos);
  {
    std::ofstream out(dir / "metrics.jsonl");
    out << "{\"step\":25,\"mfu\":1.7}\n";  // measured against too low a peak
  }
  CHECK(error_of([&] { plan::gpt(run, o); }).find("reached MFU 1.7, above 1") != std::string::npos);
  std::filesystem::remove_all(dir);
  CHECK(error_of([&] { plan::gpt(run, o); }).find("--run-dir: cannot read") != std::string::npos);
  // Text and JSON carry the same figures.
  o = fixed_options();
  o.tokens = 10e9;
  o.prices = plan::parse_prices("H100=2.5", o.devices);
  const plan::Report t = plan::gpt(run, o);
  const std::string text = plan::to_text(t), json = plan::to_json(t);
  CHECK(text.find("H100 SXM 80GB") != std::string::npos);
  CHECK(text.find("40.0% MFU (default)") != std::string::npos);
  CHECK(json.find("\"id\":\"H100\"") != std::string::npos);
  CHECK(json.find("\"price_per_gpu_hour\":2.5") != std::string::npos);
  CHECK(json.find("\"device_bytes\":" + std::to_string(t.memory.device_bytes())) !=
        std::string::npos);
}

TEST_CASE("plan: bad inputs give errors naming the flag") {
  const auto run_error = [](auto change) {
    plan::GptRun run = gpt2_small();
    change(run);
    return error_of([&] { plan::gpt_memory(run); });
  };
  CHECK(run_error([](plan::GptRun& r) { r.model.n_layer = 0; }).find("--layers") !=
        std::string::npos);
  CHECK(run_error([](plan::GptRun& r) { r.model.n_embd = -8; }).find("--dim") != std::string::npos);
  CHECK(run_error([](plan::GptRun& r) { r.model.n_head = 0; }).find("--heads") !=
        std::string::npos);
  CHECK(run_error([](plan::GptRun& r) { r.model.n_head = 5; }) ==
        "trainkit: --dim 768 is not a multiple of --heads 5");
  CHECK(run_error([](plan::GptRun& r) { r.batch = 0; }).find("--batch") != std::string::npos);
  CHECK(run_error([](plan::GptRun& r) { r.batch = -3; }).find("--batch") != std::string::npos);
  CHECK(run_error([](plan::GptRun& r) { r.ranks = 0; }).find("--ranks") != std::string::npos);
  CHECK(run_error([](plan::GptRun& r) { r.seq = 2048; }).find("--seq") != std::string::npos);
  CHECK(run_error([](plan::GptRun& r) { r.model.vocab_size = 0; }).find("--vocab") !=
        std::string::npos);
  CHECK(run_error([](plan::GptRun& r) {
          r.model.n_layer = std::int64_t{1} << 40;
        }).find("beyond") != std::string::npos);
  CHECK(run_error([](plan::GptRun& r) {
          r.model.n_layer = (std::int64_t{1} << 14) + 1;  // counting them would take gigabytes
        }).find("--layers at most 2^14") != std::string::npos);
  // Sizes each within the limits whose bytes add up past 64 bits: an error, not a small (or
  // negative) total that "fits".
  CHECK(run_error([](plan::GptRun& r) {
          r.model = {
              .vocab_size = 256, .block_size = 4096, .n_layer = 2, .n_head = 16, .n_embd = 16};
          r.seq = 4096;
          r.batch = std::int64_t{1} << 31;
          r.device = false;
          r.evaluation = true;
        }).find("plan: a memory size") != std::string::npos);
  for (const std::int64_t batch : {std::int64_t{1} << 20, std::int64_t{1} << 26}) {
    CAPTURE(batch);  // where the sum still fits, the totals are the lines' sum and positive
    plan::GptRun r = gpt2_small();
    r.batch = batch;
    try {
      const plan::MemoryPlan m = plan::gpt_memory(r);
      CHECK(m.total_bytes() > 0);
      CHECK(m.device_bytes() > 0);
    } catch (const tk::Error& e) {
      CHECK(std::string(e.what()).find("plan: a memory size") != std::string::npos);
    }
  }
  CHECK(error_of([] { plan::parse_precision("fp8"); }) ==
        "trainkit: --precision: precision 'fp8' is not fp32, tf32, bf16 or fp16");
  CHECK(error_of([] { plan::parse_precision("bf\n16"); }) ==
        "trainkit: --precision: precision 'bf\\x0a16' is not fp32, tf32, bf16 or fp16");
  CHECK(error_of([] { (void)tk::amp::visit_policy("fp\n8", []<class P>() { return 0; }); }) ==
        "trainkit: precision 'fp\\x0a8' is not fp32, tf32, bf16 or fp16");
  const std::vector<plan::Device> devices = plan::known_devices();
  CHECK(error_of([&] {
          plan::parse_prices("X100=2", devices);
        }).find("--price 'X100=2': unknown device 'X100'") != std::string::npos);
  CHECK(error_of([&] { plan::parse_prices("H100", devices); }).find("--price 'H100'") !=
        std::string::npos);
  CHECK(error_of([&] { plan::parse_prices("H100=-1", devices); }).find("not a price") !=
        std::string::npos);
  CHECK(error_of([&] { plan::parse_prices("H100=abc", devices); }).find("not a price") !=
        std::string::npos);
  CHECK(error_of([&] { plan::parse_prices("H100=nan", devices); }).find("not a price") !=
        std::string::npos);
  CHECK(plan::parse_prices("", devices).empty());
  plan::PlanOptions o = fixed_options();
  o.mfu = 1.5;
  CHECK(error_of([&] { plan::gpt(gpt2_small(), o); }).find("--mfu") != std::string::npos);
  o.mfu = 0.4;
  o.headroom = 1.0;
  CHECK(error_of([&] { plan::gpt(gpt2_small(), o); }).find("--headroom") != std::string::npos);
  o.headroom = 0.1;
  o.tokens = -1.0;
  CHECK(error_of([&] { plan::gpt(gpt2_small(), o); }).find("--tokens") != std::string::npos);
}
