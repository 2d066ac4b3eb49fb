// Host-side tests of the CUDA runtime wrappers, run on every machine (label cpu). With no GPU they
// check the "no device" paths: device_count() is 0 without throwing, and everything that needs a
// device throws trainkit::Error naming the CUDA error. On a GPU machine the same binary checks the
// out-of-range paths instead. In a tier-0 build only device_count() and version_string() exist.
#include <doctest/doctest.h>
#include <stdlib.h>

#include <cstddef>
#include <limits>
#include <string>
#include <type_traits>
#include <utility>

#include <trainkit/cuda/buffer.hpp>
#include <trainkit/cuda/device.hpp>
#include <trainkit/cuda/event.hpp>
#include <trainkit/cuda/stream.hpp>
#include <trainkit/error.hpp>

namespace cuda = trainkit::cuda;

TEST_CASE("version_string formats CUDA version numbers as MAJOR.MINOR") {
  CHECK(cuda::version_string(13000) == "13.0");
  CHECK(cuda::version_string(12040) == "12.4");
  CHECK(cuda::version_string(11080) == "11.8");
  CHECK(cuda::version_string(12090) == "12.9");
  CHECK(cuda::version_string(0) == "0.0");
}

TEST_CASE("device_count never throws and is never negative") {
  static_assert(noexcept(cuda::device_count()));
  int count = -1;
  CHECK_NOTHROW(count = cuda::device_count());
  CHECK(count >= 0);
#if !TRAINKIT_WITH_CUDA
  CHECK(count == 0);  // tier 0: there is no CUDA runtime to ask
#endif
}

#if TRAINKIT_WITH_CUDA

namespace {

bool contains(const std::string& text, const std::string& part) {
  return text.find(part) != std::string::npos;
}

// The runtime's "last error" after our wrappers ran. Without a driver it can never be cleared:
// every call re-reports cudaErrorInsufficientDriver, so that case is pinned down instead.
void check_no_pending_error() {
  if (trainkit::cuda::driver_version() == 0) {
    CHECK(cudaGetLastError() == cudaErrorInsufficientDriver);
  } else {
    CHECK(cudaGetLastError() == cudaSuccess);
  }
}

}  // namespace

TEST_CASE("device_count leaves no sticky CUDA error behind") {
  (void)cuda::device_count();
  check_no_pending_error();
}

TEST_CASE("runtime_version matches the headers' major version; driver_version never throws") {
  const int runtime = cuda::runtime_version();
  CHECK(runtime / 1000 == CUDART_VERSION / 1000);
  CHECK(cuda::version_string(runtime).rfind(std::to_string(CUDART_VERSION / 1000) + ".", 0) == 0);
  static_assert(noexcept(cuda::driver_version()));
  const int driver = cuda::driver_version();
  CHECK(driver >= 0);
  if (cuda::device_count() > 0) CHECK(driver >= 1000);
}

TEST_CASE("TRAINKIT_CUDA_CHECK: message format, library, code, sticky error cleared") {
  // The call text and file:line are added in debug builds or with TRAINKIT_VERBOSE_ERRORS=1.
  ::setenv("TRAINKIT_VERBOSE_ERRORS", "1", 1);
  try {
    TRAINKIT_CUDA_CHECK(cudaErrorInvalidValue);
    FAIL("no exception");
  } catch (const trainkit::Error& e) {
    const std::string what = e.what();
    CHECK(what.rfind("trainkit: CUDA error 1 cudaErrorInvalidValue: ", 0) == 0);
    CHECK(contains(what, cudaGetErrorString(cudaErrorInvalidValue)));
    CHECK(contains(what, "[cudaErrorInvalidValue]"));
    CHECK(contains(what, "test_cuda_runtime_host.cpp:"));
    CHECK(e.library() == "CUDA");
    CHECK(e.code() == static_cast<long long>(cudaErrorInvalidValue));
  }
  ::setenv("TRAINKIT_VERBOSE_ERRORS", "0", 1);
  try {
    TRAINKIT_CUDA_CHECK(cudaErrorInvalidValue);
    FAIL("no exception");
  } catch (const trainkit::Error& e) {
    const std::string what = e.what();
    CHECK(contains(what, "cudaErrorInvalidValue: "));
    CHECK_FALSE(contains(what, "test_cuda_runtime_host.cpp"));
  }
  ::unsetenv("TRAINKIT_VERBOSE_ERRORS");
  CHECK_NOTHROW(TRAINKIT_CUDA_CHECK(cudaSuccess));
  CHECK(TRAINKIT_CUDA_CHECK_NOTHROW(cudaSuccess));
  // Logs "error ignored in a destructor: CUDA error 1 ..." to stderr: expected in the test output.
  CHECK_FALSE(TRAINKIT_CUDA_CHECK_NOTHROW(cudaErrorInvalidValue));
}

