// SPDX-License-Identifier: MIT
// trainkit/monitor/gpu_monitor.hpp: samples the rank's GPU through NVML on a background thread —
// utilization, memory, temperature, power, SM clock and clock-throttle reasons (the numbers
// nvidia-smi shows, and llm.c logs). NVML is loaded at run time with dlopen, so there is no build
// or link dependency; without the driver the monitor disables itself with one info line.
#pragma once

#include <dlfcn.h>

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <mutex>
#include <string>
#include <thread>
#include <utility>

#include "trainkit/config.hpp"
#include "trainkit/error.hpp"

#if TRAINKIT_WITH_CUDA
#include <cuda_runtime_api.h>
#endif

TRAINKIT_NAMESPACE_BEGIN
namespace monitor {

/// The slice of the NVML C API the monitor uses, declared here so no nvml.h is needed. The
/// layouts and values are NVML's (stable since CUDA 5; nvml.h of driver 450+).
namespace nvml {
using Return = int;  ///< nvmlReturn_t; 0 = NVML_SUCCESS
using Device = struct DeviceOpaque*;
struct Utilization {
  unsigned int gpu;     ///< % of time a kernel was running over the last sample period
  unsigned int memory;  ///< % of time device memory was read or written
};
struct Memory {
  unsigned long long total;
  unsigned long long free;
  unsigned long long used;
};
inline constexpr int kTemperatureGpu = 0;  ///< NVML_TEMPERATURE_GPU
inline constexpr int kClockSm = 1;         ///< NVML_CLOCK_SM

/// Function table; GpuMonitor loads it from libnvidia-ml, tests substitute fakes.
struct Api {
  Return (*init)() = nullptr;                                         ///< nvmlInit_v2
  Return (*shutdown)() = nullptr;                                     ///< nvmlShutdown
  const char* (*error_string)(Return) = nullptr;                      ///< nvmlErrorString
  Return (*handle_by_index)(unsigned int, Device*) = nullptr;         ///< ..._v2
  Return (*handle_by_pci_bus_id)(const char*, Device*) = nullptr;     ///< ..._v2
  Return (*utilization)(Device, Utilization*) = nullptr;              ///< GetUtilizationRates
  Return (*memory)(Device, Memory*) = nullptr;                        ///< GetMemoryInfo
  Return (*temperature)(Device, int, unsigned int*) = nullptr;        ///< GetTemperature
  Return (*power_usage)(Device, unsigned int*) = nullptr;             ///< GetPowerUsage (mW)
  Return (*clock_info)(Device, int, unsigned int*) = nullptr;         ///< GetClockInfo (MHz)
  Return (*throttle_reasons)(Device, unsigned long long*) = nullptr;  ///< ...ClocksThrottleReasons
};
}  // namespace nvml

/// Clock-throttle reason bits (nvmlClocksThrottleReason*; "clocks event reasons" in new drivers).
enum ThrottleReason : std::uint64_t {
  kThrottleGpuIdle = 0x1,
  kThrottleApplicationClocks = 0x2,
  kThrottleSwPowerCap = 0x4,
  kThrottleHwSlowdown = 0x8,
  kThrottleSyncBoost = 0x10,
  kThrottleSwThermal = 0x20,
  kThrottleHwThermal = 0x40,
  kThrottleHwPowerBrake = 0x80,
  kThrottleDisplayClocks = 0x100,
};

/// "none", or the set reasons joined by '+', e.g. "sw_power_cap+hw_thermal".
TRAINKIT_INLINE std::string throttle_reason_string(std::uint64_t reasons);

/// Statistics of the samples taken since the previous GpuMonitor::take_window().
struct GpuStats {
  int samples = 0;
  double util_gpu_mean = 0.0;          ///< %
  double util_memory_mean = 0.0;       ///< %
  std::uint64_t memory_used_max = 0;   ///< bytes
  std::uint64_t memory_total = 0;      ///< bytes
  unsigned int temperature_max = 0;    ///< degrees C
  double power_mean_w = 0.0;           ///< watts
  unsigned int sm_clock_min = 0;       ///< MHz
  unsigned int sm_clock_mean = 0;      ///< MHz
  std::uint64_t throttle_reasons = 0;  ///< OR of every sample's reasons, GPU-idle bit removed
};

/// Options of GpuMonitor.
struct GpuMonitorOptions {
  /// NVML device index; -1 = the current CUDA device (matched by PCI bus id, which stays right
  /// under CUDA_VISIBLE_DEVICES) in the CUDA tier, else LOCAL_RANK, else 0.
  int device = -1;
  /// Time between background samples; must be positive. Infinity (or anything from 1e9 s, ~30
  /// years) means no background sampling: only sample_now() and the first sample at start.
  double interval_secs = 1.0;
  const char* library = "libnvidia-ml.so.1";  ///< what dlopen loads
  std::FILE* log = stderr;                    ///< where the one "disabled" info line goes
};

/// Samples one GPU on a background thread until destroyed. When NVML or the device is missing,
/// enabled() is false, one info line says why, and every query returns empty statistics.
class GpuMonitor {
 public:
  /// Loads NVML with dlopen(options.library) and starts sampling. Never throws for a missing
  /// driver or device; throws trainkit::Error when interval_secs is not positive.
  TRAINKIT_INLINE explicit GpuMonitor(GpuMonitorOptions options = {});

