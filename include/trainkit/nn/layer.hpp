// SPDX-License-Identifier: MIT
// trainkit/nn/layer.hpp: the conventions every nn/ layer follows, and their shared helpers.
//
// Layers are llm.c-style: explicit `forward(exec, x, y)` and `backward(exec, x, dy, dx)` on
// caller-owned activation views, parameters in a ParamArena. Backward ACCUMULATES (+=) into the
// arena's parameter gradients (so micro-batches add up until zero_grad) and WRITES (=) the input
// gradient dx, or adds to it when passed InputGrad::kAccumulate (residual branches).
#pragma once

#include <algorithm>
#include <cstdint>
#include <type_traits>

#include "trainkit/amp/policy.hpp"
#include "trainkit/blas/gemm.hpp"
#include "trainkit/config.hpp"
#include "trainkit/core/half.hpp"
#include "trainkit/core/tensor.hpp"
#include "trainkit/core/tensor_view.hpp"
#include "trainkit/error.hpp"
#include "trainkit/exec/executor.hpp"
#include "trainkit/exec/host.hpp"

#if TRAINKIT_WITH_CUDA
#include <memory>
#include <unordered_map>

#include "trainkit/exec/cuda.hpp"
#endif

TRAINKIT_NAMESPACE_BEGIN
namespace nn {

/// What a backward does with the input gradient it computes: `kWrite` overwrites dx (the
/// default), `kAccumulate` adds to it (dx += ...), for inputs that also feed a residual branch.
enum class InputGrad : std::uint8_t { kWrite, kAccumulate };

namespace detail {

/// Element types activations may have.
template <class T>
inline constexpr bool is_activation_element_v =
    std::is_same_v<std::remove_cv_t<T>, float> || std::is_same_v<std::remove_cv_t<T>, bf16> ||
    std::is_same_v<std::remove_cv_t<T>, f16>;

/// Widening load / rounding store for float, bf16 and f16 (host and device).
template <class T>
TRAINKIT_HOST_DEVICE inline float load(T v) noexcept {
  if constexpr (std::is_same_v<std::remove_cv_t<T>, float>) {
    return v;
  } else {
    return static_cast<float>(v);
  }
}
template <class T>
TRAINKIT_HOST_DEVICE inline T store(float v) noexcept {
  if constexpr (std::is_same_v<T, float>) {
    return v;
  } else {
    return T(v);
  }
}

/// The executor type matches the memory space of the layer's views.
template <class E, Space S>
inline constexpr bool executor_matches_v = (exec::is_host_executor_v<E> && S == Space::kHost) ||
                                           (exec::is_cuda_executor_v<E> && S == Space::kDevice);

/// Checks at compile time that a layer call is well-formed: exec matches the space, the view
/// element types agree (up to const) and are the policy's activation type.
template <class P, class E, Space S, class... Ts>
constexpr void check_call() {
  static_assert(exec::Executor<E>, "trainkit::nn: pass an exec::Host or an exec::Cuda executor");
  static_assert(executor_matches_v<E, S>,
                "trainkit::nn: host layers (ParamArena<Space::kHost>) run on exec::Host, device "
                "layers (ParamArena<Space::kDevice>) on exec::Cuda");
  static_assert((is_activation_element_v<Ts> && ...),
                "trainkit::nn: activations are float, trainkit::bf16 or trainkit::f16");
  static_assert((amp::is_activation_type_v<P, Ts> && ...),
                "trainkit::nn: activation views must hold the policy's activation type "
                "(amp::activation_t<P>: float for Fp32/Tf32, bf16 for Bf16, f16 for Fp16)");
}

/// "[a, b, c]" of a view for messages.
template <class V>
std::string shape_of(const V& v) {
  return v.shape().to_string();
}

/// Throws unless `v` is contiguous (layers index activations densely).
template <class V>
void check_contiguous(const char* who, const char* name, const V& v) {
  TRAINKIT_CHECK(v.is_contiguous(), who, ": ", name, " with shape ", shape_of(v),
                 " must be contiguous (row-major, dense)");
}

/// True for a view that was not given (default-constructed: null data).
template <class V>
bool absent(const V& v) noexcept {
  return v.data() == nullptr && v.numel() == 0;
}

/// Splits rows [0, rows) into contiguous ranges and runs f(r0, r1) on the Host pool. `cost` is
/// the work per row in elements touched; small problems run on the calling thread. Each row is
/// handled by one call, so per-row results never depend on the thread count.
template <class F>
void for_rows(const exec::Host& host, std::int64_t rows, std::int64_t cost, F&& f) {
  if (rows <= 0) return;
  constexpr std::int64_t kMinTaskWork = std::int64_t{1} << 14;
  const std::int64_t threads = host.num_threads();
  std::int64_t tasks =
      std::min<std::int64_t>(rows, std::max<std::int64_t>(1, rows * cost / kMinTaskWork));
  tasks = std::min<std::int64_t>(tasks, 4 * threads);
  if (threads <= 1 || tasks <= 1) {
    f(std::int64_t{0}, rows);
    return;
  }
  host.parallel_for(tasks, [&](std::int64_t t) {
    const std::int64_t r0 = rows * t / tasks, r1 = rows * (t + 1) / tasks;
    if (r0 < r1) f(r0, r1);
  });
}

/// Grow-only scratch storage owned by a layer (saved activations such as LayerNorm's mean/rstd,
/// attention probabilities): reallocated only when a larger size is requested.
template <class T, Space S>
class Scratch {
 public:
  /// At least n elements, contents unspecified (kept from earlier use when not reallocated).
  T* get(std::int64_t n) {
    if (n > tensor_.numel()) tensor_ = Tensor<T, S>(Shape{n});
    return tensor_.data();
  }
  T* data() noexcept { return tensor_.data(); }
  const T* data() const noexcept { return tensor_.data(); }
  std::int64_t capacity() const noexcept { return tensor_.numel(); }

