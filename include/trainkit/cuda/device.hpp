// SPDX-License-Identifier: MIT
// trainkit/cuda/device.hpp: device queries and selection (count, properties, versions, memory) and
// DeviceGuard, the RAII way to run code on another device. `device_count()` and `version_string()`
// exist in every tier so CPU-only code can ask "is there a GPU?" without an #if; everything else
// needs TRAINKIT_WITH_CUDA.
#pragma once

#include <string>

#include "trainkit/config.hpp"
#include "trainkit/error.hpp"

#if TRAINKIT_WITH_CUDA
#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdio>
#include <utility>
#endif

TRAINKIT_NAMESPACE_BEGIN
namespace cuda {

/// "MAJOR.MINOR" of a CUDA-style version number (1000 * major + 10 * minor), as returned by
/// runtime_version() / driver_version() / CUDART_VERSION: 13000 -> "13.0", 12040 -> "12.4".
inline std::string version_string(int cuda_version) {
  return std::to_string(cuda_version / 1000) + "." + std::to_string((cuda_version % 1000) / 10);
}

// ODR note: device_count() has two bodies, one per tier. That is sound only because
// TRAINKIT_WITH_CUDA is a per-program setting: the CMake/Meson target defines it (together with the
// cudart link) for every TU of a program, and config.hpp defaults it to TRAINKIT_CUDA_COMPILER, so
// mixing .cpp and .cu TUs in one program requires the build to set it explicitly. Never compile
// some TUs of one program with TRAINKIT_WITH_CUDA=0 and others with 1.
#if TRAINKIT_WITH_CUDA

namespace detail {
/// query(&value), or 0 when it fails (no driver, no device), the sticky CUDA error cleared.
inline int query_or_zero(cudaError_t (*query)(int*)) noexcept {
  int value = 0;
  if (query(&value) != cudaSuccess) {
    (void)cudaGetLastError();
    return 0;
  }
  return value;
}
}  // namespace detail

/// Number of CUDA devices this process can use. Returns 0, never throws, when there is no driver,
/// no device, or a driver too old for this runtime; the sticky CUDA error is cleared in that case.
inline int device_count() noexcept { return detail::query_or_zero(cudaGetDeviceCount); }

#else

/// Number of CUDA devices this process can use: always 0 in a build without the CUDA runtime.
inline int device_count() noexcept { return 0; }

#endif  // TRAINKIT_WITH_CUDA

#if TRAINKIT_WITH_CUDA

/// A snapshot of what `env_check`, launch heuristics and benchmarks need to know about one device.
/// Sizes are in bytes, clocks in kHz (peak values as reported by the driver).
struct DeviceProperties {
  int index = -1;                           ///< the CUDA device ordinal
  std::string name;                         ///< e.g. "NVIDIA H200"
  std::string pci_bus_id;                   ///< "domain:bus:device.function", e.g. "0000:19:00.0"
  std::size_t total_memory = 0;             ///< global memory
  int sm_count = 0;                         ///< streaming multiprocessors
  int major = 0;                            ///< compute capability major (9 on Hopper)
  int minor = 0;                            ///< compute capability minor
  int clock_khz = 0;                        ///< peak SM clock
  int memory_clock_khz = 0;                 ///< peak memory clock
  int memory_bus_width = 0;                 ///< global memory bus width in bits
  std::size_t l2_cache = 0;                 ///< L2 cache size
  std::size_t shared_memory_per_block = 0;  ///< default static + dynamic limit per block
  std::size_t shared_memory_per_block_optin = 0;  ///< limit after cudaFuncSetAttribute opt-in
  std::size_t shared_memory_per_sm = 0;           ///< per multiprocessor
  int max_threads_per_block = 0;
  int max_threads_per_sm = 0;
  int warp_size = 0;
  bool ecc = false;         ///< ECC enabled
  bool integrated = false;  ///< shares memory with the host (Jetson, Grace...)

  /// Compute capability as one number, 10 * major + minor (90 on H100/H200).
  int compute_capability() const noexcept { return 10 * major + minor; }