  /// Uses a caller-provided function table (tests, or an NVML loaded some other way).
  GpuMonitor(GpuMonitorOptions options, const nvml::Api& api) : options_(checked(options)) {
    start(api);
  }

  GpuMonitor(const GpuMonitor&) = delete;
  GpuMonitor& operator=(const GpuMonitor&) = delete;

  TRAINKIT_INLINE ~GpuMonitor();

  /// True when NVML is loaded and the device was found.
  bool enabled() const noexcept { return enabled_; }
  /// Why the monitor is disabled (empty when enabled).
  const std::string& disabled_reason() const noexcept { return disabled_reason_; }
  /// The NVML device index or PCI bus id being sampled (empty when disabled).
  const std::string& device_label() const noexcept { return device_label_; }

  /// Takes one sample now on the calling thread and adds it to the window (also what the
  /// background thread does every interval_secs).
  TRAINKIT_INLINE void sample_now();

  /// Statistics since the previous call; `samples == 0` when disabled or nothing was sampled.
  TRAINKIT_INLINE GpuStats take_window();

 private:
  struct Sample {
    nvml::Utilization util{};
    nvml::Memory memory{};
    unsigned int temperature = 0;
    unsigned int power_mw = 0;
    unsigned int sm_clock = 0;
    unsigned long long throttle = 0;
  };

  template <class Fn>
  bool load(Fn& fn, const char* name) noexcept {
    void* symbol = ::dlsym(library_, name);
    fn = reinterpret_cast<Fn>(symbol);
    return symbol != nullptr;
  }

  TRAINKIT_INLINE static GpuMonitorOptions checked(GpuMonitorOptions options);

  TRAINKIT_INLINE void disable(std::string reason);

  std::string nvml_error(nvml::Return status) const {
    const char* text = api_.error_string != nullptr ? api_.error_string(status) : nullptr;
    return "NVML error " + std::to_string(status) +
           (text != nullptr ? std::string(": ") + text : "");
  }

  TRAINKIT_INLINE void start(const nvml::Api& api);

  TRAINKIT_INLINE bool find_device();

  TRAINKIT_INLINE Sample read_sample() const;

  TRAINKIT_INLINE void accumulate(const Sample& s);

  TRAINKIT_INLINE void run();

