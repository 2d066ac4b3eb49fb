// SPDX-License-Identifier: MIT
// trainkit/nn/sequential.hpp: `Sequential<Layers...>`, a stack of [N, in] -> [N, out] layers
// composed at compile time (a std::tuple, no virtual calls): forward runs them in order, backward
// in reverse, and the stack owns the intermediate activations and two ping-pong gradient buffers.
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
/// `forward<P>(exec, x, y)` / `backward<P>(exec, x, dy, dx)` on [N, width] views (Linear,
/// LayerNorm, ReLU, GELU, Dropout, or your own).
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
/// out_features). forward stores a view of x (keep x alive and unchanged until backward) and
/// the intermediate activations (owned, in the activation type of P). backward runs the layers'
/// backward in reverse order and writes dx (absent: the first layer skips its input gradient).
template <StackableLayer... Layers>
class Sequential {
  static_assert(sizeof...(Layers) >= 1, "nn::Sequential needs at least one layer");

 public:
  static constexpr std::size_t kSize = sizeof...(Layers);

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
  std::int64_t out_features(std::int64_t in) const {
    widths(in);
    return widths_[kSize];
  }

  template <amp::Policy P = amp::Fp32, class E, class TX, class TY, Space S>
  void forward(const E& exec, TensorView<TX, 2, S> x, TensorView<TY, 2, S> y) {
    using T = std::remove_const_t<TX>;
    detail::check_call<P, E, S, TX, TY>();
    widths(x.size(1));
    TRAINKIT_CHECK(y.size(0) == x.size(0) && y.size(1) == widths_[kSize],
                   "nn::Sequential::"
                   "forward: y is ",
                   detail::shape_of(y), ", expected [", x.size(0), ", ", widths_[kSize], "]");
    rows_ = x.size(0);
    input_ = x.data();
    [&]<std::size_t... I>(std::index_sequence<I...>) { (forward_one<I, P, T>(exec, y), ...); }
    (std::make_index_sequence<kSize>{});
  }

  template <amp::Policy P = amp::Fp32, class E, class TD, class TG, Space S>
  void backward(const E& exec, TensorView<TD, 2, S> dy, TensorView<TG, 2, S> dx) {
    using T = std::remove_const_t<TD>;
    detail::check_call<P, E, S, TD, TG>();
    TRAINKIT_CHECK(input_ != nullptr && dy.size(0) == rows_ && dy.size(1) == widths_[kSize],
                   "nn::Sequential::backward: dy ", detail::shape_of(dy),
                   " does not match the last forward ([", rows_, ", ", widths_[kSize], "])");
    if (!detail::absent(dx))
      TRAINKIT_CHECK(dx.size(0) == rows_ && dx.size(1) == widths_[0],
                     "nn::Sequential::backward: "
                     "dx ",
                     detail::shape_of(dx), ", expected [", rows_, ", ", widths_[0], "]");
    std::int64_t max_width = 0;
    for (std::size_t i = 1; i < kSize; ++i) max_width = std::max(max_width, widths_[i]);
    for (auto& g : grads_) storage<S>(g).template get<T>(rows_ * max_width);
    [&]<std::size_t... I>(std::index_sequence<I...>) {
      (backward_one<kSize - 1 - I, P, T>(exec, dy, dx), ...);
    }
    (std::make_index_sequence<kSize>{});
  }

 private:
  /// Grow-only untyped storage in one memory space.
  template <Space S>
  class Bytes {
   public:
    template <class T>
    T* get(std::int64_t n) {
      const std::int64_t bytes = n * static_cast<std::int64_t>(sizeof(T));
      if (bytes > mem_.numel()) mem_ = Tensor<unsigned char, S>(Shape{bytes});
      return reinterpret_cast<T*>(mem_.data());
    }
    template <class T>
    T* data() noexcept {
      return reinterpret_cast<T*>(mem_.data());
    }

   private:
    Tensor<unsigned char, S> mem_;
  };
  struct Buffer {
    Bytes<Space::kHost> host;
    Bytes<Space::kDevice> device;
  };
  template <Space S>
  static Bytes<S>& storage(Buffer& b) {
    if constexpr (S == Space::kHost) {
      return b.host;
    } else {
      return b.device;
    }
  }

  template <class L>
  static void check_order(const L& layer, std::int32_t& last, bool& ordered) {
    if constexpr (requires { layer.weight().index; }) {
      const std::int32_t index = layer.weight().index;
      if (index >= 0) {
        ordered = ordered && index > last;
        last = index;
      }
    }
  }

  void widths(std::int64_t in) const {
    widths_[0] = in;
    [&]<std::size_t... I>(std::index_sequence<I...>) {
      ((widths_[I + 1] = static_cast<std::int64_t>(std::get<I>(layers_).out_features(widths_[I]))),
       ...);
    }
    (std::make_index_sequence<kSize>{});
  }

  /// Activation i (the output of layer i, input of layer i + 1), for i < kSize - 1.
  template <class T, Space S>
  TensorView<T, 2, S> activation(std::size_t i) {
    return TensorView<T, 2, S>(storage<S>(acts_[i]).template data<T>(),
                               Extents<2>{{rows_, widths_[i + 1]}});
  }

  template <std::size_t I, class P, class T, class E, class TY, Space S>
  void forward_one(const E& exec, TensorView<TY, 2, S> y) {
    TensorView<const T, 2, S> in;
    if constexpr (I == 0) {
      in =
          TensorView<const T, 2, S>(static_cast<const T*>(input_), Extents<2>{{rows_, widths_[0]}});
    } else {
      in = activation<T, S>(I - 1);
    }
    if constexpr (I + 1 == kSize) {
      std::get<I>(layers_).template forward<P>(exec, in, y);
    } else {
      storage<S>(acts_[I]).template get<T>(rows_ * widths_[I + 1]);
      std::get<I>(layers_).template forward<P>(exec, in, activation<T, S>(I));
    }
  }

  template <std::size_t I, class P, class T, class E, class TD, class TG, Space S>
  void backward_one(const E& exec, TensorView<TD, 2, S> dy, TensorView<TG, 2, S> dx) {
    TensorView<const T, 2, S> in;
    if constexpr (I == 0) {
      in =
          TensorView<const T, 2, S>(static_cast<const T*>(input_), Extents<2>{{rows_, widths_[0]}});
    } else {
      in = activation<T, S>(I - 1);
    }
    // Gradient w.r.t. this layer's output: dy for the last layer, else what layer I+1 wrote.
    TensorView<const T, 2, S> g_out;
    if constexpr (I + 1 == kSize) {
      g_out = dy;
    } else {
      g_out = TensorView<const T, 2, S>(storage<S>(grads_[(I + 1) % 2]).template data<T>(),
                                        Extents<2>{{rows_, widths_[I + 1]}});
    }
    TensorView<T, 2, S> g_in;
    if constexpr (I == 0) {
      g_in = dx;
    } else {
      g_in = TensorView<T, 2, S>(storage<S>(grads_[I % 2]).template data<T>(),
                                 Extents<2>{{rows_, widths_[I]}});
    }
    std::get<I>(layers_).template backward<P>(exec, in, g_out, g_in);
  }

  std::tuple<Layers...> layers_;
  mutable std::array<std::int64_t, kSize + 1> widths_{};
  std::int64_t rows_ = 0;
  const void* input_ = nullptr;
  std::array<Buffer, kSize> acts_{};
  std::array<Buffer, 2> grads_{};
};

}  // namespace nn
TRAINKIT_NAMESPACE_END
