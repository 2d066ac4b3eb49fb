// SPDX-License-Identifier: MIT
// trainkit/optim/prune.hpp: magnitude pruning of a ParamArena's weight matrices. `Pruner` keeps
// one mask byte per element beside the arena (its layout, its memory space), recomputes the masks
// by magnitude (unstructured, per tensor or global, or N:M structured such as the 2:4 pattern of
// sparse tensor cores), zeroes the pruned weights, gradients and optimizer moments in one flat
// pass each, follows Zhu & Gupta's gradual cubic sparsity schedule (or one shot at a step), and
// saves its masks in checkpoints. ckpt/pruned_model.hpp exports the result for PyTorch.
#pragma once

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <limits>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "trainkit/config.hpp"
#include "trainkit/core/any_tensor.hpp"
#include "trainkit/core/bytes.hpp"
#include "trainkit/core/dtype.hpp"
#include "trainkit/core/half.hpp"
#include "trainkit/core/shape.hpp"
#include "trainkit/core/state_dict.hpp"
#include "trainkit/core/tensor.hpp"
#include "trainkit/error.hpp"
#include "trainkit/exec/executor.hpp"
#include "trainkit/exec/launch.hpp"
#include "trainkit/nn/param_arena.hpp"
#include "trainkit/optim/param_groups.hpp"

TRAINKIT_NAMESPACE_BEGIN
namespace optim {

/// How Pruner::update spreads an unstructured sparsity target over the pruned tensors.
enum class PruneScope : std::uint8_t {
  kPerTensor,  ///< every tensor pruned to the target (torch.nn.utils.prune.l1_unstructured)
  kGlobal,     ///< the smallest magnitudes of all pruned tensors together (global_unstructured)
};

/// The settings of a Pruner (designated initializers: `{.scope = PruneScope::kGlobal}`).
struct PrunerOptions {
  /// Glob patterns (glob_match) of the parameters to prune; empty: every parameter of rank >= 2
  /// (weight matrices: biases and LayerNorm weights are rank 1).
  std::vector<std::string> include = {};
  /// Patterns left out even when included: embedding tables by default (nn::Embedding layers
  /// named "*emb*", GPT's "transformer.wte" / "transformer.wpe"). `{}` prunes them too.
  std::vector<std::string> exclude = {"*emb*", "*wte*", "*wpe*"};
  /// Unstructured pruning: per tensor or global (ignored with an N:M pattern).
  PruneScope scope = PruneScope::kPerTensor;
  /// N:M structured pruning when m > 0: in every group of m consecutive elements along the last
  /// (input) dimension at most m - n are pruned, the smallest magnitudes first; {2, 4} is the
  /// pattern of sparse tensor cores. m = 0: unstructured.
  int n = 0;
  int m = 0;
  /// apply() also zeroes the pruned entries of every optimizer state of the arena (Adam's m and
  /// v), so that a pruned weight never receives a momentum update.
  bool zero_optimizer_state = true;
  /// step() calls apply() after every optimizer step (a pass over the parameters and each
  /// state). false: only after a mask update, which is enough when mask_gradients() runs every
  /// step: a weight, gradient and moments at zero stay at zero through trainkit's SGD, AdamW and
  /// LAMB (weight decay included).
  bool apply_every_step = true;
};

/// The N:M pattern written "N:M" (e.g. "2:4", from a command line) as {n, m}; "" and
/// "unstructured" give {0, 0}. Throws trainkit::Error quoting the text unless both are integers
/// with 1 <= N < M <= 256.
inline std::pair<int, int> parse_prune_pattern(std::string_view text) {
  if (text.empty() || text == "unstructured") return {0, 0};
  const std::size_t colon = text.find(':');
  int n = 0, m = 0;
  bool ok = colon != std::string_view::npos && colon > 0 && colon + 1 < text.size();
  for (std::size_t i = 0; ok && i < text.size(); ++i) {
    if (i == colon) continue;
    ok = text[i] >= '0' && text[i] <= '9' && (i < colon ? n : m) < 1000;
    int& v = i < colon ? n : m;
    if (ok) v = v * 10 + (text[i] - '0');
  }
  TRAINKIT_CHECK(ok && n >= 1 && n < m && m <= 256, "optim: '", text,
                 "' is not an N:M pruning pattern such as 2:4 (integers, 1 <= N < M <= 256)");
  return {n, m};
}

/// Zhu & Gupta's gradual sparsity schedule ("To prune, or not to prune", 2017): masks are
/// updated at steps t = t0, t0 + dt, ..., t0 + n dt (t: completed optimizer steps) to
///   s_t = s_f + (s_i - s_f) (1 - (t - t0) / (n dt))^3,
/// and kept at s_f after. Between updates the last target stays in force; before t0 nothing is
/// pruned. n = 0 is one shot: s_f at t0. A pure function of the step, so a resumed run
/// recomputes it exactly. The default schedule never prunes.
struct SparsitySchedule {
  double initial_sparsity = 0.0;  ///< s_i, the target of the first update (at t0)
  double final_sparsity = 0.0;    ///< s_f
  std::int64_t begin_step = 0;    ///< t0
  std::int64_t every = 1;         ///< dt, steps between updates (>= 1)
  std::int64_t num_updates = 0;   ///< n: updates after the first one (0: one shot at t0)

