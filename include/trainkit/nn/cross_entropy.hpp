// SPDX-License-Identifier: MIT
// trainkit/nn/cross_entropy.hpp: `SoftmaxCrossEntropy`, torch.nn.functional.cross_entropy on raw
// logits, fused: log-softmax is never materialised. Forward saves, in the caller's
// SoftmaxCrossEntropy::Context, each row's max m and log(sum_j exp(l_j - m)) apart, never their f32
// sum m + log(...), whose rounding (half an ulp of |m|: 5e-4 for logits around 1e4) would shift
// every loss and gradient; like PyTorch's log_softmax, every log-probability is (l - m) - log(sum).
// Backward writes (softmax - onehot) * dloss / n_valid in one pass. `ignore_index` rows count
// neither in the loss nor in the mean, as in PyTorch.
#pragma once

#include <cmath>
#include <cstdint>
#include <limits>
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

template <class T, class I>
struct CrossEntropyArgs {
  const T* logits;   // [N, V]
  const I* targets;  // [N]
  T* dlogits;        // backward output [N, V]
  float* loss;       // forward output, 1 element
  float* row_max;    // [N] saved max of each row
  float* log_sum;    // [N] saved log(sum_j exp(l_j - max)) of each row
  float* row_loss;   // [N] each row's loss (forward)
  float* count;      // 1 element: number of valid targets (saved)
  std::int64_t rows;
  std::int64_t vocab;
  std::int64_t ld;   // row stride of logits (>= vocab: rows may be padded)
  std::int64_t dld;  // row stride of dlogits
  std::int64_t ignore_index;
  float dloss;
  const float* dloss_ptr;  // when set, dloss is read from here (executor memory) by the kernel
};

/// The backward's multiplier: *dloss_ptr when given (a device-resident loss scale), else dloss.
template <class A>
TRAINKIT_HOST_DEVICE inline float backward_dloss(const A& a) {
  return a.dloss_ptr != nullptr ? *a.dloss_ptr : a.dloss;
}

/// log softmax(l)_j = (l_j - max) - log_sum, in this order (PyTorch's): l_j - max is exact
/// for logits within a factor 2 of each other, so the result keeps f32 precision at any offset.
TRAINKIT_HOST_DEVICE inline float log_softmax_of(float logit, float max, float log_sum) {
  return (logit - max) - log_sum;
}

/// One row's loss -log softmax(l)_t.
TRAINKIT_HOST_DEVICE inline float cross_entropy_row_loss(float target_logit, float max,
                                                         float log_sum) {
  return -log_softmax_of(target_logit, max, log_sum);
}

/// d loss / d l_j = (softmax_j - [j == t]) * scale, from softmax_j = e^(log softmax_j).
TRAINKIT_HOST_DEVICE inline float cross_entropy_grad(float softmax, float scale, bool target) {
  const float g = softmax * scale;
  return target ? g - scale : g;
}

/// Throws naming the first target outside [0, vocab) that is not ignore_index (the logits of
/// a row are addressed by it unchecked).
template <class T, class I>
void check_cross_entropy_targets(const CrossEntropyArgs<T, I>& a) {
  const std::int64_t V = a.vocab;
  for (std::int64_t r = 0; r < a.rows; ++r) {
    const auto t = static_cast<std::int64_t>(a.targets[r]);
    TRAINKIT_CHECK(t == a.ignore_index || (t >= 0 && t < V), "nn::SoftmaxCrossEntropy: target ", t,
                   " of row ", r, " is out of range [0, ", V, ") and not ignore_index (",
                   a.ignore_index, ")");
  }
}

template <class T, class I>
void cross_entropy_forward(const exec::Host& host, const CrossEntropyArgs<T, I>& a) {
  const std::int64_t V = a.vocab;
  check_cross_entropy_targets(a);
  for_rows(host, a.rows, 2 * V, [&](std::int64_t r0, std::int64_t r1) TRAINKIT_INLINE_LAMBDA {
    for (std::int64_t r = r0; r < r1; ++r) {
      const T* l = a.logits + r * a.ld;
      // A NaN logit is skipped by the max but poisons the sum (and so the loss), as it should.
      const float m = lane_max(V, [&](std::int64_t j) { return load(l[j]); });
      const float sum = lane_sum(V, [&](std::int64_t j) { return exp_approx(load(l[j]) - m); });
      const float log_sum = std::log(sum);
      a.row_max[r] = m;
      a.log_sum[r] = log_sum;
      const auto t = static_cast<std::int64_t>(a.targets[r]);
      a.row_loss[r] = t == a.ignore_index ? 0.0f : cross_entropy_row_loss(load(l[t]), m, log_sum);
    }
  });
  // The mean in a fixed order (rows ascending, in double): deterministic.
  double sum = 0.0;
  std::int64_t valid = 0;
  for (std::int64_t r = 0; r < a.rows; ++r) {
    if (static_cast<std::int64_t>(a.targets[r]) == a.ignore_index) continue;
    sum += a.row_loss[r];
    ++valid;
  }
  *a.count = static_cast<float>(valid);
  *a.loss = valid == 0 ? std::numeric_limits<float>::quiet_NaN()
                       : static_cast<float>(sum / static_cast<double>(valid));
}

