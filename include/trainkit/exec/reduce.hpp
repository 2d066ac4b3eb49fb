// SPDX-License-Identifier: MIT
// trainkit/exec/reduce.hpp: `reduce(exec, n, f, op, init)` = op-fold of f(i) over [0, n), e.g. a
// sum of squares for a gradient norm, with the op functors exec::Sum, exec::Max and exec::Min.
// Deterministic by construction: the order in which values are combined is a function of n only,
// never of the thread count, the SM count or timing, so the same input gives the same bits.
#pragma once

#include <algorithm>
#include <bit>
#include <cstdint>
#include <memory>
#include <new>
#include <type_traits>
#include <utility>

#include "trainkit/config.hpp"
#include "trainkit/error.hpp"
#include "trainkit/exec/cuda.hpp"
#include "trainkit/exec/executor.hpp"
#include "trainkit/exec/host.hpp"
#include "trainkit/exec/launch.hpp"

TRAINKIT_NAMESPACE_BEGIN
namespace exec {

namespace detail {

/// True for NaN (x != x); false for integers, where the self-comparison would be a warning.
template <class T>
TRAINKIT_HOST_DEVICE inline constexpr bool is_nan(const T& x) {
  if constexpr (std::is_integral_v<T>) {
    return false;
  } else {
    return !(x == x);
  }
}

}  // namespace detail

/// a + b.
struct Sum {
  template <class T>
  TRAINKIT_HOST_DEVICE constexpr T operator()(const T& a, const T& b) const {
    return a + b;
  }
};

/// The larger of a and b; NaN if either is NaN (a NaN anywhere makes the reduction NaN, so an
/// overflow is never hidden). Ties return a.
struct Max {
  template <class T>
  TRAINKIT_HOST_DEVICE constexpr T operator()(const T& a, const T& b) const {
    return (b > a || detail::is_nan(b)) ? b : a;
  }
};

/// The smaller of a and b; NaN if either is NaN. Ties return a.
struct Min {
  template <class T>
  TRAINKIT_HOST_DEVICE constexpr T operator()(const T& a, const T& b) const {
    return (b < a || detail::is_nan(b)) ? b : a;
  }
};

/// Host reductions fold fixed chunks of this many consecutive elements (a function of n only).
inline constexpr std::int64_t kReduceChunk = 4096;
/// Within a chunk, element i goes to accumulator (i - chunk_begin) % kReduceLanes: 16
/// independent chains fill the SIMD lanes and hide the add latency, and they are combined by a
/// fixed tree (0+8, 1+9, ...; then 0+4, ...), so the order stays a function of n.
inline constexpr int kReduceLanes = 16;

namespace detail {

/// Pairwise combination of a stream of values, left to right, in O(log n) memory: a binary
/// counter whose entry k holds the combination of 2^k consecutive values. Any aligned block of
/// 2^k pushes forms one subtree, which is why Host tasks of 2^k chunks give identical bits.
template <class T, class Op>
class PairwiseFold {
 public:
  /// Starts the fold with its first value (a fold is never empty).
  PairwiseFold(const Op& op, T first) : op_(op) {
    stack_[0] = first;
    top_ = 1;
    count_ = 1;
  }

  void push(T value) {
    for (std::uint64_t carry = count_; (carry & 1) != 0; carry >>= 1)
      value = op_(stack_[--top_], value);
    stack_[top_++] = value;
    ++count_;
  }

  /// The combination of everything pushed: the partial subtrees left on the stack are combined
  /// from the right, earlier values always on the left of op.
  T result() const {
    T value = stack_[top_ - 1];
    for (int k = top_ - 2; k >= 0; --k) value = op_(stack_[k], value);
    return value;
  }