TEST_CASE("set_device on a missing device throws trainkit::Error naming the CUDA error") {
  const int count = cuda::device_count();
  // On a GPU-less machine device 0 is missing; on a GPU machine `count` is one past the end.
  const int missing = count;
  ::setenv("TRAINKIT_VERBOSE_ERRORS", "1", 1);  // the failed call's text is a verbose-only part
  try {
    cuda::set_device(missing);
    FAIL("no exception");
  } catch (const trainkit::Error& e) {
    const std::string what = e.what();
    INFO(what);
    CHECK(contains(what, "set_device(" + std::to_string(missing) + ") with " +
                             std::to_string(count) + " device(s) visible"));
    CHECK(contains(what, "CUDA error "));
    CHECK(contains(what, "cudaError"));  // the error's name, e.g. cudaErrorNoDevice
    CHECK(contains(what, "[cudaSetDevice(device)]"));
    CHECK(e.library() == "CUDA");
    CHECK(e.code() != 0);
    CHECK(contains(what, cudaGetErrorName(static_cast<cudaError_t>(e.code()))));
  }
  ::unsetenv("TRAINKIT_VERBOSE_ERRORS");
  check_no_pending_error();
  CHECK_THROWS_AS(cuda::device_properties(missing), trainkit::Error);
  CHECK_THROWS_AS(cuda::DeviceGuard{missing}, trainkit::Error);
}

TEST_CASE("without a device, device queries and allocations throw trainkit::Error") {
  if (cuda::device_count() > 0) return;  // covered by test_cuda_cuda on GPU machines
  CHECK_THROWS_AS(cuda::memory_info(), trainkit::Error);
  CHECK_THROWS_AS(cuda::synchronize_device(), trainkit::Error);
  CHECK_THROWS_AS(cuda::Stream(), trainkit::Error);
  CHECK_THROWS_AS(cuda::Event(), trainkit::Error);
  try {
    cuda::DeviceBuffer<float> buffer(1000);
    FAIL("no exception");
  } catch (const trainkit::Error& e) {
    const std::string what = e.what();
    INFO(what);
    CHECK(contains(what, "DeviceBuffer: cudaMalloc of 4000 bytes"));
    CHECK(contains(what, "1000 elements x 4 B"));
    CHECK(contains(what, "free device memory unknown: 0 device(s) visible"));
    CHECK(contains(what, "cudaError"));
    CHECK(e.library() == "CUDA");
  }
  try {
    cuda::PinnedBuffer<double> buffer(3);
    FAIL("no exception");
  } catch (const trainkit::Error& e) {
    const std::string what = e.what();
    INFO(what);
    CHECK(contains(what, "PinnedBuffer: cudaMallocHost of 24 bytes"));
    CHECK(e.library() == "CUDA");
  }
  check_no_pending_error();
}

