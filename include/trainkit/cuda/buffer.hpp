// SPDX-License-Identifier: MIT
// trainkit/cuda/buffer.hpp: owning, move-only memory for the CUDA runtime. DeviceBuffer<T> holds
// global memory (cudaMalloc, or stream-ordered cudaMallocAsync), PinnedBuffer<T> page-locked host
// memory (cudaMallocHost), the kind that makes host<->device copies truly asynchronous. Both hold
// trivially copyable elements and leave them uninitialised; failures name the bytes requested.
#pragma once

#include "trainkit/config.hpp"
#include "trainkit/error.hpp"

#if TRAINKIT_WITH_CUDA
#include <cuda_runtime_api.h>

#include <cstddef>
#include <limits>
#include <span>
#include <string>
#include <type_traits>
#include <utility>

#if defined(__linux__)
#include <unistd.h>
#endif

#include "trainkit/cuda/device.hpp"
#include "trainkit/cuda/stream.hpp"

TRAINKIT_NAMESPACE_BEGIN
namespace cuda {
namespace detail {

/// n * sizeof(T), or a trainkit::Error naming `what` when that overflows std::size_t.
template <class T>
std::size_t checked_bytes(std::size_t n, const char* what) {
  TRAINKIT_CHECK(n <= std::numeric_limits<std::size_t>::max() / sizeof(T), what, ": ", n,
                 " elements of ", sizeof(T), " bytes each overflow std::size_t");
  return n * sizeof(T);
}

/// "<what>: <api> of N bytes (n elements x s B)"; the start of every allocation error message.
inline std::string allocation_context(const char* what, const char* api, std::size_t n,
                                      std::size_t element_size) {
  return ::trainkit::detail::concat(what, ": ", api, " of ", n * element_size, " bytes (",
                                    format_bytes(n * element_size), "; ", n, " elements x ",
                                    element_size, " B) failed");
}

/// Throws for a failed device allocation, adding which device it was and how much memory it had
/// left, the two things needed to tell "too big" from "fragmented" from "someone else took it".
[[noreturn]] inline void throw_device_allocation(cudaError_t status, const char* what,
                                                 const char* api, std::size_t n,
                                                 std::size_t element_size, const char* expr,
                                                 const char* file, int line) {
  (void)cudaGetLastError();
  std::string context = allocation_context(what, api, n, element_size);
  int device = -1;
  std::size_t free_bytes = 0;
  std::size_t total_bytes = 0;
  if (cudaGetDevice(&device) == cudaSuccess &&
      cudaMemGetInfo(&free_bytes, &total_bytes) == cudaSuccess) {
    context += ::trainkit::detail::concat(" on device ", device, " with ", free_bytes, " bytes (",
                                          format_bytes(free_bytes), ") free of ",
                                          format_bytes(total_bytes));
  } else {
    (void)cudaGetLastError();
    context += ::trainkit::detail::concat(" (free device memory unknown: ", device_count(),
                                          " device(s) visible)");
  }
  throw_cuda(status, context, expr, file, line);
}

/// Throws for a failed pinned host allocation, with the host memory still available.
[[noreturn]] inline void throw_pinned_allocation(cudaError_t status, std::size_t n,
                                                 std::size_t element_size, const char* expr,
                                                 const char* file, int line) {
  std::string context = allocation_context("PinnedBuffer", "cudaMallocHost", n, element_size);
#if defined(__linux__)
  const long pages = ::sysconf(_SC_AVPHYS_PAGES);
  const long page_size = ::sysconf(_SC_PAGESIZE);
  if (pages > 0 && page_size > 0) {
    const std::size_t available =
        static_cast<std::size_t>(pages) * static_cast<std::size_t>(page_size);
    context += ::trainkit::detail::concat(" with ", available, " bytes (", format_bytes(available),
                                          ") of host memory available");
  }
#endif
  throw_cuda(status, context, expr, file, line);
}

/// Rejects copies that would run past the end of a buffer, before CUDA sees them.
inline void check_copy(const char* what, const void* host, std::size_t n, std::size_t size) {
  TRAINKIT_CHECK(n <= size, what, ": ", n, " elements requested but the buffer holds ", size);
  TRAINKIT_CHECK(n == 0 || host != nullptr, what, ": null host pointer for ", n, " elements");
}

}  // namespace detail

namespace detail {
/// What DeviceBuffer and PinnedBuffer share: the owned pointer, its element and byte counts, the
/// accessors, release() and the moves. The owning class frees the memory (its reset()) before it
/// moves into a buffer or is destroyed.
template <class T>
class OwnedElements {
 public:
  /// Pointer to the first element (nullptr when empty).
  T* data() noexcept { return data_; }
  const T* data() const noexcept { return data_; }
  /// Number of elements.
  std::size_t size() const noexcept { return size_; }
  /// Size in bytes, size() * sizeof(T).
  std::size_t bytes() const noexcept { return bytes_; }
  bool empty() const noexcept { return size_ == 0; }

