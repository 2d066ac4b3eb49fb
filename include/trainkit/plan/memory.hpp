// SPDX-License-Identifier: MIT
// trainkit/plan/memory.hpp: what one rank of a nn::Gpt training run allocates, line by line, before
// anything is allocated: the arena's parameters, gradients, optimizer state and compute copy
// (sizes read from a ParamArena the model registered into, never finalized, and from the
// optimizer rule's own state declaration), the activations the model's Context saves for
// backward, the layers' backward workspaces, the logits, the loader's batch slots and the
// data-parallel staging buffer. The activation sizes follow the Context layouts of the layers
// (nn/gpt.hpp, nn/transformer_block.hpp, nn/attention.hpp, nn/layer_norm.hpp,
// nn/cross_entropy.hpp); tests/plan checks the total against the bytes a real step allocates
// (core/allocator.hpp's allocation_stats). See docs/planning.md.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "trainkit/config.hpp"
#include "trainkit/core/checked.hpp"
#include "trainkit/core/shape.hpp"
#include "trainkit/error.hpp"
#include "trainkit/monitor/throughput.hpp"
#include "trainkit/nn/gpt.hpp"
#include "trainkit/nn/layer_norm.hpp"
#include "trainkit/nn/param_arena.hpp"
#include "trainkit/optim/adamw.hpp"
#include "trainkit/optim/grad_scaler.hpp"
#include "trainkit/optim/param_groups.hpp"
#include "trainkit/optim/rule.hpp"

