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
#include <string>
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

template <Space S>
class Linear;
template <Space S>
class LayerNorm;
struct ReLU;
struct GELU;
class Dropout;

namespace detail {

/// How a layer's backward needs one of its views laid out.
enum class ViewLayout : std::uint8_t {
  kAny,         ///< nothing Sequential knows of: the layer checks the view itself
  kDenseRows,   ///< column stride 1, rows apart (padded rows allowed; check_rows)
  kContiguous,  ///< row-major and dense (check_contiguous)
};

/// What the backward of layer L requires of the views a Sequential hands it from its own caller:
/// x and dx when L is the first layer, dy when it is the last. The first layer runs last in
/// backward, so Sequential checks these at entry, before any layer adds a gradient. A layer not
/// listed here (your own) checks its views itself.
template <class L>
struct StackedBackward {
  static constexpr ViewLayout x = ViewLayout::kAny;
  static constexpr ViewLayout dy = ViewLayout::kAny;
  static constexpr ViewLayout dx = ViewLayout::kAny;
  static constexpr bool x_without_dx = false;     ///< x is checked even when dx is absent
  static constexpr bool dx_apart_from_x = false;  ///< dx may be x itself but not overlap it in part
  static std::string first_name() { return "a layer"; }
  static std::string last_name() { return "a layer"; }
};

/// The same layout and name whether the layer is first or last.
template <ViewLayout X, ViewLayout Dy, ViewLayout Dx, bool XWithoutDx, bool Apart>
struct StackedLayout {
  static constexpr ViewLayout x = X;
  static constexpr ViewLayout dy = Dy;
  static constexpr ViewLayout dx = Dx;
  static constexpr bool x_without_dx = XWithoutDx;
  static constexpr bool dx_apart_from_x = Apart;
};

template <Space S>
struct StackedBackward<Linear<S>> : StackedLayout<ViewLayout::kDenseRows, ViewLayout::kDenseRows,
                                                  ViewLayout::kDenseRows, true, false> {
  static std::string first_name() { return "nn::Linear"; }
  static std::string last_name() { return "nn::Linear"; }
};
template <Space S>
struct StackedBackward<LayerNorm<S>>
    : StackedLayout<ViewLayout::kContiguous, ViewLayout::kContiguous, ViewLayout::kContiguous, true,
                    true> {
  static std::string first_name() { return "nn::LayerNorm"; }
  static std::string last_name() { return "nn::LayerNorm"; }
};
// The element-wise layers check nothing when dx is absent.
template <>
struct StackedBackward<ReLU> : StackedLayout<ViewLayout::kContiguous, ViewLayout::kContiguous,
                                             ViewLayout::kContiguous, false, false> {
  static std::string first_name() { return "nn::ReLU"; }
  static std::string last_name() { return "nn::ReLU"; }
};
template <>
struct StackedBackward<GELU> : StackedLayout<ViewLayout::kContiguous, ViewLayout::kContiguous,
                                             ViewLayout::kContiguous, false, false> {
  static std::string first_name() { return "nn::GELU"; }
  static std::string last_name() { return "nn::GELU"; }
};
// Dropout's backward does not read x.
template <>
struct StackedBackward<Dropout> : StackedLayout<ViewLayout::kAny, ViewLayout::kContiguous,
                                                ViewLayout::kContiguous, false, false> {
  static std::string first_name() { return "nn::Dropout"; }
  static std::string last_name() { return "nn::Dropout"; }
};

}  // namespace detail

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
/// backward checks x, dy and dx first, as the library's layers that receive them will (Linear
/// accepts padded rows, the others want contiguous views; a LayerNorm first layer also refuses
/// a dx that overlaps x in part), so a refused call adds no gradient. A layer of your own at
/// either end checks its views itself.
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
    // A single layer checks its views itself before it adds anything.
    if constexpr (kSize > 1) check_ends(x, dy, dx);
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

  using First = std::tuple_element_t<0, std::tuple<Layers...>>;
  using Last = std::tuple_element_t<kSize - 1, std::tuple<Layers...>>;

  /// Checks x and dx as the first layer's backward will, and dy as the last layer's: the first
  /// layer runs last, after the others have added their gradients, so a view it would refuse
  /// must be refused before anything is added.
  template <class VX, class VD, class VG>
  static void check_ends(const VX& x, const VD& dy, const VG& dx) {
    using F = detail::StackedBackward<First>;
    using L = detail::StackedBackward<Last>;
    const bool has_dx = !detail::absent(dx);
    if (has_dx || F::x_without_dx) check_end(F::x, "x", x, 0, &F::first_name);
    if (has_dx) {
      check_end(F::dx, "dx", dx, 0, &F::first_name);
      TRAINKIT_CHECK(!F::dx_apart_from_x || !detail::overlaps_in_part(dx, x),
                     "nn::Sequential::backward: dx ", detail::shape_of(dx), " partly overlaps x ",
                     detail::shape_of(x), ", which layer 0 (", F::first_name(),
                     ") reads while it writes dx");
    }
    check_end(L::dy, "dy", dy, kSize - 1, &L::last_name);
  }

  template <class V>
  static void check_end(detail::ViewLayout layout, const char* name, const V& v, std::size_t layer,
                        std::string (*layer_name)()) {
    const bool contiguous = layout == detail::ViewLayout::kContiguous;
    const bool ok = contiguous                                 ? v.is_contiguous()
                    : layout == detail::ViewLayout::kDenseRows ? detail::has_dense_rows(v)
                                                               : true;
    TRAINKIT_CHECK(ok, "nn::Sequential::backward: ", name, " with shape ", detail::shape_of(v),
                   " and strides [", v.stride(0), ", ", v.stride(1), "] must ",
                   contiguous ? "be contiguous (row-major, dense)"
                              : "have dense rows (column stride 1, row stride >= its width)",
                   " for layer ", layer, " (", layer_name(), ")");
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

namespace detail {

/// A Sequential inside a Sequential: its first layer's needs, and its last layer's.
template <StackableLayer... Ls>
struct StackedBackward<Sequential<Ls...>> {
  using F = StackedBackward<std::tuple_element_t<0, std::tuple<Ls...>>>;
  using L = StackedBackward<std::tuple_element_t<sizeof...(Ls) - 1, std::tuple<Ls...>>>;
  static constexpr ViewLayout x = F::x;
  static constexpr ViewLayout dy = L::dy;
  static constexpr ViewLayout dx = F::dx;
  static constexpr bool x_without_dx = F::x_without_dx;
  static constexpr bool dx_apart_from_x = F::dx_apart_from_x;
  static std::string first_name() {
    return ::trainkit::detail::concat("nn::Sequential, whose layer 0 is ", F::first_name());
  }
  static std::string last_name() {
    return ::trainkit::detail::concat("nn::Sequential, whose layer ", sizeof...(Ls) - 1, " is ",
                                      L::last_name());
  }
};

}  // namespace detail

}  // namespace nn
TRAINKIT_NAMESPACE_END
