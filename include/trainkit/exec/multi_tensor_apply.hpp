// SPDX-License-Identifier: MIT
// trainkit/exec/multi_tensor_apply.hpp: one launch over many tensors. A fused optimizer step
// touches every parameter tensor with the same element-wise functor; launching per tensor costs
// a kernel launch (GPU) or a fork/join (CPU) each. `multi_tensor_apply(exec, list, f)` instead
// calls f(tensor, i, arrays...) for every element of every tensor of a TensorList in one go,
// following PyTorch/apex's design on CUDA (65,536-element chunks, tables passed as the kernel
// argument, a new launch only when the tables fill up).
#pragma once

#include <algorithm>
#include <climits>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <tuple>
#include <type_traits>
#include <utility>
#include <vector>

#include "trainkit/config.hpp"
#include "trainkit/error.hpp"
#include "trainkit/exec/cuda.hpp"
#include "trainkit/exec/executor.hpp"
#include "trainkit/exec/host.hpp"
#include "trainkit/exec/launch.hpp"

TRAINKIT_NAMESPACE_BEGIN
namespace exec {

/// Elements per CUDA block of a multi_tensor_apply (PyTorch's kChunkSize, apex's 2048 * 32).
inline constexpr std::int64_t kMtaChunk = 65536;
/// Threads per CUDA block of a multi_tensor_apply (PyTorch's kBlockSize).
inline constexpr int kMtaThreads = 512;
/// The largest depth (parallel arrays per tensor): AdamW with master weights and amsgrad is 6.
inline constexpr int kMtaMaxDepth = 8;

/// The tensors of one multi_tensor_apply: each tensor is `Depth = sizeof...(Ts)` parallel arrays
/// of the same length, array d holding elements of type Ts[d] (they may differ: bf16 params with
/// f32 master weights; use `const T` for read-only arrays). E.g. AdamW's
/// `TensorList<float, const float, float, float>` holds (param, grad, exp_avg, exp_avg_sq).
/// Build it once (e.g. when the optimizer is created) and reuse it every step. Host memory only;
/// the pointers are host or device addresses according to the executor they are used with.
template <class... Ts>
class TensorList {
  static_assert(sizeof...(Ts) >= 1 && sizeof...(Ts) <= kMtaMaxDepth,
                "exec::TensorList: depth (number of arrays per tensor) must be 1..8");

 public:
  static constexpr int kDepth = static_cast<int>(sizeof...(Ts));
  using Pointers = std::tuple<Ts*...>;

  TensorList() = default;

  /// Appends a tensor of `numel` elements whose arrays start at `arrays...` and returns its
  /// index, the `tensor` argument the functor receives (tensors of 0 elements keep their index;
  /// they are never visited). Throws trainkit::Error when numel < 0 or a pointer is null while
  /// numel > 0.
  int add(std::int64_t numel, Ts*... arrays) {
    TRAINKIT_CHECK(numel >= 0, "exec::TensorList::add: tensor ", size(), " has numel ", numel,
                   " < 0");
    TRAINKIT_CHECK(numel == 0 || ((arrays != nullptr) && ...), "exec::TensorList::add: tensor ",
                   size(), " (", numel, " elements) has a null array");
    TRAINKIT_CHECK(pointers_.size() < static_cast<std::size_t>(INT_MAX),
                   "exec::TensorList::add: too many tensors");
    TRAINKIT_CHECK(numel <= std::numeric_limits<std::int64_t>::max() - offsets_.back(),
                   "exec::TensorList::add: tensor ", size(), " (", numel,
                   " elements) takes the list past 2^63 - 1 elements");
    pointers_.emplace_back(arrays...);
    offsets_.push_back(offsets_.back() + numel);
    return size() - 1;
  }

  /// Number of tensors (including empty ones).
  int size() const noexcept { return static_cast<int>(pointers_.size()); }
  bool empty() const noexcept { return pointers_.empty(); }
  /// Elements of tensor t.
  std::int64_t numel(int t) const { return offsets_[t + 1] - offsets_[t]; }
  /// Elements of all tensors together.
  std::int64_t total_numel() const noexcept { return offsets_.back(); }
  /// Where tensor t starts if all tensors were laid end to end (an exclusive prefix sum).
  std::int64_t offset(int t) const { return offsets_[t]; }
  /// The arrays of tensor t.
  const Pointers& pointers(int t) const { return pointers_[static_cast<std::size_t>(t)]; }

