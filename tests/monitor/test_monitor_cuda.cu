// CUDA tier of the monitor: device spans timed with CUDA events without a host sync on the hot
// path, resolved lazily; device time shown in summaries and the Chrome trace; NVTX compiled in.
// Runs only where a GPU exists (cuda_main.cpp exits 77 = skipped otherwise).
#include <doctest/doctest.h>

#include <cstdint>
#include <string>

#include <trainkit/cuda/stream.hpp>
#include <trainkit/monitor/memory.hpp>
#include <trainkit/monitor/monitor.hpp>
#include <trainkit/monitor/timeline.hpp>

namespace mon = trainkit::monitor;
using mon::Phase;

namespace {
// Spins for about `cycles` SM clock cycles: device work whose length the host does not see.
__global__ void spin_kernel(long long cycles, int* sink) {
  const long long start = clock64();
  while (clock64() - start < cycles) {
  }
  if (threadIdx.x == 0 && sink != nullptr) *sink = 1;
}
}  // namespace

TEST_CASE("device spans measure GPU time without blocking the host") {
  trainkit::cuda::Stream stream;
  mon::Timeline tl({.trace_capacity = 64});
  // ~20 ms at <= 2 GHz: far longer than the microseconds a launch takes on the host.
  const long long cycles = 40'000'000;
  for (int step = 0; step < 3; ++step) {
    tl.begin_step(step);
    {
      auto s = tl.span(Phase::kForward, stream);
      spin_kernel<<<1, 32, 0, stream.get()>>>(cycles, nullptr);
      TRAINKIT_CUDA_CHECK(cudaGetLastError());
    }
    tl.end_step();
  }
  // The host finished its steps long before the GPU: no span is resolved yet.
  const auto early = tl.take_window();
  CHECK(early.steps == 3);
  CHECK(early.host_s[static_cast<int>(Phase::kForward)] < 0.02);
  CHECK(early.device_pending >= 1);
  tl.synchronize_device();
  const auto late = tl.take_window();
  constexpr int kForward = static_cast<int>(Phase::kForward);
  CHECK(late.device_spans[kForward] + early.device_spans[kForward] == 3);
  const double device_total = late.device_s[kForward] + early.device_s[kForward];
  CHECK(device_total > 3 * 0.005);  // each kernel spun for milliseconds
  CHECK(device_total < 3 * 0.5);
  const std::string trace = tl.chrome_trace_json();
  CHECK(trace.find("\"tid\":2") != std::string::npos);  // the device track
  CHECK(trace.find("\"name\":\"device\"") != std::string::npos);
}

TEST_CASE("monitor summary uses device time and reports device memory") {
  trainkit::cuda::Stream stream;
  int* sink = nullptr;
  TRAINKIT_CUDA_CHECK(cudaMalloc(&sink, 64 << 20));  // 64 MiB so "device used" is visibly > 0
  {
    mon::Monitor m({.log_every = 4,
                    .progress = mon::ProgressStyle::kOff,
                    .console = nullptr,
                    .tokens_per_step = 1000,
                    .flops_per_step = 1e9});
    CHECK(m.peak_flops() >= 0.0);
    for (int step = 0; step < 4; ++step) {
      m.begin_step(step);
      {
        auto s = m.span(Phase::kBackward, stream);
        spin_kernel<<<1, 32, 0, stream.get()>>>(4'000'000, sink);
      }
      // Reading the loss is where a real loop syncs; here the stream sync plays that role.
      stream.synchronize();
      m.end_step({.loss = 1.0});
    }
    REQUIRE(m.last_summary().has_value());
    const auto& s = *m.last_summary();
    CHECK(s.timeline.device_spans[static_cast<int>(Phase::kBackward)] >= 3);
    CHECK(s.timeline.fraction(Phase::kBackward) > 0.3);
    CHECK(s.device_memory_used > (64u << 20));
    CHECK(mon::device_memory_used() > 0);
  }
  TRAINKIT_CUDA_CHECK(cudaFree(sink));
}
