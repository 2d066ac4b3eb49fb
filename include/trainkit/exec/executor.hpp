// SPDX-License-Identifier: MIT
// trainkit/exec/executor.hpp: what an executor is. Element-wise work is written once as a
// TRAINKIT_HOST_DEVICE functor and handed to launch/reduce/multi_tensor_apply with an executor:
// `exec::Host` runs it on CPU threads, `exec::Cuda` on a CUDA stream. Generic code constrains
// its executor parameter with the `exec::Executor` concept and dispatches by overloading.
#pragma once

#include <cstdint>
#include <type_traits>

#include "trainkit/config.hpp"

TRAINKIT_NAMESPACE_BEGIN
namespace exec {

class Host;  // exec/host.hpp: a persistent CPU thread pool.
class Cuda;  // exec/cuda.hpp: a CUDA stream (defined only when TRAINKIT_WITH_CUDA).

/// True for `exec::Host` (cv/ref-qualified too).
template <class E>
inline constexpr bool is_host_executor_v = std::is_same_v<std::remove_cvref_t<E>, Host>;

/// True for `exec::Cuda` (cv/ref-qualified too). Usable in every tier: a .cpp TU can name
/// the type in generic code even when it cannot launch kernels with it.
template <class E>
inline constexpr bool is_cuda_executor_v = std::is_same_v<std::remove_cvref_t<E>, Cuda>;

/// `exec::Host` (any cv/ref qualification).
template <class E>
concept HostExecutor = is_host_executor_v<E>;

/// `exec::Cuda` (any cv/ref qualification).
template <class E>
concept CudaExecutor = is_cuda_executor_v<E>;

/// An executor: something `launch`, `reduce` and `multi_tensor_apply` accept. Executors are
/// passed by (const) reference; `Host` owns threads and is move-only, `Cuda` is a cheap view.
template <class E>
concept Executor = HostExecutor<E> || CudaExecutor<E>;

// Internals of the executors live in exec::detail (like cuda::detail), so their short names
// cannot collide with helpers of other folders in trainkit::detail.
namespace detail {

/// `static_assert(dependent_false<T>, ...)` fires only when the template is instantiated.
template <class...>
inline constexpr bool dependent_false = false;

/// ceil(a / b) for a >= 0, b > 0 (without forming a + b - 1, which overflows near 2^63).
TRAINKIT_HOST_DEVICE inline constexpr std::int64_t ceil_div(std::int64_t a, std::int64_t b) {
  return a / b + (a % b != 0 ? 1 : 0);
}

/// The smallest multiple of b that is >= a, for a >= 0, b > 0.
TRAINKIT_HOST_DEVICE inline constexpr std::int64_t round_up(std::int64_t a, std::int64_t b) {
  return ceil_div(a, b) * b;
}

}  // namespace detail
}  // namespace exec

TRAINKIT_NAMESPACE_END
