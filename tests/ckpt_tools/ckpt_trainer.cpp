// SPDX-License-Identifier: MIT
// ckpt_trainer: the child process of the checkpoint tests (tests/ckpt/test_crash_resume.cpp).
//
//   ckpt_trainer train DIR STEPS [--every E] [--async] [--kill-at K] [--threads T]
//     Trains a small MLP (Linear-ReLU-Dropout-Linear, AdamW with a no-decay group, warmup +
//     cosine schedule, shuffled in-memory dataset through a Prefetcher, Philox input noise) to
//     STEPS, resuming from DIR/ckpt when it holds a checkpoint. Appends "step loss-bits" lines
//     to DIR/losses.txt and checkpoints every E steps and at the end. With --kill-at K it
//     SIGKILLs itself in the middle of the step after step K (the checkpoint of K has been
//     issued; with --async it may still be in flight).
//   ckpt_trainer crash-loop DIR MIB [--async]
//     Saves a CrashState of about MIB MiB forever (step after step, continuing from DIR's newest
//     checkpoint), until the parent kills it.
#include <fcntl.h>
#include <signal.h>
#include <unistd.h>

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <span>
#include <string>
#include <vector>

#include <trainkit/ckpt/checkpointer.hpp>
#include <trainkit/core/rng.hpp>
#include <trainkit/core/tensor.hpp>
#include <trainkit/data/prefetcher.hpp>
#include <trainkit/data/sampler.hpp>
#include <trainkit/exec/host.hpp>
#include <trainkit/nn/activation.hpp>
#include <trainkit/nn/cross_entropy.hpp>
#include <trainkit/nn/dropout.hpp>
#include <trainkit/nn/linear.hpp>
#include <trainkit/nn/param_arena.hpp>
#include <trainkit/nn/sequential.hpp>
#include <trainkit/optim/adamw.hpp>
#include <trainkit/optim/lr_schedule.hpp>

#include "ckpt_tools/crash_state.hpp"

namespace {

namespace tk = trainkit;
namespace nn = trainkit::nn;
namespace data = trainkit::data;
namespace optim = trainkit::optim;
namespace ckpt = trainkit::ckpt;

constexpr std::int64_t kFeatures = 12;
constexpr std::int64_t kClasses = 4;
constexpr std::size_t kSamples = 96;
constexpr std::size_t kBatch = 8;

/// 96 rows of 12 Philox features; the label depends on the features (learnable).
class MemDataset {
 public:
  MemDataset() {
    for (std::size_t i = 0; i < kSamples; ++i) {
      float s = 0;
      for (std::int64_t j = 0; j < kFeatures; ++j) {
        const float v = tk::philox_normal(11, 1, i * kFeatures + std::size_t(j));
        x_.push_back(v);
        s += v * float(j % 3 - 1);
      }
      y_.push_back(std::int64_t(std::fabs(s) * 1.5f) % kClasses);
    }
  }
  std::size_t size() const noexcept { return kSamples; }
  std::span<const data::FieldSpec> fields() const noexcept { return fields_; }
  void read(std::size_t i, const data::SampleRef& out) const {
    std::memcpy(out[0].data(), &x_[i * kFeatures], kFeatures * sizeof(float));
    std::memcpy(out[1].data(), &y_[i], sizeof(std::int64_t));
  }
  std::string describe(std::size_t i) const { return "memory row " + std::to_string(i); }