  /// From s_i at step `begin` to `final` at step `end` (the last update at or before `end` on
  /// the grid of `every`; end == begin is one shot).
  static SparsitySchedule gradual(double final, std::int64_t begin, std::int64_t end,
                                  std::int64_t every, double initial = 0.0) {
    TRAINKIT_CHECK(every >= 1 && begin >= 0 && end >= begin,
                   "optim::SparsitySchedule::gradual: needs every >= 1 and ",
                   "0 <= begin <= end, got begin ", begin, ", end ", end, ", every ", every);
    return {initial, final, begin, every, (end - begin) / every};
  }
  /// `sparsity` at once after `step` completed steps (PyTorch's one-shot prune).
  static SparsitySchedule one_shot(std::int64_t step, double sparsity) {
    return {sparsity, sparsity, step, 1, 0};
  }

  /// Throws unless 0 <= s_i, s_f <= 1, t0 >= 0, dt >= 1, n >= 0 and the last update step
  /// t0 + n dt fits in 64 bits.
  void validate() const {
    TRAINKIT_CHECK(initial_sparsity >= 0.0 && initial_sparsity <= 1.0 && final_sparsity >= 0.0 &&
                       final_sparsity <= 1.0,
                   "optim::SparsitySchedule: sparsities must be in [0, 1], got initial ",
                   initial_sparsity, " and final ", final_sparsity);
    TRAINKIT_CHECK(
        begin_step >= 0 && every >= 1 && num_updates >= 0,
        "optim::SparsitySchedule: needs begin_step >= 0, every >= 1 and num_updates >= 0,", " got ",
        begin_step, ", ", every, " and ", num_updates);
    TRAINKIT_CHECK(num_updates <= (std::numeric_limits<std::int64_t>::max() - begin_step) / every,
                   "optim::SparsitySchedule: the last update, at begin_step + num_updates * ",
                   "every = ", begin_step, " + ", num_updates, " * ", every,
                   ", is beyond step 2^63 - 1");
  }
  /// True when the masks are updated after `step` completed steps.
  bool updates_at(std::int64_t step) const noexcept {
    return step >= begin_step && (step - begin_step) % every == 0 &&
           (step - begin_step) / every <= num_updates;
  }
  /// The last step that updates the masks.
  std::int64_t end_step() const noexcept { return begin_step + num_updates * every; }
  /// The target in force after `step` completed steps (0 before t0).
  double at(std::int64_t step) const noexcept {
    if (step < begin_step) return 0.0;
    if (num_updates == 0) return final_sparsity;
    const std::int64_t k = std::min(num_updates, (step - begin_step) / every);
    if (k == 0) return initial_sparsity;  // exactly s_i (the formula rounds)
    const double r = 1.0 - static_cast<double>(k) / static_cast<double>(num_updates);
    return final_sparsity + (initial_sparsity - final_sparsity) * (r * r * r);
  }
};

/// Options of Pruner::update.
struct PruneUpdateOptions {
  /// Elements pruned now stay pruned (masks only shrink), counted towards the target; the
  /// schedule's updates (Pruner::step) always do this. false: masks recomputed from scratch.
  bool keep_pruned = false;
};

/// Pruned elements per tensor and overall (Pruner::report()).
struct PruneReport {
  struct Entry {
    std::string name;
    Shape shape;
    std::int64_t numel = 0;
    std::int64_t pruned = 0;
    double sparsity() const noexcept {
      return numel == 0 ? 0.0 : static_cast<double>(pruned) / static_cast<double>(numel);
    }
  };
  std::vector<Entry> tensors;    ///< the pruned parameters, in registration order
  std::int64_t numel = 0;        ///< elements of those parameters
  std::int64_t pruned = 0;       ///< of which pruned
  std::int64_t model_numel = 0;  ///< elements of every parameter of the arena
  double target = 0.0;           ///< the target of the last update
  /// Fraction pruned of the pruned parameters' elements.
  double sparsity() const noexcept {
    return numel == 0 ? 0.0 : static_cast<double>(pruned) / static_cast<double>(numel);
  }
  /// Fraction pruned of all parameters (biases, norms, embeddings included).
  double model_sparsity() const noexcept {
    return model_numel == 0 ? 0.0 : static_cast<double>(pruned) / static_cast<double>(model_numel);
  }
  /// One line per tensor ("  0.weight [64, 30]: 1728 of 1920 pruned (90.00%)") and a total.
  std::string to_string() const {
    std::string s;
    char line[96];
    for (const Entry& e : tensors) {
      std::snprintf(line, sizeof(line), ": %lld of %lld pruned (%.2f%%)\n",
                    static_cast<long long>(e.pruned), static_cast<long long>(e.numel),
                    100.0 * e.sparsity());
      s += "  " + e.name + " " + e.shape.to_string() + line;
    }
    std::snprintf(line, sizeof(line),
                  "  total: %.2f%% of the pruned tensors, %.2f%% of the model\n",
                  100.0 * sparsity(), 100.0 * model_sparsity());
    return s + line;
  }
};

namespace detail {

/// x[i] = +0 where the mask byte is 0 (an AND of the bits, not a multiplication: pruned entries
/// become +0 whatever they held, NaN and infinities included). Branch-free: with a branch, the
/// random masks cost a misprediction every other element (20x slower on the host).
struct MaskSelect {
  float* x;
  const std::uint8_t* mask;
  TRAINKIT_HOST_DEVICE void operator()(std::int64_t i) const {
    const std::uint32_t keep = 0u - static_cast<std::uint32_t>(mask[i] != 0);
    x[i] = trainkit::detail::u32_to_f32(trainkit::detail::f32_to_u32(x[i]) & keep);
  }
};

/// The order in which elements are pruned: by this key, then by position (lower first). 0 for
/// an element that stays pruned; otherwise 1 + the bits of |w|, which order as the magnitudes
/// do, with every NaN above +inf (torch.topk's order: a NaN is pruned last).
inline std::uint32_t prune_key(float w) noexcept {
  std::uint32_t bits;
  std::memcpy(&bits, &w, sizeof(bits));
  return (bits & 0x7fffffffu) + 1u;
}

/// round(s * n) with ties to even: the count torch.nn.utils.prune takes for an amount s.
inline std::int64_t prune_count(double s, std::int64_t n) noexcept {
  return static_cast<std::int64_t>(std::nearbyint(s * static_cast<double>(n)));
}

/// A run of elements pruned together: `n` weights, their current and their new mask bytes.
struct PruneSpan {
  const float* w;
  const std::uint8_t* old_mask;
  std::uint8_t* new_mask;
  std::int64_t n;
};

/// New masks for `spans` taken together: the k elements smallest by (key, position) pruned,
/// everything else kept. With keep_pruned, elements pruned before stay pruned even when there are
/// more of them than k (masks only shrink). Exact and deterministic: a radix select over the
/// 32-bit keys (two histogram passes) and one pass writing the masks, in O(elements) without
/// sorting.
inline void select_smallest(const std::vector<PruneSpan>& spans, std::int64_t k, bool keep_pruned) {
  const std::uint32_t keep = keep_pruned ? 1u : 0u;
  if (keep_pruned) {
    std::int64_t pruned_before = 0;
    for (const PruneSpan& s : spans)
      pruned_before +=
          static_cast<std::int64_t>(std::count(s.old_mask, s.old_mask + s.n, std::uint8_t{0}));
    k = std::max(k, pruned_before);
  }
  const auto key = [keep](const PruneSpan& s, std::int64_t i) {  // branch-free
    return prune_key(s.w[i]) * (1u - (keep & static_cast<std::uint32_t>(s.old_mask[i] == 0)));
  };
  std::uint32_t threshold = 0;  // prune keys below it, and the first `take` equal to it
  std::int64_t take = 0;
  if (k > 0) {
    std::vector<std::int64_t> hist(65536);
    for (const PruneSpan& s : spans)
      for (std::int64_t i = 0; i < s.n; ++i) ++hist[key(s, i) >> 16];
    std::int64_t below = 0;
    std::uint32_t high = 0;
    while (below + hist[high] < k) below += hist[high++];
    std::fill(hist.begin(), hist.end(), 0);
    for (const PruneSpan& s : spans)
      for (std::int64_t i = 0; i < s.n; ++i) {
        const std::uint32_t v = key(s, i);
        if ((v >> 16) == high) ++hist[v & 0xffffu];
      }
    std::uint32_t low = 0;
    while (below + hist[low] < k) below += hist[low++];
    threshold = (high << 16) | low;
    take = k - below;
  }
  for (const PruneSpan& s : spans)
    for (std::int64_t i = 0; i < s.n; ++i) {
      const std::uint32_t v = k > 0 ? key(s, i) : 1u;
      bool prune = k > 0 && v < threshold;
      if (k > 0 && v == threshold && take > 0) {
        prune = true;
        --take;
      }
      s.new_mask[i] = prune ? 0 : 1;
    }
}

/// N:M: in every group of m consecutive elements of `s`, the k smallest by (key, position)
/// pruned (elements that stay pruned count towards k and are never kept).
inline void select_groups(const PruneSpan& s, int m, int k, bool keep_pruned) {
  std::array<std::pair<std::uint32_t, int>, 256> order;
  for (std::int64_t g = 0; g < s.n; g += m) {
    int pruned_before = 0;
    for (int j = 0; j < m; ++j) {
      const bool stays = keep_pruned && s.old_mask[g + j] == 0;
      pruned_before += stays ? 1 : 0;
      order[static_cast<std::size_t>(j)] = {stays ? 0u : prune_key(s.w[g + j]), j};
    }
    std::sort(order.begin(), order.begin() + m);
    const int prune = std::max(k, pruned_before);
    for (int j = 0; j < m; ++j)
      s.new_mask[g + order[static_cast<std::size_t>(j)].second] = j < prune ? 0 : 1;
  }
}

}  // namespace detail

/// Magnitude pruning of the parameters of a ParamArena (host or device, S).
///
/// The masks are one byte per element of the arena's buffers (1 keeps, 0 prunes; the padding and
/// the parameters that are not pruned stay 1), in the arena's memory space, so each of apply()
/// and mask_gradients() is one flat pass. update() recomputes them by magnitude on the host (a
/// device arena's weights are downloaded: a sync), and step() follows a SparsitySchedule.
///
/// With train::Loop, call `mask_gradients(exec)` after the backward of the task's step() and
/// `step(exec, n)` in its `on_optimizer_step(n)`, and register the pruner with
/// `loop.state().add("pruner", pruner)`.
///
/// Semantics against torch.nn.utils.prune: PyTorch keeps `weight_orig` and a float
/// `weight_mask` and recomputes `weight = weight_orig * mask` before each forward; gradients
/// reach weight_orig through that product, so pruned entries get zero gradient while
/// weight_orig itself may still drift (weight decay, old momentum) unseen. Here the parameter is
/// the pruned weight itself: apply() sets its pruned entries to exactly +0 (PyTorch's product
/// gives -0 for negative weights and NaN for NaN or inf ones), mask_gradients() gives the zero
/// gradients (so clipping norms and moments match PyTorch's), and the optimizer moments of pruned
/// entries are zeroed too (zero_optimizer_state). A sparsity target is the fraction of a tensor
/// (or of all pruned tensors), where PyTorch's `amount` in a repeated prune is a fraction of what
/// is still unpruned; counts are round(s * n) with ties to even, as PyTorch takes them. The
/// smallest magnitudes are pruned first, ties by position (the earlier element first, in
/// registration order for global pruning), and a NaN counts as larger than every number (as in
/// torch.topk), so it is pruned last.
template <Space S = Space::kHost>
class Pruner {
 public:
  /// Chooses the parameters to prune (see PrunerOptions) and starts with every mask at 1.
  /// Throws when the arena is not finalized, when no parameter matches, for a bad N:M pattern,
  /// or when a tensor's last dimension is not a multiple of M (naming the tensor), or for an
  /// invalid schedule (or one whose final sparsity an N:M pattern cannot reach).
  explicit Pruner(nn::ParamArena<S>& arena, PrunerOptions options = {},
                  SparsitySchedule schedule = {})
      : arena_(&arena), options_(std::move(options)), schedule_(schedule) {
    TRAINKIT_CHECK(arena.finalized(), "optim::Pruner: the ParamArena is not finalized");
    schedule_.validate();
    if (options_.m != 0) {
      TRAINKIT_CHECK(
          options_.m > 0 && options_.m <= 256 && options_.n >= 1 && options_.n < options_.m,
          "optim::Pruner: the N:M pattern ", options_.n, ":", options_.m,
          " needs 1 <= N < M <= 256");
      TRAINKIT_CHECK(schedule_.final_sparsity <= max_sparsity() &&
                         schedule_.initial_sparsity <= max_sparsity(),
                     "optim::Pruner: the schedule's sparsity ", schedule_.final_sparsity,
                     " is above ", max_sparsity(), ", the most a ", pattern(), " pattern prunes");
    }
    for (const nn::ParamInfo& p : arena.infos()) {
      const bool in =
          options_.include.empty() ? p.shape.rank() >= 2 : matches(options_.include, p.name);
      if (!in || matches(options_.exclude, p.name)) continue;
      if (options_.m != 0) {
        const std::int64_t inner = p.shape.rank() == 0 ? 1 : p.shape[p.shape.rank() - 1];
        TRAINKIT_CHECK(inner % options_.m == 0, "optim::Pruner: '", p.name, "' has shape ",
                       p.shape.to_string(), ": its last (input) dimension ", inner,
                       " is not a multiple of M = ", options_.m, " for the ", pattern(),
                       " pattern (leave it out with PrunerOptions::exclude)");
      }
      targets_.push_back(*arena.find(p.name));
    }
    TRAINKIT_CHECK(
        !targets_.empty(), "optim::Pruner: no parameter of the arena matches ",
        options_.include.empty() ? std::string("the default (rank >= 2)") : "the include patterns",
        " outside the exclude patterns");
    const std::int64_t n = arena.buffer_numel();
    host_.assign(static_cast<std::size_t>(n), 1);
    if constexpr (S != Space::kHost) device_ = Tensor<std::uint8_t, S>(Shape{n});
    upload();
  }

