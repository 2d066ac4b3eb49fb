// GPU monitor: without NVML it disables itself with exactly one info line; with a (fake) NVML
// function table the background sampler aggregates utilization, memory, temperature, power, SM
// clock and throttle reasons.
#include <doctest/doctest.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <limits>
#include <string>
#include <thread>

#include <trainkit/error.hpp>
#include <trainkit/monitor/gpu_monitor.hpp>

namespace mon = trainkit::monitor;
namespace nvml = trainkit::monitor::nvml;

namespace {
std::string read_all(std::FILE* f) {
  std::rewind(f);
  std::string out;
  char buffer[1024];
  std::size_t n = 0;
  while ((n = std::fread(buffer, 1, sizeof buffer, f)) > 0) out.append(buffer, n);
  return out;
}

// A fake NVML: one device whose readings alternate between two states per call.
int g_calls = 0;
bool g_shutdown = false;
nvml::Device g_device = reinterpret_cast<nvml::Device>(0x1234);
nvml::Return fake_init() { return 0; }
nvml::Return fake_shutdown() {
  g_shutdown = true;
  return 0;
}
const char* fake_error(nvml::Return) { return "fake error"; }
nvml::Return fake_by_index(unsigned int index, nvml::Device* d) {
  if (index != 0) return 2;  // NVML_ERROR_INVALID_ARGUMENT
  *d = g_device;
  return 0;
}
nvml::Return fake_util(nvml::Device d, nvml::Utilization* u) {
  if (d != g_device) return 999;  // no doctest asserts here: this runs on the sampler thread
  ++g_calls;
  u->gpu = g_calls % 2 == 1 ? 90 : 100;
  u->memory = 40;
  return 0;
}
nvml::Return fake_memory(nvml::Device, nvml::Memory* m) {
  m->total = 80ull << 30;
  m->used = (g_calls % 2 == 1 ? 10ull : 20ull) << 30;
  m->free = m->total - m->used;
  return 0;
}
nvml::Return fake_temperature(nvml::Device, int sensor, unsigned int* t) {
  if (sensor != nvml::kTemperatureGpu) return 999;
  *t = g_calls % 2 == 1 ? 60 : 70;
  return 0;
}
nvml::Return fake_power(nvml::Device, unsigned int* mw) {
  *mw = g_calls % 2 == 1 ? 400000 : 600000;
  return 0;
}
nvml::Return fake_clock(nvml::Device, int type, unsigned int* mhz) {
  if (type != nvml::kClockSm) return 999;
  *mhz = g_calls % 2 == 1 ? 1980 : 1500;
  return 0;
}
nvml::Return fake_throttle(nvml::Device, unsigned long long* r) {
  *r = g_calls % 2 == 1 ? mon::kThrottleGpuIdle
                        : (mon::kThrottleSwPowerCap | mon::kThrottleHwThermal);
  return 0;
}
nvml::Api fake_api() {
  nvml::Api api;
  api.init = fake_init;
  api.shutdown = fake_shutdown;
  api.error_string = fake_error;
  api.handle_by_index = fake_by_index;
  api.utilization = fake_util;
  api.memory = fake_memory;
  api.temperature = fake_temperature;
  api.power_usage = fake_power;
  api.clock_info = fake_clock;
  api.throttle_reasons = fake_throttle;
  return api;
}
}  // namespace

TEST_CASE("GPU monitor without NVML: disabled, one info line, empty statistics") {
  std::FILE* log = std::tmpfile();
  REQUIRE(log != nullptr);
  {
    mon::GpuMonitor gpu(
        {.interval_secs = 0.001, .library = "libtrainkit-no-such-nvml.so.1", .log = log});
    CHECK_FALSE(gpu.enabled());
    CHECK(gpu.disabled_reason().find("libtrainkit-no-such-nvml.so.1") != std::string::npos);
    gpu.sample_now();
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
    const auto stats = gpu.take_window();
    CHECK(stats.samples == 0);
    CHECK(stats.throttle_reasons == 0);
  }
  const std::string text = read_all(log);
  std::fclose(log);
  INFO(text);
  CHECK(text.rfind("[trainkit] info: GPU monitor disabled: NVML not available", 0) == 0);
  CHECK(std::count(text.begin(), text.end(), '\n') == 1);
}

