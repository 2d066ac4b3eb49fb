// SPDX-License-Identifier: MIT
// env_check: the first program to run after installing trainkit. It prints what trainkit was
// compiled with (tiers, compiler), what the machine has (CPU, memory, GPUs, driver) and the
// versions of the libraries it linked (CUDA runtime, cuBLASLt, NCCL, MPI, BLAS, OpenMP), and it
// runs a small copy round trip on every GPU. Exit status: 0 when everything found works (a
// machine without a GPU is fine: trainkit runs on the CPU), 1 when a device or library fails.
//
// Build: the `env_check` target of examples/CMakeLists.txt, or in the CPU tier simply
//   g++ -std=c++20 -Iinclude examples/env_check.cpp -o env_check

#include <cstdio>
#include <cstring>
#include <exception>
#include <fstream>
#include <initializer_list>
#include <string>
#include <string_view>
#include <thread>

#include <trainkit/config.hpp>
#include <trainkit/cuda/buffer.hpp>
#include <trainkit/cuda/device.hpp>
#include <trainkit/cuda/event.hpp>
#include <trainkit/cuda/stream.hpp>
#include <trainkit/error.hpp>
#include <trainkit/version.hpp>

#if defined(__linux__)
#include <unistd.h>
#endif
#if TRAINKIT_WITH_CUBLASLT
#include <cublasLt.h>
#endif
#if TRAINKIT_WITH_NCCL
#include <nccl.h>
#endif
#if TRAINKIT_WITH_MPI
#include <mpi.h>
#endif
#if TRAINKIT_WITH_CBLAS
#include <cblas.h>
#endif
#if TRAINKIT_WITH_OPENMP
#include <omp.h>
#endif

