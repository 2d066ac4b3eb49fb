// Data parallelism through train::CausalLmTask's comm option and train::Loop's: two ThreadComm
// ranks of batch B give exactly the weights of one process that averages the two ranks' gradients
// (the same batches, the same summation order), and agree closely with one rank of batch 2B; rank 0
// alone writes the logs, every rank its part of each checkpoint; a run cut in two resumes bitwise.
#include <doctest/doctest.h>

#include <array>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <fstream>
#include <memory>
#include <string>
#include <vector>

#include <trainkit/data/prefetcher.hpp>
#include <trainkit/data/sampler.hpp>
#include <trainkit/data/token_shards.hpp>
#include <trainkit/dist/thread_comm.hpp>
#include <trainkit/exec/host.hpp>
#include <trainkit/nn/gpt.hpp>
#include <trainkit/optim/adamw.hpp>
#include <trainkit/train/causal_lm.hpp>
#include <trainkit/train/loop.hpp>

#include "support/temp_dir.hpp"
#include "train/lm_test_util.hpp"

namespace {
namespace tk = trainkit;
namespace train = trainkit::train;
namespace data = trainkit::data;
namespace dist = trainkit::dist;

constexpr std::int64_t kT = 12;
const tk::nn::GptOptions kModel{
    .vocab_size = 50, .block_size = kT, .n_layer = 2, .n_head = 2, .n_embd = 16};

struct Trained {
  std::vector<float> weights;
  train::LoopResult result;
};

/// One rank's run (comm null: a single process) of `steps` steps of batch `batch` under Loop.
Trained run_rank(dist::Comm* comm, dist::Comm* ckpt_comm, const std::filesystem::path& dir,
                 const data::TokenShardDataset& ds, std::int64_t batch, std::int64_t steps,
                 const tk::exec::Host& exec) {
  const std::size_t world = comm != nullptr ? std::size_t(comm->world_size()) : 1;
  const std::size_t rank = comm != nullptr ? std::size_t(comm->rank()) : 0;
  train::Loop loop({.steps = steps,
                    .dir = dir,
                    .eval_every = 4,
                    .ckpt_every = 4,
                    .clip_grad_norm = 1.0,
                    .monitor = {.log_every = 2, .console = nullptr},
                    .comm = comm,
                    .checkpoint_comm = ckpt_comm});
  tk::nn::ParamArena<> arena;
  tk::nn::Gpt model(arena, kModel);
  arena.finalize();
  arena.initialize(11 + rank);  // rank 0's weights reach every rank (the task broadcasts them)
  tk::optim::AdamW<> opt(arena, {.lr = 3e-3, .weight_decay = 0.1});
  data::DistributedSampler sampler(ds.size(), {.world_size = world, .rank = rank, .seed = 5});
  data::Prefetcher loader(ds, sampler, {.batch_size = std::size_t(batch), .drop_last = true});
  data::SequentialSampler in_order(ds.size() / 16);
  data::Prefetcher val(ds, in_order, {.batch_size = 8});
  loop.state().add("loader", loader).add("sampler", sampler);
  train::CausalLmTask<tk::nn::Gpt<>> task(exec, model, arena,
                                          {.train = &loader, .val = &val, .comm = comm});
  CHECK((task.bucketer() != nullptr) == (world > 1));
  Trained out;
  out.result = loop.run(exec, arena, opt, task);
  out.weights.assign(arena.params_data(), arena.params_data() + arena.buffer_numel());
  return out;
}

/// Runs `world` ThreadComm ranks (each with one thread and a second communicator for the
/// checkpoints); returns rank 0's result and checks every rank ends with the same weights.
Trained run_ranks(int world, const std::filesystem::path& dir, const data::TokenShardDataset& ds,
                  std::int64_t batch, std::int64_t steps) {
  std::vector<Trained> out(std::size_t(world), Trained{});
  auto ckpt_group = std::make_shared<dist::ThreadGroup>(world);
  dist::ThreadComm::run(world, [&](dist::ThreadComm& comm) {
    dist::ThreadComm ckpt(ckpt_group, comm.rank());
    const tk::exec::Host exec(1);
    out[std::size_t(comm.rank())] = run_rank(&comm, &ckpt, dir, ds, batch, steps, exec);
  });
  for (int r = 1; r < world; ++r) CHECK(out[std::size_t(r)].weights == out[0].weights);
  return out[0];
}

/// The largest difference between a and b relative to b's largest magnitude.
double max_difference(const std::vector<float>& a, const std::vector<float>& b) {
  double d = 0.0, scale = 0.0;
  for (std::size_t i = 0; i < a.size(); ++i) {
    d = std::max(d, std::abs(double(a[i]) - double(b[i])));
    scale = std::max(scale, std::abs(double(b[i])));
  }
  MESSAGE("largest weight difference ", d, " of at most ", scale);
  return d / scale;
}

}  // namespace

