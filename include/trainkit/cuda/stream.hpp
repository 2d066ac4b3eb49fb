// SPDX-License-Identifier: MIT
// trainkit/cuda/stream.hpp: RAII CUDA streams. `Stream` owns a non-blocking stream (move-only);
// `StreamRef` is the trivially copyable view every API takes, last in its argument list.
// The legacy default stream (0) is never owned; `StreamRef{}` names it explicitly.
#pragma once

#include "trainkit/config.hpp"
#include "trainkit/error.hpp"

#if TRAINKIT_WITH_CUDA
#include <cuda_runtime_api.h>

#include <cstddef>
#include <utility>

TRAINKIT_NAMESPACE_BEGIN
namespace cuda {

namespace detail {
/// The verdict of cudaStreamQuery or cudaEventQuery: false while the work runs (the not-ready
/// status is cleared, so that no later check reports it), true once it finished; errors throw.
inline bool query_done(cudaError_t status) {
  if (status == cudaErrorNotReady) {
    (void)cudaGetLastError();
    return false;
  }
  TRAINKIT_CUDA_CHECK(status);
  return true;
}
}  // namespace detail

/// A non-owning view of a CUDA stream. Default-constructed it refers to the legacy default
/// stream; `StreamRef(nullptr)` and `StreamRef(0)` are deleted to make that choice explicit.
class StreamRef {
 public:
  constexpr StreamRef() noexcept = default;
  constexpr StreamRef(cudaStream_t stream) noexcept : stream_(stream) {}  // NOLINT: implicit view
  StreamRef(std::nullptr_t) = delete;
  StreamRef(int) = delete;

  constexpr cudaStream_t get() const noexcept { return stream_; }

  /// Blocks the calling host thread until all work queued on the stream has finished.
  void synchronize() const { TRAINKIT_CUDA_CHECK(cudaStreamSynchronize(stream_)); }

  /// True when all queued work has finished (never blocks).
  bool ready() const { return detail::query_done(cudaStreamQuery(stream_)); }

  /// Makes future work on this stream wait for `event` (no host sync).
  void wait(cudaEvent_t event) const {
    TRAINKIT_CUDA_CHECK(cudaStreamWaitEvent(stream_, event, 0));
  }

  friend constexpr bool operator==(StreamRef a, StreamRef b) noexcept {
    return a.stream_ == b.stream_;
  }

 private:
  cudaStream_t stream_ = nullptr;
};

/// An owning, move-only CUDA stream created with cudaStreamNonBlocking (it does not synchronise
/// with the legacy default stream). Destroying it does not wait: queued work still completes.
class Stream {
 public:
  /// Creates a stream on the current device. `priority` follows CUDA (lower = higher priority).
  explicit Stream(int priority = 0) {
    TRAINKIT_CUDA_CHECK(cudaStreamCreateWithPriority(&stream_, cudaStreamNonBlocking, priority));
  }
  Stream(const Stream&) = delete;
  Stream& operator=(const Stream&) = delete;
  Stream(Stream&& other) noexcept : stream_(std::exchange(other.stream_, nullptr)) {}
  Stream& operator=(Stream&& other) noexcept {
    if (this != &other) {
      reset();
      stream_ = std::exchange(other.stream_, nullptr);
    }
    return *this;
  }
  ~Stream() { reset(); }

  /// Adopts a stream created elsewhere; it is destroyed with this object.
  static Stream from_native_handle(cudaStream_t stream) {
    TRAINKIT_CHECK(stream != nullptr,
                   "Stream::from_native_handle: refusing to own the legacy default stream");
    return Stream(stream, Adopt{});
  }

  /// Gives up ownership without destroying the stream.
  cudaStream_t release() noexcept { return std::exchange(stream_, nullptr); }

  /// The native handle; null for a moved-from Stream (whose ref() then names the default stream).
  cudaStream_t get() const noexcept { return stream_; }
  StreamRef ref() const noexcept { return StreamRef(stream_); }
  operator StreamRef() const noexcept { return ref(); }  // NOLINT: owning → view is implicit
  void synchronize() const { ref().synchronize(); }
  bool ready() const { return ref().ready(); }

 private:
  struct Adopt {};
  Stream(cudaStream_t stream, Adopt) noexcept : stream_(stream) {}
  void reset() noexcept {
    if (stream_ != nullptr) TRAINKIT_CUDA_CHECK_NOTHROW(cudaStreamDestroy(stream_));
    stream_ = nullptr;
  }
  cudaStream_t stream_ = nullptr;
};

}  // namespace cuda
TRAINKIT_NAMESPACE_END

#endif  // TRAINKIT_WITH_CUDA
