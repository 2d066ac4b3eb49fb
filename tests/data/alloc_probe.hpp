// SPDX-License-Identifier: MIT
// An allocation probe for the reader tests: while an alloc_probe::Limit is alive, every single
// operator-new request larger than its limit is refused with std::bad_alloc (and counted), and
// the largest request is recorded. The replacement operator new/delete live in alloc_probe.cpp
// of each test executable that includes this header. Lets a test prove that a reader never asks
// for more memory than its input can hold, without actually allocating gigabytes on failure.
#pragma once

#include <atomic>
#include <cstddef>
#include <limits>

namespace alloc_probe {

struct State {
  std::atomic<std::size_t> limit{std::numeric_limits<std::size_t>::max()};
  std::atomic<std::size_t> largest{0};
  std::atomic<std::size_t> refused{0};
  std::atomic<std::size_t> largest_refused{0};
};

/// The process-wide probe state (defined in alloc_probe.cpp).
State& state() noexcept;

/// Scoped limit: requests above `bytes` throw std::bad_alloc while this object lives.
class Limit {
 public:
  explicit Limit(std::size_t bytes) noexcept {
    state().largest = 0;
    state().refused = 0;
    state().largest_refused = 0;
    state().limit = bytes;
  }
  Limit(const Limit&) = delete;
  Limit& operator=(const Limit&) = delete;
  ~Limit() { state().limit = std::numeric_limits<std::size_t>::max(); }

  /// The largest request granted since construction.
  std::size_t largest() const noexcept { return state().largest; }
  /// How many requests were refused, and the largest of them.
  std::size_t refused() const noexcept { return state().refused; }
  std::size_t largest_refused() const noexcept { return state().largest_refused; }
};

}  // namespace alloc_probe