  /// Gives up ownership and returns the pointer (the buffer's class says how to free it). The
  /// buffer is left empty.
  T* release() noexcept {
    size_ = 0;
    bytes_ = 0;
    return std::exchange(data_, nullptr);
  }

 protected:
  OwnedElements() noexcept = default;
  OwnedElements(std::size_t n, std::size_t bytes) noexcept : size_(n), bytes_(bytes) {}
  OwnedElements(OwnedElements&& other) noexcept
      : data_(std::exchange(other.data_, nullptr)),
        size_(std::exchange(other.size_, 0)),
        bytes_(std::exchange(other.bytes_, 0)) {}
  /// Takes other's memory; the caller has freed its own.
  OwnedElements& operator=(OwnedElements&& other) noexcept {
    data_ = std::exchange(other.data_, nullptr);
    size_ = std::exchange(other.size_, 0);
    bytes_ = std::exchange(other.bytes_, 0);
    return *this;
  }
  ~OwnedElements() = default;

  T* data_ = nullptr;
  std::size_t size_ = 0;
  std::size_t bytes_ = 0;
};
}  // namespace detail

/// Owning, move-only global memory for `size()` elements of T on the device that was current when
/// it was allocated. Contents start uninitialised (call zero()). Two allocation modes:
/// - `DeviceBuffer(n)`: cudaMalloc; the destructor calls cudaFree, which waits for the device.
/// - `DeviceBuffer(n, stream)`: cudaMallocAsync on `stream`, freed with cudaFreeAsync on the same
///   stream, so neither blocks the host; the stream must outlive the buffer.
/// An empty buffer (n == 0) allocates nothing and makes no CUDA call.
template <class T>
class DeviceBuffer : public detail::OwnedElements<T> {
  static_assert(std::is_trivially_copyable_v<T>,
                "DeviceBuffer<T> needs a trivially copyable T: elements move by memcpy/memset");
  using Base = detail::OwnedElements<T>;
  using Base::bytes_;
  using Base::data_;
  using Base::size_;

 public:
  using value_type = T;

  /// An empty buffer.
  DeviceBuffer() noexcept = default;

  /// Allocates `n` elements with cudaMalloc on the current device. Throws trainkit::Error when
  /// n * sizeof(T) overflows or the allocation fails (the message gives bytes requested and free).
  explicit DeviceBuffer(std::size_t n) : Base(n, detail::checked_bytes<T>(n, "DeviceBuffer")) {
    if (bytes_ == 0) return;
    void* data = nullptr;
    const cudaError_t status = cudaMalloc(&data, bytes_);
    if (status != cudaSuccess) {
      detail::throw_device_allocation(status, "DeviceBuffer", "cudaMalloc", n, sizeof(T),
                                      "cudaMalloc(&data, bytes)", __FILE__, __LINE__);
    }
    data_ = static_cast<T*>(data);
  }

