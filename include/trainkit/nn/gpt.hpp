// SPDX-License-Identifier: MIT
// trainkit/nn/gpt.hpp: `Gpt`, a GPT-2 language model: token + position embeddings, dropout,
// n_layer pre-LayerNorm TransformerBlocks, a final LayerNorm and the lm_head, with PyTorch
// (nanoGPT) state-dict names. Written once for both memory spaces and every precision policy:
// `Gpt<Space::kHost>` runs on exec::Host, `Gpt<Space::kDevice>` on exec::Cuda, and forward<P> /
// backward<P> take the policy (Fp32, Tf32, Bf16, Fp16) that sets the activation type.
//
// Which PyTorch module it is: nanoGPT's `GPT(GPTConfig(block_size, vocab_size, n_layer, n_head,
// n_embd, dropout=0.0, bias))` with two differences, both stated by an option or fixed here:
//   - GELU is the tanh approximation (GPT-2's, torch.nn.GELU(approximate='tanh')); nanoGPT's MLP
//     uses the exact erf GELU. Weights trained by one load into the other, but the functions differ
//     by up to ~1e-3 per activation.
//   - the lm_head is tied to transformer.wte (nanoGPT's and GPT-2's choice) only with
//     `tie_weights`; untied it is its own "lm_head.weight" [V, C] parameter.
// Dropout, when p > 0, is applied after the embeddings only (nanoGPT's `transformer.drop`); the
// attention and residual dropouts of nanoGPT are not implemented. tests/nn/test_gpt.cpp checks
// logits and every gradient against that module in PyTorch, tied and untied.
#pragma once

#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstdint>
#include <limits>
#include <string>
#include <string_view>
#include <system_error>
#include <type_traits>
#include <utility>
#include <vector>

#include "trainkit/amp/policy.hpp"
#include "trainkit/config.hpp"
#include "trainkit/core/bytes.hpp"
#include "trainkit/core/rng.hpp"
#include "trainkit/core/tensor_view.hpp"
#include "trainkit/error.hpp"
#include "trainkit/nn/dropout.hpp"
#include "trainkit/nn/embedding.hpp"
#include "trainkit/nn/init.hpp"
#include "trainkit/nn/layer.hpp"
#include "trainkit/nn/layer_norm.hpp"
#include "trainkit/nn/linear.hpp"
#include "trainkit/nn/param_arena.hpp"
#include "trainkit/nn/transformer_block.hpp"

