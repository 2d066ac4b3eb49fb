// SPDX-License-Identifier: MIT
// trainkit/monitor/nvtx.hpp: NVTX ranges, so Nsight Systems shows trainkit's step phases on its
// timeline. Uses the header-only NVTX v3 shipped with the CUDA toolkit (no library to link: it
// loads the profiler's injection library only when a tool is attached). Without TRAINKIT_WITH_CUDA
// every function here is an empty inline that the compiler removes.
#pragma once

#include "trainkit/config.hpp"

#if TRAINKIT_WITH_CUDA
#include <nvtx3/nvToolsExt.h>
#endif

TRAINKIT_NAMESPACE_BEGIN
namespace monitor {

/// Opens a nested NVTX range named `name` on the calling thread (no-op in the CPU tier).
inline void nvtx_push(const char* name) noexcept {
#if TRAINKIT_WITH_CUDA
  nvtxRangePushA(name);
#else
  (void)name;
#endif
}

/// Closes the innermost NVTX range of the calling thread (no-op in the CPU tier).
inline void nvtx_pop() noexcept {
#if TRAINKIT_WITH_CUDA
  nvtxRangePop();
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

/// RAII NVTX range: `{ monitor::NvtxRange r("attention"); ... }`. `name` must outlive the range.
class NvtxRange {
 public:
  explicit NvtxRange(const char* name) noexcept { nvtx_push(name); }
  NvtxRange(const NvtxRange&) = delete;
  NvtxRange& operator=(const NvtxRange&) = delete;
  ~NvtxRange() { nvtx_pop(); }
};

}  // namespace monitor
TRAINKIT_NAMESPACE_END