TEST_CASE("Data parallel: 2 ranks equal one process averaging both ranks' gradients, bitwise") {
  const trainkit_test::TempDir dir;
  const data::TokenShardDataset ds(std::vector{trainkit_test::write_lm_shard(dir, "t.bin", 7)},
                                   {.seq_len = kT, .stride = 1});
  constexpr std::int64_t kB = 3, kSteps = 6;
  const Trained ddp = run_ranks(2, dir.path() / "ddp", ds, kB, kSteps);

  // The same steps in one process: each rank's batch through forward and backward, the two
  // gradients averaged as the all-reduce does (for two ranks: (g0 + g1) / 2), one optimizer step.
  const tk::exec::Host exec(1);
  tk::nn::ParamArena<> arena;
  tk::nn::Gpt model(arena, kModel);
  arena.finalize();
  arena.initialize(11);
  tk::optim::AdamW<> opt(arena, {.lr = 3e-3, .weight_decay = 0.1});
  std::vector<std::unique_ptr<data::Prefetcher>> loaders;
  for (std::size_t r = 0; r < 2; ++r)
    loaders.push_back(std::make_unique<data::Prefetcher>(
        ds, data::DistributedSampler(ds.size(), {.world_size = 2, .rank = r, .seed = 5}),
        data::PrefetchOptions{.batch_size = kB, .drop_last = true}));
  tk::nn::Gpt<>::Context ctx;
  tk::nn::SoftmaxCrossEntropy<> ce;
  tk::nn::SoftmaxCrossEntropy<>::Context ce_ctx;
  tk::Tensor<float> logits(tk::Shape{kB * kT, 50}), dlogits(logits.shape());
  const auto n = std::size_t(arena.buffer_numel());
  std::array<std::vector<float>, 2> grads;
  std::array<float, 2> losses{};
  float loss = 0.0f;
  for (std::int64_t s = 0; s < kSteps; ++s) {
    for (std::size_t r = 0; r < 2; ++r) {
      arena.zero_grad();
      const data::Batch b = loaders[r]->next();
      const auto ids = b.host<std::int32_t, 2>("input");
      const auto targets = b.host<std::int32_t, 2>("target").reshape<1>({{kB * kT}});
      model.set_step(std::uint32_t(s));
      model.forward(exec, ctx, ids, logits.view<2>());
      ce.forward(exec, ce_ctx, logits.view<2>(), targets, tk::make_view(&losses[r], {1}));
      ce.backward(exec, ce_ctx, logits.view<2>(), targets, dlogits.view<2>());
      model.backward(exec, ctx, ids, dlogits.view<2>());
      grads[r].assign(arena.grads_data(), arena.grads_data() + n);
    }
    for (std::size_t i = 0; i < n; ++i) arena.grads_data()[i] = (grads[0][i] + grads[1][i]) / 2;
    loss = (losses[0] + losses[1]) / 2;
    opt.step(exec, tk::amp::NoScaler{}, tk::optim::ClipGradNorm{.max_norm = 1.0});
  }
  REQUIRE(ddp.weights.size() == n);
  CHECK(std::memcmp(ddp.weights.data(), arena.params_data(), n * sizeof(float)) == 0);
  CHECK(ddp.result.last_loss == loss);

  // Rank 0 alone wrote the logs: every step's summary once; each checkpoint holds both ranks'
  // training state and the model in two parts.
  std::ifstream metrics(dir.path() / "ddp" / "metrics.jsonl");
  int summaries = 0;
  for (std::string line; std::getline(metrics, line);)
    summaries += line.find("\"steps\"") != std::string::npos;
  CHECK(summaries == int(kSteps / 2));
  const auto last = dir.path() / "ddp" / "ckpt" / "step_000000006";
  CHECK(std::filesystem::exists(last / "train_state-rank00000.safetensors"));
  CHECK(std::filesystem::exists(last / "train_state-rank00001.safetensors"));
  CHECK(std::filesystem::exists(last / "model.safetensors.index.json"));
}

TEST_CASE(
    "Data parallel: 2 ranks x batch B follow 1 rank x batch 2B; a cut 2-rank run resumes bitwise") {
  const trainkit_test::TempDir dir;
  const data::TokenShardDataset ds(std::vector{trainkit_test::write_lm_shard(dir, "t.bin", 9)},
                                   {.seq_len = kT, .stride = 1});
  constexpr std::int64_t kSteps = 8;
  const Trained two = run_ranks(2, dir.path() / "two", ds, 4, kSteps);
  const tk::exec::Host exec(1);
  const Trained one = run_rank(nullptr, nullptr, dir.path() / "one", ds, 8, kSteps, exec);
  // The same 8 sequences per step, their gradients summed in another order.
  CHECK(std::abs(two.result.last_loss - one.result.last_loss) <= 1e-6 * one.result.last_loss);
  CHECK(std::abs(two.result.first_loss - one.result.first_loss) <= 1e-6 * one.result.first_loss);
  CHECK(max_difference(two.weights, one.weights) < 1e-5);

  run_ranks(2, dir.path() / "cut", ds, 4, 4);
  const Trained resumed = run_ranks(2, dir.path() / "cut", ds, 4, kSteps);
  REQUIRE(resumed.result.resumed_from.has_value());
  CHECK(resumed.result.resumed_from->step == 4);
  CHECK(resumed.weights == two.weights);
  CHECK(resumed.result.last_loss == two.result.last_loss);
}