TRAINKIT_NAMESPACE_BEGIN
namespace nn {

/// Options of nn::Gpt (nanoGPT's GPTConfig, plus the head tying and the dropout seed).
struct GptOptions {
  std::int64_t vocab_size = 0;  ///< V: token ids are in [0, V)
  std::int64_t block_size = 0;  ///< the longest context T (rows of the position table)
  std::int64_t n_layer = 0;
  std::int64_t n_head = 0;
  std::int64_t n_embd = 0;  ///< C, a multiple of n_head
  bool bias = true;         ///< biases in the blocks' Linear and LayerNorm layers and in ln_f
  /// lm_head.weight is transformer.wte.weight (GPT-2): one [V, C] parameter, whose gradient
  /// gets both the embedding's and the head's contribution.
  bool tie_weights = false;
  float dropout = 0.0f;    ///< dropout probability after the embeddings
  std::uint64_t seed = 0;  ///< key of the dropout masks
  /// On the GPU, the blocks' fused attention core for head sizes up to 128 (no [B, H, T, T] in
  /// memory; AttentionOptions::fused_core); false: the materialised one. The host ignores it.
  bool fused_attention = true;
};

/// The default of Gpt::backward's grads_ready callback: nothing to tell.
struct NoGradsReady {
  void operator()(ParamId) const noexcept {}
};

/// A GPT-2 model. Parameters (in registration order): transformer.wte.weight [V, C],
/// transformer.wpe.weight [block_size, C], transformer.h.<l>.* (see TransformerBlock),
/// transformer.ln_f.{weight,bias}, lm_head.weight [V, C] unless tied. GPT-2 initialisation:
/// N(0, 0.02) for embeddings and weights, N(0, 0.02 / sqrt(2 n_layer)) for the residual
/// projections, zero biases, LayerNorm weights one.
///
/// Shapes: ids [B, T] (int32 or int64 token ids, T <= block_size, contiguous), logits [B*T, V]
/// in the policy's activation type; row b*T + t holds the scores of the token after ids[b, t].
/// The rows of logits and dlogits may be padded (row stride >= V, column stride 1): on the
/// GPU the lm_head's products run several times faster when the row stride is a multiple of 8
/// (16-byte rows of bf16), which GPT-2's V = 50257 is not.
/// forward writes logits and fills the caller's Context; backward reads ids, that context and
/// dlogits (e.g. SoftmaxCrossEntropy's) and adds every parameter gradient to the arena.
/// Set the dropout step before each training forward (`set_step`); eval() turns dropout off.
template <Space S = Space::kHost>
class Gpt {
 public:
  static constexpr Space space = S;  ///< where parameters and activations live
  /// What forward saves for backward: the embeddings, each block's input, ln_f's output and the
  /// contexts of the blocks and of ln_f (activations in the policy's type, in space S). Keep one
  /// per forward whose backward is still to come; refilling it reuses its memory.
  class Context {
   public:
    bool filled() const noexcept { return rec_.filled(); }

   private:
    friend class Gpt;
    detail::ForwardRecord rec_;
    detail::Bytes<S> emb_;  // the embeddings before dropout (only when dropout is applied)
    detail::Bytes<S> xs_;   // n_layer + 1 [N, C] slices: the input of each block, then of ln_f
    detail::Bytes<S> h_;    // ln_f's output, the lm_head's input
    detail::Bytes<S> pos_;  // position ids [N] (n % T) for the shape pos_shape_
    std::pair<std::int64_t, std::int64_t> pos_shape_{-1, -1};
    std::vector<typename TransformerBlock<S>::Context> blocks_;
    typename LayerNorm<S>::Context ln_f_;
    bool dropped_ = false;  // dropout applied in forward, at step drop_step_
    std::uint32_t drop_step_ = 0;
  };

  Gpt(ParamArena<S>& arena, GptOptions options)
      : options_(checked(options)),
        wte_(arena, "transformer.wte", {options.vocab_size, options.n_embd, kInit}),
        wpe_(arena, "transformer.wpe", {options.block_size, options.n_embd, kInit}),
        blocks_(make_blocks(arena, options)),
        ln_f_(arena, "transformer.ln_f", {.features = options.n_embd, .bias = options.bias}),
        lm_head_(arena, "lm_head",
                 {.in_features = options.n_embd,
                  .out_features = options.vocab_size,
                  .bias = false,
                  .weight_init = kInit,
                  .tied_weight = options.tie_weights ? wte_.weight() : ParamId{}}),
        drop_({.p = options.dropout, .seed = options.seed, .site = 1}) {
    // The parameters whose gradients each stage of backward completes, in backward's order (a
    // tied head's weight is transformer.wte.weight: final only after the embedding's stage).
    // One pass over the arena (a scan per block would be quadratic in the layers): stage 0
    // lm_head, 1 ln_f, 2 + (n_layer - 1 - l) block l, then wpe and wte.
    const std::size_t layers = static_cast<std::size_t>(options.n_layer);
    std::vector<std::vector<ParamId>> stages(layers + 4);
    const auto stage_of = [&](std::string_view name) -> std::size_t {
      constexpr std::string_view kBlock = "transformer.h.";
      if (name.starts_with("lm_head.")) return 0;
      if (name.starts_with("transformer.ln_f.")) return 1;
      if (name.starts_with("transformer.wpe.")) return layers + 2;
      if (name.starts_with("transformer.wte.")) return layers + 3;
      if (!name.starts_with(kBlock)) return stages.size();
      name.remove_prefix(kBlock.size());
      std::size_t l = 0;
      const auto [end, ec] = std::from_chars(name.data(), name.data() + name.size(), l);
      const std::size_t digits = static_cast<std::size_t>(end - name.data());
      const bool canonical = ec == std::errc() && (digits == 1 || name[0] != '0');
      if (!canonical || l >= layers || digits == name.size() || name[digits] != '.')
        return stages.size();
      return 2 + (layers - 1 - l);
    };
    for (std::size_t i = 0; i < arena.size(); ++i)
      if (const std::size_t k = stage_of(arena.infos()[i].name); k < stages.size())
        stages[k].push_back(ParamId{static_cast<std::int32_t>(i)});
    for (std::size_t k = options.tie_weights ? 1 : 0; k < stages.size(); ++k)
      ready_stages_.push_back(std::move(stages[k]));
  }

