// Tests of train/causal_lm.hpp on the host: CausalLmTask's steps under train::Loop equal a
// hand-written forward / cross-entropy / backward loop bit for bit; evaluate() is the mean loss of
// one validation epoch; bf16 and fp16 (with a dynamic loss scaler) train the same model to a
// loss close to f32's.
#include <doctest/doctest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <vector>

#include <trainkit/data/prefetcher.hpp>
#include <trainkit/data/sampler.hpp>
#include <trainkit/data/token_shards.hpp>
#include <trainkit/exec/host.hpp>
#include <trainkit/nn/gpt.hpp>
#include <trainkit/optim/adamw.hpp>
#include <trainkit/optim/grad_scaler.hpp>
#include <trainkit/train/causal_lm.hpp>
#include <trainkit/train/loop.hpp>

#include "support/temp_dir.hpp"
#include "train/lm_test_util.hpp"

namespace {
namespace tk = trainkit;
namespace train = trainkit::train;
namespace data = trainkit::data;

constexpr std::int64_t kB = 4, kT = 12, kSteps = 6;
const tk::nn::GptOptions kModel{
    .vocab_size = 50, .block_size = kT, .n_layer = 2, .n_head = 2, .n_embd = 16};

std::filesystem::path write_shard(const trainkit_test::TempDir& dir, const char* name,
                                  std::uint64_t seed) {
  return trainkit_test::write_lm_shard(dir, name, seed);
}

struct Trained {
  std::vector<float> weights;
  train::LoopResult result;
};

template <class P = tk::amp::Fp32>
Trained run_task(const trainkit_test::TempDir& dir, const data::TokenShardDataset& ds,
                 const data::TokenShardDataset& val_ds, std::int64_t steps = kSteps) {
  const tk::exec::Host& exec = tk::exec::Host::default_instance();
  train::Loop loop({.steps = steps,
                    .dir = dir.path() / "run",
                    .eval_every = 3,
                    .monitor = {.console = nullptr}});
  tk::nn::ParamArena<> arena;
  tk::nn::Gpt model(arena, kModel);
  arena.finalize();
  arena.initialize(11);
  tk::optim::AdamW<> opt(arena, {.lr = 3e-3});
  data::RandomSampler sampler(ds.size(), 5);
  data::Prefetcher loader(ds, sampler, {.batch_size = kB, .drop_last = true});
  data::SequentialSampler in_order(val_ds.size());
  data::Prefetcher val(val_ds, in_order, {.batch_size = kB});
  loop.state().add("loader", loader);
  Trained out;
  if constexpr (std::is_same_v<P, tk::amp::Fp16>) {
    tk::optim::DynamicScaler scaler(exec, {.init_scale = 1024.0});
    train::CausalLmTask<tk::nn::Gpt<>, P> task(
        exec, model, arena, {.train = &loader, .val = &val, .loss_scale = scaler.scale_data()});
    out.result =
        loop.run(exec, arena, opt, task, static_cast<tk::optim::LRScheduler*>(nullptr), scaler);
  } else {
    train::CausalLmTask<tk::nn::Gpt<>, P> task(exec, model, arena, {.train = &loader, .val = &val});
    out.result = loop.run(exec, arena, opt, task);
  }
  out.weights.assign(arena.params_data(), arena.params_data() + arena.buffer_numel());
  return out;
}

}  // namespace