TEST_CASE("GPU monitor: the default library loads or disables itself quietly") {
  // On a machine with the NVIDIA driver this samples the real device; elsewhere it is disabled.
  // Either way nothing throws and at most one line is printed.
  std::FILE* log = std::tmpfile();
  {
    mon::GpuMonitor gpu({.device = 0, .interval_secs = 0.01, .log = log});
    const auto stats = gpu.take_window();
    if (gpu.enabled()) {
      CHECK(stats.samples >= 1);
      CHECK(stats.memory_total > 0);
    } else {
      CHECK(stats.samples == 0);
    }
  }
  const std::string text = read_all(log);
  std::fclose(log);
  CHECK(std::count(text.begin(), text.end(), '\n') <= 1);
}

TEST_CASE("GPU monitor with a fake NVML: background sampling and window statistics") {
  g_calls = 0;
  g_shutdown = false;
  std::FILE* log = std::tmpfile();
  {
    mon::GpuMonitor gpu({.device = 0, .interval_secs = 3600.0, .log = log}, fake_api());
    REQUIRE(gpu.enabled());
    CHECK(gpu.device_label() == "0");
    gpu.sample_now();  // the constructor took sample 1; this is sample 2
    const auto s = gpu.take_window();
    CHECK(s.samples == 2);
    CHECK(s.util_gpu_mean == doctest::Approx(95.0));
    CHECK(s.util_memory_mean == doctest::Approx(40.0));
    CHECK(s.memory_used_max == (20ull << 30));
    CHECK(s.memory_total == (80ull << 30));
    CHECK(s.temperature_max == 70);
    CHECK(s.power_mean_w == doctest::Approx(500.0));
    CHECK(s.sm_clock_min == 1500);
    CHECK(s.sm_clock_mean == 1740);
    // GPU-idle is dropped; the other reasons are OR-ed over the window.
    CHECK(s.throttle_reasons == (mon::kThrottleSwPowerCap | mon::kThrottleHwThermal));
    CHECK(mon::throttle_reason_string(s.throttle_reasons) == "sw_power_cap+hw_thermal");
    CHECK(gpu.take_window().samples == 0);
  }
  CHECK(g_shutdown);
  CHECK(read_all(log).empty());
  std::fclose(log);

  // The thread samples on its own at the configured interval.
  g_calls = 0;
  {
    mon::GpuMonitor gpu({.device = 0, .interval_secs = 0.002, .log = nullptr}, fake_api());
    std::this_thread::sleep_for(std::chrono::milliseconds(60));
    CHECK(gpu.take_window().samples >= 3);
  }
  // A device NVML does not know disables the monitor with the reason.
  std::FILE* log2 = std::tmpfile();
  {
    mon::GpuMonitor gpu({.device = 7, .log = log2}, fake_api());
    CHECK_FALSE(gpu.enabled());
    CHECK(gpu.disabled_reason().find("no device 7") != std::string::npos);
  }
  CHECK(read_all(log2).find("fake error") != std::string::npos);
  std::fclose(log2);
  CHECK(mon::throttle_reason_string(0) == "none");
}

TEST_CASE(
    "GPU monitor: an infinite or huge interval samples on demand only; a bad one is refused") {
  // Intervals whose deadline overflows the clock once made the sampler spin on NVML calls.
  for (const double interval : {std::numeric_limits<double>::infinity(), 1e10, 1e300}) {
    CAPTURE(interval);
    g_calls = 0;
    mon::GpuMonitor gpu({.device = 0, .interval_secs = interval, .log = nullptr}, fake_api());
    REQUIRE(gpu.enabled());
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
    CHECK(gpu.take_window().samples == 1);  // the constructor's sample alone
    gpu.sample_now();
    CHECK(gpu.take_window().samples == 1);
  }
  for (const double interval : {0.0, -1.0, std::numeric_limits<double>::quiet_NaN()}) {
    CAPTURE(interval);
    CHECK_THROWS_WITH_AS(
        mon::GpuMonitor({.device = 0, .interval_secs = interval, .log = nullptr}, fake_api()),
        doctest::Contains("gpu_interval_secs"), trainkit::Error);
    CHECK_THROWS_WITH_AS(mon::GpuMonitor({.interval_secs = interval,
                                          .library = "libtrainkit-no-such-nvml.so.1",
                                          .log = nullptr}),
                         doctest::Contains("must be a positive number of seconds"),
                         trainkit::Error);
  }
}
