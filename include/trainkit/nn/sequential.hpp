// SPDX-License-Identifier: MIT
// trainkit/nn/sequential.hpp: `Sequential<Layers...>`, a stack of [N, in] -> [N, out] layers
// composed at compile time (a std::tuple, no virtual calls): forward runs them in order, backward
// in reverse. Its Context holds the intermediate activations and the layers' contexts; the stack
// owns two ping-pong gradient buffers for backward.
#pragma once

#include <algorithm>
#include <array>
#include <cstddef>
#include <cstdint>
#include <tuple>
#include <type_traits>
#include <utility>

#include "trainkit/amp/policy.hpp"
#include "trainkit/config.hpp"
#include "trainkit/core/tensor.hpp"
#include "trainkit/core/tensor_view.hpp"
#include "trainkit/error.hpp"
#include "trainkit/nn/layer.hpp"

TRAINKIT_NAMESPACE_BEGIN
namespace nn {

/// A layer Sequential can stack: `out_features(in)` gives its output width, and it has
/// `forward<P>(exec, x, y)` / `backward<P>(exec, x, dy, dx)` on [N, width] views, or with a
/// `Context` the `forward<P>(exec, ctx, x, y)` / `backward<P>(exec, ctx, x, dy, dx)` pair (Linear,
/// LayerNorm, ReLU, GELU, Dropout, a Sequential, or your own).
template <class L>
concept StackableLayer = requires(const L& layer, std::int64_t in) {
  { layer.out_features(in) } -> std::convertible_to<std::int64_t>;
};

/// Layers applied in order: y = L_{n-1}(... L_1(L_0(x))). Construct it from the layers WITH
/// BRACES: `nn::Sequential net{nn::Linear(arena, "0", {784, 1024}), nn::ReLU{}, ...}`. A braced
/// list is evaluated left to right, so the layers register their parameters in model order (the
/// order DDP and checkpoints rely on); the arguments of a parenthesised call may be evaluated in
/// any order (g++ goes right to left), which the constructor detects and rejects.
///
/// Shapes: x [N, in], y [N, out]; every layer maps [N, w_i] -> [N, w_{i+1}] (checked through
/// out_features). forward fills the caller's Context with the intermediate activations (in the
/// activation type of P) and the layers' contexts; backward takes the same x, runs the layers'
/// backward in reverse order and writes dx (absent: the first layer skips its input gradient).
template <StackableLayer... Layers>
class Sequential {
  static_assert(sizeof...(Layers) >= 1, "nn::Sequential needs at least one layer");

  /// Grow-only storage usable in either memory space (the stack's views decide which).
  struct Buffer {
    detail::Bytes<Space::kHost> host;
    detail::Bytes<Space::kDevice> device;
  };

 public:
  static constexpr std::size_t kSize = sizeof...(Layers);

  /// What forward saves for backward: activation i (the output of layer i, the input of layer
  /// i + 1) for i < kSize - 1, and the context of every layer that has one. Keep one per forward
  /// whose backward is still to come; refilling it reuses its memory.
  class Context {
   public:
    /// The context of layer I (detail::NoContext for a layer without one).
    template <std::size_t I>
    const auto& layer() const noexcept {
      return std::get<I>(layers_);
    }

   private:
    friend class Sequential;
    detail::ForwardRecord rec_;
    std::tuple<detail::context_slot_t<Layers>...> layers_;
    std::array<Buffer, kSize - 1> acts_{};
  };

  /// Throws trainkit::Error when the layers' parameters were registered out of layer order
  /// (constructed with parentheses instead of braces).
  explicit Sequential(Layers... layers) : layers_(std::move(layers)...) {
    std::int32_t last = -1;
    bool ordered = true;
    [&]<std::size_t... I>(std::index_sequence<I...>) {
      ((check_order(std::get<I>(layers_), last, ordered)), ...);
    }
    (std::make_index_sequence<kSize>{});
    TRAINKIT_CHECK(
        ordered,
        "nn::Sequential: the layers registered their parameters out of order "
        "(the compiler built the constructor's arguments right to left); construct it "
        "with braces, nn::Sequential net{layer0, layer1, ...}, which evaluates in order");
  }

  /// Layer I.
  template <std::size_t I>
  auto& get() noexcept {
    return std::get<I>(layers_);
  }
  template <std::size_t I>
  const auto& get() const noexcept {
    return std::get<I>(layers_);
  }

  /// Output width for an input of `in` features.
  std::int64_t out_features(std::int64_t in) const { return widths(in)[kSize]; }

  template <amp::Policy P = amp::Fp32, class E, class TX, class TY, Space S>
  void forward(const E& exec, Context& ctx, TensorView<TX, 2, S> x, TensorView<TY, 2, S> y) {
    using T = std::remove_const_t<TX>;
    detail::check_call<P, E, S, TX, TY>();
    const Widths w = widths(x.size(1));
    const std::int64_t rows = x.size(0);
    TRAINKIT_CHECK(y.size(0) == rows && y.size(1) == w[kSize], "nn::Sequential::forward: y is ",
                   detail::shape_of(y), ", expected [", rows, ", ", w[kSize], "]");
    ctx.rec_.template set<T>(rows, x.size(1));
    for (std::size_t i = 0; i + 1 < kSize; ++i)
      storage<S>(ctx.acts_[i]).template get<T>(rows * w[i + 1]);
    [&]<std::size_t... I>(std::index_sequence<I...>) {
      (detail::forward_with<P>(std::get<I>(layers_), exec, std::get<I>(ctx.layers_),
                               input_of<I, S>(ctx, TensorView<const T, 2, S>(x), w),
                               output_of<I, T>(ctx, y, w)),
       ...);
    }
    (std::make_index_sequence<kSize>{});
  }

