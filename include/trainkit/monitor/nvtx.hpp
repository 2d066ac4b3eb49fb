// SPDX-License-Identifier: MIT
// trainkit/monitor/nvtx.hpp: NVTX ranges, so Nsight Systems shows trainkit's step phases on its
// timeline. Uses the header-only NVTX v3 shipped with the CUDA toolkit (no library to link: it
// loads the profiler's injection library only when a tool is attached). Without TRAINKIT_WITH_CUDA
// every function here is an empty inline that the compiler removes.
//
// Two kinds of range. nvtx_push/nvtx_pop (and NvtxRange) use the calling thread's NVTX stack:
// nvtx_pop always closes the range pushed last, so ranges must close in reverse order of opening,
// on the thread that opened them. Ranges whose lifetimes may interleave (A opens, B opens, A
// closes, B closes) or that close on another thread must use nvtx_range_start/nvtx_range_end (or
// NvtxSpan), which name the range they close by its id.
#pragma once

#include <cstdint>
#include <utility>

#include "trainkit/config.hpp"

#if TRAINKIT_WITH_CUDA
#include <nvtx3/nvToolsExt.h>
#endif

TRAINKIT_NAMESPACE_BEGIN
namespace monitor {

/// Opens a nested NVTX range named `name` on the calling thread (no-op in the CPU tier). Close it
/// with nvtx_pop() on the same thread, after every range opened later on it was closed.
inline void nvtx_push(const char* name) noexcept {
#if TRAINKIT_WITH_CUDA
  nvtxRangePushA(name);
#else
  (void)name;
#endif
}

/// Closes the innermost (most recently pushed) NVTX range of the calling thread (no-op in the CPU
/// tier). It closes that range whatever the caller meant to close: ranges that do not nest need
/// nvtx_range_start/nvtx_range_end.
inline void nvtx_pop() noexcept {
#if TRAINKIT_WITH_CUDA
  nvtxRangePop();
#endif
}

/// Opens an NVTX range named `name` that may overlap others and may be closed on any thread;
/// returns its id for nvtx_range_end (0 in the CPU tier, or when no tool is attached).
inline std::uint64_t nvtx_range_start(const char* name) noexcept {
#if TRAINKIT_WITH_CUDA
  return nvtxRangeStartA(name);
#else
  (void)name;
  return 0;
#endif
}

/// Closes the range nvtx_range_start returned `id` for (no-op in the CPU tier).
inline void nvtx_range_end(std::uint64_t id) noexcept {
#if TRAINKIT_WITH_CUDA
  nvtxRangeEnd(id);
#else
  (void)id;
#endif
}

/// Marks an instant on the Nsight timeline (no-op in the CPU tier).
inline void nvtx_mark(const char* name) noexcept {
#if TRAINKIT_WITH_CUDA
  nvtxMarkA(name);
#else
  (void)name;
#endif
}

/// RAII NVTX range on the thread's stack: `{ monitor::NvtxRange r("attention"); ... }`. `name`
/// must outlive the range. Not movable, so ranges of one scope nest; for ranges whose lifetimes
/// interleave use NvtxSpan.
class NvtxRange {
 public:
  explicit NvtxRange(const char* name) noexcept { nvtx_push(name); }
  NvtxRange(const NvtxRange&) = delete;
  NvtxRange& operator=(const NvtxRange&) = delete;
  ~NvtxRange() { nvtx_pop(); }
};

/// RAII NVTX range closed by id (nvtx_range_start/nvtx_range_end): movable, and spans may end in
/// any order and on any thread. `name` is copied by NVTX when the span starts.
class NvtxSpan {
 public:
  NvtxSpan() = default;  ///< no range
  explicit NvtxSpan(const char* name) noexcept : id_(nvtx_range_start(name)), open_(true) {}
  NvtxSpan(NvtxSpan&& other) noexcept : id_(other.id_), open_(std::exchange(other.open_, false)) {}
  NvtxSpan& operator=(NvtxSpan&& other) noexcept {
    if (this != &other) {
      end();
      id_ = other.id_;
      open_ = std::exchange(other.open_, false);
    }
    return *this;
  }
  ~NvtxSpan() { end(); }
  /// Closes the range now (idempotent).
  void end() noexcept {
    if (std::exchange(open_, false)) nvtx_range_end(id_);
  }
  bool open() const noexcept { return open_; }

 private:
  std::uint64_t id_ = 0;
  bool open_ = false;
};

}  // namespace monitor
TRAINKIT_NAMESPACE_END
