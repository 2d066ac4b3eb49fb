// SPDX-License-Identifier: MIT
// trainkit/cuda/event.hpp: RAII CUDA events, for cross-stream ordering without host syncs and for
// timing device work. Timing is opt-in: an event created without it is cheaper to record and wait.
#pragma once

#include "trainkit/config.hpp"
#include "trainkit/error.hpp"

#if TRAINKIT_WITH_CUDA
#include <cuda_runtime_api.h>

#include <utility>

#include "trainkit/cuda/stream.hpp"

TRAINKIT_NAMESPACE_BEGIN
namespace cuda {

/// A move-only CUDA event.
class Event {
 public:
  /// `timing = false` creates the event with cudaEventDisableTiming (the fast kind for ordering).
  explicit Event(bool timing = false) {
    TRAINKIT_CUDA_CHECK(
        cudaEventCreateWithFlags(&event_, timing ? cudaEventDefault : cudaEventDisableTiming));
  }
  // The move members have Stream's shape; each class keeps its own so that the one CUDA handle it
  // owns and the call that destroys it (reset()) stay in view.
  Event(const Event&) = delete;
  Event& operator=(const Event&) = delete;
  Event(Event&& other) noexcept : event_(std::exchange(other.event_, nullptr)) {}
  Event& operator=(Event&& other) noexcept {
    if (this != &other) {
      reset();
      event_ = std::exchange(other.event_, nullptr);
    }
    return *this;
  }
  ~Event() { reset(); }

  cudaEvent_t get() const noexcept { return event_; }

  /// Captures the work queued on `stream` so far.
  void record(StreamRef stream) { TRAINKIT_CUDA_CHECK(cudaEventRecord(event_, stream.get())); }

  /// Makes `stream` wait for this event on the device (no host sync).
  void wait_on(StreamRef stream) const { stream.wait(event_); }

  /// Blocks the host until the captured work has finished.
  void synchronize() const { TRAINKIT_CUDA_CHECK(cudaEventSynchronize(event_)); }

  /// True when the captured work has finished (never blocks).
  bool ready() const { return detail::query_done(cudaEventQuery(event_)); }

  /// Milliseconds between two recorded timing events (`start` first); both must have completed.
  static float elapsed_ms(const Event& start, const Event& stop) {
    float ms = 0.0f;
    TRAINKIT_CUDA_CHECK(cudaEventElapsedTime(&ms, start.event_, stop.event_));
    return ms;
  }

 private:
  void reset() noexcept {
    if (event_ != nullptr) TRAINKIT_CUDA_CHECK_NOTHROW(cudaEventDestroy(event_));
    event_ = nullptr;
  }
  cudaEvent_t event_ = nullptr;
};

}  // namespace cuda
TRAINKIT_NAMESPACE_END

#endif  // TRAINKIT_WITH_CUDA