template <class T, class I>
void cross_entropy_backward(const exec::Host& host, const CrossEntropyArgs<T, I>& a) {
  const std::int64_t V = a.vocab;
  check_cross_entropy_targets(a);  // backward may be given other targets than forward was
  const float scale = *a.count > 0.0f ? backward_dloss(a) / *a.count : 0.0f;
  for_rows(host, a.rows, 2 * V, [&](std::int64_t r0, std::int64_t r1) TRAINKIT_INLINE_LAMBDA {
    for (std::int64_t r = r0; r < r1; ++r) {
      const T* l = a.logits + r * a.ld;
      T* d = a.dlogits + r * a.dld;
      const auto t = static_cast<std::int64_t>(a.targets[r]);
      if (t == a.ignore_index) {
        for (std::int64_t j = 0; j < V; ++j) d[j] = store<T>(0.0f);
        continue;
      }
      const float m = a.row_max[r];
      const float log_sum = a.log_sum[r];
      // The target's gradient is taken before the row is written: d may be l (in place).
      const float target_grad =
          cross_entropy_grad(exp_approx(log_softmax_of(load(l[t]), m, log_sum)), scale, true);
      lane_map(
          V,
          [&](std::int64_t j) {
            return cross_entropy_grad(exp_approx(log_softmax_of(load(l[j]), m, log_sum)), scale,
                                      false);
          },
          [&](std::int64_t j, float v) { d[j] = store<T>(v); });
      d[t] = store<T>(target_grad);
    }
  });
}