  Pruner(const Pruner&) = delete;
  Pruner& operator=(const Pruner&) = delete;

  /// The arena whose parameters this pruner prunes.
  const nn::ParamArena<S>& arena() const noexcept { return *arena_; }
  const PrunerOptions& options() const noexcept { return options_; }
  const SparsitySchedule& schedule() const noexcept { return schedule_; }
  /// The pruned parameters, in registration order.
  const std::vector<nn::ParamId>& targets() const noexcept { return targets_; }
  /// "unstructured" or "N:M".
  std::string pattern() const {
    return options_.m == 0 ? std::string("unstructured")
                           : std::to_string(options_.n) + ":" + std::to_string(options_.m);
  }
  /// The largest target update() accepts: 1, or (M - N) / M for an N:M pattern.
  double max_sparsity() const noexcept {
    return options_.m == 0 ? 1.0 : static_cast<double>(options_.m - options_.n) / options_.m;
  }
  /// The target of the last update (0 before the first).
  double target() const noexcept { return target_; }
  /// Elements pruned now (host bookkeeping, no device access).
  std::int64_t num_pruned() const noexcept { return pruned_; }

  /// Recomputes the masks for `target` (see the class comment for the order): unstructured,
  /// round(target * n) elements of each tensor (kPerTensor) or of all of them (kGlobal); N:M,
  /// round(target * M) of every group of M, at most M - N. With keep_pruned, pruned elements stay
  /// pruned and count towards the target (all of them stay pruned, also when they are more than
  /// the target asks for). Waits for `exec`'s queued work and reads the weights on the host; the
  /// weights themselves change only in apply(). Throws for a target outside [0, max_sparsity()].
  template <class E>
  void update(const E& exec, double target, PruneUpdateOptions options = {}) {
    static_assert((S == Space::kHost) == exec::is_host_executor_v<E>,
                  "optim::Pruner: a host arena needs exec::Host, a device arena exec::Cuda");
    TRAINKIT_CHECK(target >= 0.0 && target <= max_sparsity(), "optim::Pruner::update: target ",
                   target, " is outside [0, ", max_sparsity(), "] for the ", pattern(), " pattern");
    if constexpr (!exec::is_host_executor_v<E>) exec.synchronize();
    std::vector<float> staging;
    std::vector<detail::PruneSpan> spans;
    std::int64_t total = 0;
    for (nn::ParamId id : targets_) {
      const nn::ParamInfo& p = arena_->info(id);
      std::uint8_t* m = host_.data() + p.offset;
      spans.push_back({arena_->params_data() + p.offset, m, m, p.numel});
      total += p.numel;
    }
    if constexpr (S != Space::kHost) {  // download the pruned weights, one tensor after another
      staging.resize(static_cast<std::size_t>(total));
      std::int64_t at = 0;
      for (detail::PruneSpan& s : spans) {
        copy_bytes(staging.data() + at, Space::kHost, s.w, S,
                   static_cast<std::size_t>(s.n) * sizeof(float), "optim::Pruner");
        s.w = staging.data() + at;
        at += s.n;
      }
    }
    // The new masks go to a copy first: the selection reads the old ones throughout.
    std::vector<std::uint8_t> old(static_cast<std::size_t>(total));
    std::int64_t at = 0;
    for (detail::PruneSpan& s : spans) {
      std::copy(s.old_mask, s.old_mask + s.n, old.begin() + at);
      s.old_mask = old.data() + at;
      at += s.n;
    }
    if (options_.m != 0) {
      const int k = static_cast<int>(
          std::min<std::int64_t>(options_.m - options_.n, detail::prune_count(target, options_.m)));
      for (const detail::PruneSpan& s : spans)
        detail::select_groups(s, options_.m, k, options.keep_pruned);
    } else if (options_.scope == PruneScope::kGlobal) {
      detail::select_smallest(spans, detail::prune_count(target, total), options.keep_pruned);
    } else {
      for (const detail::PruneSpan& s : spans)
        detail::select_smallest({s}, detail::prune_count(target, s.n), options.keep_pruned);
    }
    target_ = target;
    recount();
    upload();
  }

