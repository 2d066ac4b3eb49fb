// SPDX-License-Identifier: MIT
// trainkit/exec/launch.hpp: `launch(exec, n, f)` calls f(i) for every i in [0, n): on exec::Host
// as contiguous chunks spread over the thread pool (a plain loop the compiler can vectorise), on
// exec::Cuda as a grid-stride kernel. One TRAINKIT_HOST_DEVICE functor serves both, which is how
// every element-wise op gets a CPU path that is also the oracle for its CUDA path.
#pragma once

#include <algorithm>
#include <cstdint>
#include <type_traits>

#include "trainkit/config.hpp"
#include "trainkit/error.hpp"
#include "trainkit/exec/cuda.hpp"
#include "trainkit/exec/executor.hpp"
#include "trainkit/exec/host.hpp"

TRAINKIT_NAMESPACE_BEGIN
namespace exec {

/// A Host launch gives each task at least this many elements (~128 KiB of f32): below it the
/// fork/join costs more than the loop, so n < 2 * kHostMinTaskElements runs on the caller.
inline constexpr std::int64_t kHostMinTaskElements = std::int64_t{1} << 15;
/// Host task boundaries are multiples of this many elements (64 B of f32: whole cache lines and
/// whole SIMD vectors for every type up to 4 bytes).
inline constexpr std::int64_t kHostTaskAlignment = 16;

namespace detail {

/// How a Host launch splits [0, n): `num_tasks` contiguous ranges of `per_task` elements (the
/// last one shorter). About four tasks per thread lets fast threads take over slow ones' work.
struct HostSplit {
  std::int64_t num_tasks;
  std::int64_t per_task;
};

inline HostSplit host_split(std::int64_t n, int num_threads) noexcept {
  if (num_threads <= 1 || n < 2 * kHostMinTaskElements) return {1, n};
  const std::int64_t tasks =
      std::min<std::int64_t>(n / kHostMinTaskElements, std::int64_t{4} * num_threads);
  const std::int64_t per_task = round_up(ceil_div(n, tasks), kHostTaskAlignment);
  return {ceil_div(n, per_task), per_task};
}

/// The inner loop of every Host launch. `f` is a private copy (see launch), so its members can
/// live in registers and the loop vectorises when the functor's body allows it.
template <class F>
TRAINKIT_FORCEINLINE void host_range(F& f, std::int64_t begin, std::int64_t end) {
  for (std::int64_t i = begin; i < end; ++i) f(i);
}

/// Runs f over [begin, end) on a private copy of f when f is copyable. Through a reference, each
/// store of the loop body could alias the functor's own pointer members, forcing reloads.
template <class F>
TRAINKIT_FORCEINLINE void host_range_copy(const F& f, std::int64_t begin, std::int64_t end) {
  if constexpr (std::is_copy_constructible_v<F>) {
    F local(f);
    host_range(local, begin, end);
  } else {
    host_range(f, begin, end);
  }
}

/// The most blocks a CUDA grid may have along x (2^31 - 1) and along y or z (65535).
inline constexpr std::int64_t kMaxGridX = 0x7fffffff;
inline constexpr std::int64_t kMaxGridYZ = 65535;

/// Blocks of `per_block` items (> 0) that cover n items (0 for n <= 0), as a grid's x
/// dimension. Throws trainkit::Error naming `kernel` when a grid cannot have that many blocks.
/// Host code, so that the launch wrappers' grids can be tested without a GPU.
inline unsigned grid_blocks_x(std::int64_t n, std::int64_t per_block, const char* kernel) {
  TRAINKIT_CHECK(per_block > 0, kernel, ": ", per_block, " items per block is not positive");
  const std::int64_t blocks = n <= 0 ? 0 : (n - 1) / per_block + 1;  // no overflow near 2^63
  TRAINKIT_CHECK(blocks <= kMaxGridX, kernel, ": ", n, " items in blocks of ", per_block, " need ",
                 blocks, " blocks, more than a grid's 2^31 - 1");
  return static_cast<unsigned>(blocks);
}

/// A grid's y (or z) dimension for `count` units of work (e.g. row chunks): count itself up to
/// 65535, else 65535, and the kernel strides over the units by gridDim.y. 0 for count <= 0.
inline unsigned grid_dim_yz(std::int64_t count) noexcept {
  return static_cast<unsigned>(count <= 0 ? 0 : std::min(count, kMaxGridYZ));
}

}  // namespace detail

/// Calls f(i) for every i in [0, n) (64-bit indices) on the Host pool and returns when done.
/// [0, n) is cut into contiguous ranges of >= kHostMinTaskElements elements, each run as
/// `for (i = b; i < e; ++i) f(i)` by one thread on its own copy of f; small n runs on the
/// calling thread. n <= 0 does nothing. Each i is visited exactly once, in no particular order
/// across ranges: f(i) must not depend on other indices' results. Capture pointers by value
/// (`[=]` or a functor struct), so the loop body does not reload them through a reference.
/// Rethrows the first exception thrown by f (remaining ranges are skipped).
template <class F>
void launch(const Host& exec, std::int64_t n, F&& f) {
  using Fn = std::remove_cvref_t<F>;
  if (n <= 0) return;
  const detail::HostSplit split = detail::host_split(n, exec.num_threads());
  if (split.num_tasks == 1) {
    detail::host_range_copy<Fn>(f, 0, n);
    return;
  }
  const Fn& fn = f;
  exec.parallel_for(split.num_tasks, [&fn, n, per_task = split.per_task](std::int64_t task) {
    const std::int64_t begin = task * per_task;
    detail::host_range_copy<Fn>(fn, begin, begin + std::min(per_task, n - begin));
  });
}

#if TRAINKIT_CUDA_COMPILER && TRAINKIT_WITH_CUDA
namespace detail {
inline namespace TRAINKIT_DETAIL_EXEC_ARCH_NS {

inline constexpr int kLaunchThreads = 256;
// One wave at full occupancy is 2048 / 256 = 8 blocks per SM; two waves keep every SM busy when
// the functor's register use halves the resident blocks. The rest is done by the grid stride.
inline constexpr int kLaunchBlocksPerSm = 16;

/// Call right after a kernel launch: throws trainkit::Error naming the kernel and its shape (the
/// streamed `shape` pieces) with CUDA's reason when the launch failed (a grid or block over the
/// limits, too much shared memory, too many registers, a sticky error of an earlier kernel).
template <class... Shape>
void check_kernel_launch(const char* kernel, const Shape&... shape) {
  const cudaError_t err = cudaGetLastError();
  TRAINKIT_CHECK(err == cudaSuccess, kernel, " (", shape...,
                 ") failed to launch: ", cudaGetErrorString(err));
}

template <class F>
__global__ void __launch_bounds__(kLaunchThreads) launch_kernel(std::int64_t n, F f) {
  const std::int64_t stride = static_cast<std::int64_t>(gridDim.x) * blockDim.x;
  for (std::int64_t i = static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n;
       i += stride)
    f(i);
}

}  // namespace TRAINKIT_DETAIL_EXEC_ARCH_NS
}  // namespace detail

inline namespace TRAINKIT_DETAIL_EXEC_ARCH_NS {

/// Enqueues f(i) for every i in [0, n) on the executor's stream as a grid-stride kernel
/// (256 threads per block, at most 16 blocks per SM) and returns without waiting. f is copied
/// to the device by value: it must be trivially copyable and its operator() __device__
/// (TRAINKIT_HOST_DEVICE). n <= 0 enqueues nothing. Throws trainkit::Error when the launch fails.
template <class F>
void launch(const Cuda& exec, std::int64_t n, F&& f) {
  using Fn = std::remove_cvref_t<F>;
  static_assert(std::is_trivially_copyable_v<Fn>,
                "exec::launch(Cuda): the functor is copied to the GPU as a kernel argument "
                "and must be trivially copyable (hold pointers and views, not owning containers)");
  if (n <= 0) return;
  const std::int64_t max_blocks =
      std::int64_t{detail::kLaunchBlocksPerSm} * detail::sm_count(detail::current_device());
  const std::int64_t blocks = std::min(detail::ceil_div(n, detail::kLaunchThreads), max_blocks);
  detail::launch_kernel<Fn>
      <<<static_cast<unsigned>(blocks), detail::kLaunchThreads, 0, exec.stream().get()>>>(n, Fn(f));
  detail::check_kernel_launch("exec::launch", "n ", n, ", ", blocks, " blocks of ",
                              detail::kLaunchThreads);
}

}  // namespace TRAINKIT_DETAIL_EXEC_ARCH_NS
#else
/// Without a CUDA compiler there is no kernel to launch: this overload only explains that.
template <CudaExecutor E, class F>
void launch(const E&, std::int64_t, F&&) {
  static_assert(detail::dependent_false<E, F>,
                "exec::launch with an exec::Cuda executor defines a CUDA kernel: "
                "compile this TU with nvcc (a .cu file), or pass an exec::Host");
}
#endif

}  // namespace exec
TRAINKIT_NAMESPACE_END