#if TRAINKIT_CUDA_COMPILER && TRAINKIT_WITH_CUDA
inline namespace TRAINKIT_DETAIL_EXEC_ARCH_NS {

/// Threads per block of the cross-entropy kernels (their tree reductions assume this power of 2).
inline constexpr int kCrossEntropyThreads = 256;

/// One block of 256 threads per row: max, then sum of exp, by fixed-shape tree reductions.
template <class T, class I>
__global__ void __launch_bounds__(kCrossEntropyThreads)
    cross_entropy_forward_kernel(CrossEntropyArgs<T, I> a) {
  __shared__ float shared[kCrossEntropyThreads];
  const std::int64_t r = blockIdx.x;
  const std::int64_t V = a.vocab;
  const T* l = a.logits + r * a.ld;
  float m = -INFINITY;
  for (std::int64_t j = threadIdx.x; j < V; j += blockDim.x) m = fmaxf(m, load(l[j]));
  shared[threadIdx.x] = m;
  __syncthreads();
  for (int s = blockDim.x / 2; s > 0; s >>= 1) {
    if (threadIdx.x < s) shared[threadIdx.x] = fmaxf(shared[threadIdx.x], shared[threadIdx.x + s]);
    __syncthreads();
  }
  m = shared[0];
  __syncthreads();
  float sum = 0.0f;
  for (std::int64_t j = threadIdx.x; j < V; j += blockDim.x) sum += expf(load(l[j]) - m);
  shared[threadIdx.x] = sum;
  __syncthreads();
  for (int s = blockDim.x / 2; s > 0; s >>= 1) {
    if (threadIdx.x < s) shared[threadIdx.x] += shared[threadIdx.x + s];
    __syncthreads();
  }
  if (threadIdx.x == 0) {
    const float log_sum = logf(shared[0]);
    a.row_max[r] = m;
    a.log_sum[r] = log_sum;
    const auto t = static_cast<std::int64_t>(a.targets[r]);
    if (t != a.ignore_index && (t < 0 || t >= V)) __trap();  // target out of range
    a.row_loss[r] = t == a.ignore_index ? 0.0f : cross_entropy_row_loss(load(l[t]), m, log_sum);
  }
}

/// One block: the valid count and the mean loss, summed in a fixed order in double with an
/// integer count, then rounded once, as the host's mean (f32 partial sums lost bits over
/// 65,536 rows, and an f32 count stops counting at 2^24 rows).
template <class T, class I>
__global__ void __launch_bounds__(kCrossEntropyThreads)
    cross_entropy_mean_kernel(CrossEntropyArgs<T, I> a) {
  __shared__ double sums[kCrossEntropyThreads];
  __shared__ long long counts[kCrossEntropyThreads];
  double sum = 0.0;
  long long count = 0;
  for (std::int64_t r = threadIdx.x; r < a.rows; r += blockDim.x) {
    if (static_cast<std::int64_t>(a.targets[r]) == a.ignore_index) continue;
    sum += a.row_loss[r];
    ++count;
  }
  sums[threadIdx.x] = sum;
  counts[threadIdx.x] = count;
  __syncthreads();
  for (int s = blockDim.x / 2; s > 0; s >>= 1) {
    if (threadIdx.x < s) {
      sums[threadIdx.x] += sums[threadIdx.x + s];
      counts[threadIdx.x] += counts[threadIdx.x + s];
    }
    __syncthreads();
  }
  if (threadIdx.x == 0) {
    *a.count = static_cast<float>(counts[0]);
    *a.loss = counts[0] > 0 ? static_cast<float>(sums[0] / static_cast<double>(counts[0]))
                            : __int_as_float(0x7fc00000);
  }
}

template <class T, class I>
__global__ void __launch_bounds__(kCrossEntropyThreads)
    cross_entropy_backward_kernel(CrossEntropyArgs<T, I> a) {
  const std::int64_t r = blockIdx.x;
  const std::int64_t V = a.vocab;
  const T* l = a.logits + r * a.ld;
  T* d = a.dlogits + r * a.dld;
  const auto t = static_cast<std::int64_t>(a.targets[r]);
  const float count = *a.count;
  const float scale = count > 0.0f ? backward_dloss(a) / count : 0.0f;
  const bool ignored = t == a.ignore_index;
  if (!ignored && (t < 0 || t >= V)) __trap();  // as forward: an index assertion
  const float m = a.row_max[r];
  const float log_sum = a.log_sum[r];
  for (std::int64_t j = threadIdx.x; j < V; j += blockDim.x) {
    const float g =
        ignored ? 0.0f
                : cross_entropy_grad(expf(log_softmax_of(load(l[j]), m, log_sum)), scale, j == t);
    d[j] = store<T>(g);
  }
}

template <class T, class I>
void cross_entropy_forward(const exec::Cuda& exec, const CrossEntropyArgs<T, I>& a) {
  cudaStream_t stream = exec.stream().get();
  constexpr const char* kName = "nn::SoftmaxCrossEntropy forward";
  if (a.rows > 0) {
    const unsigned blocks = exec::detail::grid_blocks_x(a.rows, 1, kName);  // a block per row
    cross_entropy_forward_kernel<T, I><<<blocks, kCrossEntropyThreads, 0, stream>>>(a);
    exec::detail::check_kernel_launch(kName, "rows ", a.rows, ", vocab ", a.vocab);
  }
  cross_entropy_mean_kernel<T, I><<<1, kCrossEntropyThreads, 0, stream>>>(a);
  exec::detail::check_kernel_launch("nn::SoftmaxCrossEntropy forward (mean)", "rows ", a.rows);
}

template <class T, class I>
void cross_entropy_backward(const exec::Cuda& exec, const CrossEntropyArgs<T, I>& a) {
  if (a.rows == 0) return;
  constexpr const char* kName = "nn::SoftmaxCrossEntropy backward";
  const unsigned blocks = exec::detail::grid_blocks_x(a.rows, 1, kName);  // a block per row
  cross_entropy_backward_kernel<T, I><<<blocks, kCrossEntropyThreads, 0, exec.stream().get()>>>(a);
  exec::detail::check_kernel_launch(kName, "rows ", a.rows, ", vocab ", a.vocab);
}

}  // namespace TRAINKIT_DETAIL_EXEC_ARCH_NS
#else
TRAINKIT_DETAIL_NN_CUDA_ONLY(cross_entropy_forward)
TRAINKIT_DETAIL_NN_CUDA_ONLY(cross_entropy_backward)
#endif
}  // namespace detail