  /// Zeroes the pruned weights (and, with zero_optimizer_state, their entries in every state
  /// buffer of the arena): one flat pass per buffer on `exec` (asynchronous on a CUDA stream).
  /// Nothing to do while no element is pruned.
  template <class E>
  void apply(const E& exec) {
    static_assert((S == Space::kHost) == exec::is_host_executor_v<E>,
                  "optim::Pruner: a host arena needs exec::Host, a device arena exec::Cuda");
    if (pruned_ == 0) return;
    const std::int64_t n = arena_->buffer_numel();
    exec::launch(exec, n, detail::MaskSelect{arena_->params_data(), mask_data()});
    if (options_.zero_optimizer_state)
      for (const std::string& name : arena_->state_names())
        exec::launch(exec, n, detail::MaskSelect{arena_->state(name).data(), mask_data()});
  }

  /// Zeroes the gradients of pruned entries (one flat pass): call it after backward, before the
  /// optimizer step, for PyTorch's gradients (clipping then sees the same norm).
  template <class E>
  void mask_gradients(const E& exec) {
    static_assert((S == Space::kHost) == exec::is_host_executor_v<E>,
                  "optim::Pruner: a host arena needs exec::Host, a device arena exec::Cuda");
    if (pruned_ == 0) return;
    exec::launch(exec, arena_->buffer_numel(),
                 detail::MaskSelect{arena_->grads_data(), mask_data()});
  }

