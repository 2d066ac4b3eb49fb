// Throughput and MFU: the documented formulas against hand-computed float64 values, the peak
// table lookups, and the measured CPU peak being sane.
#include <doctest/doctest.h>

#include <trainkit/monitor/memory.hpp>
#include <trainkit/monitor/throughput.hpp>

namespace mon = trainkit::monitor;
using mon::Precision;

TEST_CASE("transformer FLOPs per token: 6N + 12 L H Q T (PaLM appendix B)") {
  // GPT-2 small shape: 85M matmul parameters, 12 layers, 12 heads of 64, context 1024.
  const double n = 85'000'000.0;
  const double expected = 6.0 * n + 12.0 * 12 * 12 * 64 * 1024;  // 510e6 + 113,246,208
  CHECK(mon::transformer_flops_per_token(n, 12, 12, 64, 1024) == expected);
  CHECK(expected == 623'246'208.0);
  CHECK(mon::transformer_flops_per_step(n, 12, 12, 64, 1024, 8 * 1024) == expected * 8192);
  // Without attention (T = 0) it is the "6ND" shortcut.
  CHECK(mon::transformer_flops_per_token(1e9, 24, 16, 128, 0) == 6e9);
}

TEST_CASE("MFU = (FLOPs per step / step time) / peak") {
  const double flops_per_step = 623'246'208.0 * 524'288;  // 0.5M tokens per step
  const double step_s = 0.75;
  const double peak = 989e12;
  CHECK(mon::achieved_flops(flops_per_step, step_s) == flops_per_step / step_s);
  CHECK(mon::mfu(flops_per_step, step_s, peak) ==
        doctest::Approx(flops_per_step / step_s / peak).epsilon(1e-15));
  CHECK(mon::mfu(flops_per_step, step_s, peak) == doctest::Approx(0.4405264684).epsilon(1e-9));
  CHECK(mon::mfu(flops_per_step, step_s, 0.0) == 0.0);  // unknown peak
  CHECK(mon::mfu(flops_per_step, 0.0, peak) == 0.0);    // no time measured
  static_assert(mon::mfu(2e12, 1.0, 4e12) == 0.5);
}

TEST_CASE("peak table: dense tensor-core peaks by device name and precision") {
  CHECK(mon::device_peak_flops("NVIDIA H100 80GB HBM3", Precision::kBf16) == 989e12);
  CHECK(mon::device_peak_flops("NVIDIA H100 80GB HBM3", Precision::kTf32) == 494.5e12);
  CHECK(mon::device_peak_flops("NVIDIA H100 80GB HBM3", Precision::kFp32) == 67e12);
  CHECK(mon::device_peak_flops("NVIDIA H100 PCIe", Precision::kBf16) == 756e12);
  CHECK(mon::device_peak_flops("NVIDIA H200", Precision::kBf16) == 989e12);
  CHECK(mon::device_peak_flops("NVIDIA H200", Precision::kFp16) == 989e12);
  CHECK(mon::device_peak_flops("NVIDIA A100-SXM4-80GB", Precision::kBf16) == 312e12);
  CHECK(mon::device_peak_flops("NVIDIA A100-SXM4-80GB", Precision::kTf32) == 156e12);
  CHECK(mon::device_peak_flops("NVIDIA A100 80GB PCIe", Precision::kFp32) == 19.5e12);
  CHECK(mon::device_peak_flops("Tesla T4", Precision::kBf16) == 0.0);
  REQUIRE(mon::find_device_peak("NVIDIA H200") != nullptr);
  CHECK(std::string(mon::find_device_peak("NVIDIA H200")->label) == "H200 SXM");
  REQUIRE(mon::find_device_peak("NVIDIA GH200 480GB") != nullptr);
  CHECK(std::string(mon::find_device_peak("NVIDIA GH200 480GB")->label) == "GH200");
  // Lower-clocked NVL parts are not given the SXM peaks: unknown, so MFU needs a configured peak.
  CHECK(mon::find_device_peak("NVIDIA H100 NVL") == nullptr);
  CHECK(mon::find_device_peak("NVIDIA H200 NVL") == nullptr);
  CHECK(mon::device_peak_flops("NVIDIA H200 NVL", Precision::kBf16) == 0.0);
  CHECK(std::string(mon::precision_name(Precision::kTf32)) == "tf32");
}

TEST_CASE("measured CPU peak is positive and plausible") {
  const double one = mon::measure_cpu_peak_flops(1, 0.02);
  CHECK(one > 1e8);   // any CPU of this century: > 0.1 GFLOP/s per core
  CHECK(one < 1e12);  // and far below a TFLOP/s per core
}

TEST_CASE("host memory reads /proc/self/status") {
  const auto m = mon::host_memory();
  CHECK(m.rss > 1024 * 1024);  // a test binary is more than 1 MiB resident
  CHECK(m.peak_rss >= m.rss);
}
