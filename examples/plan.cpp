// SPDX-License-Identifier: MIT
// plan: which GPU, how much memory, how long and what it costs to train a GPT with trainkit,
// before training. Prints the per-rank memory breakdown of a nn::Gpt run (what trainkit will
// allocate, line by line) and a device table: fits or not with a headroom, the largest batch that
// fits, the step time at an MFU, tokens/s, and the time and cost of a token budget.
//
//   plan --layers 12 --dim 768 --heads 12 --seq 1024 --batch 8 --precision bf16 --ranks 8
//        --tokens 10e9 --price H100=2.5 --price H200=3.5
//
// --price may be given more than once (or as H100=2.5,H200=3.5); --json prints the report as
// JSON instead. See docs/planning.md.
#include <cstdio>
#include <string>
#include <string_view>
#include <vector>

#include <trainkit/plan/planner.hpp>
#include <trainkit/train/flags.hpp>

namespace tk = trainkit;
namespace plan = trainkit::plan;

int main(int argc, char** argv) try {
  std::int64_t layers = 12, dim = 768, heads = 12, seq = 1024, batch = 8, ranks = 1;
  std::int64_t vocab = 50257, depth = 4;
  double tokens = 0.0, mfu = 0.0, headroom = 0.1, dropout = 0.0, cpu_peak_tflops = 0.0;
  bool tie = false, bf16_compression = false, json = false, evaluation = false, bias = true;
  bool bf16_state = false;
  std::string precision = "bf16", run_dir;
  tk::train::Flags flags("plan",
                         "Memory, fit, time and cost of training a trainkit GPT on each device.");
  using tk::train::kSession;
  flags.add("layers", layers, "transformer blocks", kSession)
      .add("dim", dim, "embedding width (a multiple of --heads)", kSession)
      .add("heads", heads, "attention heads", kSession)
      .add("seq", seq, "tokens per sequence, the context length", kSession)
      .add("batch", batch, "sequences per rank per step", kSession)
      .add("vocab", vocab, "vocabulary size (GPT-2: 50257; train_gpt: 256)", kSession)
      .add("tie-weights", tie, "lm_head shares transformer.wte's weight", kSession)
      .add("bias", bias, "biases in the blocks' Linear and LayerNorm layers (--no-bias: none)",
           kSession)
      .add("dropout", dropout, "dropout after the embeddings (keeps one more activation)",
           {.at_least = 0, .at_most = 1}, kSession)
      .add("precision", precision, "fp32, tf32, bf16 or fp16", kSession)
      .add("bf16-state", bf16_state, "AdamW moments in bf16", kSession)
      .add("ranks", ranks, "data-parallel ranks (GPUs)", kSession)
      .add("bf16-compression", bf16_compression, "all-reduce gradients in bf16 (staging buffer)",
           kSession)
      .add("loader-depth", depth, "batch slots of the data loader (0: not counted)", kSession)
      .add("eval", evaluation, "count evaluation (a second context, a validation loader)", kSession)
      .add("tokens", tokens, "token budget for time and cost (0: none)", kSession)
      .add("mfu", mfu, "model FLOPs utilization, a fraction (0: --run-dir's or 0.4)", kSession)
      .add("run-dir", run_dir, "a finished run whose metrics.jsonl MFU to use", kSession)
      .add("headroom", headroom, "fraction of memory kept free", kSession)
      .add("cpu-peak-tflops", cpu_peak_tflops, "this CPU's peak (0: measure it)", kSession)
      .add("json", json, "print the report as JSON", kSession);
  // --price may repeat (Flags takes each flag once): gather every occurrence first.
  std::string prices;
  std::vector<const char*> rest{argv[0]};
  for (int i = 1; i < argc; ++i) {
    const std::string_view a = argv[i];
    if (a == "--price") {
      TRAINKIT_CHECK(i + 1 < argc, "--price needs a value such as H100=2.5");
      prices += std::string(prices.empty() ? "" : ",") + argv[++i];
    } else if (a.starts_with("--price=")) {
      prices += std::string(prices.empty() ? "" : ",") + std::string(a.substr(8));
    } else {
      rest.push_back(argv[i]);
    }
  }
  if (!flags.parse(int(rest.size()), rest.data())) {
    std::printf(
        "  --price DEVICE=$  dollars per GPU-hour (repeatable; devices: H200, H100, "
        "A100-80GB, A100-40GB or A100, L40S, RTX4090, gpu, cpu)\n");
    return 0;
  }
  TRAINKIT_CHECK(depth == 0 || depth >= 2, "--loader-depth ", depth,
                 " is not 0 (not counted) or a number of slots >= 2");
  plan::GptRun run;
  run.model = {.vocab_size = vocab,
               .block_size = seq,
               .n_layer = layers,
               .n_head = heads,
               .n_embd = dim,
               .bias = bias,
               .tie_weights = tie,
               .dropout = float(dropout)};
  run.seq = seq;
  run.batch = batch;
  run.precision = plan::parse_precision(precision);
  run.adamw.bf16_state = bf16_state;
  run.ranks = ranks;
  run.bf16_compression = bf16_compression;
  run.loader_depth = depth;
  run.evaluation = evaluation;
  plan::check_run(run);

  plan::PlanOptions options;
  options.mfu = mfu;
  options.run_dir = run_dir;
  options.headroom = headroom;
  options.tokens = tokens;
  options.cpu_peak_flops = 1e12 * cpu_peak_tflops;
  std::vector<plan::Device> priced = options.devices;
  if (const auto gpu = plan::detected_gpu()) priced.push_back(*gpu);
  priced.push_back(plan::this_cpu(0.0));
  options.prices = plan::parse_prices(prices, priced);
  const plan::Report report = plan::gpt(run, options);
  std::fputs((json ? plan::to_json(report) + "\n" : plan::to_text(report)).c_str(), stdout);
  return 0;
} catch (const std::exception& e) {  // "trainkit: plan: --mfu ..." -> "plan: error: --mfu ..."
  return tk::train::report_error("plan", e);
}
