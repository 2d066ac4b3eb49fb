// SPDX-License-Identifier: MIT
// trainkit/nn/transformer_block.hpp: `TransformerBlock`, one pre-LayerNorm GPT-2 block
// (nanoGPT's Block): x1 = x + attn(ln_1(x)); y = x1 + mlp(ln_2(x1)), mlp = c_proj(gelu(c_fc)).
// Forward keeps what backward needs in the caller's TransformerBlock::Context; the MLP's GELU is
// fused into its gemms, both skip connections are added by the projections' gemms, and the
// residual gradients are accumulated in place instead of being copied around.
#pragma once

#include <cmath>
#include <cstdint>
#include <string>
#include <type_traits>

#include "trainkit/amp/policy.hpp"
#include "trainkit/config.hpp"
#include "trainkit/core/tensor_view.hpp"
#include "trainkit/error.hpp"
#include "trainkit/nn/attention.hpp"
#include "trainkit/nn/layer.hpp"
#include "trainkit/nn/layer_norm.hpp"
#include "trainkit/nn/linear.hpp"
#include "trainkit/nn/param_arena.hpp"

TRAINKIT_NAMESPACE_BEGIN
namespace nn {

/// Options of nn::TransformerBlock.
struct TransformerBlockOptions {
  std::int64_t n_embd = 0;
  std::int64_t n_head = 0;
  bool bias = true;
  float eps = 1e-5f;
  /// Number of blocks in the model: GPT-2 initialises the residual projections (attn.c_proj,
  /// mlp.c_proj) with std 0.02 / sqrt(2 n_layer); every other weight with std 0.02, biases 0.
  std::int64_t n_layer = 1;
  /// On the GPU, the attention's fused core (AttentionOptions::fused_core).
  bool fused_attention = true;
};

/// A GPT-2 transformer block. Parameters (nanoGPT names, under "<name>."): ln_1.{weight,bias},
/// attn.c_attn.{weight,bias} [3C, C], attn.c_proj.{weight,bias} [C, C], ln_2.{weight,bias},
/// mlp.c_fc.{weight,bias} [4C, C], mlp.c_proj.{weight,bias} [C, 4C].
///
/// Shapes: x, y [B, T, C]. forward writes y and saves, in the caller's Context, the ln_1/ln_2
/// outputs, x1, what the MLP's GELU saves for backward (Linear::forward_gelu: the pre-activation,
/// or on the CPU its GELU slope) and its output, and the contexts of ln_1, attn and ln_2.
/// backward reads x, dy and that context, adds every parameter gradient and writes dx (or adds
/// it, Write::kAccumulate).
template <Space S = Space::kHost>
class TransformerBlock {
 public:
  /// What forward saves for backward (activations in the policy's type, in space S). Keep one
  /// per forward whose backward is still to come; refilling it reuses its memory.
  class Context {
   public:
    const typename LayerNorm<S>::Context& ln_1() const noexcept { return ln_1_; }
    const typename CausalSelfAttention<S>::Context& attn() const noexcept { return attn_; }
    const typename LayerNorm<S>::Context& ln_2() const noexcept { return ln_2_; }

   private:
    friend class TransformerBlock;
    detail::ForwardRecord rec_;
    typename LayerNorm<S>::Context ln_1_;
    typename CausalSelfAttention<S>::Context attn_;
    typename LayerNorm<S>::Context ln_2_;
    // ln_1(x), x1 = x + attn(ln_1(x)), ln_2(x1), pre = c_fc(ln_2(x1)), g = gelu(pre).
    detail::Bytes<S> h1_, x1_, h2_, pre_, g_;
  };

  TransformerBlock(ParamArena<S>& arena, const std::string& name, TransformerBlockOptions o)
      : ln_1_(arena, detail::child_name(name, "ln_1"), {checked_width(o, name), o.eps, o.bias}),
        attn_(arena, detail::child_name(name, "attn"), attention_options(o)),
        ln_2_(arena, detail::child_name(name, "ln_2"), {o.n_embd, o.eps, o.bias}),
        c_fc_(arena, detail::child_name(name, "mlp.c_fc"),
              linear_options(o, o.n_embd, 4 * o.n_embd, 0.02f)),
        c_proj_(arena, detail::child_name(name, "mlp.c_proj"),
                linear_options(o, 4 * o.n_embd, o.n_embd, residual_std(o))),
        C_(o.n_embd) {}

  LayerNorm<S>& ln_1() noexcept { return ln_1_; }
  CausalSelfAttention<S>& attn() noexcept { return attn_; }
  LayerNorm<S>& ln_2() noexcept { return ln_2_; }
  Linear<S>& c_fc() noexcept { return c_fc_; }
  Linear<S>& c_proj() noexcept { return c_proj_; }