/// Options of nn::SoftmaxCrossEntropy.
struct CrossEntropyOptions {
  /// Rows whose target equals this are skipped (loss 0, gradient 0, not counted in the mean).
  std::int64_t ignore_index = -100;
};

/// Softmax + cross-entropy with mean reduction over valid targets (F.cross_entropy(logits,
/// targets, ignore_index=...)), computed in f32 whatever the logits' type (autocast f32 list).
///
/// Shapes: logits [N, V] (activation type), targets [N] (int32 or int64), loss [1] (f32, in the
/// layer's memory space: no host sync on the GPU). All targets ignored: the loss is NaN (as
/// PyTorch's 0/0) and backward writes zeros. A target outside [0, V) that is not ignore_index
/// throws on the host and traps on the device.
/// forward saves, in the caller's Context, each row's max and log-sum-exp of the shifted logits
/// (apart) and the valid count; backward reads logits, targets and that context, and writes
/// dlogits = (softmax(logits) - onehot(target)) * dloss / n_valid; dlogits may be the logits view
/// itself (in place), any other overlap with logits throws. Loss and gradient keep f32
/// precision (~1e-7 relative, as PyTorch's) for logits of any magnitude, 1e6 included.
template <Space S = Space::kHost>
class SoftmaxCrossEntropy {
 public:
  /// What forward saves for backward (f32, in space S): per row the max and the log-sum-exp of
  /// the shifted logits and the row's loss, then the number of valid targets. Keep one per
  /// forward whose backward is still to come; refilling it reuses its memory.
  class Context : public detail::RowStatsContext<S> {
    friend class SoftmaxCrossEntropy;
  };

  SoftmaxCrossEntropy() = default;
  explicit SoftmaxCrossEntropy(CrossEntropyOptions options) : options_(options) {}

  const CrossEntropyOptions& options() const noexcept { return options_; }

  template <amp::Policy P = amp::Fp32, class E, class TL, class I, class TO>
  void forward(const E& exec, Context& ctx, TensorView<TL, 2, S> logits,
               TensorView<I, 1, S> targets, TensorView<TO, 1, S> loss) const {
    using T = std::remove_const_t<TL>;
    detail::check_call<P, E, S, TL>();
    static_assert(std::is_same_v<TO, float>, "nn::SoftmaxCrossEntropy: the loss is a float view");
    check_io("nn::SoftmaxCrossEntropy::forward", logits, targets);
    TRAINKIT_CHECK(loss.size(0) >= 1, "nn::SoftmaxCrossEntropy::forward: loss needs 1 element");
    const std::int64_t rows = logits.size(0);
    ctx.rec_.template set<T>(rows, logits.size(1));
    auto a = args<T>(logits, targets, ctx.stats_.template get<float>(3 * rows + 1));
    a.loss = loss.data();
    detail::cross_entropy_forward(exec, a);
  }

  /// dlogits = d(mean loss)/d logits * dloss, from the forward of these logits and targets that
  /// filled ctx.
  template <amp::Policy P = amp::Fp32, class E, class TL, class I, class TG>
  void backward(const E& exec, const Context& ctx, TensorView<TL, 2, S> logits,
                TensorView<I, 1, S> targets, TensorView<TG, 2, S> dlogits,
                float dloss = 1.0f) const {
    backward_impl<P>(exec, ctx, logits, targets, dlogits, dloss, nullptr);
  }
  /// The same with dloss read from memory of space S when the kernel runs, e.g. a loss
  /// scaler's `scale_data()`: the f16 recipe multiplies by the current scale with no host sync.
  template <amp::Policy P = amp::Fp32, class E, class TL, class I, class TG>
  void backward(const E& exec, const Context& ctx, TensorView<TL, 2, S> logits,
                TensorView<I, 1, S> targets, TensorView<TG, 2, S> dlogits,
                const float* dloss) const {
    TRAINKIT_CHECK(dloss != nullptr, "nn::SoftmaxCrossEntropy::backward: dloss is a null pointer");
    backward_impl<P>(exec, ctx, logits, targets, dlogits, 0.0f, dloss);
  }