  /// The schedule's work after `steps_done` completed optimizer steps (train::Loop's
  /// on_optimizer_step): when the schedule updates at this step, update(schedule().at(step)) with
  /// keep_pruned; then apply() (every step, or with apply_every_step = false only after an
  /// update). Returns whether the masks were updated.
  template <class E>
  bool step(const E& exec, std::int64_t steps_done) {
    const bool due = schedule_.updates_at(steps_done);
    if (due) {
      update(exec, std::min(schedule_.at(steps_done), max_sparsity()), {.keep_pruned = true});
      last_update_ = steps_done;
    }
    if (due || options_.apply_every_step) apply(exec);
    return due;
  }

  /// Pruned elements per tensor and overall.
  PruneReport report() const {
    PruneReport r;
    for (nn::ParamId id : targets_) {
      const nn::ParamInfo& p = arena_->info(id);
      const std::uint8_t* m = host_.data() + p.offset;
      const auto pruned = static_cast<std::int64_t>(std::count(m, m + p.numel, std::uint8_t{0}));
      r.tensors.push_back({p.name, p.shape, p.numel, pruned});
      r.numel += p.numel;
      r.pruned += pruned;
    }
    r.model_numel = arena_->num_parameters();
    r.target = target_;
    return r;
  }
  /// Fraction pruned of the pruned parameters' elements.
  double sparsity() const noexcept {
    return total_ == 0 ? 0.0 : static_cast<double>(pruned_) / static_cast<double>(total_);
  }

