// SPDX-License-Identifier: MIT
// bench/gemm worker: f32 C = op(A) @ op(B) through trainkit::blas::gemm (built-in kernel) and
// through cblas_sgemm (OpenBLAS, on its own threads: OPENBLAS_NUM_THREADS), for the shapes given
// with --shapes, plus single-thread FMA-throughput probes (the measured per-core peak, AVX2 and,
// where the CPU has it, AVX-512) and the micro-kernel alone on L1-resident operands. Driven by
// run.py (protocol: bench/common/bench.hpp).
#include <cblas.h>
#include <immintrin.h>

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "bench.hpp"
#include "trainkit/blas/gemm.hpp"
#include "trainkit/exec/host.hpp"

namespace tb = trainkit_bench;
namespace blas = trainkit::blas;

namespace {

constexpr long kProbeIterations = 4'000'000;
volatile float probe_sink = 0;  // keeps the probes from being optimised away

// 12 independent FMA chains (2 FMA pipes x 4-5 cycles latency need >= 10) in named variables
// with different start values and an empty asm per step: an array would live in memory (timing
// store forwarding), and identical chains would be merged by the compiler.
__attribute__((target("avx2,fma"), noinline)) float probe_fma_avx2(long iterations) {
  const __m256 m = _mm256_set1_ps(0.999999f), a = _mm256_set1_ps(1e-7f);
  __m256 r0 = _mm256_set1_ps(1.0f), r1 = _mm256_set1_ps(2.0f), r2 = _mm256_set1_ps(3.0f),
         r3 = _mm256_set1_ps(4.0f), r4 = _mm256_set1_ps(5.0f), r5 = _mm256_set1_ps(6.0f),
         r6 = _mm256_set1_ps(7.0f), r7 = _mm256_set1_ps(8.0f), r8 = _mm256_set1_ps(9.0f),
         r9 = _mm256_set1_ps(10.0f), r10 = _mm256_set1_ps(11.0f), r11 = _mm256_set1_ps(12.0f);
  for (long i = 0; i < iterations; ++i) {
    r0 = _mm256_fmadd_ps(r0, m, a);
    r1 = _mm256_fmadd_ps(r1, m, a);
    r2 = _mm256_fmadd_ps(r2, m, a);
    r3 = _mm256_fmadd_ps(r3, m, a);
    r4 = _mm256_fmadd_ps(r4, m, a);
    r5 = _mm256_fmadd_ps(r5, m, a);
    r6 = _mm256_fmadd_ps(r6, m, a);
    r7 = _mm256_fmadd_ps(r7, m, a);
    r8 = _mm256_fmadd_ps(r8, m, a);
    r9 = _mm256_fmadd_ps(r9, m, a);
    r10 = _mm256_fmadd_ps(r10, m, a);
    r11 = _mm256_fmadd_ps(r11, m, a);
    __asm__ volatile(""
                     : "+x"(r0), "+x"(r1), "+x"(r2), "+x"(r3), "+x"(r4), "+x"(r5), "+x"(r6),
                       "+x"(r7), "+x"(r8), "+x"(r9), "+x"(r10), "+x"(r11));
  }
  __m256 s = r0;
  s = _mm256_add_ps(s, r1);
  s = _mm256_add_ps(s, r2);
  s = _mm256_add_ps(s, r3);
  s = _mm256_add_ps(s, r4);
  s = _mm256_add_ps(s, r5);
  s = _mm256_add_ps(s, r6);
  s = _mm256_add_ps(s, r7);
  s = _mm256_add_ps(s, r8);
  s = _mm256_add_ps(s, r9);
  s = _mm256_add_ps(s, r10);
  s = _mm256_add_ps(s, r11);
  alignas(64) float out[sizeof(__m256) / sizeof(float)];
  _mm256_store_ps(out, s);
  return out[0];
}

__attribute__((target("avx512f"), noinline)) float probe_fma_avx512(long iterations) {
  const __m512 m = _mm512_set1_ps(0.999999f), a = _mm512_set1_ps(1e-7f);
  __m512 r0 = _mm512_set1_ps(1.0f), r1 = _mm512_set1_ps(2.0f), r2 = _mm512_set1_ps(3.0f),
         r3 = _mm512_set1_ps(4.0f), r4 = _mm512_set1_ps(5.0f), r5 = _mm512_set1_ps(6.0f),
         r6 = _mm512_set1_ps(7.0f), r7 = _mm512_set1_ps(8.0f), r8 = _mm512_set1_ps(9.0f),
         r9 = _mm512_set1_ps(10.0f), r10 = _mm512_set1_ps(11.0f), r11 = _mm512_set1_ps(12.0f);
  for (long i = 0; i < iterations; ++i) {
    r0 = _mm512_fmadd_ps(r0, m, a);
    r1 = _mm512_fmadd_ps(r1, m, a);
    r2 = _mm512_fmadd_ps(r2, m, a);
    r3 = _mm512_fmadd_ps(r3, m, a);
    r4 = _mm512_fmadd_ps(r4, m, a);
    r5 = _mm512_fmadd_ps(r5, m, a);
    r6 = _mm512_fmadd_ps(r6, m, a);
    r7 = _mm512_fmadd_ps(r7, m, a);
    r8 = _mm512_fmadd_ps(r8, m, a);
    r9 = _mm512_fmadd_ps(r9, m, a);
    r10 = _mm512_fmadd_ps(r10, m, a);
    r11 = _mm512_fmadd_ps(r11, m, a);
    __asm__ volatile(""
                     : "+v"(r0), "+v"(r1), "+v"(r2), "+v"(r3), "+v"(r4), "+v"(r5), "+v"(r6),
                       "+v"(r7), "+v"(r8), "+v"(r9), "+v"(r10), "+v"(r11));
  }
  __m512 s = r0;
  s = _mm512_add_ps(s, r1);
  s = _mm512_add_ps(s, r2);
  s = _mm512_add_ps(s, r3);
  s = _mm512_add_ps(s, r4);
  s = _mm512_add_ps(s, r5);
  s = _mm512_add_ps(s, r6);
  s = _mm512_add_ps(s, r7);
  s = _mm512_add_ps(s, r8);
  s = _mm512_add_ps(s, r9);
  s = _mm512_add_ps(s, r10);
  s = _mm512_add_ps(s, r11);
  alignas(64) float out[sizeof(__m512) / sizeof(float)];
  _mm512_store_ps(out, s);
  return out[0];
}

// The micro-kernel gemm_kernel_for_this_cpu() picks, alone, with every operand in L1: one row
// tile of A read in place (k contiguous, the layout the products use), one tile's packed B panels
// and C, kc = 256, called back to back. No product can run faster than this: the gap between it
// and the FMA probe is the kernel's own instruction mix (a broadcast of A per row and a load of B
// per panel for every k step), the gap between it and a product is blocking, packing and memory.
constexpr std::int64_t kKernelProbeKc = 256;
constexpr long kKernelProbeCalls = 4000;
struct KernelProbe {
  const blas::detail::GemmKernel& kernel = blas::detail::gemm_kernel_for_this_cpu();
  std::vector<float> a, b, c;
  blas::detail::GemmTileArgs g{};
  KernelProbe()
      : a(static_cast<std::size_t>(kernel.rows * kKernelProbeKc), 0.5f),
        b(static_cast<std::size_t>(kernel.cols * kKernelProbeKc) + 16, 0.25f),
        c(static_cast<std::size_t>(kernel.rows * kernel.cols), 0.0f) {
    float* b64 = b.data();  // packed panels are 64-byte aligned
    while (reinterpret_cast<std::uintptr_t>(b64) % 64 != 0) ++b64;
    g.kc = kKernelProbeKc;
    g.a = a.data();
    g.a_rs = kKernelProbeKc;
    g.a_ks = 1;
    g.b = b64;
    g.b_panel = blas::detail::kGemmNR * kKernelProbeKc;
    g.c = c.data();
    g.ldc = kernel.cols;
    g.alpha = 1.0f;
    g.beta = 0.0f;
    g.mr = kernel.rows;
    g.nr = kernel.cols;
    g.epi = nullptr;
  }
  KernelProbe(const KernelProbe&) = delete;  // g points into the vectors
  KernelProbe& operator=(const KernelProbe&) = delete;
  double flops() const {
    return 2.0 * kernel.rows * kernel.cols * kKernelProbeKc * kKernelProbeCalls;
  }
  void run() {
    for (long i = 0; i < kKernelProbeCalls; ++i) kernel.run(g);
    probe_sink = c[0];
  }
};

struct Problem {
  std::string name;
  blas::Op op_a, op_b;
  std::int64_t m, k, n;
  std::vector<float> a, b, c;
};

// "name:NN:m:k:n,..." (NN = op_a op_b letters).
std::vector<Problem> parse_shapes(const std::string& spec) {
  std::vector<Problem> out;
  std::stringstream list(spec);
  std::string item;
  while (std::getline(list, item, ',')) {
    std::stringstream fields(item);
    std::string name, ops, m, k, n;
    std::getline(fields, name, ':');
    std::getline(fields, ops, ':');
    std::getline(fields, m, ':');
    std::getline(fields, k, ':');
    std::getline(fields, n, ':');
    Problem p;
    p.name = name;
    p.op_a = ops[0] == 'T' ? blas::Op::kT : blas::Op::kN;
    p.op_b = ops[1] == 'T' ? blas::Op::kT : blas::Op::kN;
    p.m = std::stoll(m);
    p.k = std::stoll(k);
    p.n = std::stoll(n);
    out.push_back(std::move(p));
  }
  return out;
}

}  // namespace

