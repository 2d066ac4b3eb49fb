// SPDX-License-Identifier: MIT
// trainkit/core/allocator.hpp: the three kinds of tensor memory — 64-byte aligned host memory
// (cache lines, AVX-512 loads), page-locked ("pinned") host memory for asynchronous copies, and
// device memory — behind one move-only owner, `Allocation`. Pinned memory degrades to aligned
// host memory when no CUDA device is usable, so CPU-only programs can ask for it unconditionally.
// A process-wide count of the live and peak bytes of each kind (relaxed atomics, two per
// allocation) tells what trainkit really allocated (`allocation_stats`).
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <new>
#include <utility>

#include "trainkit/config.hpp"
#include "trainkit/core/shape.hpp"
#include "trainkit/error.hpp"

#if TRAINKIT_WITH_CUDA
#include <cuda_runtime_api.h>
#endif

TRAINKIT_NAMESPACE_BEGIN

/// The alignment of every host allocation trainkit makes.
inline constexpr std::size_t kHostAlignment = 64;

enum class MemoryKind : std::uint8_t {
  kHost,    ///< pageable host memory, 64-byte aligned
  kPinned,  ///< page-locked host memory (cudaMallocHost); falls back to kHost without a device
  kDevice,  ///< device global memory (cudaMalloc) on the current device
};

inline constexpr const char* memory_kind_name(MemoryKind k) noexcept {
  switch (k) {
    case MemoryKind::kHost: return "host";
    case MemoryKind::kPinned: return "pinned";
    case MemoryKind::kDevice: return "device";
  }
  return "?";
}

/// The bytes of one MemoryKind that trainkit's Allocations hold now (live) and held at most
/// (peak) since the start of the process or the last reset_allocation_peak. Requested sizes, as
/// Allocation::bytes() reports them (host blocks are rounded up to 64 bytes on top).
struct AllocationStats {
  std::int64_t live = 0;
  std::int64_t peak = 0;
};

namespace detail {
struct AllocationCounter {
  std::atomic<std::int64_t> live{0};
  std::atomic<std::int64_t> peak{0};
};
inline AllocationCounter& allocation_counter(MemoryKind k) noexcept {
  static AllocationCounter counters[3];
  return counters[static_cast<int>(k)];
}
inline void count_allocation(MemoryKind k, std::int64_t bytes) noexcept {
  AllocationCounter& c = allocation_counter(k);
  const std::int64_t now = c.live.fetch_add(bytes, std::memory_order_relaxed) + bytes;
  std::int64_t peak = c.peak.load(std::memory_order_relaxed);
  while (now > peak && !c.peak.compare_exchange_weak(peak, now, std::memory_order_relaxed)) {
  }
}
}  // namespace detail

/// Live and peak bytes of `kind` held by trainkit's Allocations (tensors, arenas, layer
/// contexts and workspaces, loader slots); memory obtained otherwise (std::vector, CUDA
/// libraries' own workspaces) is not counted. A pinned request that fell back counts as kHost.
inline AllocationStats allocation_stats(MemoryKind kind) noexcept {
  const detail::AllocationCounter& c = detail::allocation_counter(kind);
  return {c.live.load(std::memory_order_relaxed), c.peak.load(std::memory_order_relaxed)};
}

/// Sets the peak of `kind` to its live bytes, so that allocation_stats(kind).peak measures from
/// here on (e.g. around one training step).
inline void reset_allocation_peak(MemoryKind kind) noexcept {
  detail::AllocationCounter& c = detail::allocation_counter(kind);
  c.peak.store(c.live.load(std::memory_order_relaxed), std::memory_order_relaxed);
}

/// One owned block of memory. Move-only; frees with the matching deallocator; never throws on
/// destruction. A zero-byte allocation holds a null pointer.
class Allocation {
 public:
  Allocation() noexcept = default;