  /// The masks, flat with the arena's layout (buffer_numel() bytes), in the arena's space.
  const std::uint8_t* mask_data() const noexcept {
    if constexpr (S == Space::kHost) {
      return host_.data();
    } else {
      return device_.data();
    }
  }
  /// The host copy of the masks (always current; the same bytes as mask_data() on the host).
  const std::uint8_t* host_mask() const noexcept { return host_.data(); }

  /// Tensors "<param>_mask" (U8, 1 keeps, 0 prunes; the parameter's shape) of every pruned
  /// parameter; values "pattern", "scope", "targets" (the names, comma-separated), the
  /// schedule's settings ("schedule.*"), the target of the last update ("target") and its step
  /// ("last_update_step", -1 before the first).
  StateDict state_dict() const {
    StateDict sd;
    for (nn::ParamId id : targets_) {
      const nn::ParamInfo& p = arena_->info(id);
      AnyTensor t(DType::kU8, p.shape);
      if (t.bytes() != 0) std::memcpy(t.data(), host_.data() + p.offset, t.bytes());
      sd.tensors.emplace(p.name + "_mask", std::move(t));
    }
    sd.set("pattern", pattern());
    sd.set("scope", scope_name());
    sd.set("targets", target_names());
    sd.set("schedule.initial_sparsity", schedule_.initial_sparsity);
    sd.set("schedule.final_sparsity", schedule_.final_sparsity);
    sd.set("schedule.begin_step", schedule_.begin_step);
    sd.set("schedule.every", schedule_.every);
    sd.set("schedule.num_updates", schedule_.num_updates);
    sd.set("target", target_);
    sd.set("last_update_step", last_update_);
    return sd;
  }