  const GptOptions& options() const noexcept { return options_; }
  /// Parameters of the matrix products per token (the blocks' four weights and the lm_head's),
  /// the N of the usual 6 N FLOPs-per-token estimate; embeddings, biases and norms excluded.
  std::int64_t matmul_parameters() const noexcept {
    const std::int64_t C = options_.n_embd;
    return options_.n_layer * 12 * C * C + options_.vocab_size * C;
  }

  /// Training mode (the default) applies dropout; eval mode does not.
  void train(bool on = true) noexcept { drop_.train(on); }
  void eval() noexcept { drop_.eval(); }
  /// The step the next forward draws its dropout mask for (the run's step counter).
  void set_step(std::uint32_t step) noexcept { drop_.set_step(step); }
  /// The dropout layer (its step and mode are part of a checkpoint: register it).
  Dropout& dropout() noexcept { return drop_; }
  const Dropout& dropout() const noexcept { return drop_; }

  template <amp::Policy P = amp::Fp32, class E, class I, class TL>
  void forward(const E& exec, Context& ctx, TensorView<I, 2, S> ids, TensorView<TL, 2, S> logits) {
    using T = TL;
    detail::check_call<P, E, S, TL>();
    check_ids("nn::Gpt::forward", ids);
    const std::int64_t B = ids.size(0), Tn = ids.size(1), N = B * Tn, C = options_.n_embd;
    TRAINKIT_CHECK(logits.size(0) == N && logits.size(1) == options_.vocab_size,
                   "nn::Gpt::forward: logits ", detail::shape_of(logits), " for ids [", B, ", ", Tn,
                   "] must be [", N, ", ", options_.vocab_size, "]");
    detail::check_rows("nn::Gpt::forward", "logits", logits);
    ctx.rec_.template set<T>(B, Tn, C);
    ctx.blocks_.resize(blocks_.size());
    ctx.dropped_ = drop_.training() && drop_.options().p > 0.0f;
    ctx.drop_step_ = drop_.step();
    T* xs = ctx.xs_.template get<T>((n_layer() + 1) * N * C);
    T* emb = ctx.dropped_ ? ctx.emb_.template get<T>(N * C) : xs;
    const auto flat_ids = ids.template reshape<1>(Extents<1>{{N}});
    wte_.template forward<P>(exec, flat_ids, mat(emb, N, C));
    wpe_.template forward<P>(exec, positions(ctx, B, Tn), mat(emb, N, C), Write::kAccumulate);
    if (ctx.dropped_) drop_.template forward<P>(exec, mat<const T>(emb, N, C), mat(xs, N, C));
    for (std::int64_t l = 0; l < n_layer(); ++l)
      blocks_[std::size_t(l)].template forward<P>(exec, ctx.blocks_[std::size_t(l)],
                                                  cube<const T>(xs + l * N * C, B, Tn),
                                                  cube(xs + (l + 1) * N * C, B, Tn));
    T* h = ctx.h_.template get<T>(N * C);
    ln_f_.template forward<P>(exec, ctx.ln_f_, mat<const T>(xs + n_layer() * N * C, N, C),
                              mat(h, N, C));
    lm_head_.template forward<P>(exec, mat<const T>(h, N, C), logits);
  }

