// SPDX-License-Identifier: MIT
// hpsearch: hyper-parameter search over any trainer that writes <out>/metrics.jsonl (a
// train::Loop does), by train::Search with process trials: random search, ASHA or synchronous
// successive halving, K trials at a time. Everything after `--` is the trial's command, with
// {dir}, {seed}, {trial}, {max_budget} and each hyper-parameter's {name} filled in:
//   hpsearch --dir runs/search --trials 12 --parallel 2 --strategy asha --max-budget 8
//     --space 'lr=loguniform(1e-4,3e-2); hidden=choice(32,64,128)'
//     -- ./build/examples/mlp_classifier --data runs/mlp_data --out {dir} --lr {lr} --hidden
//     {hidden}
// Run the same command again to continue a search that was stopped or killed. Exit status 1 when
// no trial reported the metric (every trial failed).
#include <cstdio>
#include <string>
#include <string_view>
#include <vector>

#include <trainkit/trainkit.hpp>

namespace tk = trainkit;

int main(int argc, char** argv) try {
  std::string dir = "runs/search", strategy = "asha", metric = "val_accuracy", mode = "max";
  std::string space_text;
  std::int64_t trials = 12, parallel = 2, seed = 0, min_budget = 1, max_budget = 8, eta = 3;
  bool tensorboard = true;
  tk::train::Flags flags("hpsearch",
                         "Hyper-parameter search: hpsearch [flags] -- COMMAND {dir} {name}...\n"
                         "Each trial runs COMMAND with {dir} (its directory), {seed}, {trial},\n"
                         "{max_budget} and {name} for each --space dimension replaced; its metric\n"
                         "is read from {dir}/metrics.jsonl (the n-th line holding --metric is the\n"
                         "report at budget n). Run the same command again to continue a search.");
  flags.add("dir", dir, "search directory (search.json, results.json, tb/, trial_NNN/)")
      .add("space", space_text,
           "dimensions separated by ';' or spaces: name=uniform(a,b), loguniform(a,b), int(a,b), "
           "logint(a,b), choice(x,y,...)")
      .add("trials", trials, "trials to run", {.at_least = 1, .at_most = 1 << 20})
      .add("parallel", parallel, "trials at a time", {.at_least = 1, .at_most = 1024})
      .add("strategy", strategy, "random, asha or sh (synchronous successive halving)")
      .add("metric", metric, "the metrics.jsonl key to optimize")
      .add("mode", mode, "max or min: whether a higher or a lower metric is better")
      .add("min-budget", min_budget, "first rung (reports, e.g. epochs)", {.at_least = 1})
      .add("max-budget", max_budget,
           "a trial is complete at this budget (0: no limit, random only)", {.at_least = 0})
      .add("eta", eta, "keep the top 1/eta at each rung", {.at_least = 2, .at_most = 1 << 20})
      .add("seed", seed, "sampling seed (trial k's values depend only on it and k)",
           {.at_least = 0})
      .add("tensorboard", tensorboard, "write <dir>/tb for TensorBoard's HPARAMS tab");
  std::vector<std::string_view> args, command_args;
  bool in_command = false;
  for (int i = 1; i < argc; ++i) {
    if (!in_command && std::string_view(argv[i]) == "--") {
      in_command = true;
      continue;
    }
    (in_command ? command_args : args).emplace_back(argv[i]);
  }
  if (!flags.parse(args)) return 0;
  TRAINKIT_CHECK(!command_args.empty(),
                 "hpsearch: no trial command: give it after `--` (see "
                 "--help)");
  TRAINKIT_CHECK(!space_text.empty(),
                 "hpsearch: --space is required, e.g. --space "
                 "'lr=loguniform(1e-4,1e-1); hidden=choice(64,128)'");
  TRAINKIT_CHECK(mode == "max" || mode == "min", "hpsearch: --mode is '", mode,
                 "', not max or min");
  TRAINKIT_CHECK(!dir.empty(), "hpsearch: --dir must name the search directory");
  TRAINKIT_CHECK(!metric.empty(), "hpsearch: --metric must name a key of metrics.jsonl");
  tk::train::SearchSpace space;
  // Dimensions are separated by ';' or by spaces outside parentheses.
  std::string part;
  int depth = 0;
  for (std::size_t i = 0; i <= space_text.size(); ++i) {
    const char c = i < space_text.size() ? space_text[i] : ';';
    depth += c == '(' ? 1 : c == ')' ? -1 : 0;
    if (c == ';' || ((c == ' ' || c == '\t') && depth == 0)) {
      if (!part.empty()) space.add(part);
      part.clear();
    } else {
      part += c;
    }
  }
  tk::train::Search search(std::move(space), {.dir = dir,
                                              .seed = static_cast<std::uint64_t>(seed),
                                              .trials = static_cast<int>(trials),
                                              .parallel = static_cast<int>(parallel),
                                              .strategy = tk::train::parse_strategy(strategy),
                                              .metric = metric,
                                              .mode = mode == "max" ? tk::ckpt::MetricMode::kMax
                                                                    : tk::ckpt::MetricMode::kMin,
                                              .min_budget = min_budget,
                                              .max_budget = max_budget,
                                              .eta = static_cast<int>(eta),
                                              .tensorboard = tensorboard});
  const std::vector<std::string> command(command_args.begin(), command_args.end());
  const tk::train::SearchResult result = search.run_command(command);
  if (result.interrupted) return 0;
  const tk::train::Trial* best = result.best();
  if (best != nullptr)
    std::printf("hpsearch: best trial %d: %s = %g (%s)\n", best->id, metric.c_str(), best->metric,
                best->params.to_string().c_str());
  std::printf("hpsearch: results in %s/results.json%s\n", dir.c_str(),
              tensorboard ? (", HPARAMS: tensorboard --logdir " + dir + "/tb").c_str() : "");
  if (best == nullptr)  // every trial failed: a script must not go on as if the search had worked
    std::fprintf(stderr, "hpsearch: no trial reported %s (see the failures above)\n",
                 metric.c_str());
  return best != nullptr ? 0 : 1;
} catch (const std::exception& e) {  // trainkit::Error, or e.g. std::bad_alloc
  return tk::train::report_error("hpsearch", e);
}