TEST_CASE("CausalLmTask: the Loop's steps equal a hand-written training loop bit for bit") {
  const trainkit_test::TempDir dir;
  const data::TokenShardDataset ds(std::vector{write_shard(dir, "train.bin", 1)},
                                   {.seq_len = kT, .stride = 1});
  const data::TokenShardDataset val_ds(std::vector{write_shard(dir, "val.bin", 2)},
                                       {.seq_len = kT});
  const Trained task = run_task(dir, ds, val_ds);

  // The same steps written out.
  const tk::exec::Host& exec = tk::exec::Host::default_instance();
  tk::nn::ParamArena<> arena;
  tk::nn::Gpt model(arena, kModel);
  arena.finalize();
  arena.initialize(11);
  tk::optim::AdamW<> opt(arena, {.lr = 3e-3});
  data::RandomSampler sampler(ds.size(), 5);
  data::Prefetcher loader(ds, sampler, {.batch_size = kB, .drop_last = true});
  tk::nn::Gpt<>::Context ctx;
  tk::nn::SoftmaxCrossEntropy<> ce;
  tk::nn::SoftmaxCrossEntropy<>::Context ce_ctx;
  tk::Tensor<float> logits(tk::Shape{kB * kT, 50}), dlogits(logits.shape());
  float loss = 0.0f;
  for (std::int64_t s = 0; s < kSteps; ++s) {
    arena.zero_grad();
    const data::Batch b = loader.next();
    const auto ids = b.host<std::int32_t, 2>("input");
    const auto targets = b.host<std::int32_t, 2>("target").reshape<1>({{kB * kT}});
    model.set_step(std::uint32_t(s));
    model.forward(exec, ctx, ids, logits.view<2>());
    ce.forward(exec, ce_ctx, logits.view<2>(), targets, tk::make_view(&loss, {1}));
    ce.backward(exec, ce_ctx, logits.view<2>(), targets, dlogits.view<2>());
    model.backward(exec, ctx, ids, dlogits.view<2>());
    opt.step(exec);
  }
  REQUIRE(task.weights.size() == std::size_t(arena.buffer_numel()));
  CHECK(std::memcmp(task.weights.data(), arena.params_data(), task.weights.size() * 4) == 0);
  CHECK(task.result.last_loss == loss);

  // evaluate(): the mean loss of one epoch of val (the last batch is smaller).
  REQUIRE(task.result.last_eval.count("val/loss") == 1);
  CHECK(val_ds.size() % kB != 0);
  data::SequentialSampler in_order(val_ds.size());
  data::Prefetcher val(val_ds, in_order, {.batch_size = kB});
  double sum = 0.0;
  model.eval();
  tk::nn::Gpt<>::Context eval_ctx;
  for (std::size_t i = 0; i < val.batches_per_epoch(); ++i) {
    const data::Batch b = val.next();
    const auto ids = b.host<std::int32_t, 2>("input");
    const auto l = tk::make_view(logits.data(), {ids.numel(), 50});
    model.forward(exec, eval_ctx, ids, l);
    ce.forward(exec, ce_ctx, l, b.host<std::int32_t, 2>("target").reshape<1>({{ids.numel()}}),
               tk::make_view(&loss, {1}));
    sum += double(loss) * double(ids.size(0));
  }
  CHECK(task.result.last_eval.at("val/loss") == sum / double(val_ds.size()));
}

TEST_CASE("CausalLmTask: bf16 and fp16 (dynamic loss scaling) follow the f32 run") {
  const trainkit_test::TempDir dir;
  const data::TokenShardDataset ds(std::vector{write_shard(dir, "train.bin", 3)},
                                   {.seq_len = kT, .stride = 1});
  const data::TokenShardDataset val_ds(std::vector{write_shard(dir, "val.bin", 4)},
                                       {.seq_len = kT});
  const trainkit_test::TempDir d32, d16b, d16h;
  const Trained f32 = run_task(d32, ds, val_ds, 30);
  const Trained bf16 = run_task<tk::amp::Bf16>(d16b, ds, val_ds, 30);
  const Trained fp16 = run_task<tk::amp::Fp16>(d16h, ds, val_ds, 30);
  const double v32 = f32.result.last_eval.at("val/loss");
  CHECK(v32 < std::log(50.0) - 0.5);  // it learned something
  CHECK(std::abs(bf16.result.last_eval.at("val/loss") - v32) < 0.05 * v32);
  CHECK(std::abs(fp16.result.last_eval.at("val/loss") - v32) < 0.05 * v32);
  CHECK(bf16.weights != f32.weights);  // the policy really ran
}