 private:
  Op op_;
  T stack_[65];
  int top_;
  std::uint64_t count_;
};

/// lanes[j] = op(lanes[j], f(i + j)) for every lane, unrolled in the source: the compiler then
/// keeps the lanes in (SIMD) registers even at -O2, where it would not unroll a loop of 16.
template <class T, class F, class Op, int... J>
TRAINKIT_FORCEINLINE void fold_lanes(T* lanes, const F& f, const Op& op, std::int64_t i,
                                     std::integer_sequence<int, J...>) {
  ((lanes[J] = op(lanes[J], static_cast<T>(f(i + J)))), ...);
}

/// The fold of f over one chunk [begin, end) (begin < end), in kReduceLanes interleaved lanes.
template <class T, class F, class Op>
TRAINKIT_FORCEINLINE T chunk_fold(const F& f, const Op& op, std::int64_t begin, std::int64_t end) {
  if (end - begin < kReduceLanes) {
    T value = static_cast<T>(f(begin));
    for (std::int64_t i = begin + 1; i < end; ++i) value = op(value, static_cast<T>(f(i)));
    return value;
  }
  T lanes[kReduceLanes];
  for (int j = 0; j < kReduceLanes; ++j) lanes[j] = static_cast<T>(f(begin + j));
  std::int64_t i = begin + kReduceLanes;
  for (; i + kReduceLanes <= end; i += kReduceLanes)
    fold_lanes<T>(lanes, f, op, i, std::make_integer_sequence<int, kReduceLanes>{});
  for (int j = 0; i < end; ++i, ++j) lanes[j] = op(lanes[j], static_cast<T>(f(i)));
  for (int width = kReduceLanes / 2; width > 0; width /= 2)
    for (int j = 0; j < width; ++j) lanes[j] = op(lanes[j], lanes[j + width]);
  return lanes[0];
}

/// Folds chunks [first, last) of [0, n) pairwise (first < last); fold_chunk(begin, end) folds
/// the elements of one chunk (chunk_fold's value, possibly from code for another ISA).
template <class T, class Op, class ChunkFold>
T fold_chunks_with(const Op& op, std::int64_t n, std::int64_t first, std::int64_t last,
                   const ChunkFold& fold_chunk) {
  const auto chunk = [&](std::int64_t c) {
    const std::int64_t begin = c * kReduceChunk;
    return fold_chunk(begin, std::min(n, begin + kReduceChunk));
  };
  PairwiseFold<T, Op> fold(op, chunk(first));
  for (std::int64_t c = first + 1; c < last; ++c) fold.push(chunk(c));
  return fold.result();
}

/// Folds chunks [first, last) of [0, n) pairwise (first < last).
template <class T, class F, class Op>
T fold_chunks(const F& f, const Op& op, std::int64_t n, std::int64_t first, std::int64_t last) {
  return fold_chunks_with<T>(op, n, first, last, [&](std::int64_t begin, std::int64_t end) {
    return chunk_fold<T>(f, op, begin, end);
  });
}

/// exec::reduce's schedule with the chunk folding supplied by the caller: fold(first, last) must
/// return detail::fold_chunks<T>(f, op, n, first, last) for the reduce being computed (the
/// same value, e.g. from code compiled for another ISA). Everything else, who folds which
/// aligned group of chunks and how the groups are combined, is reduce's.
template <class T, class Op, class Fold>
T reduce_chunks(const Host& exec, std::int64_t n, const Op& op, T init, const Fold& fold) {
  if (n <= 0) return init;
  const std::int64_t chunks = ceil_div(n, kReduceChunk);
  // A task folds an aligned run of `group` chunks, a power of two, i.e. one subtree of the tree
  // above: how many tasks there are changes who computes a subtree, never its shape.
  std::int64_t group = chunks;
  if (exec.num_threads() > 1 && n >= 2 * kHostMinTaskElements) {
    // About four tasks per thread, each of at least kHostMinTaskElements elements.
    const std::int64_t wanted = std::max(ceil_div(chunks, std::int64_t{4} * exec.num_threads()),
                                         kHostMinTaskElements / kReduceChunk);
    group = static_cast<std::int64_t>(std::bit_ceil(static_cast<std::uint64_t>(wanted)));
  }
  if (group >= chunks) return op(init, fold(std::int64_t{0}, chunks));

  const std::int64_t tasks = ceil_div(chunks, group);
  // Not std::vector: vector<bool> would make the tasks' writes race on shared words.
  const std::unique_ptr<T[]> partials(new T[static_cast<std::size_t>(tasks)]);
  exec.parallel_for(tasks, [&](std::int64_t task) {
    const std::int64_t first = task * group;
    partials[static_cast<std::size_t>(task)] = fold(first, std::min(chunks, first + group));
  });
  PairwiseFold<T, Op> combined(op, partials[0]);
  for (std::int64_t task = 1; task < tasks; ++task)
    combined.push(partials[static_cast<std::size_t>(task)]);
  return op(init, combined.result());
}

}  // namespace detail

/// Returns op(init, R) where R combines f(0), ..., f(n-1) (each converted to T) in an order fixed
/// by n alone: chunks of kReduceChunk elements, each folded in kReduceLanes interleaved lanes,
/// then a pairwise tree over the chunks in index order. The bits are identical for any thread
/// count and run; the pairwise tree also keeps float error at O(log n) instead of O(n).
/// Returns init when n <= 0. T (deduced from init) must be default-constructible and copyable;
/// op must be associative enough for your purpose (it is applied in a fixed, not sequential,
/// order) and callable concurrently. Rethrows the first exception thrown by f.
/// Example: `exec::reduce(host, n, [=](std::int64_t i) { return double(g[i]) * g[i]; },
///                        exec::Sum{}, 0.0)`.
template <class F, class Op, class T>
T reduce(const Host& exec, std::int64_t n, F&& f, Op op, T init) {
  using Fn = std::remove_cvref_t<F>;
  const Fn& fn = f;
  return detail::reduce_chunks(exec, n, op, init, [&](std::int64_t first, std::int64_t last) {
    return detail::fold_chunks<T>(fn, op, n, first, last);
  });
}

#if TRAINKIT_CUDA_COMPILER && TRAINKIT_WITH_CUDA
/// Threads per block of the CUDA reduction kernels.
inline constexpr int kCudaReduceThreads = 256;
/// The CUDA reduction's grid: min(kCudaReduceMaxBlocks, ceil(n / 256)) blocks, fixed by n and
/// not by the GPU, so the combination order (and the result) is the same on every device.
inline constexpr int kCudaReduceMaxBlocks = 1024;

namespace detail {
inline namespace TRAINKIT_DETAIL_EXEC_ARCH_NS {

/// Combines the block's slots in a fixed tree (slot t with t + width, width = 128, 64, ... 1);
/// `has[t]` is false for a thread that had no element. The result ends in slot 0.
template <class T, class Op>
__device__ void block_tree(T* values, bool* has, const Op& op, int tid) {
  for (int width = kCudaReduceThreads / 2; width > 0; width /= 2) {
    __syncthreads();
    if (tid < width && has[tid + width]) {
      values[tid] = has[tid] ? op(values[tid], values[tid + width]) : values[tid + width];
      has[tid] = true;
    }
  }
  __syncthreads();
}

/// Pass 1: block b writes the combination of its threads; thread t folds, in index order, the
/// elements i = (b * 256 + t) + k * (gridDim.x * 256). Every block has at least one element.
template <class T, class F, class Op>
__global__ void __launch_bounds__(kCudaReduceThreads)
    reduce_blocks_kernel(std::int64_t n, F f, Op op, T* partials) {
  __shared__ alignas(T) unsigned char storage[kCudaReduceThreads * sizeof(T)];
  __shared__ bool has[kCudaReduceThreads];
  T* values = reinterpret_cast<T*>(storage);
  const int tid = static_cast<int>(threadIdx.x);
  const std::int64_t stride = static_cast<std::int64_t>(gridDim.x) * kCudaReduceThreads;
  std::int64_t i = static_cast<std::int64_t>(blockIdx.x) * kCudaReduceThreads + tid;
  has[tid] = i < n;
  if (i < n) {
    T value = static_cast<T>(f(i));
    i += stride;
    // Four loads in flight per step, still folded in index order.
    for (; i + 3 * stride < n; i += 4 * stride) {
      const T v0 = static_cast<T>(f(i));
      const T v1 = static_cast<T>(f(i + stride));
      const T v2 = static_cast<T>(f(i + 2 * stride));
      const T v3 = static_cast<T>(f(i + 3 * stride));
      value = op(op(op(op(value, v0), v1), v2), v3);
    }
    for (; i < n; i += stride) value = op(value, static_cast<T>(f(i)));
    ::new (static_cast<void*>(values + tid)) T(value);
  }
  block_tree(values, has, op, tid);
  if (tid == 0) partials[blockIdx.x] = values[0];
}

/// Pass 2 (one block): *out = op(init, combination of partials[0 .. count)), or init if count
/// is 0. Thread t folds partials t, t + 256, ... in order, then the fixed block tree.
template <class T, class Op>
__global__ void __launch_bounds__(kCudaReduceThreads)
    reduce_final_kernel(const T* partials, int count, Op op, T init, T* out) {
  __shared__ alignas(T) unsigned char storage[kCudaReduceThreads * sizeof(T)];
  __shared__ bool has[kCudaReduceThreads];
  T* values = reinterpret_cast<T*>(storage);
  const int tid = static_cast<int>(threadIdx.x);
  has[tid] = tid < count;
  if (tid < count) {
    T value = partials[tid];
    for (int k = tid + kCudaReduceThreads; k < count; k += kCudaReduceThreads)
      value = op(value, partials[k]);
    ::new (static_cast<void*>(values + tid)) T(value);
  }
  block_tree(values, has, op, tid);
  if (tid == 0) *out = has[0] ? op(init, values[0]) : init;
}

}  // namespace TRAINKIT_DETAIL_EXEC_ARCH_NS
}  // namespace detail

inline namespace TRAINKIT_DETAIL_EXEC_ARCH_NS {

/// Enqueues the reduction of `reduce` on the executor's stream and writes op(init, R) to
/// `device_out` (device memory, sizeof(T) bytes) without waiting. Two kernels: at most 1024
/// blocks of 256 threads, each thread folding its grid-strided elements in index order and each
/// block combining in a fixed tree, then one block combining the block results. The grid does
/// not depend on the GPU, so the bits are the same on every device and run (they differ from
/// the Host's, whose order is different). Scratch for the block results comes from
/// cudaMallocAsync on the same stream. f and op must be trivially copyable with __device__
/// call operators; T trivially copyable. Throws trainkit::Error when a launch fails.
template <class F, class Op, class T>
void reduce_into(const Cuda& exec, std::int64_t n, F&& f, Op op, T init, T* device_out) {
  using Fn = std::remove_cvref_t<F>;
  static_assert(std::is_trivially_copyable_v<Fn> && std::is_trivially_copyable_v<Op>,
                "exec::reduce(Cuda): "
                "the functor and the op are kernel arguments and must be trivially copyable");
  static_assert(std::is_trivially_copyable_v<T>,
                "exec::reduce(Cuda): the result type must be trivially copyable");
  TRAINKIT_CHECK(device_out != nullptr, "exec::reduce_into: device_out is null");
  const cudaStream_t stream = exec.stream().get();
  const int blocks = n <= 0 ? 0
                            : static_cast<int>(std::min<std::int64_t>(
                                  detail::ceil_div(n, kCudaReduceThreads), kCudaReduceMaxBlocks));
  T* partials = nullptr;
  cudaError_t status = cudaSuccess;
  if (blocks > 0) {
    TRAINKIT_CUDA_CHECK(cudaMallocAsync(reinterpret_cast<void**>(&partials),
                                        static_cast<std::size_t>(blocks) * sizeof(T), stream));
    detail::reduce_blocks_kernel<T, Fn, Op>
        <<<blocks, kCudaReduceThreads, 0, stream>>>(n, Fn(f), op, partials);
    status = cudaGetLastError();
  }
  if (status == cudaSuccess) {
    detail::reduce_final_kernel<T, Op>
        <<<1, kCudaReduceThreads, 0, stream>>>(partials, blocks, op, init, device_out);
    status = cudaGetLastError();
  }
  if (partials != nullptr) TRAINKIT_CUDA_CHECK_NOTHROW(cudaFreeAsync(partials, stream));
  TRAINKIT_CHECK(status == cudaSuccess, "exec::reduce_into (n ", n, ", ", blocks,
                 " blocks) failed to launch: ", cudaGetErrorString(status));
}

/// Like reduce_into, then copies the result to the host and waits for the stream: a host sync.
/// Prefer reduce_into in a training step.
template <class F, class Op, class T>
T reduce(const Cuda& exec, std::int64_t n, F&& f, Op op, T init) {
  const cudaStream_t stream = exec.stream().get();
  T* out = nullptr;
  TRAINKIT_CUDA_CHECK(cudaMallocAsync(reinterpret_cast<void**>(&out), sizeof(T), stream));
  try {
    reduce_into(exec, n, static_cast<F&&>(f), op, init, out);
  } catch (...) {
    TRAINKIT_CUDA_CHECK_NOTHROW(cudaFreeAsync(out, stream));
    throw;
  }
  T result = init;
  const cudaError_t copied =
      cudaMemcpyAsync(&result, out, sizeof(T), cudaMemcpyDeviceToHost, stream);
  TRAINKIT_CUDA_CHECK_NOTHROW(cudaFreeAsync(out, stream));
  TRAINKIT_CUDA_CHECK(copied);
  exec.synchronize();
  return result;
}

}  // namespace TRAINKIT_DETAIL_EXEC_ARCH_NS
#else
/// Without a CUDA compiler there is no kernel to launch: these overloads only explain that.
template <CudaExecutor E, class F, class Op, class T>
T reduce(const E&, std::int64_t, F&&, Op, T init) {
  static_assert(detail::dependent_false<E, F>,
                "exec::reduce with an exec::Cuda executor defines a CUDA kernel: "
                "compile this TU with nvcc (a .cu file), or pass an exec::Host");
  return init;
}

template <CudaExecutor E, class F, class Op, class T>
void reduce_into(const E&, std::int64_t, F&&, Op, T, T*) {
  static_assert(detail::dependent_false<E, F>,
                "exec::reduce_into defines a CUDA kernel: compile this TU with nvcc (a .cu file)");
}
#endif

}  // namespace exec
TRAINKIT_NAMESPACE_END
