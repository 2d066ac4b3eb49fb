// SPDX-License-Identifier: MIT
// trainkit/optim/grad_norm.hpp: the global gradient norm and gradient clipping over a
// ParamArena, PyTorch's `clip_grad_norm_` / `clip_grad_value_`. The norm is a deterministic
// reduction (exec::reduce: fixed order, double accumulation) that stays where it was computed:
// `GradNorm` is a handle to a float in host or device memory, read with `get()` (a host sync on
// the device) only when the caller asks. Clipping reads the norm on the device, so a step with
// clipping needs no sync either.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <memory>
#include <type_traits>

#include "trainkit/config.hpp"
#include "trainkit/core/bytes.hpp"
#include "trainkit/core/shape.hpp"
#include "trainkit/error.hpp"
#include "trainkit/exec/executor.hpp"
#include "trainkit/exec/launch.hpp"
#include "trainkit/exec/reduce.hpp"
#include "trainkit/nn/math.hpp"
#include "trainkit/nn/param_arena.hpp"

#if TRAINKIT_DETAIL_HOST_AVX2
#include <immintrin.h>
#endif

#if TRAINKIT_WITH_CUDA
#include <cuda_runtime_api.h>
#endif

TRAINKIT_NAMESPACE_BEGIN
namespace optim {

/// A global gradient norm (f32) where it was computed: host memory for exec::Host, device memory
/// for exec::Cuda. Cheap to copy (shared ownership of the scalar). Reading it with get() is the
/// only host sync; kernels take data().
class GradNorm {
 public:
  GradNorm() = default;
  /// A non-owning handle to the float at `data` in `space` (e.g. inside a loss scaler).
  GradNorm(const float* data, Space space) noexcept : data_(data), space_(space) {}
  /// A handle owning `owner` (whose memory holds the float at `data`).
  GradNorm(std::shared_ptr<void> owner, const float* data, Space space) noexcept
      : owner_(std::move(owner)), data_(data), space_(space) {}

  bool valid() const noexcept { return data_ != nullptr; }
  /// Where the norm lives (in space()).
  const float* data() const noexcept { return data_; }
  Space space() const noexcept { return space_; }

  /// The norm's value. On the device this waits for every queued kernel (cudaDeviceSynchronize)
  /// and copies 4 bytes. Throws when the handle is empty.
  TRAINKIT_INLINE float get() const;

