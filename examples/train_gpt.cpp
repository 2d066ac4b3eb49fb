// SPDX-License-Identifier: MIT
// train_gpt: trainkit's flagship example: a byte-level GPT (nn::Gpt) trained on text with
// train::Loop on the CPU or a GPU (--device, --precision): AdamW, warmup + cosine LR, clipping,
// llm.c token shards through a shuffling Prefetcher, TensorBoard / metrics.jsonl / MFU, exact
// --resume. Build: the CMake target (train_gpt_cuda: nvcc), or with the single header:
//   g++ -std=c++20 -O2 -I single_include examples/train_gpt.cpp -pthread -o train_gpt
// "step N" counts completed optimizer steps (step 0: the first evaluation); a resume with a
// larger --steps (no --decay-steps) follows the schedule of a run that long. `--help`: flags.
#include <algorithm>
#include <atomic>
#include <bit>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <functional>
#include <fstream>
#include <iterator>
#include <memory>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include <unistd.h>  // sysconf: the machine's memory

#include <trainkit/trainkit.hpp>

namespace {

namespace tk = trainkit;
namespace fs = std::filesystem;
namespace nn = tk::nn;
namespace data = tk::data;
using tk::train::kSession;

constexpr std::int64_t kBytes = 256;  // byte-level: every file is valid input
constexpr bool kCudaBuild = TRAINKIT_WITH_CUDA && TRAINKIT_CUDA_COMPILER;  // nvcc, CUDA tier

struct Config {
  std::int64_t steps = 300, batch = 16, seq = 64, layers = 4, dim = 128, heads = 4, seed = 1337;
  std::int64_t vocab = kBytes;
  std::int64_t warmup = 0, decay_steps = 0, log_every = 25, eval_every = 50, eval_batches = 8;
  std::int64_t ckpt_every = 100, keep = 3, sample_chars = 240, threads = 0, ranks = 1;
  double lr = 3e-3, wd = 0.1, grad_clip = 1.0, dropout = 0.0, peak_tflops = 0.0, temperature = 0.8;
  bool tie_weights = false, resume = false, allow_fresh_start = false, check = false, plan = false;
  std::string out = "runs/train_gpt", data = "/usr/share/common-licenses", prompt = "The ";
  std::string init_from, device = "cpu", precision = "fp32";
};

void add_flags(tk::train::Flags& f, Config& c) {
  constexpr double kSize = 1 << 24;  // model and batch sizes (the planner's bound)
  f.add("steps", c.steps, "train until step N", {.at_least = 1}, kSession)
      .add("batch", c.batch, "sequences per step", {.at_least = 1, .at_most = kSize})
      .add("seq", c.seq, "tokens per sequence, the context length",
           {.at_least = 2, .at_most = kSize})
      .add("layers", c.layers, "transformer blocks", {.at_least = 1, .at_most = 1 << 16})
      .add("dim", c.dim, "embedding width (a multiple of --heads)",
           {.at_least = 1, .at_most = kSize})
      .add("heads", c.heads, "attention heads", {.at_least = 1, .at_most = kSize})
      .add("vocab", c.vocab, "embedding rows; the bytes use the first 256 (50257: GPT-2's shapes)",
           {.at_least = kBytes, .at_most = kSize})
      .add("tie-weights", c.tie_weights, "lm_head shares transformer.wte's weight (GPT-2)")
      .add("init-from", c.init_from, "start from these weights (.safetensors, PyTorch names)")
      .add("device", c.device, "cpu, or cuda (a build by nvcc: the train_gpt_cuda target)",
           kSession)
      .add("precision", c.precision, "fp32, tf32, bf16 or fp16 (dynamic loss scaling)")
      .add("lr", c.lr, "peak learning rate of AdamW", {.above = 0})
      .add("seed", c.seed, "seed of initialisation, data order, dropout, sampling", {.at_least = 0})
      .add("dropout", c.dropout, "dropout after the embeddings", {.at_least = 0, .below = 1})
      .add("weight-decay", c.wd, "AdamW weight decay of the matrices", {.at_least = 0})
      .add("grad-clip", c.grad_clip, "clip the gradient norm to X, 0 = off", {.at_least = 0})
      .add("warmup", c.warmup, "linear warmup steps (0: decay-steps / 10)", {.at_least = 0})
      .add("decay-steps", c.decay_steps, "warmup + cosine length (0: --steps)", {.at_least = 0})
      .add("out", c.out, "run directory", kSession)
      .add("resume", c.resume, "continue from the newest checkpoint in OUT/ckpt that verifies",
           kSession)
      .add("allow-fresh-start", c.allow_fresh_start, "--resume without one: start over", kSession)
      .add("data", c.data, "a text file or a directory of them", kSession)
      .add("threads", c.threads, "CPU threads of the process (0: all)",
           {.at_least = 0, .at_most = 4096}, kSession)
      .add("ranks", c.ranks, "data-parallel CPU ranks as threads (mpirun/torchrun: processes)",
           {.at_least = 1, .at_most = 4096})
      .add("log-every", c.log_every, "steps per monitor summary", {.at_least = 1}, kSession)
      .add("eval-every", c.eval_every, "steps between evaluations", {.at_least = 1}, kSession)
      .add("eval-batches", c.eval_batches, "batches per evaluation (the best checkpoint's metric)",
           {.at_least = 1, .at_most = 1 << 20})
      .add("ckpt-every", c.ckpt_every, "steps between checkpoints", {.at_least = 1}, kSession)
      .add("keep", c.keep, "checkpoints kept besides the best (0: every one)",
           {.at_least = 0, .at_most = 1 << 20}, kSession)
      .add("sample-chars", c.sample_chars, "bytes generated at the end (0: none)",
           {.at_least = 0, .at_most = 1 << 20}, kSession)
      .add("temperature", c.temperature, "sampling temperature (0: greedy)", {.at_least = 0},
           kSession)
      .add("prompt", c.prompt, "start of the generated text", kSession)
      .add("peak-tflops", c.peak_tflops, "peak for MFU (0: measured)",
           {.at_least = 0, .at_most = 1e9}, kSession)
      .add("check", c.check, "exit 3 unless the train and val losses fell", kSession)
      .add("plan", c.plan, "print memory, fit, time and cost of this run per device, and exit",
           kSession);
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

/// The bytes of a regular file, or of every regular file under a directory (symbolic links
/// skipped, so /usr/share/common-licenses/GPL does not repeat GPL-3), in path order; at most
/// kMaxCorpusBytes (it is held in memory twice: as text and as tokens).
constexpr std::uintmax_t kMaxCorpusBytes = std::uintmax_t{1} << 31;
std::string read_corpus(const fs::path& path) {
  std::error_code ec;
  std::vector<fs::path> files;
  if (fs::is_directory(path, ec)) {
    fs::recursive_directory_iterator it(path, ec), end;
    for (; !ec && it != end; it.increment(ec))
      if (it->symlink_status(ec).type() == fs::file_type::regular) files.push_back(it->path());
    TRAINKIT_CHECK(!ec, "--data: cannot list the files under '", path.string(),
                   "': ", ec.message());
    std::sort(files.begin(), files.end());
  } else {
    // Not a device, pipe or socket: those have no end, or no size to check first.
    TRAINKIT_CHECK(fs::is_regular_file(path, ec), "--data '", path.string(), "' is ",
                   fs::exists(path, ec) ? "not a regular file or a directory" : "missing");
    files.push_back(path);
  }
  std::uintmax_t total = 0;
  for (const fs::path& f : files) {
    const std::uintmax_t bytes = fs::file_size(f, ec);
    TRAINKIT_CHECK(!ec, "--data: cannot read '", f.string(), "': ", ec.message());
    total += bytes;
    TRAINKIT_CHECK(total <= kMaxCorpusBytes, "--data '", path.string(), "' holds more than ",
                   kMaxCorpusBytes >> 20, " MiB of text; train_gpt reads its corpus into memory");
  }
  std::string text;
  text.reserve(std::size_t(total));
  for (const fs::path& f : files) {
    std::ifstream in(f, std::ios::binary);
    TRAINKIT_CHECK(in.good(), "--data: cannot read '", f.string(), "'");
    text.append(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
    TRAINKIT_CHECK(text.size() <= kMaxCorpusBytes, "--data: '", f.string(),
                   "' grew while it was read");
  }
  return text;
}

/// Throws, naming the size flags, when the run's parameters, gradients, AdamW state and
/// activations (what --plan lists) would not fit this machine's memory: a clear message instead of
/// a failed allocation deep inside the model. The parameters are estimated first in floating
/// point, so the planner never builds an absurd model.
void check_host_memory(const Config& c) {
  const long pages = ::sysconf(_SC_PHYS_PAGES), page = ::sysconf(_SC_PAGESIZE);
  if (pages <= 0 || page <= 0) return;
  const double have = double(pages) * double(page);
  const double C = double(c.dim), V = double(c.vocab);
  const double params = V * C * (c.tie_weights ? 1 : 2) + double(c.seq) * C +
                        double(c.layers) * (12 * C * C + 13 * C) + 2 * C;
  const auto fail = [&](double need) {
    TRAINKIT_FAIL("--layers ", c.layers, ", --dim ", c.dim, ", --vocab ", c.vocab, ", --seq ",
                  c.seq, ", --batch ", c.batch, " and --ranks ", c.ranks, " need about ",
                  std::ceil(need / double(1 << 30)),
                  " GiB of memory (--plan itemises it); this machine has ",
                  std::floor(have / double(1 << 30)), " GiB");
  };
  if (16 * params * double(c.ranks) > have) fail(16 * params * double(c.ranks));
  const tk::plan::GptRun run =
      tk::plan::train_gpt_run(c.layers, c.dim, c.heads, c.seq, c.batch, c.tie_weights, c.precision,
                              c.dropout, false, c.vocab, c.ranks);
  const double need = double(tk::plan::gpt_memory(run).total_bytes()) * double(c.ranks);
  if (need > have) fail(need);
}

/// What main prepares for train(): the settings, the loop, the datasets and the rank.
struct Run {
  Config& c;
  tk::train::Loop& loop;
  tk::dist::Comm* comm;  // data parallel: this rank's communicator (null: one process)
  std::size_t corpus_bytes;
  const data::TokenShardDataset &train_set, &val_set;
  bool extend;  // a resume with a longer schedule (from planned_decay to c.steps)
  std::int64_t planned_decay;
  std::atomic<bool>& started;  // set when the first step is about to run
};

/// Builds the model, optimizer and data on `exec` (host or GPU) in policy P, and trains.
template <class P, class E>
int train(Run& run, const E& exec) {
  constexpr tk::Space S = tk::exec::is_cuda_executor_v<E> ? tk::Space::kDevice : tk::Space::kHost;
  Config& c = run.c;
  const int rank = run.loop.rank(), world = run.comm != nullptr ? run.comm->world_size() : 1;
  const auto say = [&](const char* format, auto... args) {  // rank 0 speaks for the run
    if (rank == 0) std::printf(format, args...);
  };
  nn::ParamArena<S> arena;
  nn::Gpt<S> model(arena, {.vocab_size = c.vocab,
                           .block_size = c.seq,
                           .n_layer = c.layers,
                           .n_head = c.heads,
                           .n_embd = c.dim,
                           .tie_weights = c.tie_weights,
                           .dropout = float(c.dropout),
                           .seed = std::uint64_t(c.seed) ^ std::uint64_t(rank) << 32});
  arena.finalize();
  arena.initialize(std::uint64_t(c.seed));
  if (!c.init_from.empty() &&
      !run.loop.resuming()) {  // a resumed run's weights are its checkpoint's
    // A tied model's one head/embedding tensor may be stored under either name, or under both
    // with equal values (PyTorch's state_dict lists both names). F16, BF16 and F64 files (a
    // PyTorch model saved in half precision) are rounded to F32.
    using Tied = std::pair<std::string, std::string>;
    const auto r = [&] {
      try {
        return tk::ckpt::load_model(
            arena, c.init_from,
            {.tied = c.tie_weights ? std::vector<Tied>{{"lm_head.weight", "transformer.wte.weight"}}
                                   : std::vector<Tied>{},
             .convert_dtype = true,
             .remedy = "--init-from takes a file of this model's names and shapes: check "
                       "--layers, --dim, --heads, --vocab and --tie-weights"});
      } catch (const tk::Error& e) {  // a file that is missing or not safetensors: name the flag
        std::string_view why = e.what();
        if (why.starts_with("trainkit: ")) why.remove_prefix(10);
        TRAINKIT_FAIL("--init-from: ", why);
      }
    }();
    say("train_gpt: --init-from %s: loaded %zu tensors (%zu rounded to F32), %zu of the file "
        "unused\n",
        c.init_from.c_str(), r.loaded.size(), r.converted.size(), r.unexpected.size());
  }
  tk::optim::AdamW<S> opt(arena, {.lr = c.lr, .beta1 = 0.9, .beta2 = 0.95, .weight_decay = c.wd},
                          {tk::optim::no_weight_decay({"*.bias", "*ln_*"})});
  const tk::optim::WarmupCosineOptions plan{
      .warmup_steps = c.warmup, .total_steps = c.decay_steps, .eta_min = 0.1 * c.lr};
  auto schedule = tk::optim::warmup_cosine(opt.lr_groups(), plan);
  data::DistributedSampler sampler(
      run.train_set.size(),
      {.world_size = std::size_t(world), .rank = std::size_t(rank), .seed = std::uint64_t(c.seed)});
  auto loader = data::make_prefetcher(exec, run.train_set, sampler,
                                      {.batch_size = std::size_t(c.batch), .drop_last = true});
  auto val = data::make_prefetcher(exec, run.val_set, data::SequentialSampler(run.val_set.size()),
                                   {.batch_size = std::size_t(c.batch)});
  run.loop.state().add("loader", *loader).add("sampler", sampler).add("dropout", model.dropout());

  std::string where = "cuda";
  if constexpr (S == tk::Space::kHost) where = std::to_string(exec.num_threads()) + " threads";
  if (world > 1)
    where = std::to_string(world) + " ranks (" + std::string(run.comm->backend()) + ") x " + where;
  say("train_gpt: %lld parameters (%lld layers, dim %lld, %lld heads, context %lld%s) | "
      "%zu-byte corpus: %zu train, %zu val windows | %s, %s\n",
      (long long)arena.num_parameters(), (long long)c.layers, (long long)c.dim, (long long)c.heads,
      (long long)c.seq, c.tie_weights ? ", tied head" : "", run.corpus_bytes, run.train_set.size(),
      run.val_set.size(), where.c_str(), c.precision.c_str());
  const std::int64_t tokens = c.batch * c.seq * world;  // per step, all ranks together
  tk::monitor::MonitorOptions& mo = run.loop.monitor_options();
  mo.log_every = c.log_every;
  mo.chrome_trace = (fs::path(c.out) / "trace.json").string();
  mo.tokens_per_step = double(tokens);
  mo.flops_per_step = tk::monitor::transformer_flops_per_step(
      double(model.matmul_parameters()), int(c.layers), int(c.heads), int(c.dim / c.heads),
      int(c.seq), double(tokens));
  for (int i = 0; i < 4; ++i)  // the precision picks the GPU's peak
    if (c.precision == precision_name(tk::monitor::Precision(i)))
      mo.precision = decltype(mo.precision)(i);
  mo.peak_flops = 1e12 * c.peak_tflops;  // 0: the GPU's table entry, or measured on the CPU
  if constexpr (S == tk::Space::kHost) {
    if (c.peak_tflops == 0)
      mo.peak_flops = world * tk::monitor::measure_cpu_peak_flops(exec.num_threads());
    mo.peak_label = c.peak_tflops > 0 ? "configured" : "measured: FMA rate of the threads";
  }

  constexpr bool fp16 = std::is_same_v<P, tk::amp::Fp16>;  // loss scaling, skipping overflows
  auto scaler = [&] {
    if constexpr (fp16) return tk::optim::DynamicScaler(exec);
    else return tk::amp::NoScaler{};
  }();
  const float* loss_scale = nullptr;
  if constexpr (fp16) loss_scale = scaler.scale_data();
  auto on_resume = [&](const tk::ckpt::CheckpointInfo& info) {
    if (!run.extend) return;
    say("train_gpt: the schedule now decays until step %lld (--decay-steps %lld keeps it)\n",
        (long long)c.steps, (long long)run.planned_decay);
    tk::optim::replay_schedule(*schedule, opt.lr_groups(), info.step, [&](auto& groups) {
      return tk::optim::warmup_cosine(groups, plan);
    });
  };
  tk::train::CausalLmTask<nn::Gpt<S>, P> task(exec, model, arena,
                                              {.train = loader.get(),
                                               .val = val.get(),
                                               .loss_scale = loss_scale,
                                               .on_resume = on_resume,
                                               .comm = run.comm});
  run.started = true;
  const tk::train::LoopResult r = run.loop.run(exec, arena, opt, task, schedule.get(), scaler);

  const double last_val =
      r.last_eval.count("val/loss") ? r.last_eval.at("val/loss") : task.evaluate().at("val/loss");
  const double first_val = r.first_eval.count("val/loss") ? r.first_eval.at("val/loss") : NAN;
  say("train_gpt: step %lld | train loss %.4f -> %.4f (mean of the last %d steps; last 0x%08x) | "
      "val loss %.4f -> %.4f | %.1f ms/step over %lld steps\n",
      (long long)r.step, r.first_loss, r.recent_loss, r.recent_count,
      unsigned(std::bit_cast<std::uint32_t>(r.last_loss)), first_val, last_val,
      r.steps_this_run > 0 ? 1e3 * r.seconds / double(r.steps_this_run) : 0.0,
      (long long)r.steps_this_run);

  const bool ok = r.recent_loss < r.first_loss && last_val < first_val;
  if (rank != 0) return c.check && !ok ? 3 : 0;
  if (c.sample_chars > 0) {  // --sample-chars 0: no sample
    std::vector<std::int32_t> prompt(c.prompt.begin(), c.prompt.end());
    for (auto& t : prompt) t &= 0xff;
    if (prompt.empty()) prompt.push_back('\n');
    tk::PhiloxStream rng(std::uint64_t(c.seed), /*stream=*/0x5a3e);
    std::string sample;
    task.refresh_weights();
    typename nn::Gpt<S>::Context gen;
    for (std::int32_t t :
         model.template generate<P>(exec, gen, prompt, c.sample_chars, c.temperature, rng))
      sample.push_back(t == '\n' || t == '\t' || (t >= 32 && t < kBytes) ? char(t) : '?');
    std::printf("---- sample (temperature %.2g, %lld bytes) ----\n%s%s\n----\n", c.temperature,
                (long long)c.sample_chars, c.prompt.c_str(), sample.c_str());
  }

  if (!c.check) return 0;
  std::printf("train_gpt: --check %s\n", ok ? "passed" : "FAILED: the loss did not fall");
  return ok ? 0 : 3;
}

/// Parses the flags (again: each rank keeps its own, which a resume may replace), then prepares
/// the data and the loop and trains as this rank of `comm` (null: one process); sets `started`
/// before the first step.
int prepare_and_train(Config& c, tk::train::Flags& flags, const std::string& text,
                      tk::dist::Comm* comm, tk::dist::Comm* ckpt_comm, int threads,
                      std::atomic<bool>& started) {
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
                        .allow_fresh_start = c.allow_fresh_start,
                        .fresh_start_setting = "--allow-fresh-start",
                        .comm = comm,
                        .checkpoint_comm = ckpt_comm},
                       &flags);  // on resume the run's flags are the checkpoint's from here on
  TRAINKIT_CHECK(!loop.resuming() || loop.resuming()->step < c.steps, "--resume: the checkpoint ",
                 loop.resuming() ? loop.resuming()->path.string() : "", " is at step ",
                 loop.resuming() ? loop.resuming()->step : 0, ", not before --steps ", c.steps,
                 ": give a larger --steps to train on");
  const std::int64_t planned_decay = c.decay_steps;
  const bool extend = loop.resuming() && c.steps > c.decay_steps && !flags.given("decay-steps");
  if (extend) c.decay_steps = c.steps;  // the next checkpoints save the longer schedule
  c = resolved(c);

  // The corpus, split 90/10 and written as token shards (by rank 0), read back as windows of
  // T + 1 tokens.
  const std::size_t split = text.size() - text.size() / 10;
  const std::int64_t world = comm != nullptr ? comm->world_size() : 1;
  const std::size_t windows = split - std::size_t(c.seq);  // of T + 1 tokens, every offset
  TRAINKIT_CHECK(std::size_t(c.batch) <= windows / std::size_t(world), "--batch ", c.batch,
                 world > 1 ? " on each of " + std::to_string(world) + " ranks" : std::string(),
                 " is more than the corpus gives: ", windows, " training windows of --seq ", c.seq,
                 " + 1 bytes");
  if (loop.rank() == 0) {
    fs::create_directories(out / "data");
    std::vector<std::uint16_t> bytes(text.begin(), text.end());
    for (auto& b : bytes) b &= 0xff;  // bytes, not signed chars
    // A resumed run continues on its own corpus: the tokens of the shards it wrote must be these.
    for (const bool train : {true, false}) {
      const fs::path shard = out / "data" / (train ? "train.bin" : "val.bin");
      const auto tokens = train ? std::span(bytes).first(split) : std::span(bytes).subspan(split);
      if (!loop.resuming() || !fs::exists(shard)) {
        data::write_token_shard(shard, tokens);
        continue;
      }
      const tk::io::MappedFile then(shard);
      const auto saved = then.bytes();
      const bool same =
          saved.size() == data::kTokenShardHeaderBytes + tokens.size_bytes() &&
          std::ranges::equal(saved.subspan(data::kTokenShardHeaderBytes), std::as_bytes(tokens));
      TRAINKIT_CHECK(same, "--data '", c.data, "' is not the corpus this run was trained on (",
                     shard.string(), " differs); resume with the same --data");
    }
  }
  if (comm != nullptr) comm->barrier().wait();
  const auto T = static_cast<std::size_t>(c.seq);
  const data::TokenShardDataset train_set(std::vector{out / "data" / "train.bin"},
                                          {.seq_len = T, .stride = 1});  // every offset
  // Validation: eval_batches * batch windows spread evenly over the shard, the same each time.
  const std::size_t val_tokens = text.size() - split - T - 1;
  const std::size_t want = std::min(std::size_t(c.eval_batches * c.batch), val_tokens / T + 1);
  const data::TokenShardDataset val_set(
      std::vector{out / "data" / "val.bin"},
      {.seq_len = T, .stride = want > 1 ? std::max(T, val_tokens / (want - 1)) : T});

  Run run{c, loop, comm, text.size(), train_set, val_set, extend, planned_decay, started};
  const auto train_on = [&](const auto& exec) {  // one run-time choice of the policy
    return tk::amp::visit_policy(c.precision, [&]<class P>() { return train<P>(run, exec); });
  };
#if TRAINKIT_WITH_CUDA && TRAINKIT_CUDA_COMPILER
  if (c.device == "cuda") return train_on(tk::exec::Cuda());
#endif
  return train_on(threads > 0 ? tk::exec::Host(threads) : tk::exec::Host());
}

/// Trains as this rank of `comm` (null: one process); sets `started` before the first step.
int train_rank(int argc, char** argv, tk::dist::Comm* comm, tk::dist::Comm* ckpt_comm, int threads,
               std::atomic<bool>& started) {
  Config c;
  tk::train::Flags flags("train_gpt", "Trains a byte-level GPT on text with trainkit.");
  add_flags(flags, c);
  flags.parse(argc, argv);
  const std::string text = read_corpus(c.data);
  TRAINKIT_CHECK(text.size() / 10 > std::size_t(c.seq) + 1, "the corpus (", text.size(),
                 " bytes) is too small for --seq ", c.seq);
  return prepare_and_train(c, flags, text, comm, ckpt_comm, threads, started);
}

/// Trains as one process, as this process's rank under torchrun / mpirun / srun, or as --ranks
/// threads; sets `started` when a rank is about to run its first step.
int train_ranks(int argc, char** argv, const Config& c, const tk::dist::LaunchInfo& launch,
                int cores, std::atomic<bool>& started) {
  // Under torchrun, mpirun or srun each process is a rank (NCCL on GPUs, MPI or TCP on CPUs).
  if (launch.world_size > 1) {
    TRAINKIT_CHECK(c.ranks == 1, "--ranks ", c.ranks, ": ", launcher_name(launch.launcher),
                   " already started ", launch.world_size, " processes, one rank each");
    tk::dist::Context ctx =
        tk::dist::init({.space = c.device == "cuda" ? tk::Space::kDevice : tk::Space::kHost});
    const int threads =
        c.threads > 0 ? int(c.threads) : std::max(1, cores / std::max(1, launch.local_world_size));
    return train_rank(argc, argv, &ctx.comm(), nullptr, threads, started);
  }
  if (c.ranks == 1) return train_rank(argc, argv, nullptr, nullptr, int(c.threads), started);
  // --ranks N: N threads of this process, each a rank with its share of the threads; a second
  // group of communicators carries the checkpoints' barriers (written in the background).
  const int n = int(c.ranks), threads = std::max(1, int(c.threads > 0 ? c.threads : cores) / n);
  auto ckpt_group = std::make_shared<tk::dist::ThreadGroup>(n);
  std::atomic<int> rc{0};
  tk::dist::ThreadComm::run(n, [&](tk::dist::ThreadComm& comm) {
    tk::dist::ThreadComm ckpt(ckpt_group, comm.rank());
    const int r = train_rank(argc, argv, &comm, &ckpt, threads, started);
    if (comm.rank() == 0) rc = r;
  });
  return rc;
}

}  // namespace