  /// The tensor holding element `index` of the end-to-end layout (0 <= index < total_numel()).
  int tensor_at(std::int64_t index) const {
    const auto it = std::upper_bound(offsets_.begin(), offsets_.end(), index);
    return static_cast<int>(it - offsets_.begin()) - 1;
  }

  void reserve(int num_tensors) {
    pointers_.reserve(static_cast<std::size_t>(num_tensors));
    offsets_.reserve(static_cast<std::size_t>(num_tensors) + 1);
  }
  void clear() {
    pointers_.clear();
    offsets_.assign(1, 0);
  }

 private:
  std::vector<Pointers> pointers_;
  std::vector<std::int64_t> offsets_{0};
};

namespace detail {

template <class F, class... Ps>
TRAINKIT_FORCEINLINE void mta_range(F& f, int tensor, std::int64_t begin, std::int64_t end,
                                    Ps... arrays) {
  for (std::int64_t i = begin; i < end; ++i) f(tensor, i, arrays...);
}

/// Runs f over [begin, end) of the end-to-end layout, tensor by tensor.
template <class F, class... Ts>
void mta_host_range(F& f, const TensorList<Ts...>& list, std::int64_t begin, std::int64_t end) {
  for (int t = list.tensor_at(begin); begin < end; ++t) {
    const std::int64_t first = list.offset(t);
    const std::int64_t stop = std::min(end, first + list.numel(t));
    std::apply([&](Ts*... arrays) { mta_range(f, t, begin - first, stop - first, arrays...); },
               list.pointers(t));
    begin = std::max(begin, stop);
  }
}

}  // namespace detail

/// Calls f(tensor, i, arrays...) for every tensor of `list` and every i in [0, numel(tensor)),
/// where arrays... are that tensor's Depth base pointers (`Ts*...`), e.g. for AdamW
/// `void operator()(int t, std::int64_t i, float* p, const float* g, float* m, float* v) const`
/// (t indexes per-tensor hyper-parameters). Each element is visited exactly once, in no fixed
/// order across tasks. The Host splits the tensors laid end to end into contiguous ranges of
/// >= kHostMinTaskElements elements (so many tiny tensors cost no more than one big one), each
/// run as a plain loop per tensor on a private copy of f; small lists run on the calling thread.
/// Rethrows the first exception thrown by f.
template <class F, class... Ts>
void multi_tensor_apply(const Host& exec, const TensorList<Ts...>& list, F&& f) {
  using Fn = std::remove_cvref_t<F>;
  const std::int64_t total = list.total_numel();
  if (total == 0) return;
  const detail::HostSplit split = detail::host_split(total, exec.num_threads());
  const Fn& fn = f;
  auto run = [&fn, &list](std::int64_t begin, std::int64_t end) {
    if constexpr (std::is_copy_constructible_v<Fn>) {
      Fn local(fn);
      detail::mta_host_range(local, list, begin, end);
    } else {
      detail::mta_host_range(fn, list, begin, end);
    }
  };
  if (split.num_tasks == 1) {
    run(0, total);
    return;
  }
  exec.parallel_for(split.num_tasks, [&run, total, per_task = split.per_task](std::int64_t task) {
    const std::int64_t begin = task * per_task;
    run(begin, begin + std::min(per_task, total - begin));
  });
}

namespace detail {

/// Table sizes of one CUDA launch. The metadata travels as the kernel argument, whose size is
/// limited to 4 KB (every CUDA version) or 32,764 B (CUDA >= 12.1 runtime and driver, sm_70+).
/// Per depth 1..8: PyTorch's/apex's tables (the large one's depths 6-8 scaled from the small
/// one by 7); the tests check that each leaves >= 256 bytes for the functor.
struct MtaLimitsSmall {
  static constexpr int kMaxTensors[kMtaMaxDepth] = {110, 64, 48, 36, 30, 26, 22, 20};
  static constexpr int kMaxBlocks = 320;
  static constexpr std::size_t kParamBytes = 4096;
  using BlockTensor = std::uint8_t;
};
struct MtaLimitsLarge {
  static constexpr int kMaxTensors[kMtaMaxDepth] = {770, 448, 336, 252, 210, 182, 154, 140};
  static constexpr int kMaxBlocks = 2240;
  static constexpr std::size_t kParamBytes = 32764;
  using BlockTensor = std::uint16_t;
};

/// What one launch processes: a slot per tensor (its arrays, length and index in the list) and
/// a (slot, chunk) pair per block. Passed by value as the kernel argument.
template <class Limits, int Depth>
struct MtaMeta {
  static constexpr int kMaxTensors = Limits::kMaxTensors[Depth - 1];
  static constexpr int kMaxBlocks = Limits::kMaxBlocks;
  void* arrays[Depth][kMaxTensors];
  std::int64_t numel[kMaxTensors];
  int tensor_index[kMaxTensors];
  typename Limits::BlockTensor block_slot[kMaxBlocks];
  int block_chunk[kMaxBlocks];
};

template <class T>
void* mta_address(T* p) noexcept {
  return const_cast<void*>(static_cast<const volatile void*>(p));
}

/// Packs `list` into as few launches as the tables allow and calls `emit(meta, num_blocks)` for
/// each; block b of that launch processes chunk meta.block_chunk[b] of slot meta.block_slot[b].
/// A launch is emitted when the block table is full, or when the tensor table is full and its
/// last tensor is complete; a tensor cut by a full block table is carried over as slot 0 of
/// the next launch with its remaining chunks. Tensors of 0 elements take no slot. Host code,
/// the same in every tier (the CPU tests check it).
template <class Limits, class Emit, class... Ts>
void mta_plan(const TensorList<Ts...>& list, MtaMeta<Limits, sizeof...(Ts)>& meta, Emit&& emit) {
  using Meta = MtaMeta<Limits, sizeof...(Ts)>;
  int used = 0;
  int blocks = 0;
  for (int t = 0; t < list.size(); ++t) {
    const std::int64_t numel = list.numel(t);
    if (numel == 0) continue;
    int slot = used++;
    std::apply(
        [&](Ts*... arrays) {
          int d = 0;
          ((meta.arrays[d++][slot] = mta_address(arrays)), ...);
        },
        list.pointers(t));
    meta.numel[slot] = numel;
    meta.tensor_index[slot] = t;
    const std::int64_t chunks = ceil_div(numel, kMtaChunk);
    for (std::int64_t c = 0; c < chunks; ++c) {
      meta.block_slot[blocks] = static_cast<typename Limits::BlockTensor>(slot);
      meta.block_chunk[blocks] = static_cast<int>(c);
      ++blocks;
      const bool last_chunk = c + 1 == chunks;
      if (blocks == Meta::kMaxBlocks || (used == Meta::kMaxTensors && last_chunk)) {
        emit(static_cast<const Meta&>(meta), blocks);
        blocks = 0;
        if (last_chunk) {
          used = 0;
        } else {
          for (int d = 0; d < static_cast<int>(sizeof...(Ts)); ++d)
            meta.arrays[d][0] = meta.arrays[d][slot];
          meta.numel[0] = numel;
          meta.tensor_index[0] = t;
          slot = 0;
          used = 1;
        }
      }
    }
  }
  if (blocks > 0) emit(static_cast<const Meta&>(meta), blocks);
}

}  // namespace detail

#if TRAINKIT_CUDA_COMPILER && TRAINKIT_WITH_CUDA
namespace detail {
inline namespace TRAINKIT_DETAIL_EXEC_ARCH_NS {

#if defined(__CUDA_ARCH_LIST__)
inline constexpr int kMtaArchList[] = {__CUDA_ARCH_LIST__};
#else
inline constexpr int kMtaArchList[] = {0};
#endif

/// True when every architecture this TU is compiled for accepts 32 KB kernel arguments.
inline constexpr bool mta_archs_take_large_params() {
  for (int arch : kMtaArchList)
    if (arch < 700) return false;
  return true;
}

template <class... Ts, class Meta, class F, std::size_t... D>
__device__ TRAINKIT_FORCEINLINE void mta_block(const Meta& meta, F& f, int slot,
                                               std::index_sequence<D...>) {
  const std::int64_t numel = meta.numel[slot];
  const std::int64_t begin = static_cast<std::int64_t>(meta.block_chunk[blockIdx.x]) * kMtaChunk;
  const std::int64_t end = numel < begin + kMtaChunk ? numel : begin + kMtaChunk;
  const int tensor = meta.tensor_index[slot];
  for (std::int64_t i = begin + threadIdx.x; i < end; i += kMtaThreads)
    f(tensor, i, static_cast<Ts*>(meta.arrays[D][slot])...);
}

template <class Meta, class F, class... Ts>
__global__ void __launch_bounds__(kMtaThreads) multi_tensor_apply_kernel(Meta meta, F f) {
  mta_block<Ts...>(meta, f, static_cast<int>(meta.block_slot[blockIdx.x]),
                   std::make_index_sequence<sizeof...(Ts)>{});
}

template <class Limits, class Fn, class... Ts>
void mta_launch_all(const TensorList<Ts...>& list, const Fn& f, cudaStream_t stream) {
  using Meta = MtaMeta<Limits, sizeof...(Ts)>;
  Meta meta;
  mta_plan<Limits>(list, meta, [&](const Meta& m, int blocks) {
    // The arguments are copied at launch, so meta can be refilled for the next launch at once.
    multi_tensor_apply_kernel<Meta, Fn, Ts...><<<blocks, kMtaThreads, 0, stream>>>(m, f);
    check_kernel_launch("exec::multi_tensor_apply", list.size(), " tensors of ", list.total_numel(),
                        " elements, ", blocks, " blocks of depth ", sizeof...(Ts), ", ",
                        sizeof(Meta) + sizeof(Fn), " bytes of kernel arguments");
  });
}

}  // namespace TRAINKIT_DETAIL_EXEC_ARCH_NS
}  // namespace detail

inline namespace TRAINKIT_DETAIL_EXEC_ARCH_NS {

/// Enqueues f(tensor, i, arrays...) for every element of every tensor on the executor's stream,
/// in as few launches as the kernel-argument tables allow (one per <= 21M elements / 36 tensors
/// at depth 4 with 4 KB arguments; <= 147M / 252 with 32 KB arguments, used when runtime,
/// driver and all target architectures allow). Block b handles one 65,536-element chunk of one
/// tensor with 512 threads. f is a kernel argument: trivially copyable, __device__ callable, and
/// small (about 300 bytes are left at depth 1: keep per-tensor hyper-parameters in device memory
/// indexed by `tensor`). Returns without waiting; throws trainkit::Error when a launch fails.
/// Per-tensor reductions (LAMB's per-tensor norms) are not provided yet. The intended design
/// reuses mta_plan: each block writes the fold of its chunk to partials[chunk_base[tensor] +
/// chunk] (chunk_base = prefix sums of ceil(numel / kMtaChunk)), then a second kernel folds
/// each tensor's partials in chunk order: deterministic like exec::reduce, no atomics. Until
/// then, call exec::reduce per tensor.
template <class F, class... Ts>
void multi_tensor_apply(const Cuda& exec, const TensorList<Ts...>& list, F&& f) {
  using Fn = std::remove_cvref_t<F>;
  using SmallMeta = detail::MtaMeta<detail::MtaLimitsSmall, sizeof...(Ts)>;
  static_assert(std::is_trivially_copyable_v<Fn>,
                "exec::multi_tensor_apply(Cuda): "
                "the functor is a kernel argument and must be trivially copyable");
  static_assert(detail::round_up(sizeof(SmallMeta), alignof(Fn)) + sizeof(Fn) <=
                    detail::MtaLimitsSmall::kParamBytes,
                "exec::multi_tensor_apply(Cuda): "
                "the functor does not fit in the 4 KB kernel argument next to the tensor tables: "
                "keep per-tensor data in device memory");
  if (list.total_numel() == 0) return;
  const cudaStream_t stream = exec.stream().get();
#if CUDART_VERSION >= 12010
  using LargeMeta = detail::MtaMeta<detail::MtaLimitsLarge, sizeof...(Ts)>;
  if constexpr (detail::mta_archs_take_large_params() &&
                detail::round_up(sizeof(LargeMeta), alignof(Fn)) + sizeof(Fn) <=
                    detail::MtaLimitsLarge::kParamBytes) {
    if (detail::driver_version() >= 12010 &&
        detail::compute_capability_major(detail::current_device()) >= 7) {
      detail::mta_launch_all<detail::MtaLimitsLarge>(list, Fn(f), stream);
      return;
    }
  }
#endif
  detail::mta_launch_all<detail::MtaLimitsSmall>(list, Fn(f), stream);
}

}  // namespace TRAINKIT_DETAIL_EXEC_ARCH_NS
#else
/// Without a CUDA compiler there is no kernel to launch: this overload only explains that.
template <CudaExecutor E, class F, class... Ts>
void multi_tensor_apply(const E&, const TensorList<Ts...>&, F&&) {
  static_assert(detail::dependent_false<E, F>,
                "exec::multi_tensor_apply with an exec::Cuda executor defines a CUDA kernel: "
                "compile this TU with nvcc (a .cu file), or pass an exec::Host");
}
#endif

}  // namespace exec
TRAINKIT_NAMESPACE_END