  GpuMonitorOptions options_;
  void* library_ = nullptr;
  nvml::Api api_{};
  nvml::Device device_ = nullptr;
  bool initialized_ = false;
  bool enabled_ = false;
  std::string disabled_reason_;
  std::string device_label_;
  std::thread thread_;
  std::mutex mutex_;
  std::condition_variable wake_;
  bool stop_ = false;
  GpuStats window_;
  double util_sum_ = 0.0;
  double util_mem_sum_ = 0.0;
  double power_sum_ = 0.0;
  double clock_sum_ = 0.0;
};

#if TRAINKIT_IMPL

TRAINKIT_INLINE std::string throttle_reason_string(std::uint64_t reasons) {
  constexpr std::pair<std::uint64_t, const char*> kNames[] = {
      {kThrottleGpuIdle, "gpu_idle"},
      {kThrottleApplicationClocks, "app_clocks"},
      {kThrottleSwPowerCap, "sw_power_cap"},
      {kThrottleHwSlowdown, "hw_slowdown"},
      {kThrottleSyncBoost, "sync_boost"},
      {kThrottleSwThermal, "sw_thermal"},
      {kThrottleHwThermal, "hw_thermal"},
      {kThrottleHwPowerBrake, "hw_power_brake"},
      {kThrottleDisplayClocks, "display_clocks"}};
  std::string out;
  for (const auto& [bit, name] : kNames) {
    if ((reasons & bit) == 0) continue;
    if (!out.empty()) out.push_back('+');
    out.append(name);
  }
  return out.empty() ? "none" : out;
}

TRAINKIT_INLINE GpuMonitorOptions GpuMonitor::checked(GpuMonitorOptions options) {
  // Zero, a negative or a NaN interval would make the sampler spin on NVML calls.
  TRAINKIT_CHECK(options.interval_secs > 0.0,
                 "monitor::GpuMonitor: the sampling interval (GpuMonitorOptions::interval_secs, "
                 "MonitorOptions::gpu_interval_secs) must be a positive number of seconds, got ",
                 options.interval_secs);
  return options;
}

TRAINKIT_INLINE GpuMonitor::GpuMonitor(GpuMonitorOptions options) : options_(checked(options)) {
  library_ = ::dlopen(options_.library, RTLD_NOW | RTLD_LOCAL);
  if (library_ == nullptr) {
    disable(std::string("NVML not available (") + options_.library +
            " could not be loaded: no NVIDIA driver?)");
    return;
  }
  nvml::Api api;
  const bool ok = load(api.init, "nvmlInit_v2") && load(api.shutdown, "nvmlShutdown") &&
                  load(api.error_string, "nvmlErrorString") &&
                  load(api.handle_by_index, "nvmlDeviceGetHandleByIndex_v2") &&
                  load(api.utilization, "nvmlDeviceGetUtilizationRates") &&
                  load(api.memory, "nvmlDeviceGetMemoryInfo") &&
                  load(api.temperature, "nvmlDeviceGetTemperature") &&
                  load(api.power_usage, "nvmlDeviceGetPowerUsage") &&
                  load(api.clock_info, "nvmlDeviceGetClockInfo") &&
                  load(api.throttle_reasons, "nvmlDeviceGetCurrentClocksThrottleReasons");
  (void)load(api.handle_by_pci_bus_id, "nvmlDeviceGetHandleByPciBusId_v2");  // optional
  if (!ok) {
    disable(std::string("NVML in ") + options_.library + " lacks a required function");
    return;
  }
  start(api);
}

TRAINKIT_INLINE GpuMonitor::~GpuMonitor() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stop_ = true;
  }
  wake_.notify_all();
  if (thread_.joinable()) thread_.join();
  if (initialized_ && api_.shutdown != nullptr) (void)api_.shutdown();
  if (library_ != nullptr) ::dlclose(library_);
}

TRAINKIT_INLINE void GpuMonitor::sample_now() {
  if (!enabled_) return;
  Sample s = read_sample();
  std::lock_guard<std::mutex> lock(mutex_);
  accumulate(s);
}

TRAINKIT_INLINE GpuStats GpuMonitor::take_window() {
  std::lock_guard<std::mutex> lock(mutex_);
  GpuStats out = window_;
  if (out.samples > 0) {
    out.util_gpu_mean = util_sum_ / out.samples;
    out.util_memory_mean = util_mem_sum_ / out.samples;
    out.power_mean_w = power_sum_ / out.samples;
    out.sm_clock_mean = static_cast<unsigned int>(clock_sum_ / out.samples);
  }
  window_ = GpuStats{};
  util_sum_ = util_mem_sum_ = power_sum_ = clock_sum_ = 0.0;
  return out;
}

TRAINKIT_INLINE void GpuMonitor::disable(std::string reason) {
  disabled_reason_ = std::move(reason);
  enabled_ = false;
  if (options_.log != nullptr) {
    std::fprintf(options_.log, "[trainkit] info: GPU monitor disabled: %s\n",
                 disabled_reason_.c_str());
    std::fflush(options_.log);
  }
}