int main(int argc, char** argv) try {
  std::setvbuf(stdout, nullptr, _IOLBF, 0);  // a killed run's log ends at its last line
  Config c;
  tk::train::Flags flags("train_gpt", "Trains a byte-level GPT on text with trainkit.");
  add_flags(flags, c);
  if (!flags.parse(argc, argv)) return 0;  // --help; bad flags throw before anything is written
  TRAINKIT_CHECK(!c.out.empty(), "--out must name the run directory");
  for (fs::path p = c.out; !p.empty(); p = p.parent_path()) {  // a file on the way: refused now
    std::error_code ec;
    const fs::file_status s = fs::status(p, ec);
    TRAINKIT_CHECK(!fs::exists(s) || fs::is_directory(s), "--out '", c.out, "': '", p.string(),
                   "' is a file, not a directory");
    if (p == p.parent_path()) break;
  }
  // A resumed run keeps its saved run flags (--ranks among them, needed before the ranks start).
  const bool saved = c.resume && !c.plan && tk::train::Loop::adopt_saved_flags(flags, c.out);
  TRAINKIT_CHECK(c.dim % c.heads == 0, "--dim ", c.dim, " is not a multiple of --heads ", c.heads);
  tk::amp::visit_policy(c.precision, [&]<class P>() { return 0; });  // a bad --precision throws
  TRAINKIT_CHECK(c.device == "cpu" || c.device == "cuda", "--device '", c.device,
                 "' is not cpu or cuda");
  if (c.plan) {  // what this run needs on each device; nothing is read, written or trained;
                 // --device cuda plans for a GPU on any machine
    const tk::plan::GptRun run =
        tk::plan::train_gpt_run(c.layers, c.dim, c.heads, c.seq, c.batch, c.tie_weights,
                                c.precision, c.dropout, c.device == "cuda", c.vocab, c.ranks);
    std::fputs(tk::plan::to_text(tk::plan::gpt(run, {})).c_str(), stdout);
    return 0;
  }
  TRAINKIT_CHECK(c.device == "cpu" || (c.device == "cuda" && kCudaBuild), "--device '", c.device,
                 "' is not cpu or, in an nvcc build (train_gpt_cuda), cuda");
  TRAINKIT_CHECK(c.device == "cpu" || tk::cuda::device_count() > 0, "--device cuda: no GPU here");
  TRAINKIT_CHECK(c.device == "cpu" || c.ranks == 1, "--ranks ", c.ranks,
                 " runs CPU ranks as threads; on GPUs start one process per GPU (torchrun or "
                 "mpirun)");
  if (c.device == "cpu") check_host_memory(c);
  if (!saved) resolved(c);  // a resumed run's schedule is checked once its Loop has adopted it

  const tk::dist::LaunchInfo launch = tk::dist::detect_launch();
  const int cores = int(std::max(1u, std::thread::hardware_concurrency()));
  // A run that fails before its first step (a bad --init-from, a corpus too small for --batch)
  // removes the run directory it created, once its ranks have stopped, so that the corrected
  // command starts as if it had never run.
  const bool made_dir = !fs::exists(c.out);
  std::atomic<bool> started{false};
  try {
    return train_ranks(argc, argv, c, launch, cores, started);
  } catch (...) {
    if (made_dir && !started && launch.rank == 0) {
      std::error_code ignored;  // the error being reported matters more than this one
      fs::remove_all(c.out, ignored);
    }
    throw;
  }
} catch (const std::exception& e) {  // "trainkit: --steps ..." -> "train_gpt: error: --steps ..."
  return tk::train::report_error("train_gpt", e);
}