  template <amp::Policy P = amp::Fp32, class E, class TX, class TD, class TG, Space S>
  void backward(const E& exec, const Context& ctx, TensorView<TX, 2, S> x, TensorView<TD, 2, S> dy,
                TensorView<TG, 2, S> dx) {
    using T = std::remove_const_t<TX>;
    detail::check_call<P, E, S, TX, TD, TG>();
    const std::int64_t rows = x.size(0);
    ctx.rec_.template check<T>("nn::Sequential::backward", rows, x.size(1));
    const Widths w = widths(x.size(1));
    TRAINKIT_CHECK(dy.size(0) == rows && dy.size(1) == w[kSize], "nn::Sequential::backward: dy ",
                   detail::shape_of(dy), ", expected [", rows, ", ", w[kSize], "]");
    if (!detail::absent(dx))
      TRAINKIT_CHECK(dx.sizes() == x.sizes(), "nn::Sequential::backward: dx ", detail::shape_of(dx),
                     " differs from x ", detail::shape_of(x));
    std::int64_t max_width = 0;
    for (std::size_t i = 1; i < kSize; ++i) max_width = std::max(max_width, w[i]);
    for (auto& g : grads_) storage<S>(g).template get<T>(rows * max_width);
    [&]<std::size_t... I>(std::index_sequence<I...>) {
      (backward_one<kSize - 1 - I, P>(exec, ctx, TensorView<const T, 2, S>(x), dy, dx, w), ...);
    }
    (std::make_index_sequence<kSize>{});
  }

 private:
  using Widths = std::array<std::int64_t, kSize + 1>;

  template <Space S, class B>
  static auto& storage(B& b) {
    if constexpr (S == Space::kHost) {
      return b.host;
    } else {
      return b.device;
    }
  }

  template <class L>
  static void check_order(const L& layer, std::int32_t& last, bool& ordered) {
    if constexpr (requires { layer.weight().index; }) {
      // The first parameter the layer registered: a tied weight belongs to an earlier layer.
      std::int32_t index = layer.weight().index;
      if constexpr (requires {
                      layer.weight_tied();
                      layer.bias().index;
                    })
        if (layer.weight_tied()) index = layer.bias().index;
      if (index >= 0) {
        ordered = ordered && index > last;
        last = index;
      }
    }
  }

  /// w[0] = in, w[i + 1] = layer i's output width.
  Widths widths(std::int64_t in) const {
    Widths w{};
    w[0] = in;
    [&]<std::size_t... I>(std::index_sequence<I...>) {
      ((w[I + 1] = static_cast<std::int64_t>(std::get<I>(layers_).out_features(w[I]))), ...);
    }
    (std::make_index_sequence<kSize>{});
    return w;
  }

  /// Activation i of ctx, [rows, w[i + 1]] (const for a const context).
  template <class T, Space S, class C>
  static auto activation(C& ctx, std::size_t i, std::int64_t rows, const Widths& w) {
    return detail::mat<S>(storage<S>(ctx.acts_[i]).template data<T>(), rows, w[i + 1]);
  }

  /// The input of layer I: x, or activation I - 1.
  template <std::size_t I, Space S, class T>
  static TensorView<const T, 2, S> input_of(const Context& ctx, TensorView<const T, 2, S> x,
                                            const Widths& w) {
    if constexpr (I == 0) {
      return x;
    } else {
      return activation<T, S>(ctx, I - 1, x.size(0), w);
    }
  }

  /// The output of layer I in forward: y for the last layer, else activation I.
  template <std::size_t I, class T, class TY, Space S>
  static auto output_of(Context& ctx, TensorView<TY, 2, S> y, const Widths& w) {
    if constexpr (I + 1 == kSize) {
      return y;
    } else {
      return activation<T, S>(ctx, I, y.size(0), w);
    }
  }

  template <std::size_t I, class P, class E, class T, class TD, class TG, Space S>
  void backward_one(const E& exec, const Context& ctx, TensorView<const T, 2, S> x,
                    TensorView<TD, 2, S> dy, TensorView<TG, 2, S> dx, const Widths& w) {
    const std::int64_t rows = x.size(0);
    // Gradient w.r.t. this layer's output: dy for the last layer, else what layer I+1 wrote.
    TensorView<const T, 2, S> g_out;
    if constexpr (I + 1 == kSize) {
      g_out = dy;
    } else {
      g_out =
          detail::mat<S>(static_cast<const T*>(storage<S>(grads_[(I + 1) % 2]).template data<T>()),
                         rows, w[I + 1]);
    }
    TensorView<T, 2, S> g_in;
    if constexpr (I == 0) {
      g_in = dx;
    } else {
      g_in = detail::mat<S>(storage<S>(grads_[I % 2]).template data<T>(), rows, w[I]);
    }
    detail::backward_with<P>(std::get<I>(layers_), exec, std::get<I>(ctx.layers_),
                             input_of<I, S>(ctx, x, w), g_out, g_in);
  }

  std::tuple<Layers...> layers_;
  std::array<Buffer, 2> grads_{};  // backward scratch: the ping-pong gradients between layers
};

}  // namespace nn
TRAINKIT_NAMESPACE_END
