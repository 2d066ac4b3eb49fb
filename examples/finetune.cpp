// SPDX-License-Identifier: MIT
// finetune: transfer learning from PyTorch. Loads an MLP that PyTorch trained and saved with
// safetensors.torch.save_file (tests/fixtures/finetune/make_pretrained.py), keeps its two hidden
// layers, replaces the 10-class head with a new one for another task and trains it with the
// backbone frozen (a parameter group with lr 0), on train::Loop. --from "" starts from random
// weights instead, for comparison. Data: examples/data/make_classification.py --head-seed 200
// --classes 4 (the same features as the pretraining task, other labels).
#include <cstdio>
#include <exception>
#include <filesystem>
#include <string>

#include <trainkit/trainkit.hpp>

namespace tk = trainkit;
namespace nn = tk::nn;

/// Removes the run directory that a run created if it fails before its first step is done (a
/// --from file of other shapes, bad data), so that the corrected command starts afresh.
struct RemoveIfRefused {
  std::filesystem::path dir;
  bool made = !std::filesystem::exists(dir), started = false;
  ~RemoveIfRefused() {
    std::error_code ignored;  // the error being reported matters more than this one
    if (made && !started && std::uncaught_exceptions() > 0)
      std::filesystem::remove_all(dir, ignored);
  }
};

int main(int argc, char** argv) try {
  std::string from = "tests/fixtures/finetune/pretrained.safetensors", data = "runs/finetune_data";
  std::string out = "runs/finetune";
  std::int64_t classes = 4, epochs = 4, seed = 0;
  double lr = 3e-3;
  bool freeze = true;
  tk::train::Flags flags("finetune", "Fine-tunes a PyTorch-trained MLP's new head on DATA/*.npy.");
  flags.add("from", from, "pretrained safetensors file (\"\": random initialisation)")
      .add("data", data, "directory of {train,val}_{x,y}.npy", tk::train::kSession)
      .add("out", out, "run directory", tk::train::kSession)
      .add("classes", classes, "classes of the new task", {.at_least = 2, .at_most = 1 << 16})
      .add("epochs", epochs, "epochs (the schedule's length)", {.at_least = 1, .at_most = 1 << 20})
      .add("freeze", freeze, "train the head only")
      .add("lr", lr, "peak learning rate", {.above = 0})
      .add("seed", seed, "seed of the new head and the shuffling", {.at_least = 0});
  if (!flags.parse(argc, argv)) return 0;
  RemoveIfRefused guard{out};
  // The data setup is mlp_classifier.cpp's: each example is one file that stands alone.
  tk::data::NpyDataset train_set({{"x", data + "/train_x.npy"}, {"y", data + "/train_y.npy"}});
  tk::data::NpyDataset val_set({{"x", data + "/val_x.npy"}, {"y", data + "/val_y.npy"}});
  tk::data::RandomSampler sampler(train_set.size(), seed);
  tk::data::Prefetcher train(train_set, sampler, {.batch_size = 128, .drop_last = true});
  tk::data::SequentialSampler in_order(val_set.size());
  tk::data::Prefetcher val(val_set, in_order, {.batch_size = 512, .name = "val"});
  const auto epoch = std::int64_t(train.batches_per_epoch());
  TRAINKIT_CHECK(epochs * epoch >= 2, "finetune: --epochs ", epochs, " of ", epoch,
                 " batch of 128 is 1 step; the schedule needs at least 2 (warmup and decay)");
  tk::train::Loop loop(
      {.steps = epochs * epoch, .dir = out, .eval_every = epoch, .ckpt_every = epoch}, &flags);

  // PyTorch's nn.Sequential(Linear(32, 128), ReLU(), Linear(128, 128), ReLU(), Linear(128, C)):
  // the arena names are the state-dict names 0.weight ... 4.bias.
  nn::ParamArena<> arena;
  nn::Sequential net{nn::Linear(arena, "0", {train_set.fields()[0].shape[0], 128}), nn::ReLU{},
                     nn::Linear(arena, "2", {128, 128}), nn::ReLU{},
                     nn::Linear(arena, "4", {128, classes})};
  arena.finalize();
  arena.initialize(seed);
  if (!from.empty() && !loop.resuming()) {  // a resumed run gets every weight from its checkpoint
    const tk::ckpt::ModelLoadReport report = tk::ckpt::load_model(arena, from, {.skip = {"4.*"}});
    std::printf("finetune: loaded %zu tensors from %s; new head: %zu tensors (%lld classes)\n",
                report.loaded.size(), from.c_str(), report.skipped.size(),
                static_cast<long long>(classes));
  }
  std::vector<tk::optim::GroupRule> groups;
  if (freeze) groups.push_back({.match = {"0.*", "2.*"}, .lr = 0.0, .weight_decay = 0.0});
  tk::optim::AdamW<> opt(arena, {.lr = lr, .weight_decay = 0.01}, groups);
  // Warmup: the first epoch (a tenth of a one-epoch run).
  const std::int64_t warmup = epochs > 1 ? epoch : std::max<std::int64_t>(1, epoch / 10);
  auto schedule = tk::optim::warmup_cosine(opt.lr_groups(), {warmup, epochs * epoch});
  loop.state().add("loader", train).add("sampler", sampler);

  const auto& exec = tk::exec::Host::default_instance();
  decltype(net)::Context ctx;
  nn::SoftmaxCrossEntropy<> ce;
  nn::SoftmaxCrossEntropy<>::Context ce_ctx;
  tk::Tensor<float> logits, dlogits;
  auto step = [&](tk::train::StepContext&) {
    const tk::data::Batch b = train.next();
    const auto x = b.host<float, 2>("x");
    logits = tk::Tensor<float>(tk::Shape{x.size(0), classes});
    dlogits = tk::Tensor<float>(logits.shape());
    float loss = 0.0f;
    net.forward(exec, ctx, x, logits.view<2>());
    ce.forward(exec, ce_ctx, logits.view<2>(), b.host<std::int32_t, 1>("y"),
               tk::make_view(&loss, {1}));
    ce.backward(exec, ce_ctx, logits.view<2>(), b.host<std::int32_t, 1>("y"), dlogits.view<2>());
    net.backward(exec, ctx, x, dlogits.view<2>(), tk::HostView<float, 2>());
    guard.started = true;  // a first step that fails (labels >= --classes) removes the new run
    return loss;
  };
  auto evaluate = [&] {
    std::int64_t correct = 0;
    for (std::size_t i = 0; i < val.batches_per_epoch(); ++i) {
      const tk::data::Batch b = val.next();
      tk::Tensor<float> l(tk::Shape{b.host<float, 2>("x").size(0), classes});
      net.forward(exec, ctx, b.host<float, 2>("x"), l.view<2>());
      correct += nn::count_correct(l.view<2>(), b.host<std::int32_t, 1>("y"));
    }
    const double accuracy = double(correct) / double(val_set.size());
    std::printf("finetune: val accuracy %.2f%%\n", 100.0 * accuracy);
    return tk::ckpt::Metrics{{"val_accuracy", accuracy}};
  };
  loop.run(exec, arena, opt, tk::train::task(step, evaluate), schedule.get());
} catch (const std::exception& e) {  // trainkit::Error, or e.g. std::bad_alloc
  return tk::train::report_error("finetune", e);
}
