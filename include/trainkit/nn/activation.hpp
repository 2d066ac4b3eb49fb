// SPDX-License-Identifier: MIT
// trainkit/nn/activation.hpp: the element-wise activations ReLU and GELU (tanh approximation, as
// GPT-2 and PyTorch's approximate='tanh'). One TRAINKIT_HOST_DEVICE functor per direction runs
// through exec::launch on CPU threads or as a CUDA grid-stride kernel; math is f32 whatever the
// storage type. No parameters and no saved state: backward reads the forward's input x.
#pragma once

#include <cstdint>
#include <type_traits>

#include "trainkit/amp/policy.hpp"
#include "trainkit/config.hpp"
#include "trainkit/core/tensor_view.hpp"
#include "trainkit/error.hpp"
#include "trainkit/exec/launch.hpp"
#include "trainkit/nn/layer.hpp"
#include "trainkit/nn/math.hpp"

TRAINKIT_NAMESPACE_BEGIN
namespace nn {
namespace detail {

template <class T>
struct ReluForward {
  const T* x;
  T* y;
  TRAINKIT_HOST_DEVICE TRAINKIT_FORCEINLINE void operator()(std::int64_t i) const {
    const float v = load(x[i]);
    y[i] = store<T>(v < 0.0f ? 0.0f : v);  // NaN stays NaN, as torch.relu
  }
};

template <class T, bool Accumulate>
struct ReluBackward {
  const T* x;
  const T* dy;
  T* dx;
  TRAINKIT_HOST_DEVICE TRAINKIT_FORCEINLINE void operator()(std::int64_t i) const {
    // Zero where x <= 0, as PyTorch's threshold_backward: at x = NaN the gradient passes.
    float g = load(x[i]) <= 0.0f ? 0.0f : load(dy[i]);
    if constexpr (Accumulate) g += load(dx[i]);
    dx[i] = store<T>(g);
  }
};

template <class T>
struct GeluForward {
  const T* x;
  T* y;
  TRAINKIT_HOST_DEVICE TRAINKIT_FORCEINLINE void operator()(std::int64_t i) const {
    y[i] = store<T>(gelu_approx(load(x[i])));
  }
};

template <class T, bool Accumulate>
struct GeluBackward {
  const T* x;
  const T* dy;
  T* dx;
  TRAINKIT_HOST_DEVICE TRAINKIT_FORCEINLINE void operator()(std::int64_t i) const {
    float g = load(dy[i]) * gelu_grad_approx(load(x[i]));
    if constexpr (Accumulate) g += load(dx[i]);
    dx[i] = store<T>(g);
  }
};

/// Checks that views of an element-wise op have one shape and are contiguous.
template <class VA, class VB>
void check_same_shape(const char* who, const char* a_name, const VA& a, const char* b_name,
                      const VB& b) {
  TRAINKIT_CHECK(a.sizes() == b.sizes(), who, ": ", a_name, " has shape ", shape_of(a), " but ",
                 b_name, " has shape ", shape_of(b));
  check_contiguous(who, a_name, a);
  check_contiguous(who, b_name, b);
}

/// Throws when the contiguous view `out` shares memory with `in` other than by being it: each
/// thread of an element-wise launch would then read elements another one already wrote, and the
/// result would depend on the schedule. Exactly in place (out == in) is fine.
template <class VO, class VI>
void check_elementwise_apart(const char* who, const char* out_name, const VO& out,
                             const char* in_name, const VI& in) {
  const auto o = reinterpret_cast<std::uintptr_t>(out.data());
  const auto i = reinterpret_cast<std::uintptr_t>(in.data());
  const auto o_end = o + static_cast<std::uintptr_t>(out.numel()) * sizeof(*out.data());
  const auto i_end = i + static_cast<std::uintptr_t>(in.numel()) * sizeof(*in.data());
  TRAINKIT_CHECK(o == i || o_end <= i || i_end <= o, who, ": ", out_name, " ", shape_of(out),
                 " partly overlaps ", in_name, " ", shape_of(in),
                 " (the same memory, or none of it, is fine)");
}

/// Calls f(std::true_type) for Write::kAccumulate and f(std::false_type) otherwise: picks the
/// accumulating or the overwriting instantiation of an element-wise functor.
template <class F>
void with_write_mode(Write mode, F&& f) {
  if (mode == Write::kAccumulate) {
    f(std::true_type{});
  } else {
    f(std::false_type{});
  }
}

/// An element-wise layer without parameters or saved state: Fwd<T>{x, y} computes y from x,
/// Bwd<T, accumulate>{x, dy, dx} the input gradient. Names gives the `forward` / `backward`
/// names of its messages.
template <template <class> class Fwd, template <class, bool> class Bwd, class Names>
struct ElementwiseLayer {
  /// Width of the output for an input of `in` features (Sequential uses it): `in`.
  std::int64_t out_features(std::int64_t in) const noexcept { return in; }