  /// Allocates `n` elements stream-ordered (cudaMallocAsync): the memory may be used by work on
  /// `stream` right away, and by other streams once they are ordered after it (an Event).
  DeviceBuffer(std::size_t n, StreamRef stream)
      : Base(n, detail::checked_bytes<T>(n, "DeviceBuffer")),
        stream_(stream),
        stream_ordered_(true) {
    if (bytes_ == 0) return;
    void* data = nullptr;
    const cudaError_t status = cudaMallocAsync(&data, bytes_, stream.get());
    if (status != cudaSuccess) {
      detail::throw_device_allocation(status, "DeviceBuffer", "cudaMallocAsync", n, sizeof(T),
                                      "cudaMallocAsync(&data, bytes, stream)", __FILE__, __LINE__);
    }
    data_ = static_cast<T*>(data);
  }

  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
  DeviceBuffer(DeviceBuffer&& other) noexcept
      : Base(std::move(other)),
        stream_(std::exchange(other.stream_, StreamRef{})),
        stream_ordered_(std::exchange(other.stream_ordered_, false)) {}
  DeviceBuffer& operator=(DeviceBuffer&& other) noexcept {
    if (this != &other) {
      reset();
      Base::operator=(std::move(other));
      stream_ = std::exchange(other.stream_, StreamRef{});
      stream_ordered_ = std::exchange(other.stream_ordered_, false);
    }
    return *this;
  }
  ~DeviceBuffer() { reset(); }

  /// Frees the memory now (cudaFree, or cudaFreeAsync on the allocation stream) and leaves the
  /// buffer empty. Errors are logged, never thrown.
  void reset() noexcept {
    if (data_ != nullptr) {
      if (stream_ordered_) {
        TRAINKIT_CUDA_CHECK_NOTHROW(cudaFreeAsync(data_, stream_.get()));
      } else {
        TRAINKIT_CUDA_CHECK_NOTHROW(cudaFree(data_));
      }
    }
    data_ = nullptr;
    size_ = 0;
    bytes_ = 0;
  }

  // release() (OwnedElements): the caller frees the pointer with cudaFree, or cudaFreeAsync when
  // stream_ordered(). data() is a device pointer: never dereference it on the host.
  /// True when allocated with cudaMallocAsync; stream() is then the stream that frees it.
  bool stream_ordered() const noexcept { return stream_ordered_; }
  StreamRef stream() const noexcept { return stream_; }

  /// Sets every byte to 0, asynchronously on `stream`.
  void zero(StreamRef stream) {
    if (bytes_ == 0) return;
    TRAINKIT_CUDA_CHECK(cudaMemsetAsync(data_, 0, bytes_, stream.get()));
  }

  /// Copies `n` elements from host memory `src` into the first `n` elements, queued on `stream`.
  /// Fully asynchronous only when `src` is pinned (PinnedBuffer); from pageable memory CUDA stages
  /// the data first. Either way `src` must stay valid until `stream` reaches the copy.
  /// Throws trainkit::Error when n > size().
  void copy_from_host(const T* src, std::size_t n, StreamRef stream) {
    detail::check_copy("DeviceBuffer::copy_from_host", src, n, size_);
    if (n == 0) return;
    TRAINKIT_CUDA_CHECK(
        cudaMemcpyAsync(data_, src, n * sizeof(T), cudaMemcpyHostToDevice, stream.get()));
  }

  /// Copies the first `n` elements into host memory `dst`, queued on `stream`; `dst` holds the
  /// data only after the stream is synchronised (pinned `dst`) — pageable copies block the host.
  /// Throws trainkit::Error when n > size().
  void copy_to_host(T* dst, std::size_t n, StreamRef stream) const {
    detail::check_copy("DeviceBuffer::copy_to_host", dst, n, size_);
    if (n == 0) return;
    TRAINKIT_CUDA_CHECK(
        cudaMemcpyAsync(dst, data_, n * sizeof(T), cudaMemcpyDeviceToHost, stream.get()));
  }

