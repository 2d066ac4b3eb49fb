// SPDX-License-Identifier: MIT
// trainkit/monitor/throughput.hpp: the numbers that say how fast training is — model FLOPs per
// step (transformer formula from PaLM appendix B, as torchtitan uses), peak FLOP/s of the device
// (dense tensor-core peaks for H200/H100/A100, a configured or measured CPU peak) and MFU:
//   MFU = achieved model FLOP/s / peak FLOP/s = (flops_per_step / step_seconds) / peak.
// MFU figures computed with other formulas or peaks are not comparable, so logs name both.
#pragma once

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <string_view>
#include <thread>
#include <vector>

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#include <immintrin.h>
#endif

#include "trainkit/config.hpp"

TRAINKIT_NAMESPACE_BEGIN
namespace monitor {

/// The arithmetic a step's matrix multiplies run in; it selects the peak MFU is measured against.
enum class Precision : std::uint8_t { kFp32, kTf32, kBf16, kFp16 };

inline constexpr const char* precision_name(Precision p) noexcept {
  constexpr const char* kNames[] = {"fp32", "tf32", "bf16", "fp16"};
  return kNames[static_cast<int>(p)];
}

/// Dense (no sparsity) peak FLOP/s of one GPU, per precision.
struct DevicePeak {
  const char*
      pattern;        ///< substring of the CUDA device name, e.g. "H100" in "NVIDIA H100 80GB HBM3"
  const char* label;  ///< what logs print
  double fp32;        ///< FP32 on CUDA cores (non-tensor)
  double tf32;        ///< TF32 tensor cores
  double bf16;        ///< BF16 tensor cores (FP16 is the same on these parts)
};

/// Spec-sheet dense peaks (NVIDIA's data sheets: 989 TFLOP/s BF16 = 528 tensor cores x
/// 1024 FLOP/clk x 1.83 GHz on H100/H200 SXM). The sparsity figures NVIDIA
/// advertises (1,979 BF16) are twice these and must not be used for MFU. "H100 PCIe" comes
/// first so it wins over the plain "H100" (SXM) entry; its numbers are the PCIe data sheet's
/// (llm.c's mfu.h uses the same 756 TFLOP/s BF16 base). GH200 (Grace Hopper) carries the same
/// GPU as H100 SXM and gets its own label. The NVL parts (H100 NVL, H200 NVL) run at lower
/// power and clocks and are deliberately not matched: find_device_peak returns nullptr for them
/// (and any other name it does not know), so MFU needs MonitorOptions::peak_flops there.
inline constexpr DevicePeak kDevicePeaks[] = {
    {"GH200", "GH200", 67e12, 494.5e12, 989e12},
    {"H200", "H200 SXM", 67e12, 494.5e12, 989e12},
    {"H100 PCIe", "H100 PCIe", 51e12, 378e12, 756e12},
    {"H100", "H100 SXM", 67e12, 494.5e12, 989e12},
    {"A100", "A100", 19.5e12, 156e12, 312e12},
};

/// The table entry whose pattern occurs in `device_name`, or nullptr for an unknown device.
TRAINKIT_INLINE const DevicePeak* find_device_peak(std::string_view device_name) noexcept;

/// Dense peak FLOP/s of `device_name` for `precision`; 0 when the device is not in the table.
TRAINKIT_INLINE double device_peak_flops(std::string_view device_name,
                                         Precision precision) noexcept;

/// Training FLOPs per token of a decoder-only transformer, PaLM appendix B / torchtitan
/// `get_num_flop_per_token`: 6·N + 12·L·H·Q·T.
///  - 6·N: forward (2 FLOP per multiply-add) plus backward (twice the forward) of every matmul
///    weight. `n_params` counts the parameters used in matmuls: exclude the token-embedding table
///    (a lookup), include an untied output head.
///  - 12·L·H·Q·T: the attention score and value matmuls (2 in forward, 4 in backward, 2 FLOP
///    each per multiply-add) for L layers, H heads of dimension Q over sequence length T. No
///    discount for causal masking, and activation recomputation is not counted (that would be HFU).
inline constexpr double transformer_flops_per_token(double n_params, int layers, int heads,
                                                    int head_dim, int seq_len) noexcept {
  return 6.0 * n_params + 12.0 * static_cast<double>(layers) * static_cast<double>(heads) *
                              static_cast<double>(head_dim) * static_cast<double>(seq_len);
}

/// Training FLOPs of one step processing `tokens` tokens: transformer_flops_per_token · tokens.
inline constexpr double transformer_flops_per_step(double n_params, int layers, int heads,
                                                   int head_dim, int seq_len,
                                                   double tokens) noexcept {
  return transformer_flops_per_token(n_params, layers, heads, head_dim, seq_len) * tokens;
}

/// Achieved FLOP/s: flops_per_step / step_seconds (0 when the step time is not positive).
inline constexpr double achieved_flops(double flops_per_step, double step_seconds) noexcept {
  return step_seconds > 0.0 ? flops_per_step / step_seconds : 0.0;
}

/// Model FLOPs utilization in [0, 1]: achieved_flops(flops_per_step, step_seconds) / peak_flops.
/// Returns 0 when the peak or the step time is unknown (not positive).
inline constexpr double mfu(double flops_per_step, double step_seconds,
                            double peak_flops) noexcept {
  return peak_flops > 0.0 ? achieved_flops(flops_per_step, step_seconds) / peak_flops : 0.0;
}

namespace detail {
// 32 independent multiply-add chains hide the FP latency; the compiler vectorizes them with
// whatever the build enables (SSE2 by default on x86-64, AVX2/FMA with -march=native).
TRAINKIT_INLINE double cpu_peak_worker_portable(std::int64_t min_ns,
                                                const std::atomic<bool>& go) noexcept;

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
// The rate the library's own kernels reach: blas/host_gemm.hpp picks its AVX-512 or AVX2+FMA
// micro-kernel by CPUID at run time whatever the build flags, so the peak must be measured the
// same way, or MFU exceeds 100% on a build without -march=native. 12 independent FMA chains
// cover the 4-cycle latency of two FMA ports. Written once for both widths as a macro: the FMA
// body must stay inside the target("...") function (a lambda or template handed to a shared
// loop would not inherit the target), and the 12 accumulators must be named to stay in
// registers.
#define TRAINKIT_DETAIL_CPU_PEAK_WORKER(name, target_isa, V, pfx, lanes_n)                       \
  __attribute__((target(target_isa))) inline double name(std::int64_t min_ns,                    \
                                                         const std::atomic<bool>& go) noexcept { \
    constexpr int kChains = 12;                                                                  \
    V a0 = pfx##_set1_ps(0.000f), a1 = pfx##_set1_ps(0.001f), a2 = pfx##_set1_ps(0.002f);        \
    V a3 = pfx##_set1_ps(0.003f), a4 = pfx##_set1_ps(0.004f), a5 = pfx##_set1_ps(0.005f);        \
    V a6 = pfx##_set1_ps(0.006f), a7 = pfx##_set1_ps(0.007f), a8 = pfx##_set1_ps(0.008f);        \
    V a9 = pfx##_set1_ps(0.009f), a10 = pfx##_set1_ps(0.010f), a11 = pfx##_set1_ps(0.011f);      \
    const V m = pfx##_set1_ps(0.999999f);                                                        \
    const V c = pfx##_set1_ps(1e-7f);                                                            \
    while (!go.load(std::memory_order_acquire)) std::this_thread::yield();                       \
    const auto t0 = std::chrono::steady_clock::now();                                            \
    std::int64_t iterations = 0;                                                                 \
    std::int64_t elapsed = 0;                                                                    \
    do {                                                                                         \
      for (int rep = 0; rep < 4096; ++rep) {                                                     \
        a0 = pfx##_fmadd_ps(a0, m, c);                                                           \
        a1 = pfx##_fmadd_ps(a1, m, c);                                                           \
        a2 = pfx##_fmadd_ps(a2, m, c);                                                           \
        a3 = pfx##_fmadd_ps(a3, m, c);                                                           \
        a4 = pfx##_fmadd_ps(a4, m, c);                                                           \
        a5 = pfx##_fmadd_ps(a5, m, c);                                                           \
        a6 = pfx##_fmadd_ps(a6, m, c);                                                           \
        a7 = pfx##_fmadd_ps(a7, m, c);                                                           \
        a8 = pfx##_fmadd_ps(a8, m, c);                                                           \
        a9 = pfx##_fmadd_ps(a9, m, c);                                                           \
        a10 = pfx##_fmadd_ps(a10, m, c);                                                         \
        a11 = pfx##_fmadd_ps(a11, m, c);                                                         \
      }                                                                                          \
      iterations += 4096;                                                                        \
      elapsed = std::chrono::duration_cast<std::chrono::nanoseconds>(                            \
                    std::chrono::steady_clock::now() - t0)                                       \
                    .count();                                                                    \
    } while (elapsed < min_ns);                                                                  \
    const V sum =                                                                                \
        pfx##_add_ps(pfx##_add_ps(pfx##_add_ps(pfx##_add_ps(a0, a1), pfx##_add_ps(a2, a3)),      \
                                  pfx##_add_ps(pfx##_add_ps(a4, a5), pfx##_add_ps(a6, a7))),     \
                     pfx##_add_ps(pfx##_add_ps(a8, a9), pfx##_add_ps(a10, a11)));                \
    alignas(64) float lanes[lanes_n];                                                            \
    pfx##_store_ps(lanes, sum);                                                                  \
    volatile float keep = lanes[0]; /* keeps the loop from being optimized away */               \
    (void)keep;                                                                                  \
    return 2.0 * lanes_n * kChains * static_cast<double>(iterations) /                           \
           (1e-9 * static_cast<double>(elapsed));                                                \
  }
TRAINKIT_DETAIL_CPU_PEAK_WORKER(cpu_peak_worker_avx2, "avx2,fma", __m256, _mm256, 8)
TRAINKIT_DETAIL_CPU_PEAK_WORKER(cpu_peak_worker_avx512, "avx512f", __m512, _mm512, 16)
#undef TRAINKIT_DETAIL_CPU_PEAK_WORKER
#endif

inline double cpu_peak_worker(std::int64_t min_ns, const std::atomic<bool>& go) noexcept {
#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
  if (__builtin_cpu_supports("avx512f")) return cpu_peak_worker_avx512(min_ns, go);
  if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma"))
    return cpu_peak_worker_avx2(min_ns, go);
#endif
  return cpu_peak_worker_portable(min_ns, go);
}

/// One probe: every thread runs its multiply-add loop for `min_ns` at once; the sum of their rates.
TRAINKIT_INLINE double measure_cpu_peak_once(unsigned threads, std::int64_t min_ns);
#if TRAINKIT_IMPL

TRAINKIT_INLINE double cpu_peak_worker_portable(std::int64_t min_ns,
                                                const std::atomic<bool>& go) noexcept {
  constexpr int kChains = 32;
  float acc[kChains];
  for (int j = 0; j < kChains; ++j) acc[j] = static_cast<float>(j) * 1e-3f;
  const float m = 0.999999f;
  const float c = 1e-7f;
  while (!go.load(std::memory_order_acquire)) std::this_thread::yield();
  const auto t0 = std::chrono::steady_clock::now();
  std::int64_t iterations = 0;
  std::int64_t elapsed = 0;
  do {
    for (int rep = 0; rep < 4096; ++rep) {
      for (int j = 0; j < kChains; ++j) acc[j] = acc[j] * m + c;
    }
    iterations += 4096;
    elapsed =
        std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now() - t0)
            .count();
  } while (elapsed < min_ns);
  float sink = 0.0f;
  for (int j = 0; j < kChains; ++j) sink += acc[j];
  volatile float keep = sink;  // keeps the loop from being optimized away
  (void)keep;
  return 2.0 * kChains * static_cast<double>(iterations) / (1e-9 * static_cast<double>(elapsed));
}

TRAINKIT_INLINE double measure_cpu_peak_once(unsigned threads, std::int64_t min_ns) {
  std::atomic<bool> go{false};
  std::vector<double> rates(threads, 0.0);
  std::vector<std::thread> workers;
  workers.reserve(threads);
  for (unsigned t = 0; t < threads; ++t) {
    workers.emplace_back([&, t] { rates[t] = detail::cpu_peak_worker(min_ns, go); });
  }
  go.store(true, std::memory_order_release);
  for (auto& w : workers) w.join();
  double total = 0.0;
  for (double r : rates) total += r;
  return total;
}

#endif  // TRAINKIT_IMPL

}  // namespace detail