TEST_CASE("buffers are move-only with noexcept moves and destructors") {
  using D = cuda::DeviceBuffer<float>;
  using P = cuda::PinnedBuffer<int>;
  static_assert(!std::is_copy_constructible_v<D> && !std::is_copy_assignable_v<D>);
  static_assert(std::is_nothrow_move_constructible_v<D> && std::is_nothrow_move_assignable_v<D>);
  static_assert(std::is_nothrow_destructible_v<D>);
  static_assert(!std::is_copy_constructible_v<P> && !std::is_copy_assignable_v<P>);
  static_assert(std::is_nothrow_move_constructible_v<P> && std::is_nothrow_move_assignable_v<P>);
  static_assert(std::is_nothrow_destructible_v<P>);
  static_assert(!std::is_copy_constructible_v<cuda::DeviceGuard>);
  static_assert(!std::is_move_constructible_v<cuda::DeviceGuard>);
  // StreamRef(0) is deleted, so a literal 0 cannot silently pick the legacy stream.
  static_assert(!std::is_constructible_v<D, std::size_t, int>);
  static_assert(std::is_constructible_v<D, std::size_t, cuda::StreamRef>);
}

TEST_CASE("empty buffers make no CUDA call, so they work without a device") {
  cuda::DeviceBuffer<double> device(0);
  CHECK(device.empty());
  CHECK(device.size() == 0);
  CHECK(device.bytes() == 0);
  CHECK(device.data() == nullptr);
  CHECK_FALSE(device.stream_ordered());
  CHECK_NOTHROW(device.zero(cuda::StreamRef{}));
  CHECK_NOTHROW(device.copy_from_host(nullptr, 0, cuda::StreamRef{}));
  CHECK_NOTHROW(device.copy_to_host(nullptr, 0, cuda::StreamRef{}));

  cuda::DeviceBuffer<double> ordered(0, cuda::StreamRef{});
  CHECK(ordered.stream_ordered());
  CHECK(ordered.empty());
  device = std::move(ordered);
  CHECK(device.stream_ordered());
  CHECK_FALSE(ordered.stream_ordered());  // NOLINT(bugprone-use-after-move): moved-from is empty

  cuda::PinnedBuffer<int> pinned(0);
  CHECK(pinned.empty());
  CHECK(pinned.begin() == pinned.end());
  CHECK(pinned.span().empty());
  cuda::PinnedBuffer<int> moved(std::move(pinned));
  CHECK(moved.release() == nullptr);
}

TEST_CASE("buffer misuse is rejected before CUDA is called") {
  const std::size_t huge = std::numeric_limits<std::size_t>::max() / 4;
  try {
    cuda::DeviceBuffer<double> buffer(huge);
    FAIL("no exception");
  } catch (const trainkit::Error& e) {
    const std::string what = e.what();
    CHECK(contains(what, "DeviceBuffer: " + std::to_string(huge) +
                             " elements of 8 bytes each overflow std::size_t"));
    CHECK(e.library() == "trainkit");
  }
  const std::string pinned_overflow = "PinnedBuffer: " + std::to_string(huge) + " elements";
  CHECK_THROWS_WITH_AS(cuda::PinnedBuffer<double>{huge}, doctest::Contains(pinned_overflow.c_str()),
                       trainkit::Error);

  cuda::DeviceBuffer<int> empty;
  int host[4] = {1, 2, 3, 4};
  CHECK_THROWS_WITH_AS(
      empty.copy_from_host(host, 4, cuda::StreamRef{}),
      doctest::Contains(
          "trainkit: DeviceBuffer::copy_from_host: 4 elements requested but the buffer holds 0"),
      trainkit::Error);
  CHECK_THROWS_WITH_AS(empty.copy_to_host(host, 1, cuda::StreamRef{}),
                       doctest::Contains("copy_to_host: 1 elements requested"), trainkit::Error);
  CHECK_THROWS_WITH_AS(empty.copy_from_device(nullptr, 2, cuda::StreamRef{}),
                       doctest::Contains("copy_from_device: 2 elements requested"),
                       trainkit::Error);
}

#endif  // TRAINKIT_WITH_CUDA