 private:
  template <class P, class E, class TL, class I, class TG>
  void backward_impl(const E& exec, const Context& ctx, TensorView<TL, 2, S> logits,
                     TensorView<I, 1, S> targets, TensorView<TG, 2, S> dlogits, float dloss,
                     const float* dloss_ptr) const {
    using T = std::remove_const_t<TL>;
    detail::check_call<P, E, S, TL, TG>();
    check_io("nn::SoftmaxCrossEntropy::backward", logits, targets);
    TRAINKIT_CHECK(dlogits.sizes() == logits.sizes(), "nn::SoftmaxCrossEntropy::backward: dlogits ",
                   detail::shape_of(dlogits), " differs from logits ", detail::shape_of(logits));
    detail::check_rows("nn::SoftmaxCrossEntropy::backward", "dlogits", dlogits);
    // In place (dlogits over logits, as llm.c does) works: each row is read before it is
    // written. Any other overlap would let one row's gradient overwrite logits still to be read.
    const bool in_place = dlogits.data() == logits.data() &&
                          detail::row_stride(dlogits) == detail::row_stride(logits);
    TRAINKIT_CHECK(
        in_place || !blas::detail::byte_rows_overlap(blas::detail::byte_rows("dlogits", dlogits),
                                                     blas::detail::byte_rows("logits", logits)),
        "nn::SoftmaxCrossEntropy::backward: dlogits ", detail::shape_of(dlogits),
        " partly overlaps logits ", detail::shape_of(logits),
        "; pass the logits view itself (in place) or memory of its own");
    ctx.rec_.template check<T>("nn::SoftmaxCrossEntropy::backward", logits.size(0), logits.size(1));
    // The kernels' argument block is shared with forward; backward only reads the statistics.
    auto a = args<T>(logits, targets, const_cast<float*>(ctx.stats_.template data<float>()));
    a.dlogits = dlogits.data();
    a.dld = detail::row_stride(dlogits);
    a.dloss = dloss;
    a.dloss_ptr = dloss_ptr;
    detail::cross_entropy_backward(exec, a);
  }

  template <class T, class TL, class I>
  detail::CrossEntropyArgs<T, std::remove_const_t<I>> args(TensorView<TL, 2, S> logits,
                                                           TensorView<I, 1, S> targets,
                                                           float* stats) const {
    static_assert(std::is_same_v<std::remove_const_t<I>, std::int32_t> ||
                      std::is_same_v<std::remove_const_t<I>, std::int64_t>,
                  "nn::SoftmaxCrossEntropy: targets are int32 or int64");
    const std::int64_t rows = logits.size(0);
    detail::CrossEntropyArgs<T, std::remove_const_t<I>> a{};
    a.logits = logits.data();
    a.targets = targets.data();
    a.row_max = stats;
    a.log_sum = stats + rows;
    a.row_loss = stats + 2 * rows;
    a.count = stats + 3 * rows;
    a.rows = rows;
    a.vocab = logits.size(1);
    a.ld = detail::row_stride(logits);
    a.dld = a.ld;
    a.ignore_index = options_.ignore_index;
    return a;
  }

  template <class VL, class VT>
  void check_io(const char* who, const VL& logits, const VT& targets) const {
    TRAINKIT_CHECK(targets.size(0) == logits.size(0), who, ": logits ", detail::shape_of(logits),
                   " and targets ", detail::shape_of(targets), " disagree on N");
    TRAINKIT_CHECK(logits.size(1) >= 1, who, ": logits ", detail::shape_of(logits),
                   " have no classes");
    detail::check_rows(who, "logits", logits);
    detail::check_contiguous(who, "targets", targets);
  }

  CrossEntropyOptions options_{};
};

/// Top-1 correct predictions of a batch on the host: rows whose largest logit (the first one on a
/// tie, as torch.argmax) is at the target's index. Targets outside [0, classes) never count.
template <class TL, class I>
std::int64_t count_correct(HostView<TL, 2> logits, HostView<I, 1> targets) {
  TRAINKIT_CHECK(targets.size(0) == logits.size(0), "nn::count_correct: ", targets.size(0),
                 " targets for ", logits.size(0), " rows of logits");
  std::int64_t correct = 0;
  for (std::int64_t r = 0; r < logits.size(0); ++r) {
    std::int64_t best = 0;  // NaN is the largest, as torch.argmax has it
    for (std::int64_t k = 1; k < logits.size(1); ++k) {
      const float v = detail::load(logits(r, k)), b = detail::load(logits(r, best));
      if (!std::isnan(b) && (v > b || std::isnan(v))) best = k;
    }
    correct += logits.size(1) > 0 && static_cast<std::int64_t>(targets(r)) == best;
  }
  return correct;
}

}  // namespace nn
TRAINKIT_NAMESPACE_END