TRAINKIT_NAMESPACE_BEGIN
namespace plan {

/// What one training run of a nn::Gpt looks like to the planner (per rank).
struct GptRun {
  nn::GptOptions model{};  ///< vocab_size, block_size, n_layer, n_head, n_embd, bias, tie, dropout
  std::int64_t batch = 1;  ///< sequences per rank per step (the micro-batch)
  std::int64_t seq = 0;    ///< tokens per sequence T (0: model.block_size)
  /// The policy: fp32 and tf32 keep f32 activations, bf16 and fp16 16-bit activations and a
  /// compute copy of the weights; fp16 adds a loss scaler.
  monitor::Precision precision = monitor::Precision::kFp32;
  optim::AdamWOptions adamw{};    ///< amsgrad and bf16_state decide the optimizer state
  std::int64_t ranks = 1;         ///< data-parallel ranks (each holds everything below)
  bool bf16_compression = false;  ///< GradBucketer's bf16 staging buffer (ranks > 1 only)
  std::int64_t loader_depth = 4;  ///< the Prefetcher's batch slots (0: no loader counted)
  bool device = true;       ///< a GPU run: loader slots in pinned host memory and on the device
  bool evaluation = false;  ///< evaluation forwards (a second Context and a validation loader)
};

/// One line of the memory breakdown.
struct MemoryLine {
  std::string name;        ///< e.g. "optimizer state"
  std::int64_t bytes = 0;  ///< per rank
  std::string detail;      ///< how it is made up, e.g. "exp_avg, exp_avg_sq (f32)"
  bool on_device = true;   ///< in the training device's memory (false: pinned host memory)
};

/// The memory of one rank: the lines in the order a run allocates them.
struct MemoryPlan {
  std::vector<MemoryLine> lines;
  std::int64_t parameters = 0;     ///< parameter elements (as ParamArena::num_parameters)
  std::int64_t buffer_numel = 0;   ///< elements of each arena buffer (padding included)
  std::int64_t matmul_params = 0;  ///< the N of 6 N FLOPs per token (Gpt::matmul_parameters)
  /// The lines in the training device's memory (what must fit a GPU, or the host on a CPU run).
  std::int64_t device_bytes() const noexcept {
    std::int64_t n = 0;
    for (const MemoryLine& l : lines)
      if (l.on_device) n += l.bytes;
    return n;
  }
  /// Every line (device and host together: what a CPU run holds in host memory).
  std::int64_t total_bytes() const noexcept {
    std::int64_t n = 0;
    for (const MemoryLine& l : lines) n += l.bytes;
    return n;
  }
  /// The line named `name`; throws when there is none.
  const MemoryLine& line(const std::string& name) const {
    for (const MemoryLine& l : lines)
      if (l.name == name) return l;
    TRAINKIT_FAIL("plan::MemoryPlan: no line named '", name, "'");
  }
};

/// "fp32", "tf32", "bf16", "fp16" as a monitor::Precision; throws naming `flag` (e.g.
/// "--precision") otherwise.
inline monitor::Precision parse_precision(const std::string& text,
                                          const char* flag = "--precision") {
  for (int i = 0; i < 4; ++i)
    if (text == monitor::precision_name(monitor::Precision(i))) return monitor::Precision(i);
  TRAINKIT_FAIL(flag, ": precision '", ::trainkit::detail::printable_bytes(text),
                "' is not fp32, tf32, bf16 or fp16");
}

/// Bytes of one activation element under `p` (the policy's activation type).
inline constexpr std::int64_t activation_bytes(monitor::Precision p) noexcept {
  return p == monitor::Precision::kBf16 || p == monitor::Precision::kFp16 ? 2 : 4;
}

/// Throws, naming the flag of each setting (--layers, --dim, --heads, --seq, --batch, --ranks,
/// --vocab), unless the run is one nn::Gpt can train: positive sizes, heads dividing dim,
/// seq <= block_size.
inline void check_run(const GptRun& r) {
  const nn::GptOptions& m = r.model;
  TRAINKIT_CHECK(m.n_layer > 0, "--layers must be > 0, got ", m.n_layer);
  TRAINKIT_CHECK(m.n_embd > 0, "--dim must be > 0, got ", m.n_embd);
  TRAINKIT_CHECK(m.n_head > 0, "--heads must be > 0, got ", m.n_head);
  TRAINKIT_CHECK(m.n_embd % m.n_head == 0, "--dim ", m.n_embd, " is not a multiple of --heads ",
                 m.n_head);
  TRAINKIT_CHECK(m.vocab_size > 0, "--vocab must be > 0, got ", m.vocab_size);
  TRAINKIT_CHECK(m.block_size > 0, "--seq must be > 0, got ", m.block_size);
  TRAINKIT_CHECK(r.seq >= 0 && r.seq <= m.block_size, "--seq ", r.seq,
                 " must be in [1, block_size ", m.block_size, "]");
  TRAINKIT_CHECK(r.batch > 0, "--batch must be > 0, got ", r.batch);
  TRAINKIT_CHECK(r.ranks > 0, "--ranks must be > 0, got ", r.ranks);
  TRAINKIT_CHECK(r.loader_depth == 0 || r.loader_depth >= 2, "loader depth must be 0 or >= 2, got ",
                 r.loader_depth);
  // The planner multiplies these in 64 bits; keep every factor well inside. The layers are
  // registered into an arena to be counted (kilobytes each): at most 2^14.
  constexpr std::int64_t kMax = std::int64_t{1} << 24;
  TRAINKIT_CHECK(m.n_layer <= (std::int64_t{1} << 14) && m.n_embd <= kMax && m.vocab_size <= kMax &&
                     m.block_size <= kMax && r.batch <= (std::int64_t{1} << 31) && r.ranks <= kMax,
                 "plan: a size is beyond what the planner handles (--layers at most 2^14; each "
                 "of --dim, --vocab, --seq and --ranks at most 2^24, --batch at most 2^31)");
}

/// The parameter counts of a nn::Gpt, read from a ParamArena the model registered into (the
/// arena is never finalized: nothing is allocated).
struct GptSizes {
  std::int64_t parameters = 0;     ///< ParamArena::num_parameters()
  std::int64_t buffer_numel = 0;   ///< ParamArena::buffer_numel(): each buffer, padding included
  std::int64_t tensors = 0;        ///< registered parameter tensors
  std::int64_t matmul_params = 0;  ///< Gpt::matmul_parameters()
};

/// Registers `model` into a host ParamArena (no allocation) and reads its sizes.
inline GptSizes gpt_sizes(const nn::GptOptions& model) {
  nn::ParamArena<Space::kHost> arena;
  const nn::Gpt<Space::kHost> gpt(arena, model);
  return {arena.num_parameters(), arena.buffer_numel(), static_cast<std::int64_t>(arena.size()),
          gpt.matmul_parameters()};
}

/// The sizes of a model that exists: its arena (finalized or not) and the model itself.
template <Space S>
GptSizes gpt_sizes(const nn::ParamArena<S>& arena, const nn::Gpt<S>& model) {
  return {arena.num_parameters(), arena.buffer_numel(), static_cast<std::int64_t>(arena.size()),
          model.matmul_parameters()};
}

namespace detail {

/// a * b * ...: throws a plan error when the product leaves 64 bits.
inline std::int64_t mul(std::int64_t a, std::int64_t b) {
  return checked_mul(a, b, "plan: a memory size");
}
template <class... R>
std::int64_t mul(std::int64_t a, std::int64_t b, std::int64_t c, R... rest) {
  return mul(mul(a, b), c, rest...);
}
/// a + b + ...: throws a plan error when the sum leaves 64 bits.
inline std::int64_t add(std::int64_t a) { return a; }
template <class... R>
std::int64_t add(std::int64_t a, std::int64_t b, R... rest) {
  return add(checked_add(a, b, "plan: a memory size"), rest...);
}

/// Whether a run's attention takes the GPU's fused core (nn::CausalSelfAttention's rule).
inline bool gpt_fused_attention(const nn::GptOptions& m, bool device) {
  return device && m.fused_attention && m.n_head > 0 &&
         nn::detail::fused_attention_supports(m.n_embd / m.n_head);
}

/// Bytes of one rank's activations of a Gpt forward over [B, T] (nn::Gpt::Context): the block
/// inputs, ln_f's output, position ids, per block the contexts of ln_1, attention and ln_2 and the
/// block's own h1, x1, h2, pre, g.
inline std::int64_t gpt_context_bytes(const nn::GptOptions& m, std::int64_t B, std::int64_t T,
                                      std::int64_t a, bool dropout, bool fused) {
  const std::int64_t N = mul(B, T), C = m.n_embd, H = m.n_head, L = m.n_layer;
  const std::int64_t NC = mul(N, C);
  const std::int64_t ln_stats = mul(2 * N + 1, 4);  // mean, rstd (f32) and one spare
  // ln_1, ln_2 stats; qkv (3NC), heads (NC), h1, x1, h2 (NC each), pre and g (4NC each);
  // the probabilities [B, H, T, T], or the fused core's f32 log-sum-exps [B, H, T].
  const std::int64_t saved = fused ? mul(B, H, T, 4) : mul(B, H, T, T, a);
  const std::int64_t block = add(mul(2, ln_stats), mul(15, NC, a), saved);
  std::int64_t bytes = add(mul(L + 1, NC, a), mul(NC, a), mul(N, 4), ln_stats, mul(L, block));
  if (dropout) bytes = add(bytes, mul(NC, a));  // the embeddings before dropout
  return bytes;
}

/// Bytes of the layers' own scratch once a forward and a backward over [B, T] ran: per block
/// the attention output, the f32 scores (the fused core: its f32 row sums [B, H, T]), dheads,
/// dqkv, dS (16-bit operands only, materialised core), dpre, dh, dx1 and two LayerNorm
/// partial-sum tables; ln_f's table; the model's da / db.
inline std::int64_t gpt_workspace_bytes(const nn::GptOptions& m, std::int64_t B, std::int64_t T,
                                        std::int64_t a, bool fused) {
  const std::int64_t N = mul(B, T), C = m.n_embd, H = m.n_head, L = m.n_layer;
  const std::int64_t NC = mul(N, C);
  const std::int64_t chunks = (N + nn::detail::kLayerNormChunk - 1) / nn::detail::kLayerNormChunk;
  const std::int64_t ln_partial = mul(chunks, 2, C, 4);
  const std::int64_t scores = fused ? mul(B, H, T, 4) : mul(B, H, T, T, 4);
  const std::int64_t dscores = a == 4 || fused ? 0 : mul(B, H, T, T, a);
  // a (NC), dheads (NC), dqkv (3NC), dpre (4NC), dh (NC), dx1 (NC): 11 NC.
  const std::int64_t block = add(mul(11, NC, a), scores, dscores, mul(2, ln_partial));
  return add(mul(L, block), ln_partial, mul(2, NC, a));
}

}  // namespace detail

/// The memory of one rank of `run` for a model of `sizes` (gpt_sizes(run.model)): pure
/// arithmetic, cheap enough to search batch sizes with. Throws for an invalid run (check_run).
inline MemoryPlan gpt_memory(const GptRun& run, const GptSizes& sizes) {
  check_run(run);
  using detail::mul;
  const nn::GptOptions& m = run.model;
  const std::int64_t B = run.batch, T = run.seq > 0 ? run.seq : m.block_size;
  const std::int64_t a = activation_bytes(run.precision);
  const std::int64_t n = sizes.buffer_numel;
  const std::string elems = std::to_string(n) + " elements";
  MemoryPlan p;
  p.parameters = sizes.parameters;
  p.buffer_numel = n;
  p.matmul_params = sizes.matmul_params;

  p.lines.push_back({"parameters", mul(n, 4) + n / nn::ParamArena<>::kAlignment,
                     "f32 master weights, " + elems + " + padding mask"});
  p.lines.push_back({"gradients", mul(n, 4), "f32, " + elems});
  using Traits = optim::detail::RuleTraits<optim::detail::AdamWRule>;
  const unsigned variant = optim::detail::AdamWRule::variant(run.adamw);
  const int states = Traits::num_states(variant);
  const bool bf16_state = Traits::state_dtype(variant) == DType::kBF16;
  // The fused step's own tables: its header, the per-group scalars, a group and a start per
  // segment (at most one segment per parameter tensor).
  const std::int64_t tables =
      static_cast<std::int64_t>(sizeof(optim::StepHeader)) +
      mul(optim::kMaxParamGroups,
          static_cast<std::int64_t>(sizeof(optim::detail::AdamWRule::Scalars))) +
      mul(sizes.tensors + 1, 12);
  std::string names;
  for (int k = 0; k < states; ++k)
    names += std::string(k == 0 ? "" : ", ") + optim::detail::AdamWRule::kStates[std::size_t(k)];
  p.lines.push_back({"optimizer state", detail::add(mul(states, n, bf16_state ? 2 : 4), tables),
                     "AdamW " + names + (bf16_state ? " (bf16)" : " (f32)")});
  if (a == 2)
    p.lines.push_back({"compute copy", mul(n, 2),
                       std::string(monitor::precision_name(run.precision)) + " weights"});
  if (run.precision == monitor::Precision::kFp16)
    p.lines.push_back({"loss scaler", static_cast<std::int64_t>(sizeof(optim::detail::ScalerBlock)),
                       "dynamic loss scale"});

  const bool dropout = m.dropout > 0.0f;
  const std::string shape =
      trainkit::detail::concat("[", B, ", ", T, "] ", a == 2 ? "16-bit" : "f32", " activations");
  const bool fused = detail::gpt_fused_attention(m, run.device);
  p.lines.push_back({"activations", detail::gpt_context_bytes(m, B, T, a, dropout, fused),
                     "saved for backward, " + shape});
  const std::int64_t N = mul(B, T);
  const std::int64_t ld = nn::logits_row_stride(m.vocab_size);  // CausalLmTask's padded rows
  p.lines.push_back({"logits", detail::add(mul(2, N, ld, a), mul(3 * N + 1, 4), 4),
                     trainkit::detail::concat("logits and their gradient [", N, ", ", m.vocab_size,
                                              "] (rows of ", ld, "), cross-entropy statistics")});
  p.lines.push_back({"backward workspaces", detail::gpt_workspace_bytes(m, B, T, a, fused),
                     "attention scores, layer scratch, gradient ping-pong"});
  if (run.evaluation)
    p.lines.push_back({"evaluation context", detail::gpt_context_bytes(m, B, T, a, false, fused),
                       "a second Context for evaluation forwards"});

  if (run.loader_depth > 0) {
    // A Prefetcher slot holds input and target [B, T] int32, each 256-byte aligned, then the
    // B int64 row indices (data/prefetcher.hpp).
    const auto align = [](std::int64_t x) { return (x + 255) / 256 * 256; };
    const std::int64_t field = mul(B, T, 4);
    const std::int64_t slot = align(align(field) + field) + mul(B, 8);
    const std::int64_t loaders = run.evaluation ? 2 : 1;
    const std::int64_t bytes = mul(loaders, run.loader_depth, slot);
    const std::string what =
        trainkit::detail::concat(loaders * run.loader_depth, " batch slots of ", slot, " bytes");
    if (run.device) {
      p.lines.push_back({"loader slots", bytes, what + " on the device", true});
      p.lines.push_back({"loader host slots", bytes, what + " in pinned host memory", false});
    } else {
      p.lines.push_back({"loader slots", bytes, what, true});
    }
  }
  if (run.ranks > 1 && run.bf16_compression)
    p.lines.push_back(
        {"gradient staging", mul(n, 2),
         trainkit::detail::concat("bf16 all-reduce staging over ", run.ranks, " ranks")});
  std::int64_t total = 0;  // so that device_bytes() and total_bytes() fit 64 bits
  for (const MemoryLine& l : p.lines) total = detail::add(total, l.bytes);
  return p;
}

/// gpt_memory(run, gpt_sizes(run.model)).
inline MemoryPlan gpt_memory(const GptRun& run) {
  check_run(run);
  return gpt_memory(run, gpt_sizes(run.model));
}

}  // namespace plan
TRAINKIT_NAMESPACE_END