  template <amp::Policy P = amp::Fp32, class E, class TX, class TY, int R, Space S>
  void forward(const E& exec, TensorView<TX, R, S> x, TensorView<TY, R, S> y) const {
    using T = std::remove_const_t<TX>;
    check_call<P, E, S, TX, TY>();
    static_assert(std::is_same_v<T, TY>, "trainkit::nn: x and y must have one element type");
    check_same_shape(Names::forward, "x", x, "y", y);
    check_elementwise_apart(Names::forward, "y", y, "x", x);
    exec::launch(exec, x.numel(), Fwd<T>{x.data(), y.data()});
  }

  template <amp::Policy P = amp::Fp32, class E, class TX, class TD, class TG, int R, Space S>
  void backward(const E& exec, TensorView<TX, R, S> x, TensorView<TD, R, S> dy,
                TensorView<TG, R, S> dx, Write mode = Write::kOverwrite) const {
    using T = std::remove_const_t<TX>;
    check_call<P, E, S, TX, TD, TG>();
    static_assert(std::is_same_v<T, std::remove_const_t<TD>> && std::is_same_v<T, TG>,
                  "trainkit::nn: x, dy and dx must have one element type");
    if (absent(dx)) return;
    check_same_shape(Names::backward, "x", x, "dy", dy);
    check_same_shape(Names::backward, "x", x, "dx", dx);
    check_elementwise_apart(Names::backward, "dx", dx, "x", x);
    check_elementwise_apart(Names::backward, "dx", dx, "dy", dy);
    with_write_mode(mode, [&](auto accumulate) {
      exec::launch(exec, x.numel(),
                   Bwd<T, decltype(accumulate)::value>{x.data(), dy.data(), dx.data()});
    });
  }
};

struct ReluNames {
  static constexpr const char* forward = "nn::ReLU::forward";
  static constexpr const char* backward = "nn::ReLU::backward";
};
struct GeluNames {
  static constexpr const char* forward = "nn::GELU::forward";
  static constexpr const char* backward = "nn::GELU::backward";
};

}  // namespace detail

/// ReLU: y = max(x, 0). Shapes: any rank, x and y alike (y may be x: in place).
/// backward reads x and dy and writes dx = dy * (x > 0) (or adds it, Write::kAccumulate);
/// an absent dx (default view) skips the work. dx may alias dy.
struct ReLU
    : detail::ElementwiseLayer<detail::ReluForward, detail::ReluBackward, detail::ReluNames> {};

/// GELU with the tanh approximation (GPT-2; torch.nn.GELU(approximate='tanh')):
/// y = 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))). Shapes: any rank, x and y alike.
/// backward reads x (the forward's input) and dy, writes dx = dy * gelu'(x) (or adds it).
/// For a Linear followed by GELU, Linear::forward_gelu / backward_dgelu fuse the two.
struct GELU
    : detail::ElementwiseLayer<detail::GeluForward, detail::GeluBackward, detail::GeluNames> {};

}  // namespace nn
TRAINKIT_NAMESPACE_END
