// SPDX-License-Identifier: MIT
// mlp_classifier: an MLP on .npy features and labels, trained by train::Loop: AdamW, warmup +
// cosine, clipping, TensorBoard, accuracy per epoch, checkpoints (run again to resume exactly).
// --prune 0.9 prunes the weight matrices gradually to 90% sparsity (--prune-pattern 2:4: N:M)
// and exports the pruned weights and masks for PyTorch (docs/pruning.md).
#include <algorithm>
#include <cstdio>
#include <exception>
#include <string>

#include <trainkit/trainkit.hpp>

namespace tk = trainkit;
namespace nn = tk::nn;

int main(int argc, char** argv) try {
  std::string data = "runs/mlp_data", out = "runs/mlp", pattern;
  std::int64_t hidden = 256, epochs = 8, seed = 0;
  double lr = 3e-3, prune = 0;
  tk::train::Flags flags("mlp_classifier", "Trains an MLP on DATA/{train,val}_{x,y}.npy.");
  flags.add("data", data, "directory of the .npy files", tk::train::kSession)
      .add("out", out, "run directory", tk::train::kSession)
      .add("epochs", epochs, "epochs (the schedule's length)", {.at_least = 1, .at_most = 1 << 20})
      .add("hidden", hidden, "hidden width", {.at_least = 1, .at_most = 1 << 16})
      .add("lr", lr, "peak learning rate", {.above = 0})
      .add("seed", seed, "initialisation and shuffling seed", {.at_least = 0})
      .add("prune", prune, "final sparsity of magnitude pruning (0: none)",
           {.at_least = 0, .below = 1})
      .add("prune-pattern", pattern, "N:M structured pruning, e.g. 2:4 (to 1 - N/M, or --prune)");
  if (!flags.parse(argc, argv)) return 0;
  tk::data::NpyDataset train_set({{"x", data + "/train_x.npy"}, {"y", data + "/train_y.npy"}});
  tk::data::NpyDataset val_set({{"x", data + "/val_x.npy"}, {"y", data + "/val_y.npy"}});
  tk::data::RandomSampler sampler(train_set.size(), seed);
  tk::data::Prefetcher train(train_set, sampler, {.batch_size = 128, .drop_last = true});
  tk::data::SequentialSampler in_order(val_set.size());
  tk::data::Prefetcher val(val_set, in_order, {.batch_size = 512, .name = "val"});
  const auto epoch = std::int64_t(train.batches_per_epoch());
  TRAINKIT_CHECK(epochs * epoch >= 2, "mlp_classifier: --epochs ", epochs, " of ", epoch,
                 " batch of 128 is 1 step; the schedule needs at least 2 (warmup and decay)");
  tk::train::Loop loop({.steps = epochs * epoch,
                        .dir = out,
                        .eval_every = epoch,
                        .ckpt_every = epoch,
                        .clip_grad_norm = 1},
                       &flags);
  nn::ParamArena<> arena;
  nn::Sequential net{nn::Linear(arena, "0", {train_set.fields()[0].shape[0], hidden}), nn::ReLU{},
                     nn::Linear(arena, "2", {hidden, 10})};
  arena.finalize();
  arena.initialize(seed);
  tk::optim::AdamW<> opt(arena, {.lr = lr, .weight_decay = 0.01});
  // Warmup: the first epoch (a tenth of a one-epoch run).
  const std::int64_t warmup = epochs > 1 ? epoch : std::max<std::int64_t>(1, epoch / 10);
  auto schedule = tk::optim::warmup_cosine(opt.lr_groups(), {warmup, epochs * epoch});
  loop.state().add("loader", train).add("sampler", sampler);
  // Pruning from the start to 3/4 of the run (Zhu & Gupta's cubic schedule), then fine-tuning.
  const auto [n, m] = tk::optim::parse_prune_pattern(pattern);
  const double sparsity = prune > 0 || m == 0 ? prune : 1.0 - double(n) / m;
  tk::optim::Pruner<> pruner(
      arena, {.n = n, .m = m},
      tk::optim::SparsitySchedule::gradual(sparsity, 0, epochs * epoch * 3 / 4,
                                           std::max<std::int64_t>(1, epoch / 4)));
  if (sparsity > 0) loop.state().add("pruner", pruner);
  const auto& exec = tk::exec::Host::default_instance();
  decltype(net)::Context ctx;
  nn::SoftmaxCrossEntropy<> ce;
  nn::SoftmaxCrossEntropy<>::Context ce_ctx;
  tk::Tensor<float> logits, dlogits;
  auto forward = [&](const tk::data::Batch& b, bool backward) {  // the batch's mean loss
    const auto x = b.host<float, 2>("x");
    const auto y = b.host<std::int32_t, 1>("y");
    logits = tk::Tensor<float>(tk::Shape{x.size(0), 10});
    float loss = 0.0f;
    net.forward(exec, ctx, x, logits.view<2>());
    ce.forward(exec, ce_ctx, logits.view<2>(), y, tk::make_view(&loss, {1}));
    if (backward) {
      dlogits = tk::Tensor<float>(logits.shape());
      ce.backward(exec, ce_ctx, logits.view<2>(), y, dlogits.view<2>());
      net.backward(exec, ctx, x, dlogits.view<2>(), tk::HostView<float, 2>());
      pruner.mask_gradients(exec);  // nothing to do while no weight is pruned
    }
    return loss;
  };
  auto evaluate = [&] {  // validation accuracy, one pass over val
    double correct = 0.0;
    for (std::size_t i = 0; i < val.batches_per_epoch(); ++i) {
      const tk::data::Batch b = val.next();
      forward(b, false);
      correct += double(nn::count_correct(logits.view<2>(), b.host<std::int32_t, 1>("y")));
    }
    std::printf("mlp_classifier: val accuracy %.2f%%", 100.0 * correct / double(val_set.size()));
    std::printf(sparsity > 0 ? ", sparsity %.2f%%\n" : "\n", 100.0 * pruner.sparsity());
    return tk::ckpt::Metrics{{"val_accuracy", correct / double(val_set.size())}};
  };
  auto step = [&](auto&) { return forward(train.next(), true); };
  struct Task : decltype(tk::train::task(step, evaluate)) {  // + pruning after each update
    tk::optim::Pruner<>* pruner;
    void on_optimizer_step(std::int64_t t) { pruner->step(tk::exec::Host::default_instance(), t); }
  };
  loop.run(exec, arena, opt, Task{tk::train::task(step, evaluate), &pruner}, schedule.get());
  if (sparsity == 0) return 0;
  tk::ckpt::save_pruned_model(out + "/pruned.safetensors", pruner);         // zeros where pruned
  tk::ckpt::save_pruning_masks(out + "/pruned_masks.safetensors", pruner);  // <param>_mask
  std::printf("mlp_classifier: pruned weights in %s/pruned{,_masks}.safetensors\n%s", out.c_str(),
              pruner.report().to_string().c_str());
} catch (const std::exception& e) {  // trainkit::Error, or e.g. std::bad_alloc
  return tk::train::report_error("mlp_classifier", e);
}