  /// Restores state_dict()'s masks. Checks everything before changing anything: the same
  /// pattern, scope, pruned parameters and schedule (a different one would not continue the same
  /// run), a target in [0, max_sparsity()], a last_update_step >= -1, a U8 mask of the
  /// parameter's shape for each, holding only 0 and 1 (for an N:M pattern at most M - N zeros in
  /// every group of M), and no mask for a parameter this pruner does not prune. Throws
  /// trainkit::Error naming the mask or the setting.
  void load_state_dict(const StateDict& sd) {
    static constexpr const char* kWho = "optim::Pruner";
    check_saved_setting(kWho, "the pattern", sd.get_string("pattern"), pattern());
    check_saved_setting(kWho, "the scope", sd.get_string("scope"), std::string(scope_name()));
    check_saved_setting(kWho, "the pruned parameters", sd.get_string("targets"), target_names());
    check_saved_setting(kWho, "schedule.initial_sparsity",
                        sd.get_double("schedule.initial_sparsity"), schedule_.initial_sparsity);
    check_saved_setting(kWho, "schedule.final_sparsity", sd.get_double("schedule.final_sparsity"),
                        schedule_.final_sparsity);
    check_saved_setting(kWho, "schedule.begin_step", sd.get_int("schedule.begin_step"),
                        schedule_.begin_step);
    check_saved_setting(kWho, "schedule.every", sd.get_int("schedule.every"), schedule_.every);
    check_saved_setting(kWho, "schedule.num_updates", sd.get_int("schedule.num_updates"),
                        schedule_.num_updates);
    const double target = sd.get_double("target");
    const std::int64_t last_update = sd.get_int("last_update_step");
    TRAINKIT_CHECK(target >= 0.0 && target <= max_sparsity(), kWho, ": 'target' is ", target,
                   "; expected a sparsity in [0, ", max_sparsity(), "] for the ", pattern(),
                   " pattern");
    TRAINKIT_CHECK(last_update >= -1, kWho, ": 'last_update_step' is ", last_update,
                   "; expected a step >= 0, or -1 before the first update");
    for (const auto& [key, t] : sd.tensors) {
      bool known = false;
      for (nn::ParamId id : targets_) known = known || key == arena_->info(id).name + "_mask";
      TRAINKIT_CHECK(known, kWho, ": the state holds '", StateDict::shown(key),
                     "', which is not the mask of a parameter this pruner prunes");
    }
    for (nn::ParamId id : targets_) {
      const nn::ParamInfo& p = arena_->info(id);
      const std::string key = p.name + "_mask";
      TRAINKIT_CHECK(sd.tensors.count(key) != 0, kWho, ": the state has no mask '", key, "'");
      const AnyTensor& t = sd.tensor(key);
      TRAINKIT_CHECK(t.dtype() == DType::kU8 && t.shape() == p.shape, kWho, ": mask '", key,
                     "' is ", dtype_name(t.dtype()), " ", t.shape().to_string(), ", expected U8 ",
                     p.shape.to_string());
      const auto* m = reinterpret_cast<const std::uint8_t*>(t.data());
      for (std::int64_t i = 0; i < p.numel; ++i)
        TRAINKIT_CHECK(m[i] <= 1, kWho, ": mask '", key, "' holds ", int(m[i]), " at element ", i,
                       "; a mask holds 0 (pruned) or 1 (kept)");
      if (options_.m != 0) {
        for (std::int64_t g = 0; g < p.numel; g += options_.m) {
          const auto zeros = std::count(m + g, m + g + options_.m, std::uint8_t{0});
          TRAINKIT_CHECK(zeros <= options_.m - options_.n, kWho, ": mask '", key, "' prunes ",
                         zeros, " of the ", options_.m, " elements from element ", g, "; the ",
                         pattern(), " pattern prunes at most ", options_.m - options_.n,
                         " of every ", options_.m);
        }
      }
    }
    for (nn::ParamId id : targets_) {
      const nn::ParamInfo& p = arena_->info(id);
      const AnyTensor& t = sd.tensor(p.name + "_mask");
      if (t.bytes() != 0) std::memcpy(host_.data() + p.offset, t.data(), t.bytes());
    }
    target_ = target;
    last_update_ = last_update;
    recount();
    upload();
  }

