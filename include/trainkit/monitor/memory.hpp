// SPDX-License-Identifier: MIT
// trainkit/monitor/memory.hpp: memory figures for the step summary — the process's resident set
// and its peak (VmRSS / VmHWM of Linux, what `top` and Slurm report) and, in the CUDA tier, the
// memory in use on the current device.
#pragma once

#include <fcntl.h>
#include <sys/resource.h>
#include <unistd.h>

#include <cstddef>
#include <cstdio>

#include "trainkit/config.hpp"

#if TRAINKIT_WITH_CUDA
#include <cuda_runtime_api.h>
#endif

TRAINKIT_NAMESPACE_BEGIN
namespace monitor {

/// Resident memory of this process in bytes; 0 where the OS does not say.
struct HostMemory {
  std::size_t rss = 0;       ///< VmRSS: resident now
  std::size_t peak_rss = 0;  ///< VmHWM: the high-water mark of the resident set since start
};

/// The resident set now (/proc/self/statm, resident pages) and its peak (getrusage ru_maxrss,
/// the kernel's VmHWM). Two cheap reads (a few µs), meant for summaries rather than every step.
TRAINKIT_INLINE HostMemory host_memory() noexcept;

/// Bytes in use on the current CUDA device (total - free from cudaMemGetInfo: this process's
/// allocations, its context and any other process on the device). 0 in the CPU tier or without a
/// usable device; never throws.
TRAINKIT_INLINE std::size_t device_memory_used() noexcept;

#if TRAINKIT_IMPL

TRAINKIT_INLINE HostMemory host_memory() noexcept {
  HostMemory m;
  rusage usage{};
  if (::getrusage(RUSAGE_SELF, &usage) == 0) {
    m.peak_rss = static_cast<std::size_t>(usage.ru_maxrss) * 1024;  // KiB on Linux
  }
  const int fd = ::open("/proc/self/statm", O_RDONLY | O_CLOEXEC);
  if (fd >= 0) {
    char text[128];
    const ssize_t n = ::read(fd, text, sizeof text - 1);
    ::close(fd);
    if (n > 0) {
      text[n] = '\0';
      unsigned long long size_pages = 0;
      unsigned long long resident_pages = 0;
      if (std::sscanf(text, "%llu %llu", &size_pages, &resident_pages) == 2) {
        m.rss = static_cast<std::size_t>(resident_pages) *
                static_cast<std::size_t>(::sysconf(_SC_PAGESIZE));
      }
    }
  }
  if (m.peak_rss < m.rss) m.peak_rss = m.rss;  // the two reads are not atomic together
  return m;
}

TRAINKIT_INLINE std::size_t device_memory_used() noexcept {
#if TRAINKIT_WITH_CUDA
  std::size_t free_bytes = 0;
  std::size_t total_bytes = 0;
  if (cudaMemGetInfo(&free_bytes, &total_bytes) != cudaSuccess) {
    (void)cudaGetLastError();
    return 0;
  }
  return total_bytes - free_bytes;
#else
  return 0;
#endif
}

#endif  // TRAINKIT_IMPL

}  // namespace monitor
TRAINKIT_NAMESPACE_END
