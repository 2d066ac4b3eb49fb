// SPDX-License-Identifier: MIT
// trainkit/nn/init.hpp: parameter initialisers (torch.nn.init's normal, uniform, constant, zeros,
// xavier_* and kaiming_*, with PyTorch's fan and gain rules). Values come from Philox keyed by
// (seed, parameter index, element), so they do not depend on threads, registration of other
// parameters' sizes or the device: a host and a device ParamArena hold the same bits.
#pragma once

#include <cmath>
#include <cstdint>
#include <limits>
#include <string>

#include "trainkit/config.hpp"
#include "trainkit/core/rng.hpp"
#include "trainkit/core/shape.hpp"
#include "trainkit/error.hpp"

TRAINKIT_NAMESPACE_BEGIN
namespace nn {

/// Which fan kaiming_* scales by (torch.nn.init's `mode`).
enum class FanMode : std::uint8_t { kFanIn, kFanOut };

/// The `a` of torch.nn.Linear's default weight init, kaiming_uniform(a = sqrt(5)): its gain
/// sqrt(2 / (1 + a^2)) = 1 / sqrt(3) makes the bound gain * sqrt(3 / fan_in) = 1 / sqrt(fan_in).
/// Spelled as a literal because std::sqrt is not constexpr.
inline constexpr float kTorchLinearKaimingA = 2.23606797749979f;

/// How to initialise one parameter. Build it with the named constructors:
/// `Init::normal(0.0f, 0.02f)`, `Init::kaiming_uniform(std::sqrt(5.0f))`, ...
struct Init {
  enum class Kind : std::uint8_t {
    kZeros,
    kConstant,        ///< every element = a
    kNormal,          ///< N(mean a, std b)
    kUniform,         ///< U[a, b)
    kXavierUniform,   ///< U[-g sqrt(6 / (fan_in + fan_out)), +...), g = a
    kXavierNormal,    ///< N(0, g sqrt(2 / (fan_in + fan_out))), g = a
    kKaimingUniform,  ///< U[-bound, bound), bound = gain sqrt(3 / fan), gain = sqrt(2 / (1 + a^2))
    kKaimingNormal,   ///< N(0, gain / sqrt(fan))
  };
  Kind kind = Kind::kZeros;
  float a = 0.0f;
  float b = 0.0f;
  FanMode mode = FanMode::kFanIn;