  /// Theoretical DRAM bandwidth in bytes/s: two transfers per memory clock (DDR/HBM) times the bus
  /// width. The roofline benchmarks compare against it; real kernels reach ~90 % at best.
  double peak_memory_bandwidth() const noexcept {
    return 2.0 * 1000.0 * static_cast<double>(memory_clock_khz) *
           (static_cast<double>(memory_bus_width) / 8.0);
  }
};

namespace detail {

/// Throws like TRAINKIT_CUDA_CHECK, with `context` (which function, which device) in front.
[[noreturn]] inline void throw_cuda(cudaError_t status, const std::string& context,
                                    const char* expr, const char* file, int line) {
  (void)cudaGetLastError();
  ::trainkit::detail::throw_error(context + ": " + ::trainkit::detail::cuda_message(status), expr,
                                  file, line, "CUDA", status);
}

inline int device_attribute(cudaDeviceAttr attribute, int device) {
  int value = 0;
  TRAINKIT_CUDA_CHECK(cudaDeviceGetAttribute(&value, attribute, device));
  return value;
}

/// "1.50 GiB": byte counts in error messages and reports, binary units, two decimals.
inline std::string format_bytes(std::size_t bytes) {
  static constexpr const char* kUnits[] = {"B", "KiB", "MiB", "GiB", "TiB", "PiB"};
  double value = static_cast<double>(bytes);
  int unit = 0;
  while (value >= 1024.0 && unit < 5) {
    value /= 1024.0;
    ++unit;
  }
  char text[32];
  if (unit == 0) {
    std::snprintf(text, sizeof text, "%zu B", bytes);
  } else {
    std::snprintf(text, sizeof text, "%.2f %s", value, kUnits[unit]);
  }
  return text;
}

}  // namespace detail

/// The device the calling host thread currently uses. Throws trainkit::Error without a driver.
inline int current_device() {
  int device = 0;
  TRAINKIT_CUDA_CHECK(cudaGetDevice(&device));
  return device;
}

/// Makes `device` current for the calling host thread (and initialises its primary context).
/// Throws trainkit::Error naming the CUDA error (e.g. cudaErrorInvalidDevice) and the device.
inline void set_device(int device) {
  const cudaError_t status = cudaSetDevice(device);
  if (status != cudaSuccess) {
    detail::throw_cuda(status,
                       ::trainkit::detail::concat("set_device(", device, ") with ", device_count(),
                                                  " device(s) visible"),
                       "cudaSetDevice(device)", __FILE__, __LINE__);
  }
}

/// Properties of `device` (see DeviceProperties). Throws trainkit::Error for an invalid ordinal.
inline DeviceProperties device_properties(int device) {
  cudaDeviceProp prop{};
  const cudaError_t status = cudaGetDeviceProperties(&prop, device);
  if (status != cudaSuccess) {
    detail::throw_cuda(status,
                       ::trainkit::detail::concat("device_properties(", device, ") with ",
                                                  device_count(), " device(s) visible"),
                       "cudaGetDeviceProperties(&prop, device)", __FILE__, __LINE__);
  }
  DeviceProperties out;
  out.index = device;
  out.name = prop.name;
  out.total_memory = prop.totalGlobalMem;
  out.sm_count = prop.multiProcessorCount;
  out.major = prop.major;
  out.minor = prop.minor;
  // CUDA 13 removed clockRate/memoryClockRate from cudaDeviceProp; attributes work on 11-13.
  out.clock_khz = detail::device_attribute(cudaDevAttrClockRate, device);
  out.memory_clock_khz = detail::device_attribute(cudaDevAttrMemoryClockRate, device);
  out.memory_bus_width = prop.memoryBusWidth;
  out.l2_cache = static_cast<std::size_t>(prop.l2CacheSize);
  out.shared_memory_per_block = prop.sharedMemPerBlock;
  out.shared_memory_per_block_optin = prop.sharedMemPerBlockOptin;
  out.shared_memory_per_sm = prop.sharedMemPerMultiprocessor;
  out.max_threads_per_block = prop.maxThreadsPerBlock;
  out.max_threads_per_sm = prop.maxThreadsPerMultiProcessor;
  out.warp_size = prop.warpSize;
  out.ecc = prop.ECCEnabled != 0;
  out.integrated = prop.integrated != 0;
  char bus_id[32] = {};
  TRAINKIT_CUDA_CHECK(cudaDeviceGetPCIBusId(bus_id, static_cast<int>(sizeof bus_id), device));
  out.pci_bus_id = bus_id;
  return out;
}

/// Free and total global memory of the current device in bytes, as {free, total}.
inline std::pair<std::size_t, std::size_t> memory_info() {
  std::size_t free_bytes = 0;
  std::size_t total_bytes = 0;
  TRAINKIT_CUDA_CHECK(cudaMemGetInfo(&free_bytes, &total_bytes));
  return {free_bytes, total_bytes};
}

/// Version of the CUDA runtime library this program loaded (1000 * major + 10 * minor). Needs no
/// driver or device.
inline int runtime_version() {
  int version = 0;
  TRAINKIT_CUDA_CHECK(cudaRuntimeGetVersion(&version));
  return version;
}

/// Latest CUDA version the installed driver supports (1000 * major + 10 * minor); 0 when no
/// driver is installed. Never throws.
inline int driver_version() noexcept { return detail::query_or_zero(cudaDriverGetVersion); }

/// Blocks the host until all work on the current device, in every stream, has finished. Prefer
/// StreamRef::synchronize() or Event::synchronize(): this one also waits for other libraries' work.
inline void synchronize_device() { TRAINKIT_CUDA_CHECK(cudaDeviceSynchronize()); }

/// Makes `device` current for the lifetime of the guard and restores the previously current device
/// on destruction (errors there are logged, never thrown). Not copyable, not movable: the device
/// switch belongs to one scope of one thread.
class DeviceGuard {
 public:
  /// Throws trainkit::Error if the current device cannot be read or `device` cannot be selected;
  /// the current device is then unchanged.
  explicit DeviceGuard(int device) : previous_(current_device()) {
    if (device != previous_) set_device(device);
  }
  DeviceGuard(const DeviceGuard&) = delete;
  DeviceGuard& operator=(const DeviceGuard&) = delete;
  ~DeviceGuard() {
    int now = -1;
    // cudaGetDevice only reads thread state; skip the cudaSetDevice when nothing changed.
    if (cudaGetDevice(&now) != cudaSuccess) (void)cudaGetLastError();
    if (now != previous_) TRAINKIT_CUDA_CHECK_NOTHROW(cudaSetDevice(previous_));
  }

  /// The device that will be made current again when the guard ends.
  int previous() const noexcept { return previous_; }

 private:
  int previous_;
};

#endif  // TRAINKIT_WITH_CUDA

}  // namespace cuda
TRAINKIT_NAMESPACE_END