 private:
  static bool matches(const std::vector<std::string>& patterns, std::string_view name) {
    for (const std::string& p : patterns)
      if (glob_match(p, name)) return true;
    return false;
  }
  const char* scope_name() const noexcept {
    return options_.m != 0 ? "groups"
                           : (options_.scope == PruneScope::kGlobal ? "global" : "per_tensor");
  }
  std::string target_names() const {
    std::string s;
    for (nn::ParamId id : targets_) s += (s.empty() ? "" : ",") + arena_->info(id).name;
    return s;
  }
  void recount() {
    pruned_ = 0;
    total_ = 0;
    for (nn::ParamId id : targets_) {
      const nn::ParamInfo& p = arena_->info(id);
      const std::uint8_t* m = host_.data() + p.offset;
      pruned_ += static_cast<std::int64_t>(std::count(m, m + p.numel, std::uint8_t{0}));
      total_ += p.numel;
    }
  }
  void upload() {
    if constexpr (S != Space::kHost)
      copy_bytes(device_.data(), S, host_.data(), Space::kHost, host_.size(), "optim::Pruner");
  }

  nn::ParamArena<S>* arena_;
  PrunerOptions options_;
  SparsitySchedule schedule_;
  std::vector<nn::ParamId> targets_;
  std::vector<std::uint8_t> host_;  // the masks (host copy; the masks themselves on the host)
  Tensor<std::uint8_t, S> device_;  // the masks of a device arena
  std::int64_t pruned_ = 0;
  std::int64_t total_ = 0;
  double target_ = 0.0;
  std::int64_t last_update_ = -1;
};

}  // namespace optim
TRAINKIT_NAMESPACE_END
