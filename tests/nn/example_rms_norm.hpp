// SPDX-License-Identifier: MIT
// The example layer of docs/layers.md ("Writing a layer"): RMS normalisation with a forward
// context. The document shows the code from `namespace example` to its end verbatim;
// test_writing_a_layer.cpp checks that, and the layer against float64 finite differences.
#pragma once

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <string>
#include <type_traits>
#include <vector>

#include <trainkit/amp/policy.hpp>
#include <trainkit/core/tensor_view.hpp>
#include <trainkit/error.hpp>
#include <trainkit/exec/host.hpp>
#include <trainkit/nn/param_arena.hpp>

namespace example {

namespace tk = trainkit;
namespace nn = trainkit::nn;

/// RMS normalisation over the last dimension (LLaMA's RMSNorm): y = x / rms(x) * g, with
/// rms(x) = sqrt(mean(x^2) + eps) per row and a learned gain g ("<name>.weight", ones). f32, host.
class RmsNorm {
 public:
  /// What forward saves for backward: 1 / rms(x) of each row. The caller owns it; refilling a
  /// context kept across steps reuses its memory (resize keeps a vector's capacity).
  struct Context {
    std::vector<float> inv_rms;
  };

  RmsNorm(nn::ParamArena<>& arena, const std::string& name, std::int64_t features,
          float eps = 1e-6f)
      : arena_(&arena),
        features_(features),
        eps_(eps),
        gain_(arena.add(name + ".weight", tk::Shape{features}, nn::Init::ones())) {}

  nn::ParamId weight() const noexcept { return gain_; }
  /// For nn::Sequential: the output width for an input width.
  std::int64_t out_features(std::int64_t in) const { return in; }

  /// x, y [N, C]: y = x / rms(x) * g; saves 1 / rms(x) of every row in ctx.
  template <tk::amp::Policy P = tk::amp::Fp32>
  void forward(const tk::exec::Host&, Context& ctx, tk::HostView<const float, 2> x,
               tk::HostView<float, 2> y) const {
    static_assert(std::is_same_v<tk::amp::activation_t<P>, float>, "RmsNorm computes in f32");
    const std::int64_t n = x.size(0), c = features_;
    TRAINKIT_CHECK(x.size(1) == c && y.sizes() == x.sizes(), "RmsNorm::forward: x ",
                   x.shape().to_string(), " and y ", y.shape().to_string(), " are not both [N, ", c,
                   "]");
    const float* g = arena_->param<1>(gain_).data();
    ctx.inv_rms.resize(static_cast<std::size_t>(n));
    for (std::int64_t i = 0; i < n; ++i) {
      float squares = 0.0f;
      for (std::int64_t j = 0; j < c; ++j) squares += x(i, j) * x(i, j);
      const float r = 1.0f / std::sqrt(squares / static_cast<float>(c) + eps_);
      ctx.inv_rms[static_cast<std::size_t>(i)] = r;
      for (std::int64_t j = 0; j < c; ++j) y(i, j) = x(i, j) * r * g[j];
    }
  }

  /// dg += sum_rows dy * x * r (accumulated, like every parameter gradient) and
  /// dx = r * dy * g - x * r^3 * mean(dy * g * x) (written; an absent dx is skipped).
  template <tk::amp::Policy P = tk::amp::Fp32>
  void backward(const tk::exec::Host&, const Context& ctx, tk::HostView<const float, 2> x,
                tk::HostView<const float, 2> dy, tk::HostView<float, 2> dx) {
    const std::int64_t n = x.size(0), c = features_;
    TRAINKIT_CHECK(ctx.inv_rms.size() == static_cast<std::size_t>(n) && dy.sizes() == x.sizes(),
                   "RmsNorm::backward: x ", x.shape().to_string(), " and dy ",
                   dy.shape().to_string(), " do not match the forward of the context (",
                   ctx.inv_rms.size(), " rows)");
    const float* g = arena_->param<1>(gain_).data();
    float* dg = arena_->grad<1>(gain_).data();
    for (std::int64_t i = 0; i < n; ++i) {
      const float r = ctx.inv_rms[static_cast<std::size_t>(i)];
      float dot = 0.0f;
      for (std::int64_t j = 0; j < c; ++j) dot += dy(i, j) * g[j] * x(i, j);
      for (std::int64_t j = 0; j < c; ++j) dg[j] += dy(i, j) * x(i, j) * r;
      if (dx.data() == nullptr) continue;
      const float k = r * r * r * dot / static_cast<float>(c);
      for (std::int64_t j = 0; j < c; ++j) dx(i, j) = r * dy(i, j) * g[j] - x(i, j) * k;
    }
  }

 private:
  nn::ParamArena<>* arena_;
  std::int64_t features_;
  float eps_;
  nn::ParamId gain_;
};

}  // namespace example
