// SPDX-License-Identifier: MIT
// bench/gemm_gpu worker: bf16 C = op(A) @ op(B) (f32 accumulate) through trainkit::blas::gemm on
// device views (cuBLASLt, plan cached after the first call) for the shapes given with --shapes.
// One repetition = --reps gemms queued back to back on one stream, then a synchronize, so the
// host launch cost is hidden the same way as in the torch peer. Driven by run.py.
#include <cuda_runtime_api.h>

#include <cstdint>
#include <cstdio>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include "bench.hpp"
#include "trainkit/blas/gemm.hpp"
#include "trainkit/core/half.hpp"
#include "trainkit/cuda/buffer.hpp"
#include "trainkit/cuda/stream.hpp"

namespace tb = trainkit_bench;
namespace blas = trainkit::blas;
using trainkit::bf16;

namespace {

struct Problem {
  std::string name;
  blas::Op op_a, op_b;
  std::int64_t m, k, n;
  trainkit::cuda::DeviceBuffer<bf16> a, b, c;
};

// Deterministic values in [-1, 1), made on the host once per size.
std::vector<bf16> random_bf16(std::size_t n, std::uint64_t seed) {
  std::vector<bf16> out(n);
  std::uint64_t x = seed * 0x9E3779B97F4A7C15ull + 1;
  for (auto& v : out) {
    x ^= x << 13;
    x ^= x >> 7;
    x ^= x << 17;
    v = bf16(static_cast<float>(x >> 40) / float(1 << 23) - 1.0f);
  }
  return out;
}

}  // namespace

int main(int argc, char** argv) {
  const int reps = std::stoi(tb::arg(argc, argv, "reps", "10"));
  const std::string spec = tb::arg(argc, argv, "shapes", "sq8192:NN:8192:8192:8192");
  trainkit::cuda::Stream stream;
  blas::CublasLt lt;

  std::vector<std::unique_ptr<Problem>> problems;
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
    auto p = std::make_unique<Problem>();
    p->name = name;
    p->op_a = ops[0] == 'T' ? blas::Op::kT : blas::Op::kN;
    p->op_b = ops[1] == 'T' ? blas::Op::kT : blas::Op::kN;
    p->m = std::stoll(m);
    p->k = std::stoll(k);
    p->n = std::stoll(n);
    const std::vector<bf16> ha = random_bf16(static_cast<std::size_t>(p->m * p->k), 1);
    const std::vector<bf16> hb = random_bf16(static_cast<std::size_t>(p->k * p->n), 2);
    p->a = trainkit::cuda::DeviceBuffer<bf16>(ha.size());
    p->b = trainkit::cuda::DeviceBuffer<bf16>(hb.size());
    p->c = trainkit::cuda::DeviceBuffer<bf16>(static_cast<std::size_t>(p->m * p->n));
    p->a.copy_from_host(ha.data(), ha.size(), stream);
    p->b.copy_from_host(hb.data(), hb.size(), stream);
    stream.synchronize();
    problems.push_back(std::move(p));
  }

  std::vector<tb::Case> cases;
  for (auto& ptr : problems) {
    Problem* p = ptr.get();
    const std::int64_t ar = p->op_a == blas::Op::kN ? p->m : p->k;
    const std::int64_t ac = p->op_a == blas::Op::kN ? p->k : p->m;
    const std::int64_t br = p->op_b == blas::Op::kN ? p->k : p->n;
    const std::int64_t bc = p->op_b == blas::Op::kN ? p->n : p->k;
    const trainkit::DeviceView<const bf16, 2> a(p->a.data(), {{ar, ac}});
    const trainkit::DeviceView<const bf16, 2> b(p->b.data(), {{br, bc}});
    const trainkit::DeviceView<bf16, 2> c(p->c.data(), {{p->m, p->n}});
    cases.push_back({"tk_" + p->name, [&, p, a, b, c] {
                       for (int r = 0; r < reps; ++r)
                         blas::gemm(lt, p->op_a, p->op_b, a, b, c, stream);
                       stream.synchronize();
                     }});
  }
  int device = 0;
  cudaDeviceProp prop{};
  TRAINKIT_CUDA_CHECK(cudaGetDevice(&device));
  TRAINKIT_CUDA_CHECK(cudaGetDeviceProperties(&prop, device));
  std::string gpu = prop.name;
  for (char& ch : gpu)
    if (ch == ' ') ch = '_';
  return tb::serve({{"reps", std::to_string(reps)}, {"gpu", gpu}}, cases);
}