 private:
  std::vector<float> x_;
  std::vector<std::int64_t> y_;
  std::vector<data::FieldSpec> fields_{{"x", tk::DType::kF32, {kFeatures}},
                                       {"y", tk::DType::kI64, {}}};
};

void append_line(const std::string& path, const std::string& line) {
  const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
  if (fd < 0) std::abort();
  const std::string text = line + "\n";
  if (::write(fd, text.data(), text.size()) != static_cast<ssize_t>(text.size())) std::abort();
  ::close(fd);
}

int train(const std::string& dir, std::int64_t steps, std::int64_t every, bool async,
          std::int64_t kill_at, int threads) {
  tk::exec::Host exec(threads);
  nn::ParamArena<> arena;
  nn::Sequential net{nn::Linear(arena, "0", {.in_features = kFeatures, .out_features = 32}),
                     nn::ReLU{}, nn::Dropout({.p = 0.2f, .seed = 99, .site = 1}),
                     nn::Linear(arena, "3", {.in_features = 32, .out_features = kClasses})};
  arena.finalize();
  arena.initialize(1234);
  optim::AdamW<> opt(arena, {.lr = 3e-3, .weight_decay = 0.1},
                     {optim::no_weight_decay({"*.bias"})});
  auto schedule = optim::warmup_cosine(opt.lr_groups(), {.warmup_steps = 5, .total_steps = 60});
  MemDataset dataset;
  data::RandomSampler sampler(dataset.size(), 2024);
  data::Prefetcher loader(dataset, sampler,
                          {.batch_size = kBatch,
                           .num_workers = 2,
                           .drop_last = true,
                           .pin_memory = false,
                           .name = "train"});
  tk::PhiloxStream noise(5, 0, 0);
  nn::SoftmaxCrossEntropy<> loss_fn;

  ckpt::TrainState state;
  state.model(arena)
      .add("optimizer", opt)
      .add("schedule", *schedule)
      .add("loader", loader)
      .add("sampler", sampler)
      .add("noise", noise)
      .add("dropout", net.get<2>());
  state.metadata["run"] = "ckpt_trainer";
  ckpt::Checkpointer checkpointer(
      dir + "/ckpt", {.every_steps = every, .keep_last = 2, .async = async, .durable = false});
  if (auto info = checkpointer.resume(state))
    std::fprintf(stderr, "resumed at step %lld\n", static_cast<long long>(info->step));

  tk::Tensor<float> x(tk::Shape{std::int64_t(kBatch), kFeatures});
  tk::Tensor<float> logits(tk::Shape{std::int64_t(kBatch), kClasses});
  tk::Tensor<float> dlogits(tk::Shape{std::int64_t(kBatch), kClasses});
  float loss = 0;
  decltype(net)::Context ctx;
  nn::SoftmaxCrossEntropy<>::Context loss_ctx;
  while (state.step < steps) {
    const data::Batch b = loader.next();
    const auto bx = b.host<float, 2>("x");
    for (std::int64_t i = 0; i < x.numel(); ++i)
      x.data()[i] = bx.data()[i] + 0.05f * noise.next_normal();
    const tk::HostView<const std::int64_t, 1> y(b.host<std::int64_t, 1>("y").data(),
                                                tk::Extents<1>{{std::int64_t(kBatch)}});
    net.get<2>().set_step(static_cast<std::uint32_t>(state.step));
    arena.zero_grad();
    net.forward(exec, ctx, x.view<2>(), logits.view<2>());
    loss_fn.forward(exec, loss_ctx, logits.view<2>(), y, tk::make_view(&loss, {1}));
    loss_fn.backward(exec, loss_ctx, logits.view<2>(), y, dlogits.view<2>());
    net.backward(exec, ctx, x.view<2>(), dlogits.view<2>(), tk::HostView<float, 2>());
    opt.step(exec, optim::ClipGradNorm{1.0});
    if (kill_at >= 0 && state.step == kill_at) ::kill(::getpid(), SIGKILL);  // mid-step
    schedule->step();
    ++state.step;
    std::uint32_t bits;
    std::memcpy(&bits, &loss, 4);
    char line[64];
    std::snprintf(line, sizeof line, "%lld %08x", static_cast<long long>(state.step), bits);
    append_line(dir + "/losses.txt", line);
    checkpointer.maybe_save(state, {{"loss", double(loss)}});
  }
  if (every <= 0 || state.step % every != 0) checkpointer.save(state, {{"loss", double(loss)}});
  checkpointer.wait();
  return 0;
}

int crash_loop(const std::string& dir, double mib, bool async) {
  ckpt_tools::CrashState s(mib);
  ckpt::Checkpointer checkpointer(dir, {.keep_last = 3, .async = async, .durable = true});
  std::int64_t step = 0;
  if (auto info = checkpointer.resume(s.state)) {
    const std::string bad = s.check();
    if (!bad.empty()) {
      std::fprintf(stderr, "resumed checkpoint of step %lld is wrong: %s\n",
                   static_cast<long long>(info->step), bad.c_str());
      return 3;
    }
    step = info->step;
  }
  for (;;) {
    s.set(++step);
    checkpointer.save(s.state, {{"value", double(step % 7)}});
  }
}

}  // namespace

int main(int argc, char** argv) {
  try {
    const std::vector<std::string> args(argv + 1, argv + argc);
    const auto flag = [&](const std::string& name, const std::string& fallback) {
      for (std::size_t i = 0; i + 1 < args.size(); ++i)
        if (args[i] == name) return args[i + 1];
      return fallback;
    };
    const auto has = [&](const std::string& name) {
      for (const std::string& a : args)
        if (a == name) return true;
      return false;
    };
    if (args.size() >= 3 && args[0] == "train")
      return train(args[1], std::stoll(args[2]), std::stoll(flag("--every", "5")), has("--async"),
                   std::stoll(flag("--kill-at", "-1")), std::stoi(flag("--threads", "2")));
    if (args.size() >= 3 && args[0] == "crash-loop")
      return crash_loop(args[1], std::stod(args[2]), has("--async"));
    std::fprintf(stderr,
                 "usage: ckpt_trainer train DIR STEPS [--every E] [--async] [--kill-at K]"
                 " [--threads T] | crash-loop DIR MIB [--async]\n");
    return 2;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "ckpt_trainer: %s\n", e.what());
    return 1;
  }
}