/// The best (largest) rate of `probes` calls of `probe` (a callable returning FLOP/s). A peak
/// measured once is only a lower bound, and a low one when other work shares the machine: several
/// short probes spread over time are likely to catch a quiet moment.
template <class Probe>
double best_of_probes(int probes, Probe&& probe) {
  double best = 0.0;
  for (int i = 0; i < std::max(1, probes); ++i) best = std::max(best, static_cast<double>(probe()));
  return best;
}

/// Measures the FP32 multiply-add rate this build reaches on `threads` threads (0 = all hardware
/// threads) for about `seconds`: a practical CPU "peak" for MFU on machines without a spec-sheet
/// number: the best of `probes` probes of seconds / probes each (see best_of_probes). It depends on
/// the CPU features the build and the run time dispatch use, so prefer a configured peak when
/// comparing machines.
TRAINKIT_INLINE double measure_cpu_peak_flops(unsigned threads = 0, double seconds = 0.2,
                                              int probes = 4);

#if TRAINKIT_IMPL

TRAINKIT_INLINE const DevicePeak* find_device_peak(std::string_view device_name) noexcept {
  if (device_name.find("NVL") != std::string_view::npos) return nullptr;  // see kDevicePeaks
  for (const DevicePeak& entry : kDevicePeaks) {
    if (device_name.find(entry.pattern) != std::string_view::npos) return &entry;
  }
  return nullptr;
}

TRAINKIT_INLINE double device_peak_flops(std::string_view device_name,
                                         Precision precision) noexcept {
  const DevicePeak* entry = find_device_peak(device_name);
  if (entry == nullptr) return 0.0;
  switch (precision) {
    case Precision::kFp32: return entry->fp32;
    case Precision::kTf32: return entry->tf32;
    case Precision::kBf16:
    case Precision::kFp16: return entry->bf16;
  }
  return 0.0;
}

TRAINKIT_INLINE double measure_cpu_peak_flops(unsigned threads, double seconds, int probes) {
  if (threads == 0) threads = std::max(1u, std::thread::hardware_concurrency());
  probes = std::max(1, probes);
  const auto min_ns = static_cast<std::int64_t>(seconds * 1e9 / probes);
  return best_of_probes(probes, [&] { return detail::measure_cpu_peak_once(threads, min_ns); });
}

#endif  // TRAINKIT_IMPL

}  // namespace monitor
TRAINKIT_NAMESPACE_END