 private:
  Tensor<T, S> tensor_;
};

/// The static_assert every CUDA-only entry point has in TUs not compiled by nvcc.
template <class E>
inline constexpr bool needs_cuda_compiler_v = !exec::is_cuda_executor_v<E>;

/// Host gemm of the layers (blas::gemm on the Host pool).
template <class A, class B, class C, int R>
void gemm_on(const exec::Host& host, blas::Op op_a, blas::Op op_b, TensorView<A, R, Space::kHost> a,
             TensorView<B, R, Space::kHost> b, TensorView<C, R, Space::kHost> c,
             const blas::GemmOptions<C>& options) {
  blas::gemm(host, op_a, op_b, a, b, c, options);
}

#if TRAINKIT_WITH_CUBLASLT
/// The cuBLASLt handle (workspace and plan cache) the layers use on the calling thread for the
/// current device. Created on first use and deliberately never destroyed: it would otherwise be
/// freed after the CUDA runtime has shut down at exit.
inline blas::CublasLt& layer_cublaslt() {
  thread_local std::unordered_map<int, blas::CublasLt*> handles;
  int device = 0;
  TRAINKIT_CUDA_CHECK(cudaGetDevice(&device));
  blas::CublasLt*& lt = handles[device];
  if (lt == nullptr) lt = new blas::CublasLt();
  return *lt;
}

/// Device gemm of the layers: cuBLASLt on the executor's stream.
template <class A, class B, class C, int R>
void gemm_on(const exec::Cuda& exec, blas::Op op_a, blas::Op op_b,
             TensorView<A, R, Space::kDevice> a, TensorView<B, R, Space::kDevice> b,
             TensorView<C, R, Space::kDevice> c, const blas::GemmOptions<C>& options) {
  blas::gemm(layer_cublaslt(), op_a, op_b, a, b, c, options, exec.stream());
}
#else
template <class E, class... Args>
requires exec::is_cuda_executor_v<E>
void gemm_on(const E&, Args&&...) {
  static_assert(needs_cuda_compiler_v<E>,
                "trainkit::nn: layers with matmuls on exec::Cuda use cuBLASLt: build with "
                "TRAINKIT_WITH_CUBLASLT=1 (CMake: TRAINKIT_ENABLE_CUBLASLT) and link cublasLt");
}
#endif

}  // namespace detail
}  // namespace nn
TRAINKIT_NAMESPACE_END

/// Declares, in a TU that cannot launch kernels, the exec::Cuda overload of nn::detail::NAME as
/// a template whose instantiation explains what to do (the real one exists under nvcc).
#define TRAINKIT_DETAIL_NN_CUDA_ONLY(NAME)                                                     \
  template <class E, class... Args>                                                            \
  requires ::trainkit::exec::is_cuda_executor_v<E>                                             \
  void NAME(const E&, Args&&...) {                                                             \
    static_assert(::trainkit::nn::detail::needs_cuda_compiler_v<E>,                            \
                  "trainkit::nn: this layer was called with exec::Cuda, which launches CUDA "  \
                  "kernels: compile this TU with nvcc (a .cu file), or run it on exec::Host"); \
  }