  /// Adds the gradients of the forward that filled ctx (with these ids) to the arena, given
  /// dlogits [B*T, V]. `grads_ready(ParamId)` is called for each parameter once its gradient is
  /// final (after its layer's backward was issued on exec), in the order backward completes
  /// them: lm_head, ln_f, the blocks from the last, wpe, wte. Data parallelism starts each
  /// gradient bucket's all-reduce there (dist::GradBucketer::mark_ready), overlapping the rest.
  template <amp::Policy P = amp::Fp32, class E, class I, class TD, class Ready = NoGradsReady>
  void backward(const E& exec, const Context& ctx, TensorView<I, 2, S> ids,
                TensorView<TD, 2, S> dlogits, Ready&& grads_ready = {}) {
    using T = std::remove_const_t<TD>;
    detail::check_call<P, E, S, TD>();
    check_ids("nn::Gpt::backward", ids);
    const std::int64_t B = ids.size(0), Tn = ids.size(1), N = B * Tn, C = options_.n_embd;
    ctx.rec_.template check<T>("nn::Gpt::backward", B, Tn, C);
    TRAINKIT_CHECK(ctx.blocks_.size() == blocks_.size(),
                   "nn::Gpt::backward: the context holds the forward of a model with ",
                   ctx.blocks_.size(), " layers, this one has ", blocks_.size());
    TRAINKIT_CHECK(dlogits.size(0) == N && dlogits.size(1) == options_.vocab_size,
                   "nn::Gpt::backward: dlogits ", detail::shape_of(dlogits), " must be [", N, ", ",
                   options_.vocab_size, "]");
    detail::check_rows("nn::Gpt::backward", "dlogits", dlogits);
    const T* xs = ctx.xs_.template data<T>();
    T* da = da_.template get<T>(N * C);
    T* db = db_.template get<T>(N * C);
    std::size_t stage = 0;
    const auto stage_done = [&] {
      for (const ParamId id : ready_stages_[stage]) grads_ready(id);
      ++stage;
    };
    lm_head_.template backward<P>(exec, mat(ctx.h_.template data<T>(), N, C),
                                  TensorView<const T, 2, S>(dlogits), mat(da, N, C));
    if (!options_.tie_weights) stage_done();
    ln_f_.template backward<P>(exec, ctx.ln_f_, mat(xs + n_layer() * N * C, N, C),
                               mat<const T>(da, N, C), mat(db, N, C));
    stage_done();
    std::swap(da, db);  // da: the gradient of the current block's output
    for (std::int64_t l = n_layer(); l-- > 0;) {
      blocks_[std::size_t(l)].template backward<P>(exec, ctx.blocks_[std::size_t(l)],
                                                   cube(xs + l * N * C, B, Tn),
                                                   cube<const T>(da, B, Tn), cube(db, B, Tn));
      stage_done();
      std::swap(da, db);
    }
    if (ctx.dropped_) {  // the mask of the forward's step, whatever the layer's state is now
      Dropout mask = drop_;
      mask.train();
      mask.set_step(ctx.drop_step_);
      mask.template backward<P>(exec, mat(ctx.emb_.template data<T>(), N, C),
                                mat<const T>(da, N, C), mat(db, N, C));
      std::swap(da, db);
    }
    const auto flat_ids = ids.template reshape<1>(Extents<1>{{N}});
    wpe_.template backward<P>(exec, stored_positions(ctx, N), mat<const T>(da, N, C));
    stage_done();
    wte_.template backward<P>(exec, flat_ids, mat<const T>(da, N, C));
    stage_done();
  }