int main(int argc, char** argv) {
  const int threads = std::stoi(tb::arg(argc, argv, "threads", "1"));
  std::vector<Problem> problems =
      parse_shapes(tb::arg(argc, argv, "shapes", "sq1024:NN:1024:1024:1024"));
  trainkit::exec::Host host(threads);

  std::mt19937 rng(1);
  std::uniform_real_distribution<float> dist(-1.0f, 1.0f);
  std::vector<tb::Case> cases;
  for (Problem& p : problems) {
    p.a.resize(static_cast<std::size_t>(p.m * p.k));
    p.b.resize(static_cast<std::size_t>(p.k * p.n));
    p.c.assign(static_cast<std::size_t>(p.m * p.n), 0.0f);
    for (float& x : p.a) x = dist(rng);
    for (float& x : p.b) x = dist(rng);
    const std::int64_t ar = p.op_a == blas::Op::kN ? p.m : p.k,
                       ac = p.op_a == blas::Op::kN ? p.k : p.m;
    const std::int64_t br = p.op_b == blas::Op::kN ? p.k : p.n,
                       bc = p.op_b == blas::Op::kN ? p.n : p.k;
    const trainkit::HostView<const float, 2> a(p.a.data(), {{ar, ac}});
    const trainkit::HostView<const float, 2> b(p.b.data(), {{br, bc}});
    const trainkit::HostView<float, 2> c(p.c.data(), {{p.m, p.n}});
    Problem* pp = &p;
    cases.push_back(
        {"tk_" + p.name, [&host, pp, a, b, c] { blas::gemm(host, pp->op_a, pp->op_b, a, b, c); }});
    cases.push_back({"openblas_" + p.name, [&host, pp, a, b, c] {
                       blas::gemm(host, pp->op_a, pp->op_b, a, b, c,
                                  {.host_backend = blas::HostBackend::kCblas});
                     }});
    // Sanity check once: trainkit vs OpenBLAS on this problem.
    blas::gemm(host, p.op_a, p.op_b, a, b, c);
    std::vector<float> mine = p.c;
    blas::gemm(host, p.op_a, p.op_b, a, b, c, {.host_backend = blas::HostBackend::kCblas});
    double num = 0, den = 0;
    for (std::size_t i = 0; i < mine.size(); ++i) {
      num += double(mine[i] - p.c[i]) * double(mine[i] - p.c[i]);
      den += double(p.c[i]) * double(p.c[i]);
    }
    if (!(std::sqrt(num / den) < 1e-5)) {
      std::fprintf(stderr, "gemm: %s: trainkit and OpenBLAS disagree (rel %g)\n", p.name.c_str(),
                   std::sqrt(num / den));
      return 1;
    }
  }
  cases.push_back({"probe_fma", [] { probe_sink = probe_fma_avx2(kProbeIterations); }});
  KernelProbe kernel_probe;
  cases.push_back({"probe_kernel", [&kernel_probe] { kernel_probe.run(); }});
  const bool avx512 = __builtin_cpu_supports("avx512f");
  if (avx512)
    cases.push_back({"probe_fma512", [] { probe_sink = probe_fma_avx512(kProbeIterations); }});
  return tb::serve({{"threads", std::to_string(host.num_threads())},
                    {"kernel", blas::detail::gemm_kernel_name()},
                    {"probe_flops", std::to_string(kProbeIterations * 12 * 16)},
                    {"kernel_probe_flops", std::to_string(kernel_probe.flops())},
                    {"avx512", avx512 ? "1" : "0"}},
                   cases);
}