  /// Copies `n` elements from device memory `src` (any device buffer) into the first `n`
  /// elements, queued on `stream`. Throws trainkit::Error when n > size().
  void copy_from_device(const T* src, std::size_t n, StreamRef stream) {
    TRAINKIT_CHECK(n <= size_, "DeviceBuffer::copy_from_device: ", n,
                   " elements requested but the buffer holds ", size_);
    if (n == 0) return;
    TRAINKIT_CUDA_CHECK(
        cudaMemcpyAsync(data_, src, n * sizeof(T), cudaMemcpyDeviceToDevice, stream.get()));
  }

 private:
  StreamRef stream_{};
  bool stream_ordered_ = false;
};

/// Owning, move-only page-locked host memory (cudaMallocHost) for `size()` elements of T: the
/// staging area for asynchronous host<->device copies. Contents start uninitialised. Allocation
/// needs a CUDA driver. Pinned memory is taken from the OS for good: keep such buffers few, large
/// and long-lived.
template <class T>
class PinnedBuffer : public detail::OwnedElements<T> {
  // The head and the allocating constructor have DeviceBuffer's shape: the using-declarations
  // bring OwnedElements' members into this template, and each allocation call is its own.
  static_assert(std::is_trivially_copyable_v<T>,
                "PinnedBuffer<T> needs a trivially copyable T: elements move by memcpy");
  using Base = detail::OwnedElements<T>;
  using Base::bytes_;
  using Base::data_;
  using Base::size_;

 public:
  using value_type = T;

  PinnedBuffer() noexcept = default;

  /// Allocates `n` elements. Throws trainkit::Error when n * sizeof(T) overflows or the
  /// allocation fails (no driver, or not enough lockable host memory).
  explicit PinnedBuffer(std::size_t n) : Base(n, detail::checked_bytes<T>(n, "PinnedBuffer")) {
    if (bytes_ == 0) return;
    void* data = nullptr;
    const cudaError_t status = cudaMallocHost(&data, bytes_);
    if (status != cudaSuccess) {
      detail::throw_pinned_allocation(status, n, sizeof(T), "cudaMallocHost(&data, bytes)",
                                      __FILE__, __LINE__);
    }
    data_ = static_cast<T*>(data);
  }

  PinnedBuffer(const PinnedBuffer&) = delete;
  PinnedBuffer& operator=(const PinnedBuffer&) = delete;
  PinnedBuffer(PinnedBuffer&& other) noexcept : Base(std::move(other)) {}
  PinnedBuffer& operator=(PinnedBuffer&& other) noexcept {
    if (this != &other) {
      reset();
      Base::operator=(std::move(other));
    }
    return *this;
  }
  ~PinnedBuffer() { reset(); }

  /// Frees the memory now (cudaFreeHost, which waits for the device) and leaves the buffer empty.
  void reset() noexcept {
    if (data_ != nullptr) TRAINKIT_CUDA_CHECK_NOTHROW(cudaFreeHost(data_));
    data_ = nullptr;
    size_ = 0;
    bytes_ = 0;
  }

  // release() (OwnedElements): the caller frees the pointer with cudaFreeHost.

  /// Element access on the host (unchecked, like std::vector).
  T& operator[](std::size_t i) noexcept { return data_[i]; }
  const T& operator[](std::size_t i) const noexcept { return data_[i]; }
  T* begin() noexcept { return data_; }
  T* end() noexcept { return data_ + size_; }
  const T* begin() const noexcept { return data_; }
  const T* end() const noexcept { return data_ + size_; }
  std::span<T> span() noexcept { return {data_, size_}; }
  std::span<const T> span() const noexcept { return {data_, size_}; }
};

}  // namespace cuda
TRAINKIT_NAMESPACE_END

#endif  // TRAINKIT_WITH_CUDA