  static constexpr Init zeros() noexcept { return {}; }
  static constexpr Init constant(float value) noexcept { return {Kind::kConstant, value, 0.0f}; }
  static constexpr Init ones() noexcept { return constant(1.0f); }
  static constexpr Init normal(float mean = 0.0f, float std = 1.0f) noexcept {
    return {Kind::kNormal, mean, std};
  }
  static constexpr Init uniform(float low = 0.0f, float high = 1.0f) noexcept {
    return {Kind::kUniform, low, high};
  }
  static constexpr Init xavier_uniform(float gain = 1.0f) noexcept {
    return {Kind::kXavierUniform, gain, 0.0f};
  }
  static constexpr Init xavier_normal(float gain = 1.0f) noexcept {
    return {Kind::kXavierNormal, gain, 0.0f};
  }
  /// `a` is the negative slope of the leaky ReLU that follows (0: ReLU, gain sqrt(2)).
  /// PyTorch's nn.Linear default weight init is kaiming_uniform(kTorchLinearKaimingA).
  static constexpr Init kaiming_uniform(float a = 0.0f, FanMode mode = FanMode::kFanIn) noexcept {
    return {Kind::kKaimingUniform, a, 0.0f, mode};
  }
  static constexpr Init kaiming_normal(float a = 0.0f, FanMode mode = FanMode::kFanIn) noexcept {
    return {Kind::kKaimingNormal, a, 0.0f, mode};
  }
};

/// fan_in and fan_out as torch.nn.init computes them: for shape [out, in, k...], fan_in =
/// in * prod(k), fan_out = out * prod(k). Throws for rank < 2 (PyTorch raises too) and for a
/// zero dimension (a fan of 0, which the bounds would divide by), naming the parameter.
struct Fans {
  std::int64_t fan_in;
  std::int64_t fan_out;
};

inline Fans compute_fans(const Shape& shape, const std::string& name = {}) {
  TRAINKIT_CHECK(shape.rank() >= 2, "fan in/out of parameter '", name, "' with shape ",
                 shape.to_string(), ": xavier/kaiming initialisers need at least 2 dimensions");
  // A zero dimension makes a fan 0, and the bounds divide by it (or by fan_in + fan_out).
  for (int d = 0; d < shape.rank(); ++d)
    TRAINKIT_CHECK(shape[d] > 0, "fan in/out of parameter '", name, "' with shape ",
                   shape.to_string(), ": dimension ", d, " is ", shape[d],
                   "; xavier/kaiming initialisers need every dimension > 0");
  std::int64_t receptive = 1;
  for (int d = 2; d < shape.rank(); ++d) receptive *= shape[d];
  return {shape[1] * receptive, shape[0] * receptive};
}

/// The Philox stream an initialiser of parameter `index` draws from. The top word is all ones so
/// it cannot meet a dropout stream `rng_stream_id(step, site)` before step 2^32 - 1.
inline constexpr std::uint64_t init_stream_id(std::uint64_t param_index) noexcept {
  return (std::uint64_t{0xffffffffU} << 32) | (param_index & 0xffffffffU);
}

/// Fills dst[0, shape.numel()) (host memory) for the parameter number `param_index` named `name`.
/// Element i gets the i-th uniform (or normal) of Philox stream init_stream_id(param_index) under
/// `seed`. Throws for a fan-based initialiser on a parameter of rank < 2.
inline void fill_init(float* dst, const Shape& shape, const Init& init, std::uint64_t seed,
                      std::uint64_t param_index, const std::string& name = {}) {
  const std::int64_t n = shape.numel();
  if (n == 0) return;  // as torch.nn.init: initialising an empty tensor is a no-op
  const std::uint64_t stream = init_stream_id(param_index);
  auto fill_uniform = [&](float low, float high) {
    PhiloxStream rng(seed, stream);
    for (std::int64_t i = 0; i < n; ++i) dst[i] = low + (high - low) * rng.next_uniform();
  };
  auto fill_normal = [&](float mean, float std) {
    PhiloxStream rng(seed, stream);
    for (std::int64_t i = 0; i < n; ++i) dst[i] = mean + std * rng.next_normal();
  };
  auto fan = [&](FanMode mode) {
    const Fans f = compute_fans(shape, name);
    return static_cast<double>(mode == FanMode::kFanIn ? f.fan_in : f.fan_out);
  };
  switch (init.kind) {
    case Init::Kind::kZeros:
      for (std::int64_t i = 0; i < n; ++i) dst[i] = 0.0f;
      return;
    case Init::Kind::kConstant:
      for (std::int64_t i = 0; i < n; ++i) dst[i] = init.a;
      return;
    case Init::Kind::kNormal:
      // torch.nn.init.normal_ refuses std < 0 (and NaN); a non-finite value fills inf or NaN.
      TRAINKIT_CHECK(std::isfinite(init.a) && std::isfinite(init.b) && init.b >= 0.0f,
                     "normal initialiser of '", name, "': mean ", init.a, " and std ", init.b,
                     " must be finite with std >= 0");
      fill_normal(init.a, init.b);
      return;
    case Init::Kind::kUniform:
      TRAINKIT_CHECK(std::isfinite(init.a) && std::isfinite(init.b), "uniform initialiser of '",
                     name, "': low ", init.a, " and high ", init.b, " must be finite");
      TRAINKIT_CHECK(init.a <= init.b, "uniform initialiser of '", name, "': low ", init.a,
                     " > high ", init.b);
      // As torch's uniform_: a range wider than the largest float would fill inf.
      TRAINKIT_CHECK(double(init.b) - double(init.a) <= double(std::numeric_limits<float>::max()),
                     "uniform initialiser of '", name,
                     "': high - low = ", double(init.b) - double(init.a), " (low ", init.a,
                     ", high ", init.b, ") exceeds the largest float ",
                     std::numeric_limits<float>::max());
      fill_uniform(init.a, init.b);
      return;
    case Init::Kind::kXavierUniform: {
      const Fans f = compute_fans(shape, name);
      const auto bound =
          static_cast<float>(init.a * std::sqrt(6.0 / static_cast<double>(f.fan_in + f.fan_out)));
      fill_uniform(-bound, bound);
      return;
    }
    case Init::Kind::kXavierNormal: {
      const Fans f = compute_fans(shape, name);
      fill_normal(0.0f, static_cast<float>(
                            init.a * std::sqrt(2.0 / static_cast<double>(f.fan_in + f.fan_out))));
      return;
    }
    case Init::Kind::kKaimingUniform: {
      const double gain = std::sqrt(2.0 / (1.0 + double(init.a) * double(init.a)));
      const auto bound = static_cast<float>(gain * std::sqrt(3.0 / fan(init.mode)));
      fill_uniform(-bound, bound);
      return;
    }
    case Init::Kind::kKaimingNormal: {
      const double gain = std::sqrt(2.0 / (1.0 + double(init.a) * double(init.a)));
      fill_normal(0.0f, static_cast<float>(gain / std::sqrt(fan(init.mode))));
      return;
    }
  }
}

}  // namespace nn
TRAINKIT_NAMESPACE_END
