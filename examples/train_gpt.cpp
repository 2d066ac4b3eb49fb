// SPDX-License-Identifier: MIT
// train_gpt: trainkit's flagship example: a byte-level GPT (nn::Gpt) trained on real text with
// train::Loop: AdamW (nanoGPT's betas; no decay of biases and norms), warmup + cosine LR, clipping,
// llm.c token shards through a shuffling Prefetcher, progress / TensorBoard / metrics.jsonl / MFU,
// checkpoints (exact --resume, damaged ones skipped). `--help` lists the flags. Build: the CMake
// target, or  g++ -std=c++20 -O2 -I single_include examples/train_gpt.cpp -pthread -o train_gpt
// Writes to --out: data/{train,val}.bin, ckpt/step_*/ (model.safetensors: nanoGPT's names), tb/,
// metrics.jsonl, trace.json. "step N" counts completed optimizer steps (step 0: the first eval);
// a resume with a larger --steps (no --decay-steps) follows the schedule of a run that long.
#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

#include <trainkit/trainkit.hpp>

namespace {

namespace tk = trainkit;
namespace fs = std::filesystem;
namespace nn = tk::nn;
namespace data = tk::data;
using tk::train::kSession;

constexpr std::int64_t kVocab = 256;  // byte-level: every file is valid input

struct Config {
  std::int64_t steps = 300, batch = 16, seq = 64, layers = 4, dim = 128, heads = 4, seed = 1337;
  std::int64_t warmup = 0, decay_steps = 0, log_every = 25, eval_every = 50, eval_batches = 8;
  std::int64_t ckpt_every = 100, keep = 3, sample_chars = 240, threads = 0;
  double lr = 3e-3, weight_decay = 0.1, grad_clip = 1.0, dropout = 0.0, peak_tflops = 0.0;
  double temperature = 0.8;
  bool tie_weights = false, resume = false, allow_fresh_start = false, check = false;
  std::string out = "runs/train_gpt", data = "/usr/share/common-licenses", prompt = "The ";
  std::string init_from;
};

void add_flags(tk::train::Flags& f, Config& c) {
  f.add("steps", c.steps, "train until step N", {.at_least = 1}, kSession)
      .add("batch", c.batch, "sequences per step", {.at_least = 1})
      .add("seq", c.seq, "tokens per sequence, the context length", {.at_least = 2})
      .add("layers", c.layers, "transformer blocks", {.at_least = 1})
      .add("dim", c.dim, "embedding width (a multiple of --heads)", {.at_least = 1})
      .add("heads", c.heads, "attention heads", {.at_least = 1})
      .add("tie-weights", c.tie_weights, "lm_head shares transformer.wte's weight (GPT-2)")
      .add("init-from", c.init_from, "start from these weights (.safetensors, PyTorch names)")
      .add("lr", c.lr, "peak learning rate of AdamW", {.above = 0})
      .add("seed", c.seed, "seed of initialisation, data order, dropout, sampling", {.at_least = 0})
      .add("dropout", c.dropout, "dropout after the embeddings", {.at_least = 0, .below = 1})
      .add("weight-decay", c.weight_decay, "AdamW weight decay of the matrices", {.at_least = 0})
      .add("grad-clip", c.grad_clip, "clip the gradient norm to X, 0 = off", {.at_least = 0})
      .add("warmup", c.warmup, "linear warmup steps (0: decay-steps / 10)", {.at_least = 0})
      .add("decay-steps", c.decay_steps, "warmup + cosine length (0: --steps)", {.at_least = 0})
      .add("out", c.out, "run directory", kSession)
      .add("resume", c.resume, "continue from the newest checkpoint in OUT/ckpt that verifies",
           kSession)
      .add("allow-fresh-start", c.allow_fresh_start, "--resume without one: start over", kSession)
      .add("data", c.data, "a text file or a directory of them", kSession)
      .add("threads", c.threads, "CPU threads (0: all)", {.at_least = 0}, kSession)
      .add("log-every", c.log_every, "steps per monitor summary", {.at_least = 1}, kSession)
      .add("eval-every", c.eval_every, "steps between evaluations", {.at_least = 1}, kSession)
      .add("eval-batches", c.eval_batches, "batches per evaluation", {.at_least = 1}, kSession)
      .add("ckpt-every", c.ckpt_every, "steps between checkpoints", {.at_least = 1}, kSession)
      .add("keep", c.keep, "checkpoints kept besides the best", {.at_least = 0}, kSession)
      .add("sample-chars", c.sample_chars, "bytes generated at the end", {.at_least = 0}, kSession)
      .add("temperature", c.temperature, "sampling temperature (0: greedy)", {.at_least = 0},
           kSession)
      .add("prompt", c.prompt, "start of the generated text", kSession)
      .add("peak-tflops", c.peak_tflops, "peak for MFU (0: measured)", {.at_least = 0}, kSession)
      .add("check", c.check, "exit 3 unless the train and val losses fell", kSession);
}

/// The schedule's length and warmup resolved as a fresh run does; throws naming the flags.
Config resolved(Config c) {
  TRAINKIT_CHECK(c.decay_steps != 1, "--decay-steps must be >= 2 (or 0 for --steps), got 1");
  if (c.decay_steps == 0) c.decay_steps = std::max<std::int64_t>(c.steps, 2);
  if (c.warmup == 0) c.warmup = std::max<std::int64_t>(1, c.decay_steps / 10);
  TRAINKIT_CHECK(c.warmup < c.decay_steps, "--warmup ", c.warmup, " must be below --decay-steps ",
                 c.decay_steps);
  return c;
}

/// The bytes of a file, or of every regular file under a directory (symbolic links skipped, so
/// /usr/share/common-licenses/GPL does not repeat GPL-3), in path order.
std::string read_corpus(const fs::path& path) {
  std::vector<fs::path> files{path};
  if (fs::is_directory(path)) {
    files.clear();
    for (const auto& e : fs::recursive_directory_iterator(path))
      if (e.symlink_status().type() == fs::file_type::regular) files.push_back(e.path());
    std::sort(files.begin(), files.end());
  }
  std::string text;
  for (const fs::path& f : files) {
    std::ifstream in(f, std::ios::binary);
    TRAINKIT_CHECK(in.good(), "--data: cannot read '", f.string(), "'");
    text.append(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
  }
  return text;
}

}  // namespace

int main(int argc, char** argv) try {
  std::setvbuf(stdout, nullptr, _IOLBF, 0);  // a killed run's log ends at its last line
  Config c;
  tk::train::Flags flags("train_gpt", "Trains a byte-level GPT on text with trainkit.");
  add_flags(flags, c);
  if (!flags.parse(argc, argv)) return 0;
  TRAINKIT_CHECK(c.dim % c.heads == 0, "--dim ", c.dim, " is not a multiple of --heads ", c.heads);
  if (!c.resume) resolved(c);  // bad schedule flags fail before anything is written
  const std::string text = read_corpus(c.data);
  TRAINKIT_CHECK(text.size() / 10 > std::size_t(c.seq) + 1, "the corpus (", text.size(),
                 " bytes) is too small for --seq ", c.seq);

  const fs::path out = c.out;
  tk::train::Loop loop({.steps = c.steps,
                        .dir = out,
                        .eval_every = c.eval_every,
                        .eval_at_start = true,
                        .print_evals = true,
                        .ckpt_every = c.ckpt_every,
                        .keep_last = int(c.keep),
                        .best_metric = "val/loss",
                        .clip_grad_norm = c.grad_clip,
                        .resume = c.resume,
                        .allow_fresh_start = c.allow_fresh_start},
                       &flags);  // on resume the run's flags are the checkpoint's from here on
  const std::int64_t planned_decay = c.decay_steps;
  const bool extend = loop.resuming() && c.steps > c.decay_steps && !flags.given("decay-steps");
  if (extend) c.decay_steps = c.steps;  // the next checkpoints save the longer schedule
  c = resolved(c);

  // The corpus, split 90/10 and written as token shards, read back as windows of T + 1 tokens.
  fs::create_directories(out / "data");
  const std::size_t split = text.size() - text.size() / 10;
  std::vector<std::uint16_t> bytes(text.begin(), text.end());
  for (auto& b : bytes) b &= 0xff;  // bytes, not signed chars
  data::write_token_shard(out / "data" / "train.bin", std::span(bytes).first(split));
  data::write_token_shard(out / "data" / "val.bin", std::span(bytes).subspan(split));
  const auto T = static_cast<std::size_t>(c.seq);
  const data::TokenShardDataset train_set(std::vector{out / "data" / "train.bin"},
                                          {.seq_len = T, .stride = 1});  // every offset
  // Validation: eval_batches * batch windows spread evenly over the shard, the same each time.
  const std::size_t val_tokens = text.size() - split - T - 1;
  const std::size_t want = std::min(std::size_t(c.eval_batches * c.batch), val_tokens / T + 1);
  const data::TokenShardDataset val_set(
      std::vector{out / "data" / "val.bin"},
      {.seq_len = T, .stride = want > 1 ? std::max(T, val_tokens / (want - 1)) : T});

  tk::exec::Host exec = c.threads > 0 ? tk::exec::Host(int(c.threads)) : tk::exec::Host();
  nn::ParamArena<> arena;
  nn::Gpt model(arena, {.vocab_size = kVocab,
                        .block_size = c.seq,
                        .n_layer = c.layers,
                        .n_head = c.heads,
                        .n_embd = c.dim,
                        .tie_weights = c.tie_weights,
                        .dropout = float(c.dropout),
                        .seed = std::uint64_t(c.seed)});
  arena.finalize();
  arena.initialize(std::uint64_t(c.seed));
  if (!c.init_from.empty() && !loop.resuming()) {  // a resumed run's weights are its checkpoint's
    const auto r = tk::ckpt::load_model(arena, c.init_from, {.allow_unexpected = c.tie_weights});
    std::printf("train_gpt: --init-from %s: loaded %zu tensors, %zu of the file unused\n",
                c.init_from.c_str(), r.loaded.size(), r.unexpected.size());
  }
  tk::optim::AdamW<> opt(arena,
                         {.lr = c.lr, .beta1 = 0.9, .beta2 = 0.95, .weight_decay = c.weight_decay},
                         {tk::optim::no_weight_decay({"*.bias", "*ln_*"})});
  const tk::optim::WarmupCosineOptions plan{
      .warmup_steps = c.warmup, .total_steps = c.decay_steps, .eta_min = 0.1 * c.lr};
  auto schedule = tk::optim::warmup_cosine(opt.lr_groups(), plan);
  data::RandomSampler sampler(train_set.size(), std::uint64_t(c.seed));
  data::Prefetcher loader(train_set, sampler,
                          {.batch_size = std::size_t(c.batch), .drop_last = true, .name = "train"});
  data::SequentialSampler in_order(val_set.size());
  data::Prefetcher val_loader(val_set, in_order,
                              {.batch_size = std::size_t(c.batch), .name = "val"});
  loop.state().add("loader", loader).add("sampler", sampler).add("dropout", model.dropout());

  const std::int64_t tokens = c.batch * c.seq;
  std::printf(
      "train_gpt: %lld parameters (%lld layers, dim %lld, %lld heads, context %lld%s) | "
      "%zu-byte corpus: %zu train, %zu val windows | %d threads\n",
      (long long)arena.num_parameters(), (long long)c.layers, (long long)c.dim, (long long)c.heads,
      (long long)c.seq, c.tie_weights ? ", tied head" : "", text.size(), train_set.size(),
      val_set.size(), exec.num_threads());
  tk::monitor::MonitorOptions& mo = loop.monitor_options();
  mo.log_every = c.log_every;
  mo.chrome_trace = (out / "trace.json").string();
  mo.tokens_per_step = double(tokens);
  mo.flops_per_step = tk::monitor::transformer_flops_per_step(
      double(model.matmul_parameters()), int(c.layers), int(c.heads), int(c.dim / c.heads),
      int(c.seq), double(tokens));
  mo.peak_flops = c.peak_tflops > 0 ? 1e12 * c.peak_tflops
                                    : tk::monitor::measure_cpu_peak_flops(exec.num_threads());
  mo.peak_label = c.peak_tflops > 0 ? "configured" : "measured: FMA rate of the threads";

  nn::Gpt<>::Context ctx, eval_ctx;
  nn::SoftmaxCrossEntropy<> ce;
  nn::SoftmaxCrossEntropy<>::Context ce_ctx;
  tk::Tensor<float> logits(tk::Shape{tokens, kVocab}), dlogits(logits.shape());
  std::vector<double> recent;  // train losses of the last steps of this process
  float loss = NAN;
  auto step = [&](tk::train::StepContext& s) {
    data::Batch batch;
    {
      auto span = s.monitor->span(tk::monitor::Phase::kDataWait);
      batch = loader.next();
    }
    const auto ids = batch.host<std::int32_t, 2>("input");
    const auto targets = batch.host<std::int32_t, 2>("target").reshape<1>({{tokens}});
    {
      auto span = s.monitor->span(tk::monitor::Phase::kForward);
      model.set_step(std::uint32_t(s.step));
      model.forward(exec, ctx, ids, logits.view<2>());
      ce.forward(exec, ce_ctx, logits.view<2>(), targets, tk::make_view(&loss, {1}));
    }
    {
      auto span = s.monitor->span(tk::monitor::Phase::kBackward);
      ce.backward(exec, ce_ctx, logits.view<2>(), targets, dlogits.view<2>());
      model.backward(exec, ctx, ids, dlogits.view<2>());
    }
    if (s.step == 0) loop.state().metadata["initial_loss"] = tk::StateDict::number_to_string(loss);
    recent.push_back(loss);
    if (recent.size() > 10) recent.erase(recent.begin());
    return loss;
  };
  // Mean loss (nats per byte) over the validation windows, dropout off.
  auto evaluate = [&] {
    double sum = 0.0;
    model.eval();
    for (std::size_t b = 0; b < val_loader.batches_per_epoch(); ++b) {
      const data::Batch batch = val_loader.next();
      const auto ids = batch.host<std::int32_t, 2>("input");
      const auto l = tk::make_view(logits.data(), {ids.numel(), kVocab});
      float batch_loss = 0.0f;
      model.forward(exec, eval_ctx, ids, l);
      ce.forward(exec, ce_ctx, l, batch.host<std::int32_t, 2>("target").reshape<1>({{ids.numel()}}),
                 tk::make_view(&batch_loss, {1}));
      sum += double(batch_loss) * double(ids.size(0));
    }
    model.train();
    return tk::ckpt::Metrics{{"val/loss", sum / double(val_set.size())}};
  };
  auto on_resume = [&](const tk::ckpt::CheckpointInfo& info) {
    if (!extend) return;
    std::printf(
        "train_gpt: the schedule now decays until step %lld (--decay-steps %lld keeps it)\n",
        (long long)c.steps, (long long)planned_decay);
    tk::optim::replay_schedule(*schedule, opt.lr_groups(), info.step, [&](auto& groups) {
      return tk::optim::warmup_cosine(groups, plan);
    });
  };
  const tk::train::LoopResult r =
      loop.run(exec, arena, opt, tk::train::task(step, evaluate, on_resume), schedule.get());

  const double val =
      r.last_eval.count("val/loss") ? r.last_eval.at("val/loss") : evaluate().at("val/loss");
  const double initial_val = r.first_eval.count("val/loss") ? r.first_eval.at("val/loss") : NAN;
  const auto& meta = loop.state().metadata;
  const double initial = meta.count("initial_loss") ? std::stod(meta.at("initial_loss")) : NAN;
  double final_loss = recent.empty() ? NAN : 0.0;
  for (double l : recent) final_loss += l / double(recent.size());
  const auto bits = std::bit_cast<std::uint32_t>(r.last_loss);
  std::printf(
      "train_gpt: step %lld | train loss %.4f -> %.4f (mean of the last %zu steps; last "
      "0x%08x) | val loss %.4f -> %.4f | %.1f ms/step over %lld steps\n",
      (long long)r.step, initial, final_loss, recent.size(), unsigned(bits), initial_val, val,
      r.steps_this_run > 0 ? 1e3 * r.seconds / double(r.steps_this_run) : 0.0,
      (long long)r.steps_this_run);

  std::vector<std::int32_t> prompt(c.prompt.begin(), c.prompt.end());
  for (auto& t : prompt) t &= 0xff;
  if (prompt.empty()) prompt.push_back('\n');
  tk::PhiloxStream rng(std::uint64_t(c.seed), /*stream=*/0x5a3e);
  std::string sample;
  for (std::int32_t t : model.generate(exec, eval_ctx, prompt, c.sample_chars, c.temperature, rng))
    sample.push_back(t == '\n' || t == '\t' || t >= 32 ? char(t) : '?');  // no control bytes
  std::printf("---- sample (temperature %.2g, %lld bytes) ----\n%s%s\n----\n", c.temperature,
              (long long)c.sample_chars, c.prompt.c_str(), sample.c_str());

  if (!c.check) return 0;
  const bool ok = std::isfinite(final_loss) && final_loss < initial && val < initial_val;
  std::printf("train_gpt: --check %s\n", ok ? "passed" : "FAILED: the loss did not fall");
  return ok ? 0 : 3;
} catch (const std::exception& e) {
  std::string_view what =
      e.what();  // "trainkit: --steps is ..." -> "train_gpt: error: --steps ..."
  for (const std::string_view prefix : {"trainkit: ", "train_gpt: "})
    if (what.starts_with(prefix)) what.remove_prefix(prefix.size());
  std::fprintf(stderr, "train_gpt: error: %.*s\n", int(what.size()), what.data());
  return 1;
}