  /// Allocates `bytes` of `kind` memory. Throws trainkit::Error naming the size and the kind on
  /// failure, and for kDevice when trainkit was built without CUDA.
  Allocation(std::size_t bytes, MemoryKind kind) : bytes_(bytes), kind_(kind) {
    if (bytes == 0) return;
    // Beyond any memory; also keeps the host rounding below and the byte counters from wrapping.
    TRAINKIT_CHECK(bytes <= (std::size_t{1} << 62), "cannot allocate ", bytes,
                   " bytes: more than any memory (2^62 bytes at most)");
    switch (kind) {
      case MemoryKind::kHost: ptr_ = allocate_host(bytes); break;
      case MemoryKind::kPinned:
#if TRAINKIT_WITH_CUDA
        if (cudaMallocHost(&ptr_, bytes) == cudaSuccess) break;
        (void)cudaGetLastError();  // no driver / no device: fall back to pageable memory
        ptr_ = nullptr;
#endif
        kind_ = MemoryKind::kHost;
        ptr_ = allocate_host(bytes);
        break;
      case MemoryKind::kDevice:
#if TRAINKIT_WITH_CUDA
      {
        const cudaError_t status = cudaMalloc(&ptr_, bytes);
        if (status != cudaSuccess) {
          (void)cudaGetLastError();
          ptr_ = nullptr;
          TRAINKIT_FAIL("cannot allocate ", bytes,
                        " bytes of device memory: ", detail::cuda_message(status));
        }
        break;
      }
#else
        TRAINKIT_FAIL_WITHOUT_CUDA("device memory requested (", bytes, " bytes)");
#endif
    }
    detail::count_allocation(kind_, static_cast<std::int64_t>(bytes_));
  }

  Allocation(const Allocation&) = delete;
  Allocation& operator=(const Allocation&) = delete;
  Allocation(Allocation&& other) noexcept
      : ptr_(std::exchange(other.ptr_, nullptr)),
        bytes_(std::exchange(other.bytes_, 0)),
        kind_(other.kind_) {}
  Allocation& operator=(Allocation&& other) noexcept {
    if (this != &other) {
      reset();
      ptr_ = std::exchange(other.ptr_, nullptr);
      bytes_ = std::exchange(other.bytes_, 0);
      kind_ = other.kind_;
    }
    return *this;
  }
  ~Allocation() { reset(); }

  void* get() const noexcept { return ptr_; }
  std::size_t bytes() const noexcept { return bytes_; }
  /// The kind actually obtained (kPinned requests may have become kHost).
  MemoryKind kind() const noexcept { return kind_; }
  Space space() const noexcept {
    return kind_ == MemoryKind::kDevice ? Space::kDevice : Space::kHost;
  }

  void reset() noexcept {
    if (ptr_ != nullptr) {
      detail::allocation_counter(kind_).live.fetch_sub(static_cast<std::int64_t>(bytes_),
                                                       std::memory_order_relaxed);
      switch (kind_) {
        case MemoryKind::kHost: ::operator delete(ptr_, std::align_val_t(kHostAlignment)); break;
        case MemoryKind::kPinned:
#if TRAINKIT_WITH_CUDA
          TRAINKIT_CUDA_CHECK_NOTHROW(cudaFreeHost(ptr_));
#endif
          break;
        case MemoryKind::kDevice:
#if TRAINKIT_WITH_CUDA
          TRAINKIT_CUDA_CHECK_NOTHROW(cudaFree(ptr_));
#endif
          break;
      }
    }
    ptr_ = nullptr;
    bytes_ = 0;
  }

 private:
  static void* allocate_host(std::size_t bytes) {
    // Round up so vector loops may read whole cache lines at the end of the block.
    const std::size_t rounded = (bytes + kHostAlignment - 1) / kHostAlignment * kHostAlignment;
    void* p = ::operator new(rounded, std::align_val_t(kHostAlignment), std::nothrow);
    TRAINKIT_CHECK(p != nullptr, "cannot allocate ", bytes, " bytes of host memory");
    return p;
  }

  void* ptr_ = nullptr;
  std::size_t bytes_ = 0;
  MemoryKind kind_ = MemoryKind::kHost;
};

TRAINKIT_NAMESPACE_END