 private:
  std::shared_ptr<void> owner_;
  const float* data_ = nullptr;
  Space space_ = Space::kHost;
};

namespace detail {

/// Where a reduction's double result and the derived float norm live.
struct NormScratch {
  double sumsq;
  float norm;
  float pad;
};

/// Allocates a NormScratch in the executor's memory: a heap object on the host, cudaMallocAsync
/// on the executor's stream on the device (stream-ordered: no sync), freed the same way.
template <class E>
std::shared_ptr<NormScratch> make_norm_scratch([[maybe_unused]] const E& exec) {
  if constexpr (exec::is_host_executor_v<E>) {
    return std::make_shared<NormScratch>();
  } else {
#if TRAINKIT_WITH_CUDA
    void* p = nullptr;
    const cudaStream_t stream = exec.stream().get();
    TRAINKIT_CUDA_CHECK(cudaMallocAsync(&p, sizeof(NormScratch), stream));
    return std::shared_ptr<NormScratch>(static_cast<NormScratch*>(p), [stream](NormScratch* q) {
      TRAINKIT_CUDA_CHECK_NOTHROW(cudaFreeAsync(q, stream));
    });
#else
    static_assert(exec::is_host_executor_v<E>, "a CUDA executor needs TRAINKIT_WITH_CUDA");
    return nullptr;
#endif
  }
}

/// (double(g[i]) * double(a))^2 with a = *scale (1 when scale is null): the terms of the
/// squared norm of the unscaled gradients. Exact products in double, so the sum is non-finite
/// exactly when some g[i] is (the non-finite check of GradScaler comes for free).
struct SquaredTerm {
  const float* g;
  const float* scale;
  TRAINKIT_HOST_DEVICE double operator()(std::int64_t i) const {
    const double x =
        static_cast<double>(g[i]) * (scale != nullptr ? static_cast<double>(*scale) : 1.0);
    return x * x;
  }
};

#if TRAINKIT_DETAIL_HOST_AVX2

/// Lanes 8h .. 8h + 7 of f(i .. i + 7): (double(g) * scale)^2, exactly as SquaredTerm rounds.
__attribute__((target("avx2"))) TRAINKIT_FORCEINLINE void squares_avx2(const float* g,
                                                                       __m256d scale, __m256d& lo,
                                                                       __m256d& hi) {
  const __m256 x = _mm256_loadu_ps(g);
  lo = _mm256_mul_pd(_mm256_cvtps_pd(_mm256_castps256_ps128(x)), scale);
  hi = _mm256_mul_pd(_mm256_cvtps_pd(_mm256_extractf128_ps(x, 1)), scale);
  lo = _mm256_mul_pd(lo, lo);
  hi = _mm256_mul_pd(hi, hi);
}

/// exec::detail::chunk_fold<double>(f, Sum, begin, end) for SquaredTerm with AVX2, the same bits:
/// the 16 lanes are four ymm registers of doubles (lane j in register j / 4), each lane adds its
/// squares in the same order and the lanes are combined by the same tree. Only mul and add are
/// used (FMA is not enabled, so nothing is contracted that the scalar code rounds twice).
__attribute__((target("avx2"))) inline double chunk_squares_avx2(const SquaredTerm& f,
                                                                 std::int64_t begin,
                                                                 std::int64_t end) {
  if (end - begin < exec::kReduceLanes)
    return exec::detail::chunk_fold<double>(f, exec::Sum{}, begin, end);
  const __m256d scale = _mm256_set1_pd(f.scale != nullptr ? static_cast<double>(*f.scale) : 1.0);
  __m256d l0, l1, l2, l3, a, b, c, d;
  squares_avx2(f.g + begin, scale, l0, l1);
  squares_avx2(f.g + begin + 8, scale, l2, l3);
  std::int64_t i = begin + exec::kReduceLanes;
  for (; i + exec::kReduceLanes <= end; i += exec::kReduceLanes) {
    // The gradients were last written during the backward: ask for them 1 KiB ahead.
    __builtin_prefetch(f.g + i + 256, 0);
    squares_avx2(f.g + i, scale, a, b);
    squares_avx2(f.g + i + 8, scale, c, d);
    l0 = _mm256_add_pd(l0, a);
    l1 = _mm256_add_pd(l1, b);
    l2 = _mm256_add_pd(l2, c);
    l3 = _mm256_add_pd(l3, d);
  }
  alignas(32) double lanes[exec::kReduceLanes];
  _mm256_store_pd(lanes, l0);
  _mm256_store_pd(lanes + 4, l1);
  _mm256_store_pd(lanes + 8, l2);
  _mm256_store_pd(lanes + 12, l3);
  for (int j = 0; i < end; ++i, ++j) lanes[j] = lanes[j] + f(i);
  for (int width = exec::kReduceLanes / 2; width > 0; width /= 2)
    for (int j = 0; j < width; ++j) lanes[j] = lanes[j] + lanes[j + width];
  return lanes[0];
}

#endif

/// Sum of f(i) over [0, n) into *out (memory of the executor's space), deterministically: the
/// value of exec::reduce(exec, n, f, exec::Sum{}, 0.0) (on the host the squared gradient norm
/// is folded with AVX2 when the CPU has it, the same bits).
template <class E, class F>
void sum_into(const E& exec, std::int64_t n, const F& f, double* out) {
  if constexpr (exec::is_host_executor_v<E>) {
#if TRAINKIT_DETAIL_HOST_AVX2
    if constexpr (std::is_same_v<F, SquaredTerm>) {
      if (nn::detail::cpu_has_avx2()) {
        const auto chunk = [&](std::int64_t begin, std::int64_t end) {
          return chunk_squares_avx2(f, begin, end);
        };
        *out = exec::detail::reduce_chunks(
            exec, n, exec::Sum{}, 0.0, [&](std::int64_t first, std::int64_t last) {
              return exec::detail::fold_chunks_with<double>(exec::Sum{}, n, first, last, chunk);
            });
        return;
      }
    }
#endif
    *out = exec::reduce(exec, n, f, exec::Sum{}, 0.0);
  } else {
    exec::reduce_into(exec, n, f, exec::Sum{}, 0.0, out);
  }
}

/// s->norm = float(sqrt(s->sumsq)).
struct FinishNorm {
  NormScratch* s;
  TRAINKIT_HOST_DEVICE void operator()(std::int64_t) const {
    s->norm = static_cast<float>(sqrt(s->sumsq));
  }
};

/// g[i] *= coef (the host path of clipping: the coefficient is read once, not per element). Only
/// for a finite coef: the zero padding then stays zero.
struct ScaleBy {
  float* g;
  float coef;
  TRAINKIT_HOST_DEVICE void operator()(std::int64_t i) const { g[i] = g[i] * coef; }
};

/// g[i] *= coef for the parameters' elements, 0 for the padding: a NaN/inf coef (a NaN norm)
/// reaches every gradient, as in PyTorch, but never the padding.
struct ScaleByMasked {
  float* g;
  float coef;
  nn::PaddingMask mask;
  TRAINKIT_HOST_DEVICE void operator()(std::int64_t i) const {
    g[i] = mask.real(i) ? g[i] * coef : 0.0f;
  }
};

/// f32 clip coefficient of PyTorch's clip_grad_norm_: min(1, max_norm / (norm + 1e-6)), NaN kept.
TRAINKIT_HOST_DEVICE inline float clip_coefficient(float norm, float max_norm) {
  const float coef = max_norm / (norm + 1e-6f);
  return coef < 1.0f || coef != coef ? coef : 1.0f;
}

/// g[i] *= min(1, max_norm / (*norm + 1e-6)), computed in f32 as PyTorch's clip_grad_norm_
/// (a NaN norm propagates into the gradients, as there, but not into the padding). Its fields
/// resemble grad_scaler.hpp's ScalerTerm (gradients, a scalar read in the kernel, the padding
/// mask), but that one is a reduction term with its own inf/NaN cases: they stay apart.
struct ClipByNorm {
  float* g;
  const float* norm;
  float max_norm;
  nn::PaddingMask mask;
  TRAINKIT_HOST_DEVICE void operator()(std::int64_t i) const {
    const float coef = clip_coefficient(*norm, max_norm);
    // A finite coefficient keeps the zero padding zero; only a NaN one needs the mask.
    g[i] = coef - coef == 0.0f || mask.real(i) ? g[i] * coef : 0.0f;
  }
};

/// g[i] = clamp(g[i], -c, c); NaN stays NaN (torch.clamp_). c >= 0: the zero padding stays zero.
struct ClipByValue {
  float* g;
  float c;
  TRAINKIT_HOST_DEVICE void operator()(std::int64_t i) const {
    const float x = g[i];
    g[i] = x < -c ? -c : (x > c ? c : x);
  }
};

template <class E, Space S>
void check_space(const char* what) {
  static_assert(exec::Executor<E>, "optim: pass an exec::Host or exec::Cuda");
  static_assert((S == Space::kHost) == exec::is_host_executor_v<E>,
                "optim: a host ParamArena needs exec::Host, a device ParamArena exec::Cuda");
  (void)what;
}

}  // namespace detail

/// The L2 norm of all gradients of `arena` (PyTorch's total_norm of clip_grad_norm_, computed
/// in double in a fixed order: the same bits for any thread count). Asynchronous on a CUDA
/// stream; the result stays on the device until GradNorm::get(). Unlike PyTorch's f32 norms,
/// the sum of squares cannot overflow: gradients of 1e30 give their finite norm where
/// torch.nn.utils.clip_grad_norm_ returns inf (and zeroes every gradient); only a norm above the
/// largest float (3.4e38) is inf.
template <class E, Space S>
GradNorm grad_norm(const E& exec, const nn::ParamArena<S>& arena) {
  detail::check_space<E, S>("grad_norm");
  auto scratch = detail::make_norm_scratch(exec);
  detail::sum_into(exec, arena.buffer_numel(), detail::SquaredTerm{arena.grads_data(), nullptr},
                   &scratch->sumsq);
  exec::launch(exec, 1, detail::FinishNorm{scratch.get()});
  const float* data = &scratch->norm;
  return GradNorm(std::shared_ptr<void>(std::move(scratch)), data, S);
}

/// Scales all gradients by min(1, max_norm / (norm + 1e-6)) where `norm` was computed before
/// (e.g. by DynamicScaler::unscale_, which measures it in its own pass). Returns `norm`.
template <class E, Space S>
GradNorm clip_grad_norm_(const E& exec, nn::ParamArena<S>& arena, double max_norm,
                         const GradNorm& norm) {
  detail::check_space<E, S>("clip_grad_norm_");
  TRAINKIT_CHECK(norm.valid() && norm.space() == S,
                 "optim::clip_grad_norm_: the given norm is empty or in the other memory space");
  TRAINKIT_CHECK(max_norm > 0.0, "optim::clip_grad_norm_: max_norm must be > 0, got ", max_norm);
  if constexpr (S == Space::kHost) {
    const float coef = detail::clip_coefficient(*norm.data(), static_cast<float>(max_norm));
    if (coef - coef == 0.0f) {
      exec::launch(exec, arena.buffer_numel(), detail::ScaleBy{arena.grads_data(), coef});
    } else {
      exec::launch(exec, arena.buffer_numel(),
                   detail::ScaleByMasked{arena.grads_data(), coef, arena.padding_mask()});
    }
  } else {
    exec::launch(exec, arena.buffer_numel(),
                 detail::ClipByNorm{arena.grads_data(), norm.data(), static_cast<float>(max_norm),
                                    arena.padding_mask()});
  }
  return norm;
}

/// torch.nn.utils.clip_grad_norm_(params, max_norm): computes the global L2 norm of the
/// gradients, scales them by min(1, max_norm / (norm + 1e-6)) and returns the norm (before
/// clipping). Two passes (read; read + write), no host sync. Deterministic.
template <class E, Space S>
GradNorm clip_grad_norm_(const E& exec, nn::ParamArena<S>& arena, double max_norm) {
  return clip_grad_norm_(exec, arena, max_norm, grad_norm(exec, arena));
}

/// torch.nn.utils.clip_grad_value_: clamps every gradient to [-clip_value, clip_value].
template <class E, Space S>
void clip_grad_value_(const E& exec, nn::ParamArena<S>& arena, double clip_value) {
  detail::check_space<E, S>("clip_grad_value_");
  TRAINKIT_CHECK(clip_value >= 0.0, "optim::clip_grad_value_: clip_value must be >= 0, got ",
                 clip_value);
  exec::launch(exec, arena.buffer_numel(),
               detail::ClipByValue{arena.grads_data(), static_cast<float>(clip_value)});
}

#if TRAINKIT_IMPL

TRAINKIT_INLINE float GradNorm::get() const {
  TRAINKIT_CHECK(data_ != nullptr, "optim::GradNorm::get on an empty handle");
  return read_value(data_, space_, "optim::GradNorm");
}

#endif  // TRAINKIT_IMPL

}  // namespace optim
TRAINKIT_NAMESPACE_END
