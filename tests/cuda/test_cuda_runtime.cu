// GPU tests of the CUDA runtime wrappers (label cuda; exit 77 without a device): device queries,
// DeviceGuard, DeviceBuffer/PinnedBuffer round trips through kernels, stream-ordered allocation,
// event timing against a known spin time, and cross-stream ordering through an Event.
#include <doctest/doctest.h>

#include <algorithm>
#include <cstddef>
#include <numeric>
#include <string>
#include <utility>
#include <vector>

#include <trainkit/cuda/buffer.hpp>
#include <trainkit/cuda/device.hpp>
#include <trainkit/cuda/event.hpp>
#include <trainkit/cuda/stream.hpp>
#include <trainkit/error.hpp>

namespace cuda = trainkit::cuda;

namespace {

__global__ static void add_index(int* data, std::size_t n) {
  const std::size_t i = blockIdx.x * static_cast<std::size_t>(blockDim.x) + threadIdx.x;
  if (i < n) data[i] += static_cast<int>(i);
}

// Busy-waits `cycles` SM clock cycles, then stores `value`: a kernel of known minimum duration.
__global__ static void spin_then_store(long long cycles, int* out, int value) {
  const long long start = clock64();
  while (clock64() - start < cycles) {
  }
  *out = value;
}

bool contains(const std::string& text, const std::string& part) {
  return text.find(part) != std::string::npos;
}

}  // namespace