  /// Continues `tokens` by `count` tokens (nanoGPT's GPT.generate): each one from a forward over
  /// the last block_size tokens, the argmax at temperature 0, else drawn from
  /// softmax(logits / temperature) with `rng` (deterministic for a given stream). Dropout is off
  /// meanwhile. Returns the new tokens; `ctx` is refilled (use one that no backward waits for).
  /// The sampling runs on the host: on the device, the last row of logits is copied back.
  template <amp::Policy P = amp::Fp32, class E>
  std::vector<std::int32_t> generate(const E& exec, Context& ctx, std::vector<std::int32_t> tokens,
                                     std::int64_t count, double temperature, PhiloxStream& rng) {
    using T = amp::activation_t<P>;
    TRAINKIT_CHECK(!tokens.empty() && count >= 0 && temperature >= 0.0,
                   "nn::Gpt::generate: needs at least one token, count >= 0 and temperature >= 0");
    const std::int64_t V = options_.vocab_size;
    struct RestoreMode {  // dropout's mode comes back however generate leaves
      Dropout& drop;
      bool training;
      ~RestoreMode() { drop.train(training); }
    } restore{drop_, drop_.training()};
    drop_.eval();
    std::vector<std::int32_t> out;
    std::vector<T> row(static_cast<std::size_t>(V));
    std::vector<double> p(row.size());
    for (std::int64_t i = 0; i < count; ++i) {
      const auto n = std::min<std::int64_t>(std::int64_t(tokens.size()), options_.block_size);
      auto* ids = gen_ids_.template get<std::int32_t>(n);
      copy_bytes(ids, S, tokens.data() + tokens.size() - std::size_t(n), Space::kHost,
                 std::size_t(n) * sizeof(std::int32_t), "nn::Gpt::generate");
      T* logits = gen_logits_.template get<T>(n * V);
      forward<P>(exec, ctx, make_view<S>(static_cast<const std::int32_t*>(ids), {1, n}),
                 mat(logits, n, V));
      copy_bytes(row.data(), Space::kHost, logits + (n - 1) * V, S, row.size() * sizeof(T),
                 "nn::Gpt::generate");  // waits for the forward on the device
      // Nothing to draw from (torch.multinomial refuses such a row too): NaN or +inf anywhere,
      // or every logit -inf. Greedy or not, token 0 would come out silently.
      bool drawable = false;
      for (const T& x : row) {
        const float f = detail::load(x);
        TRAINKIT_CHECK(!std::isnan(f) && f != std::numeric_limits<float>::infinity(),
                       "nn::Gpt::generate: the logits of new token ", i,
                       " hold NaN or +inf (has the model diverged?)");
        drawable = drawable || f != -std::numeric_limits<float>::infinity();
      }
      TRAINKIT_CHECK(drawable, "nn::Gpt::generate: every logit of new token ", i, " is -inf");
      std::int64_t next = 0;
      for (std::int64_t v = 1; v < V; ++v)
        if (detail::load(row[std::size_t(v)]) > detail::load(row[std::size_t(next)])) next = v;
      if (temperature > 0.0) {
        const double top = detail::load(row[std::size_t(next)]);
        double total = 0.0;
        for (std::size_t v = 0; v < p.size(); ++v)
          total += p[v] = std::exp((double(detail::load(row[v])) - top) / temperature);
        double u = double(rng.next_uniform()) * total;
        for (next = 0; next < V - 1 && (u -= p[std::size_t(next)]) >= 0.0; ++next) {
        }
      }
      tokens.push_back(std::int32_t(next));
      out.push_back(std::int32_t(next));
    }
    return out;
  }

 private:
  static constexpr Init kInit = Init::normal(0.0f, 0.02f);