  template <amp::Policy P = amp::Fp32, class E, class TX, class TY>
  void forward(const E& exec, Context& ctx, TensorView<TX, 3, S> x, TensorView<TY, 3, S> y) {
    using T = std::remove_const_t<TX>;
    detail::check_call<P, E, S, TX, TY>();
    detail::check_same_io("nn::TransformerBlock::forward", x, y, C_);
    const std::int64_t N = x.size(0) * x.size(1);
    ctx.rec_.template set<T>(x.size(0), x.size(1), C_);
    T* h1 = ctx.h1_.template get<T>(N * C_);
    T* x1 = ctx.x1_.template get<T>(N * C_);
    T* h2 = ctx.h2_.template get<T>(N * C_);
    T* pre = ctx.pre_.template get<T>(N * 4 * C_);
    T* g = ctx.g_.template get<T>(N * 4 * C_);
    const TensorView<const T, 2, S> x2 = detail::flat2(TensorView<const T, 3, S>(x));
    ln_1_.template forward<P>(exec, ctx.ln_1_, x2, mat(h1, N, C_));
    // Both skip connections are added by the projections' gemms (their epilogues read the
    // residual stream): x1 = x + attn(h1), y = x1 + c_proj(g).
    attn_.template forward<P>(exec, ctx.attn_, TensorView<const T, 3, S>(h1, x.sizes()),
                              TensorView<T, 3, S>(x1, x.sizes()), TensorView<const T, 3, S>(x));
    ln_2_.template forward<P>(exec, ctx.ln_2_, mat(x1, N, C_), mat(h2, N, C_));
    c_fc_.template forward_gelu<P>(exec, mat(h2, N, C_), mat(pre, N, 4 * C_), mat(g, N, 4 * C_));
    c_proj_.template forward<P>(exec, mat(g, N, 4 * C_), detail::flat2(y), mat<const T>(x1, N, C_));
  }

  template <amp::Policy P = amp::Fp32, class E, class TX, class TD, class TG>
  void backward(const E& exec, const Context& ctx, TensorView<TX, 3, S> x, TensorView<TD, 3, S> dy,
                TensorView<TG, 3, S> dx, Write mode = Write::kOverwrite) {
    using T = std::remove_const_t<TX>;
    detail::check_call<P, E, S, TX, TD, TG>();
    detail::check_backward_views("nn::TransformerBlock::backward", x, dy, dx, C_);
    ctx.rec_.template check<T>("nn::TransformerBlock::backward", x.size(0), x.size(1), C_);
    const std::int64_t N = x.size(0) * x.size(1);
    T* dpre = dpre_.template get<T>(N * 4 * C_);
    T* dh = dh_.template get<T>(N * C_);
    T* dx1 = dx1_.template get<T>(N * C_);
    const TensorView<const T, 2, S> dy2 = detail::flat2(TensorView<const T, 3, S>(dy));
    // y = x1 + c_proj(gelu(c_fc(ln_2(x1)))).
    c_proj_.template backward_dgelu<P>(exec, mat(ctx.g_.template data<T>(), N, 4 * C_), dy2,
                                       mat(ctx.pre_.template data<T>(), N, 4 * C_),
                                       mat(dpre, N, 4 * C_));
    c_fc_.template backward<P>(exec, mat(ctx.h2_.template data<T>(), N, C_), mat(dpre, N, 4 * C_),
                               mat(dh, N, C_));
    // dx1 = dy (the skip connection) + ln_2's backward, in one pass.
    ln_2_.template backward<P>(exec, ctx.ln_2_, mat(ctx.x1_.template data<T>(), N, C_),
                               mat(dh, N, C_), mat(dx1, N, C_), dy2);
    // x1 = x + attn(ln_1(x)).
    const Extents<3> shape = x.sizes();
    attn_.template backward<P>(
        exec, ctx.attn_, TensorView<const T, 3, S>(ctx.h1_.template data<T>(), shape),
        TensorView<const T, 3, S>(dx1, shape), TensorView<T, 3, S>(dh, shape));
    const TensorView<const T, 2, S> x2 = detail::flat2(TensorView<const T, 3, S>(x));
    if (detail::absent(dx)) {
      ln_1_.template backward<P>(exec, ctx.ln_1_, x2, mat(dh, N, C_), TensorView<T, 2, S>());
      return;
    }
    ln_1_.template backward<P>(exec, ctx.ln_1_, x2, mat(dh, N, C_), detail::flat2(dx),
                               mat<const T>(dx1, N, C_), mode);
  }

 private:
  template <class T>
  static TensorView<T, 2, S> mat(T* p, std::int64_t rows, std::int64_t cols) {
    return detail::mat<S>(p, rows, cols);
  }

  /// n_embd, once the attention accepts the options (before any parameter is registered).
  static std::int64_t checked_width(const TransformerBlockOptions& o, const std::string& name) {
    CausalSelfAttention<S>::check_options(attention_options(o), detail::child_name(name, "attn"));
    return o.n_embd;
  }
  static float residual_std(const TransformerBlockOptions& o) {
    return 0.02f / std::sqrt(2.0f * static_cast<float>(o.n_layer < 1 ? 1 : o.n_layer));
  }
  static AttentionOptions attention_options(const TransformerBlockOptions& o) {
    AttentionOptions a;
    a.n_embd = o.n_embd;
    a.n_head = o.n_head;
    a.bias = o.bias;
    a.weight_init = Init::normal(0.0f, 0.02f);
    a.bias_init = Init::zeros();
    a.proj_weight_init = Init::normal(0.0f, residual_std(o));
    a.fused_core = o.fused_attention;
    return a;
  }
  static LinearOptions linear_options(const TransformerBlockOptions& o, std::int64_t in,
                                      std::int64_t out, float std) {
    LinearOptions l;
    l.in_features = in;
    l.out_features = out;
    l.bias = o.bias;
    l.weight_init = Init::normal(0.0f, std);
    l.bias_init = Init::zeros();
    return l;
  }

  LayerNorm<S> ln_1_;
  CausalSelfAttention<S> attn_;
  LayerNorm<S> ln_2_;
  Linear<S> c_fc_;
  Linear<S> c_proj_;
  std::int64_t C_;
  // Scratch of one backward call: dpre, dh and dx1.
  detail::Bytes<S> dpre_, dh_, dx1_;
};

template <Space S>
TransformerBlock(ParamArena<S>&, const std::string&, TransformerBlockOptions)
    -> TransformerBlock<S>;

}  // namespace nn
TRAINKIT_NAMESPACE_END
