// SPDX-License-Identifier: MIT
// For libFuzzer targets: records the largest single heap allocation made while a
// fuzz_alloc::Scope is alive (through the sanitizer allocator's malloc hook), so a target can
// assert that a reader never allocates more than its input can hold. Without a sanitizer
// runtime that offers the hook, largest() stays 0 and the checks pass vacuously.
#pragma once

#include <atomic>
#include <cstddef>

#if __has_include(<sanitizer/allocator_interface.h>)
#include <sanitizer/allocator_interface.h>
#define TRAINKIT_FUZZ_MALLOC_HOOKS 1
#else
#define TRAINKIT_FUZZ_MALLOC_HOOKS 0
#endif

namespace fuzz_alloc {

inline std::atomic<bool> active{false};
inline std::atomic<std::size_t> largest_bytes{0};

inline void on_malloc(const volatile void*, std::size_t n) {
  if (!active.load(std::memory_order_relaxed)) return;
  std::size_t prev = largest_bytes.load(std::memory_order_relaxed);
  while (n > prev && !largest_bytes.compare_exchange_weak(prev, n)) {
  }
}
inline void on_free(const volatile void*) {}

/// Tracks allocations while alive.
class Scope {
 public:
  Scope() {
#if TRAINKIT_FUZZ_MALLOC_HOOKS
    static const bool installed = [] {
      __sanitizer_install_malloc_and_free_hooks(on_malloc, on_free);
      return true;
    }();
    (void)installed;
#endif
    largest_bytes = 0;
    active = true;
  }
  Scope(const Scope&) = delete;
  Scope& operator=(const Scope&) = delete;
  ~Scope() { active = false; }
  /// The largest single allocation so far in this scope.
  std::size_t largest() const { return largest_bytes.load(); }
};

}  // namespace fuzz_alloc