  static GptOptions checked(const GptOptions& o) {
    TRAINKIT_CHECK(
        o.vocab_size > 0 && o.block_size > 0 && o.n_layer > 0 && o.n_head > 0 && o.n_embd > 0,
        "nn::Gpt: vocab_size, block_size, n_layer, n_head and n_embd must be > 0, got ",
        o.vocab_size, ", ", o.block_size, ", ", o.n_layer, ", ", o.n_head, ", ", o.n_embd);
    TRAINKIT_CHECK(o.n_embd % o.n_head == 0, "nn::Gpt: n_embd ", o.n_embd,
                   " is not a multiple of n_head ", o.n_head);
    // Dropout's own check, made here before any parameter is registered, naming the option.
    detail::check_dropout_probability(o.dropout, "nn::Gpt", "dropout");
    return o;
  }
  static std::vector<TransformerBlock<S>> make_blocks(ParamArena<S>& arena, const GptOptions& o) {
    std::vector<TransformerBlock<S>> blocks;
    blocks.reserve(static_cast<std::size_t>(o.n_layer));
    for (std::int64_t l = 0; l < o.n_layer; ++l)
      blocks.emplace_back(arena, "transformer.h." + std::to_string(l),
                          TransformerBlockOptions{.n_embd = o.n_embd,
                                                  .n_head = o.n_head,
                                                  .bias = o.bias,
                                                  .n_layer = o.n_layer,
                                                  .fused_attention = o.fused_attention});
    return blocks;
  }

  std::int64_t n_layer() const noexcept { return options_.n_layer; }

  template <class V>
  void check_ids(const char* who, const V& ids) const {
    TRAINKIT_CHECK(ids.size(0) >= 1 && ids.size(1) >= 1 && ids.size(1) <= options_.block_size, who,
                   ": ids ", detail::shape_of(ids),
                   " must be [B, T] with B >= 1 and 1 <= T <= ", options_.block_size,
                   " (block_size)");
    detail::check_contiguous(who, "ids", ids);
  }

  /// Position ids n % T for a [B, T] batch, rebuilt only when the shape changes.
  TensorView<const std::int32_t, 1, S> positions(Context& ctx, std::int64_t B, std::int64_t T) {
    const std::int64_t N = B * T;
    if (ctx.pos_shape_ != std::pair{B, T}) {
      std::vector<std::int32_t> pos(static_cast<std::size_t>(N));
      for (std::int64_t n = 0; n < N; ++n) pos[std::size_t(n)] = static_cast<std::int32_t>(n % T);
      copy_bytes(ctx.pos_.template get<std::int32_t>(N), S, pos.data(), Space::kHost,
                 pos.size() * sizeof(std::int32_t), "nn::Gpt positions");
      ctx.pos_shape_ = {B, T};
    }
    return stored_positions(ctx, N);
  }
  static TensorView<const std::int32_t, 1, S> stored_positions(const Context& ctx, std::int64_t N) {
    return TensorView<const std::int32_t, 1, S>(ctx.pos_.template data<std::int32_t>(),
                                                Extents<1>{{N}});
  }

  template <class T>
  static TensorView<T, 2, S> mat(T* p, std::int64_t rows, std::int64_t cols) {
    return detail::mat<S>(p, rows, cols);
  }
  template <class T>
  TensorView<T, 3, S> cube(T* p, std::int64_t B, std::int64_t T_) const {
    return make_view<S>(p, {B, T_, options_.n_embd});
  }

  GptOptions options_;
  Embedding<S> wte_;
  Embedding<S> wpe_;
  std::vector<TransformerBlock<S>> blocks_;
  LayerNorm<S> ln_f_;
  Linear<S> lm_head_;
  Dropout drop_;
  std::vector<std::vector<ParamId>> ready_stages_;  // see the constructor and backward
  detail::Bytes<S> da_, db_;  // backward's two gradient buffers [N, C], swapped layer by layer
  detail::Bytes<S> gen_ids_, gen_logits_;  // generate()'s window and logits
};

template <Space S>
Gpt(ParamArena<S>&, GptOptions) -> Gpt<S>;

}  // namespace nn
TRAINKIT_NAMESPACE_END
