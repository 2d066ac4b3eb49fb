// SPDX-License-Identifier: MIT
// The training state of the crash-safety test, shared by the child that saves it in a loop
// (ckpt_trainer crash-loop) and the test that kills the child and checks what it left: every
// value is a function of the step, so a loaded checkpoint proves its own integrity.
#pragma once

#include <cstdint>
#include <cstring>
#include <memory>
#include <string>

#include <trainkit/ckpt/train_state.hpp>
#include <trainkit/core/any_tensor.hpp>
#include <trainkit/core/rng.hpp>
#include <trainkit/nn/param_arena.hpp>

namespace ckpt_tools {

namespace tk = trainkit;

/// A model of about `mib` MiB in three parameters, a Philox stream and a tensor-valued counter.
struct CrashState {
  tk::nn::ParamArena<> arena;
  tk::PhiloxStream rng{7, 3, 0};
  std::int64_t counter = 0;
  tk::ckpt::TrainState state;

  explicit CrashState(double mib) {
    const auto big = static_cast<std::int64_t>(mib * 1024 * 1024 / 4);
    arena.add("encoder.weight", tk::Shape{big / 64, 64});
    arena.add("encoder.bias", tk::Shape{7});
    arena.add("head.weight", tk::Shape{3, 5});
    arena.finalize();
    state.model(arena)
        .add("rng", rng)
        .add(
            "counter",
            [this] {
              tk::StateDict sd;
              tk::AnyTensor t(tk::DType::kI64, tk::Shape{4});
              for (int i = 0; i < 4; ++i) {
                const std::int64_t v = counter * (i + 1);
                std::memcpy(t.data() + 8 * i, &v, 8);
              }
              sd.tensors.emplace("values", std::move(t));
              sd.set("counter", counter);
              return sd;
            },
            [this](const tk::StateDict& sd) {
              counter = sd.get_int("counter");
              const tk::AnyTensor& t = sd.tensor("values");
              for (int i = 0; i < 4; ++i) {
                std::int64_t v;
                std::memcpy(&v, t.data() + 8 * i, 8);
                TRAINKIT_CHECK(v == counter * (i + 1), "counter tensor mismatch");
              }
            });
  }

  static float value(std::int64_t step, std::int64_t i) {
    return static_cast<float>(step % 100000) + static_cast<float>(i % 1024) * 0.25f;
  }

  /// Sets everything to its value at `step`.
  void set(std::int64_t step) {
    state.step = step;
    state.epoch = step / 10;
    state.metadata["step_text"] = std::to_string(step);
    float* p = arena.params_data();
    for (std::int64_t i = 0; i < arena.buffer_numel(); ++i) p[i] = value(step, i);
    rng.seek(static_cast<std::uint64_t>(step) * 10);
    counter = step;
  }

  /// Empty string when everything holds its value at state.step, else what differs.
  std::string check() const {
    const std::int64_t step = state.step;
    if (state.epoch != step / 10) return "epoch";
    const auto it = state.metadata.find("step_text");
    if (it == state.metadata.end() || it->second != std::to_string(step)) return "metadata";
    for (const tk::nn::ParamInfo& info : arena.infos())
      for (std::int64_t i = 0; i < info.numel; ++i)
        if (arena.params_data()[info.offset + i] != value(step, info.offset + i))
          return "parameter " + info.name;
    if (rng.position() != static_cast<std::uint64_t>(step) * 10) return "rng";
    if (counter != step) return "counter";
    return {};
  }
};

}  // namespace ckpt_tools