namespace {

// One aligned "label  value" line; every line of the report goes through here.
void row(const char* label, const std::string& value) {
  std::printf("  %-20s %s\n", label, value.c_str());
}

void section(const char* title) { std::printf("\n%s\n", title); }

std::string yes_no(bool value) { return value ? "yes" : "no"; }

std::string format_bytes(double bytes) {
  static constexpr const char* kUnits[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  int unit = 0;
  while (bytes >= 1024.0 && unit < 4) {
    bytes /= 1024.0;
    ++unit;
  }
  char text[32];
  std::snprintf(text, sizeof text, unit == 0 ? "%.0f %s" : "%.1f %s", bytes, kUnits[unit]);
  return text;
}

std::string trim(std::string text) {
  const char* space = " \t\r\n";
  const auto first = text.find_first_not_of(space);
  if (first == std::string::npos) return {};
  return text.substr(first, text.find_last_not_of(space) - first + 1);
}

std::string compiler() {
#if defined(__clang__)
  return std::string("clang ") + __clang_version__;
#elif defined(__GNUC__)
  return std::string("GCC ") + __VERSION__;
#elif defined(_MSC_VER)
  return "MSVC " + std::to_string(_MSC_VER);
#else
  return "unknown compiler";
#endif
}

std::string cxx_standard() {
  const long value = static_cast<long>(__cplusplus);
  const char* name = value > 202302L    ? "C++26 (draft)"
                     : value >= 202302L ? "C++23"
                     : value > 202002L  ? "C++23 (draft)"
                     : value >= 202002L ? "C++20"
                                        : "pre-C++20";
  return std::string(name) + " (__cplusplus = " + std::to_string(value) + "L)";
}

// The first "key : value" line of a /proc file whose key is one of `keys`; "" when unreadable.
std::string proc_field(const char* path, std::initializer_list<const char*> keys) {
  std::ifstream file(path);
  std::string line;
  while (std::getline(file, line)) {
    const auto colon = line.find(':');
    if (colon == std::string::npos) continue;
    const std::string key = trim(line.substr(0, colon));
    for (const char* wanted : keys) {
      if (key == wanted) return trim(line.substr(colon + 1));
    }
  }
  return {};
}

void report_build() {
  const trainkit::Capabilities caps = trainkit::capabilities();
  section("trainkit");
  row("version", trainkit::version().string);
  std::string tiers = caps.cuda ? "CPU" : "CPU only (tier 0)";
  if (caps.cuda) tiers += ", CUDA runtime";
  if (caps.cuda_compiler) tiers += ", CUDA kernels";
  if (caps.cublaslt) tiers += ", cuBLASLt";
  if (caps.nccl) tiers += ", NCCL";
  if (caps.mpi) tiers += ", MPI";
  if (caps.cblas) tiers += ", CBLAS";
  if (caps.openmp) tiers += ", OpenMP";
  row("compiled with", tiers);
  row("compiler", compiler());
  row("C++ standard", cxx_standard());
#if defined(NDEBUG)
  row("build", "optimised (NDEBUG), trainkit debug checks " + yes_no(TRAINKIT_DEBUG != 0));
#else
  row("build", "debug (assertions on), trainkit debug checks " + yes_no(TRAINKIT_DEBUG != 0));
#endif
}

void report_host() {
  section("host");
  std::string cpu = proc_field("/proc/cpuinfo", {"model name", "Model", "cpu model"});
  if (cpu.empty()) cpu = "unknown model";
  const unsigned threads = std::thread::hardware_concurrency();
  row("CPU", cpu + ", " +
                 (threads == 0 ? std::string("unknown number of") : std::to_string(threads)) +
                 " hardware threads");
  // /proc/meminfo reports kB; MemAvailable is what a new process can take without swapping.
  const std::string total = proc_field("/proc/meminfo", {"MemTotal"});
  const std::string available = proc_field("/proc/meminfo", {"MemAvailable"});
  if (!total.empty()) {
    std::string text = format_bytes(std::stod(total) * 1024.0) + " total";
    if (!available.empty())
      text += ", " + format_bytes(std::stod(available) * 1024.0) + " available";
    row("memory", text);
  } else {
#if defined(__linux__)
    const double page = static_cast<double>(sysconf(_SC_PAGESIZE));
    row("memory", format_bytes(page * static_cast<double>(sysconf(_SC_PHYS_PAGES))) + " total");
#else
    row("memory", "unknown");
#endif
  }
#if TRAINKIT_WITH_OPENMP
  row("OpenMP", "spec " + std::to_string(_OPENMP) + ", " + std::to_string(omp_get_max_threads()) +
                    " threads by default");
#endif
#if TRAINKIT_WITH_CBLAS
#if defined(OPENBLAS_VERSION)
  row("CBLAS",
      trim(openblas_get_config()) + ", " + std::to_string(openblas_get_num_threads()) + " threads");
#else
  row("CBLAS", "linked (not OpenBLAS: version unknown)");
#endif
#endif
}

#if TRAINKIT_WITH_CUDA
namespace cuda = trainkit::cuda;

std::string format(const char* fmt, double a, double b = 0.0, double c = 0.0) {
  char text[128];
  std::snprintf(text, sizeof text, fmt, a, b, c);
  return text;
}

// Copies 64 MiB up and back through pinned memory on a fresh stream, checks every value and times
// both directions: proves the driver, the device and the PCIe/NVLink-C2C path all work.
std::string copy_round_trip() {
  constexpr std::size_t kCount = std::size_t{16} << 20;  // 16 Mi ints = 64 MiB
  cuda::Stream stream;
  cuda::PinnedBuffer<int> host(kCount);
  cuda::PinnedBuffer<int> back(kCount);
  for (std::size_t i = 0; i < kCount; ++i) {
    host[i] = static_cast<int>(i * 2654435761u);
    back[i] = 0;
  }
  cuda::DeviceBuffer<int> device(kCount, stream);
  // One untimed pass so lazy context and pool setup do not count.
  device.copy_from_host(host.data(), kCount, stream);
  cuda::Event start(true);
  cuda::Event middle(true);
  cuda::Event stop(true);
  start.record(stream);
  device.copy_from_host(host.data(), kCount, stream);
  middle.record(stream);
  device.copy_to_host(back.data(), kCount, stream);
  stop.record(stream);
  stop.synchronize();
  if (std::memcmp(host.data(), back.data(), host.bytes()) != 0) {
    throw trainkit::Error("host -> device -> host copy returned different data", "env_check");
  }
  const double bytes = static_cast<double>(host.bytes());
  const double up = bytes / (cuda::Event::elapsed_ms(start, middle) * 1e-3) / 1e9;
  const double down = bytes / (cuda::Event::elapsed_ms(middle, stop) * 1e-3) / 1e9;
  return format("64 MiB round trip OK: host->device %.1f GB/s, device->host %.1f GB/s", up, down);
}

// Prints one GPU; returns false when querying or using it failed.
bool report_gpu(int index) {
  std::printf("\n");
  try {
    const cuda::DeviceProperties p = cuda::device_properties(index);
    const std::string title = "GPU " + std::to_string(index);
    row(title.c_str(), p.name);
    cuda::DeviceGuard guard(index);
    const auto [free_bytes, total_bytes] = cuda::memory_info();
    row("memory", format_bytes(static_cast<double>(total_bytes)) + " total, " +
                      format_bytes(static_cast<double>(free_bytes)) + " free" +
                      (p.integrated ? " (integrated: shared with the host)" : ""));
    row("compute capability", std::to_string(p.major) + "." + std::to_string(p.minor) + ", " +
                                  std::to_string(p.sm_count) + " SMs, " +
                                  std::to_string(p.max_threads_per_sm) + " threads/SM");
    row("clocks",
        format("SM %.0f MHz, memory %.0f MHz", p.clock_khz / 1000.0, p.memory_clock_khz / 1000.0));
    row("memory bus",
        format("%.0f-bit, peak %.2f TB/s", p.memory_bus_width, p.peak_memory_bandwidth() / 1e12));
    row("caches", format_bytes(static_cast<double>(p.l2_cache)) + " L2, " +
                      format_bytes(static_cast<double>(p.shared_memory_per_block_optin)) +
                      " shared memory per block (opt-in)");
    row("PCI bus", p.pci_bus_id + ", ECC " + (p.ecc ? "on" : "off"));
    if (p.major < 9) {
      row("note",
          "trainkit's tests and examples are compiled for sm_90; set "
          "CMAKE_CUDA_ARCHITECTURES for this GPU");
    }
    row("self-test", copy_round_trip());
    return true;
  } catch (const std::exception& e) {
    row("error", e.what());
    return false;
  }
}

bool report_cuda() {
  section("CUDA");
  bool ok = true;
  row("runtime", cuda::version_string(cuda::runtime_version()) + " (headers " +
                     cuda::version_string(CUDART_VERSION) + ")");
  const int driver = cuda::driver_version();
  row("driver", driver == 0 ? std::string("none (no NVIDIA driver found)")
                            : "supports CUDA " + cuda::version_string(driver));
  const int count = cuda::device_count();
  row("devices", std::to_string(count));
  if (count == 0) {
    int ignored = 0;
    const cudaError_t status = cudaGetDeviceCount(&ignored);
    (void)cudaGetLastError();
    if (status != cudaSuccess) {
      row("reason", std::string(cudaGetErrorName(status)) + ": " + cudaGetErrorString(status));
    }
    std::printf("  no CUDA device found: trainkit will run on the CPU\n");
  }
  for (int i = 0; i < count; ++i) ok = report_gpu(i) && ok;
  return ok;
}
#endif  // TRAINKIT_WITH_CUDA

bool report_libraries() {
  bool any = false;
  bool ok = true;
  auto header = [&] {
    if (!any) section("libraries");
    any = true;
  };
  (void)header;
  (void)ok;
#if TRAINKIT_WITH_CUBLASLT
  header();
  {
    // cublasLtGetVersion() is 10000 * major + 100 * minor + patch, like CUBLAS_VERSION.
    const std::size_t v = cublasLtGetVersion();
    row("cuBLASLt", std::to_string(v / 10000) + "." + std::to_string(v % 10000 / 100) + "." +
                        std::to_string(v % 100) + " (headers " + std::to_string(CUBLAS_VER_MAJOR) +
                        "." + std::to_string(CUBLAS_VER_MINOR) + ")");
  }
#endif
#if TRAINKIT_WITH_NCCL
  header();
  {
    int v = 0;
    if (ncclGetVersion(&v) == ncclSuccess) {
      // NCCL >= 2.9 encodes 10000 * major + 100 * minor + patch; older ones 1000 * major + ...
      const int major = v >= 10000 ? v / 10000 : v / 1000;
      const int minor = v >= 10000 ? v % 10000 / 100 : v % 1000 / 100;
      row("NCCL",
          std::to_string(major) + "." + std::to_string(minor) + "." + std::to_string(v % 100));
    } else {
      row("NCCL", "ncclGetVersion failed");
      ok = false;
    }
  }
#endif
#if TRAINKIT_WITH_MPI
  header();
  {
    // Both calls are allowed before MPI_Init, so env_check needs no mpirun.
    char text[MPI_MAX_LIBRARY_VERSION_STRING] = {};
    int length = 0;
    int major = 0;
    int minor = 0;
    if (MPI_Get_library_version(text, &length) == MPI_SUCCESS &&
        MPI_Get_version(&major, &minor) == MPI_SUCCESS) {
      std::string library(text, static_cast<std::size_t>(length > 0 ? length : 0));
      library = trim(library.substr(0, library.find('\n')));  // MPICH prints many lines
      row("MPI", library + " (MPI " + std::to_string(major) + "." + std::to_string(minor) + ")");
    } else {
      row("MPI", "MPI_Get_library_version failed");
      ok = false;
    }
  }
#endif
  return ok;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc > 1) {  // it takes no flags: say so rather than ignore what was asked
    const std::string_view arg = argv[1];
    if (argc == 2 && (arg == "--help" || arg == "-h")) {
      std::printf(
          "usage: env_check\nPrints what trainkit was built with, what this machine has "
          "and the libraries' versions, and runs a copy round trip on every GPU.\nExit "
          "status 0 when everything found works (a machine without a GPU is fine).\n");
      return 0;
    }
    std::fprintf(stderr, "env_check: error: unexpected argument '%s' (it takes none; see --help)\n",
                 trainkit::detail::printable_bytes(arg).c_str());
    return 2;
  }
  std::printf("trainkit environment check\n");
  bool ok = true;
  try {
    report_build();
    report_host();
#if TRAINKIT_WITH_CUDA
    ok = report_cuda() && ok;
#else
    section("CUDA");
    row("runtime", "not compiled in (CPU tier)");
    row("to enable", "link the trainkit::cuda (or trainkit::all) CMake target, or compile with");
    row("", "-DTRAINKIT_WITH_CUDA=1 -I<cuda>/include and link -lcudart");
    std::printf("  CUDA support not compiled in: trainkit will run on the CPU\n");
#endif
    ok = report_libraries() && ok;
  } catch (const std::exception& e) {
    std::printf("\nerror: %s\n", e.what());
    return 1;
  }
  std::printf("\n%s\n", ok ? "environment OK" : "environment has problems (see 'error' above)");
  return ok ? 0 : 1;
}