TEST_CASE("device properties are sane for the sm_90 GPUs these tests are built for") {
  const int count = cuda::device_count();
  REQUIRE(count > 0);
  for (int d = 0; d < count; ++d) {
    const cuda::DeviceProperties p = cuda::device_properties(d);
    INFO("device ", d, ": ", p.name);
    CHECK(p.index == d);
    CHECK_FALSE(p.name.empty());
    CHECK(p.sm_count > 0);
    CHECK(p.major >= 9);  // the binary holds sm_90 code only, so it cannot run on older GPUs
    CHECK(p.compute_capability() == 10 * p.major + p.minor);
    CHECK(p.total_memory > (std::size_t{1} << 30));
    CHECK(p.clock_khz > 100'000);  // > 100 MHz
    CHECK(p.memory_clock_khz > 100'000);
    CHECK(p.memory_bus_width >= 64);
    CHECK(p.peak_memory_bandwidth() > 1e11);
    CHECK(p.l2_cache > 0);
    CHECK(p.shared_memory_per_block == 48 * 1024);
    CHECK(p.shared_memory_per_block_optin > p.shared_memory_per_block);
    CHECK(p.max_threads_per_sm >= 1024);
    CHECK(p.max_threads_per_block == 1024);
    CHECK(p.warp_size == 32);
    CHECK(p.pci_bus_id.size() >= 12);  // "0000:19:00.0"
    CHECK(p.pci_bus_id[4] == ':');
  }
  // Minor-version compatibility lets a 13.x runtime run on any 13.y driver, never across majors.
  CHECK(cuda::driver_version() / 1000 >= cuda::runtime_version() / 1000);
}

TEST_CASE("DeviceGuard switches and restores the current device") {
  const int count = cuda::device_count();
  cuda::set_device(0);
  CHECK(cuda::current_device() == 0);
  {
    cuda::DeviceGuard guard(count - 1);
    CHECK(guard.previous() == 0);
    CHECK(cuda::current_device() == count - 1);
  }
  CHECK(cuda::current_device() == 0);
  CHECK_THROWS_WITH_AS(cuda::DeviceGuard{count}, doctest::Contains("cudaErrorInvalidDevice"),
                       trainkit::Error);
  CHECK(cuda::current_device() == 0);
  CHECK(cudaGetLastError() == cudaSuccess);
}

TEST_CASE("memory_info tracks allocations; a too-large allocation names bytes and free memory") {
  cuda::set_device(0);
  const auto [free0, total] = cuda::memory_info();
  CHECK(free0 <= total);
  CHECK(total <= cuda::device_properties(0).total_memory);
  constexpr std::size_t kGiB = std::size_t{1} << 30;
  {
    cuda::DeviceBuffer<char> buffer(kGiB);
    const auto [free1, total1] = cuda::memory_info();
    CHECK(total1 == total);
    CHECK(free1 + kGiB <= free0);
  }
  const std::size_t too_many = 2 * total;
  try {
    cuda::DeviceBuffer<char> buffer(too_many);
    FAIL("no exception");
  } catch (const trainkit::Error& e) {
    const std::string what = e.what();
    INFO(what);
    CHECK(contains(what, "DeviceBuffer: cudaMalloc of " + std::to_string(too_many) + " bytes"));
    CHECK(contains(what, "on device 0 with "));
    CHECK(contains(what, " free of "));
    CHECK(contains(what, "cudaErrorMemoryAllocation"));
    CHECK(e.code() == static_cast<long long>(cudaErrorMemoryAllocation));
  }
  CHECK(cudaGetLastError() == cudaSuccess);
  cuda::DeviceBuffer<float> after(16);  // the failure did not poison the context
  float* raw = after.release();
  CHECK(after.empty());
  CHECK(cudaFree(raw) == cudaSuccess);
}

TEST_CASE("pinned -> device -> kernel -> pinned round trip; zero() clears") {
  constexpr std::size_t kN = 100'003;  // not a multiple of the block size
  cuda::Stream stream;
  cuda::PinnedBuffer<int> host(kN);
  cuda::PinnedBuffer<int> back(kN);
  CHECK(host.size() == kN);
  CHECK(host.bytes() == kN * sizeof(int));
  std::iota(host.begin(), host.end(), -50'000);
  cuda::DeviceBuffer<int> device(kN);
  CHECK_FALSE(device.stream_ordered());
  device.copy_from_host(host.data(), kN, stream);
  add_index<<<(kN + 255) / 256, 256, 0, stream.get()>>>(device.data(), kN);
  TRAINKIT_CUDA_CHECK(cudaGetLastError());
  device.copy_to_host(back.data(), kN, stream);
  stream.synchronize();
  std::size_t wrong = 0;
  for (std::size_t i = 0; i < kN; ++i) wrong += back[i] != host[i] + static_cast<int>(i);
  CHECK(wrong == 0);

  device.zero(stream);
  device.copy_to_host(back.data(), kN, stream);
  stream.synchronize();
  wrong = 0;
  for (int v : back.span()) wrong += v != 0;
  CHECK(wrong == 0);

  // Moving keeps the allocation: the moved-to buffer still holds the (zeroed) data.
  cuda::DeviceBuffer<int> moved = std::move(device);
  CHECK(device.empty());  // NOLINT(bugprone-use-after-move)
  CHECK(moved.size() == kN);
}

TEST_CASE("stream-ordered buffers, device-to-device and pageable copies") {
  constexpr std::size_t kN = 4099;
  cuda::Stream stream;
  std::vector<double> source(kN);
  for (std::size_t i = 0; i < kN; ++i) source[i] = 0.5 * static_cast<double>(i) - 7.0;
  std::vector<double> result(kN, -1.0);
  {
    cuda::DeviceBuffer<double> a(kN, stream);
    cuda::DeviceBuffer<double> b(kN, stream);
    CHECK(a.stream_ordered());
    CHECK(a.stream() == stream.ref());
    a.copy_from_host(source.data(), kN, stream);
    b.zero(stream);
    b.copy_from_device(a.data(), kN - 1, stream);  // the last element stays 0
    b.copy_to_host(result.data(), kN, stream);
    stream.synchronize();
  }  // freed with cudaFreeAsync on `stream`
  stream.synchronize();
  CHECK(std::equal(source.begin(), source.end() - 1, result.begin()));
  CHECK(result.back() == 0.0);
  cuda::synchronize_device();
}

TEST_CASE("events time a kernel of known length and order work across streams") {
  const cuda::DeviceProperties p = cuda::device_properties(cuda::current_device());
  // 20 ms at the peak SM clock; any lower actual clock only makes the kernel longer.
  const long long cycles = 20LL * p.clock_khz;
  cuda::Stream producer;
  cuda::Stream consumer;
  cuda::DeviceBuffer<int> flag(1);
  cuda::PinnedBuffer<int> seen(1);
  seen[0] = -1;
  flag.zero(producer);
  producer.synchronize();

  cuda::Event start(true);
  cuda::Event stop(true);
  cuda::Event done;  // ordering only: timing disabled
  start.record(producer);
  spin_then_store<<<1, 1, 0, producer.get()>>>(cycles, flag.data(), 42);
  TRAINKIT_CUDA_CHECK(cudaGetLastError());
  stop.record(producer);
  done.record(producer);
  CHECK_FALSE(producer.ready());  // 20 ms of work was just queued
  CHECK_FALSE(done.ready());
  done.wait_on(consumer);
  // Without the wait the copy would run at once on the idle consumer stream and read 0.
  flag.copy_to_host(seen.data(), 1, consumer);
  consumer.synchronize();
  CHECK(seen[0] == 42);
  stop.synchronize();
  CHECK(stop.ready());
  CHECK(producer.ready());
  const float ms = cuda::Event::elapsed_ms(start, stop);
  CHECK(ms >= 18.0f);
  CHECK(ms < 2000.0f);
  // An ordering-only event cannot be timed: that is a CUDA error, reported as trainkit::Error.
  CHECK_THROWS_WITH_AS(cuda::Event::elapsed_ms(start, done),
                       doctest::Contains("cudaErrorInvalidResourceHandle"), trainkit::Error);
}