TRAINKIT_INLINE void GpuMonitor::start(const nvml::Api& api) {
  api_ = api;
  if (api_.init == nullptr || api_.handle_by_index == nullptr || api_.utilization == nullptr ||
      api_.memory == nullptr || api_.temperature == nullptr || api_.power_usage == nullptr ||
      api_.clock_info == nullptr || api_.throttle_reasons == nullptr) {
    disable("the NVML function table is incomplete");
    return;
  }
  const nvml::Return init = api_.init();
  if (init != 0) {
    disable("nvmlInit failed (" + nvml_error(init) + ")");
    return;
  }
  initialized_ = true;
  if (!find_device()) return;
  enabled_ = true;
  Sample first = read_sample();
  accumulate(first);
  thread_ = std::thread([this] { run(); });
}

TRAINKIT_INLINE bool GpuMonitor::find_device() {
#if TRAINKIT_WITH_CUDA
  if (options_.device < 0 && api_.handle_by_pci_bus_id != nullptr) {
    int cuda_device = 0;
    char bus_id[32] = {};
    if (cudaGetDevice(&cuda_device) == cudaSuccess &&
        cudaDeviceGetPCIBusId(bus_id, static_cast<int>(sizeof bus_id), cuda_device) ==
            cudaSuccess) {
      const nvml::Return r = api_.handle_by_pci_bus_id(bus_id, &device_);
      if (r == 0) {
        device_label_ = bus_id;
        return true;
      }
    }
    (void)cudaGetLastError();
  }
#endif
  unsigned int index = 0;
  if (options_.device >= 0) {
    index = static_cast<unsigned int>(options_.device);
  } else if (const char* local_rank = std::getenv("LOCAL_RANK")) {
    index = static_cast<unsigned int>(std::max(0, std::atoi(local_rank)));
  }
  const nvml::Return r = api_.handle_by_index(index, &device_);
  if (r != 0) {
    disable("NVML has no device " + std::to_string(index) + " (" + nvml_error(r) + ")");
    return false;
  }
  device_label_ = std::to_string(index);
  return true;
}

TRAINKIT_INLINE GpuMonitor::Sample GpuMonitor::read_sample() const {
  // A query the device does not support leaves its field 0 instead of failing the sample.
  Sample s;
  (void)api_.utilization(device_, &s.util);
  (void)api_.memory(device_, &s.memory);
  (void)api_.temperature(device_, nvml::kTemperatureGpu, &s.temperature);
  (void)api_.power_usage(device_, &s.power_mw);
  (void)api_.clock_info(device_, nvml::kClockSm, &s.sm_clock);
  (void)api_.throttle_reasons(device_, &s.throttle);
  return s;
}

TRAINKIT_INLINE void GpuMonitor::accumulate(const Sample& s) {
  ++window_.samples;
  util_sum_ += s.util.gpu;
  util_mem_sum_ += s.util.memory;
  power_sum_ += 1e-3 * s.power_mw;
  clock_sum_ += s.sm_clock;
  window_.memory_used_max = std::max<std::uint64_t>(window_.memory_used_max, s.memory.used);
  window_.memory_total = s.memory.total;
  window_.temperature_max = std::max(window_.temperature_max, s.temperature);
  window_.sm_clock_min =
      window_.samples == 1 ? s.sm_clock : std::min(window_.sm_clock_min, s.sm_clock);
  // Idle is not a problem to report while training; it only means a sample fell between kernels.
  window_.throttle_reasons |= s.throttle & ~static_cast<std::uint64_t>(kThrottleGpuIdle);
}

TRAINKIT_INLINE void GpuMonitor::run() {
  std::unique_lock<std::mutex> lock(mutex_);
  // An interval near what the clock's int64 nanoseconds hold (~292 years), or infinity, would
  // make wait_for's deadline overflow into the past and the loop spin: wait for stop alone.
  if (!(options_.interval_secs < 1e9)) {
    wake_.wait(lock, [this] { return stop_; });
    return;
  }
  const auto interval = std::chrono::duration_cast<std::chrono::nanoseconds>(
      std::chrono::duration<double>(options_.interval_secs));
  while (!stop_) {
    if (wake_.wait_for(lock, interval, [this] { return stop_; })) break;
    lock.unlock();
    const Sample s = read_sample();  // NVML calls take ~100 µs; never hold the lock for them
    lock.lock();
    accumulate(s);
  }
}

#endif  // TRAINKIT_IMPL

}  // namespace monitor
TRAINKIT_NAMESPACE_END
