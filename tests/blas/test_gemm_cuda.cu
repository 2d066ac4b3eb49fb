// GPU tests of blas/cublaslt.hpp (label cuda; exit 77 without a device): cuBLASLt against the
// host gemm (itself checked against float64 in test_gemm.cpp) for every transpose combination,
// odd sizes, beta != 0, padded rows and each input type, within per-type tolerances
// (||got - ref|| / ||ref||: f32 1e-5, tf32 1e-3, bf16 1e-2, f16 2e-3); the fused epilogues
// against the host's composition; batched views; misaligned views; and the plan cache.
#include <doctest/doctest.h>

#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include <trainkit/blas/gemm.hpp>
#include <trainkit/cuda/buffer.hpp>
#include <trainkit/cuda/stream.hpp>
#include <trainkit/exec/host.hpp>

#include "blas/gemm_reference.hpp"

namespace {

using namespace gemm_test;
namespace blas = trainkit::blas;
namespace cuda = trainkit::cuda;
using blas::ComputeType;
using blas::GemmOptions;
using trainkit::DeviceView;

constexpr Op kOps[] = {Op::kN, Op::kT};

// A host Matrix mirrored in device memory (padding included).
template <class T>
struct DeviceMatrix {
  std::int64_t rows, cols, ld;
  cuda::DeviceBuffer<T> buffer;
  DeviceMatrix(const Matrix<T>& m, cuda::StreamRef stream)
      : rows(m.rows), cols(m.cols), ld(m.ld), buffer(m.data.size()) {
    buffer.copy_from_host(m.data.data(), m.data.size(), stream);
  }
  DeviceView<T, 2> view() { return {buffer.data(), {{rows, cols}}, {{ld, 1}}}; }
  DeviceView<const T, 2> cview() { return {buffer.data(), {{rows, cols}}, {{ld, 1}}}; }
  void download(Matrix<T>& m, cuda::StreamRef stream) {
    buffer.copy_to_host(m.data.data(), m.data.size(), stream);
    stream.synchronize();
  }
};

template <class T>
struct DeviceVector {
  cuda::DeviceBuffer<T> buffer;
  DeviceVector(const std::vector<T>& v, cuda::StreamRef stream) : buffer(v.size()) {
    buffer.copy_from_host(v.data(), v.size(), stream);
  }
  std::vector<T> download(cuda::StreamRef stream) {
    std::vector<T> out(buffer.size());
    buffer.copy_to_host(out.data(), out.size(), stream);
    stream.synchronize();
    return out;
  }
};

struct Case {
  std::int64_t m, n, k;
};

struct Errors {
  double c = 0, aux = 0, bias_grad = 0;
};

// One gemm on the GPU and the same on the host; returns the relative differences.
template <class TA, class TC>
Errors gpu_vs_host(blas::CublasLt& lt, cuda::StreamRef stream, Op op_a, Op op_b, const Case& cs,
                   float alpha, float beta, Epilogue e, ComputeType compute, std::uint64_t seed) {
  Matrix<TA> a(stored_rows(op_a, cs.m, cs.k), stored_cols(op_a, cs.m, cs.k), 3);
  Matrix<TA> b(stored_rows(op_b, cs.k, cs.n), stored_cols(op_b, cs.k, cs.n), 5);
  Matrix<TC> c(cs.m, cs.n, 2);
  a.fill_random(seed);
  b.fill_random(seed + 1);
  if (beta != 0.0f) c.fill_random(seed + 2);
  // aux rows padded to a multiple of 8 elements, as cuBLASLt requires.
  Matrix<TC> aux(cs.m, cs.n, (cs.n + 7) / 8 * 8 + 8 - cs.n);
  if (e == Epilogue::kDGelu) aux.fill_random(seed + 3, -3.0, 3.0);
  std::vector<TC> bias(static_cast<std::size_t>(cs.n));
  for (std::int64_t j = 0; j < cs.n; ++j) bias[j] = from_double<TC>(0.01 * double(j % 37) - 0.15);
  std::vector<TC> bias_grad(static_cast<std::size_t>(cs.m), from_double<TC>(0.0));

  const bool uses_aux = e == Epilogue::kGelu || e == Epilogue::kBiasGelu || e == Epilogue::kDGelu;
  Matrix<TC> c_host = c, aux_host = aux;
  std::vector<TC> bias_grad_host = bias_grad;
  trainkit::exec::Host host(2);
  blas::gemm(host, op_a, op_b, a.cview(), b.cview(), c_host.view(),
             {.alpha = alpha,
              .beta = beta,
              .epilogue = e,
              .bias = bias.data(),
              .bias_grad = bias_grad_host.data(),
              .aux = uses_aux ? aux_host.data.data() : nullptr,
              .aux_ld = aux.ld});

  DeviceMatrix<TA> da(a, stream), db(b, stream);
  DeviceMatrix<TC> dc(c, stream), daux(aux, stream);
  DeviceVector<TC> dbias(bias, stream), dbias_grad(bias_grad, stream);
  blas::gemm(lt, op_a, op_b, da.cview(), db.cview(), dc.view(),
             {.alpha = alpha,
              .beta = beta,
              .epilogue = e,
              .bias = dbias.buffer.data(),
              .bias_grad = dbias_grad.buffer.data(),
              .aux = uses_aux ? daux.buffer.data() : nullptr,
              .aux_ld = aux.ld,
              .compute = compute},
             stream);
  dc.download(c, stream);
  Errors err;
  std::vector<double> ref_c;
  for (std::int64_t i = 0; i < cs.m; ++i)
    for (std::int64_t j = 0; j < cs.n; ++j) ref_c.push_back(c_host.get(i, j));
  err.c = rel_error(c, ref_c, cs.m, cs.n);
  CHECK(padding_untouched(c));
  if (e == Epilogue::kGelu || e == Epilogue::kBiasGelu) {
    daux.download(aux, stream);
    std::vector<double> ref_aux;
    for (std::int64_t i = 0; i < cs.m; ++i)
      for (std::int64_t j = 0; j < cs.n; ++j) ref_aux.push_back(aux_host.get(i, j));
    err.aux = rel_error(aux, ref_aux, cs.m, cs.n);
  }
  if (e == Epilogue::kBiasGrad) {
    const std::vector<TC> got = dbias_grad.download(stream);
    std::vector<double> ref(bias_grad_host.size());
    for (std::size_t i = 0; i < ref.size(); ++i) ref[i] = to_double(bias_grad_host[i]);
    err.bias_grad = rel_error_vec(got, ref);
  }
  return err;
}

}  // namespace

TEST_CASE("cuBLASLt gemm vs host: transposes x odd sizes x beta x types") {
  cuda::Stream stream;
  blas::CublasLt lt;
  const Case cases[] = {{1, 1, 1}, {7, 129, 33}, {129, 7, 1000}, {256, 200, 300}};
  std::uint64_t seed = 1;
  for (const Case& cs : cases)
    for (Op op_a : kOps)
      for (Op op_b : kOps)
        for (float beta : {0.0f, 0.5f}) {
          INFO("m=", cs.m, " n=", cs.n, " k=", cs.k, " op_a=", std::string(blas::to_string(op_a)),
               " op_b=", std::string(blas::to_string(op_b)), " beta=", beta);
          const float alpha = beta == 0.0f ? 1.0f : -1.25f;
          CHECK(gpu_vs_host<float, float>(lt, stream, op_a, op_b, cs, alpha, beta, Epilogue::kNone,
                                          ComputeType::kF32, seed++)
                    .c < 1e-5);
          CHECK(gpu_vs_host<float, float>(lt, stream, op_a, op_b, cs, alpha, beta, Epilogue::kNone,
                                          ComputeType::kTf32, seed++)
                    .c < 1e-3);
          CHECK(gpu_vs_host<bf16, bf16>(lt, stream, op_a, op_b, cs, alpha, beta, Epilogue::kNone,
                                        ComputeType::kF32, seed++)
                    .c < 1e-2);
          CHECK(gpu_vs_host<bf16, float>(lt, stream, op_a, op_b, cs, alpha, beta, Epilogue::kNone,
                                         ComputeType::kF32, seed++)
                    .c < 1e-5);
          CHECK(gpu_vs_host<f16, f16>(lt, stream, op_a, op_b, cs, alpha, beta, Epilogue::kNone,
                                      ComputeType::kF32, seed++)
                    .c < 2e-3);
        }
}

TEST_CASE("cuBLASLt epilogues vs the host composition") {
  cuda::Stream stream;
  blas::CublasLt lt;
  const Case cs{96, 72, 130};
  // cuBLASLt's GELU may use a fast tanh: epilogues with GELU get 1e-3 even in f32.
  for (Epilogue e : {Epilogue::kBias, Epilogue::kGelu, Epilogue::kBiasGelu, Epilogue::kDGelu}) {
    INFO("epilogue ", std::string(blas::to_string(e)));
    const double tol32 = e == Epilogue::kBias ? 1e-5 : 1e-3;
    const Errors f = gpu_vs_host<float, float>(lt, stream, Op::kN, Op::kT, cs, 1.0f, 0.0f, e,
                                               ComputeType::kF32, 11);
    CHECK(f.c < tol32);
    CHECK(f.aux < 1e-5);
    const Errors h = gpu_vs_host<bf16, bf16>(lt, stream, Op::kN, Op::kT, cs, 1.0f, 0.0f, e,
                                             ComputeType::kF32, 12);
    CHECK(h.c < 1e-2);
    CHECK(h.aux < 1e-2);
  }
  // Bias gradient of the weight-gradient gemm dW = dY^T @ X (A = dY passed with Op::kT).
  const Errors g = gpu_vs_host<float, float>(lt, stream, Op::kT, Op::kN, {64, 48, 256}, 1.0f, 1.0f,
                                             Epilogue::kBiasGrad, ComputeType::kF32, 13);
  CHECK(g.c < 1e-5);
  CHECK(g.bias_grad < 1e-5);
  const Errors g16 = gpu_vs_host<bf16, bf16>(lt, stream, Op::kT, Op::kN, {64, 48, 256}, 1.0f, 0.0f,
                                             Epilogue::kBiasGrad, ComputeType::kF32, 14);
  CHECK(g16.c < 1e-2);
  CHECK(g16.bias_grad < 1e-2);
}

TEST_CASE("cuBLASLt batched gemm with a broadcast operand matches the host") {
  cuda::Stream stream;
  blas::CublasLt lt;
  const std::int64_t batch = 6, m = 40, n = 24, k = 32;
  Matrix<float> a(batch * m, k), w(n, k), c(batch * m, n);
  a.fill_random(21);
  w.fill_random(22);
  c.fill_random(23);
  Matrix<float> c_host = c;
  trainkit::exec::Host host(2);
  const trainkit::HostView<const float, 3> ha(a.data.data(), {{batch, m, k}}, {{m * k, k, 1}});
  const trainkit::HostView<const float, 3> hw(w.data.data(), {{1, n, k}}, {{0, k, 1}});
  const trainkit::HostView<float, 3> hc(c_host.data.data(), {{batch, m, n}}, {{m * n, n, 1}});
  blas::gemm(host, Op::kN, Op::kT, ha, hw, hc, {.beta = 0.5f});

  DeviceMatrix<float> da(a, stream), dw(w, stream), dc(c, stream);
  const DeviceView<const float, 3> va(da.buffer.data(), {{batch, m, k}}, {{m * k, k, 1}});
  const DeviceView<const float, 3> vw(dw.buffer.data(), {{1, n, k}}, {{0, k, 1}});
  const DeviceView<float, 3> vc(dc.buffer.data(), {{batch, m, n}}, {{m * n, n, 1}});
  blas::gemm(lt, Op::kN, Op::kT, va, vw, vc, {.beta = 0.5f}, stream);
  dc.download(c, stream);
  std::vector<double> ref(c_host.data.begin(), c_host.data.end());
  CHECK(rel_error(c, ref, batch * m, n) < 1e-5);
}

TEST_CASE("cuBLASLt gemm with options.c_in: beta scales c_in, C is only written") {
  // cuBLASLt's separate C (c_in) and D (C): D starts as NaN, c_in keeps its values, and the
  // result matches the host gemm with the same c_in (padded rows, a bias epilogue).
  cuda::Stream stream;
  blas::CublasLt lt;
  trainkit::exec::Host host(2);
  const std::int64_t m = 70, n = 45, k = 96;
  Matrix<float> a(m, k, 3), w(n, k, 1), r(m, n, 2), c(m, n, 2);  // c: NaN everywhere
  a.fill_random(31);
  w.fill_random(32);
  r.fill_random(33);
  std::vector<float> bias(n);
  for (std::int64_t j = 0; j < n; ++j) bias[j] = 0.01f * float(j % 13) - 0.05f;
  Matrix<float> c_host = c;
  blas::gemm(host, Op::kN, Op::kT, a.cview(), w.cview(), c_host.view(),
             {.beta = 0.75f,
              .c_in = r.data.data(),
              .epilogue = blas::Epilogue::kBias,
              .bias = bias.data()});
  DeviceMatrix<float> da(a, stream), dw(w, stream), dr(r, stream), dc(c, stream);
  DeviceVector<float> db(bias, stream);
  blas::gemm(lt, Op::kN, Op::kT, da.cview(), dw.cview(), dc.view(),
             {.beta = 0.75f,
              .c_in = dr.buffer.data(),
              .epilogue = blas::Epilogue::kBias,
              .bias = db.buffer.data()},
             stream);
  dc.download(c, stream);
  Matrix<float> r_after = r;
  dr.download(r_after, stream);
  std::vector<double> ref(c_host.data.begin(), c_host.data.end());
  CHECK(rel_error(c, ref, m, n) < 1e-5);
  CHECK(padding_untouched(c));
  CHECK(std::memcmp(r_after.data.data(), r.data.data(), r.data.size() * sizeof(float)) == 0);
}

TEST_CASE("cuBLASLt plan cache: the second call of a shape does no planning") {
  cuda::Stream stream;
  blas::CublasLt lt;
  Matrix<bf16> a(64, 96), b(80, 96);
  Matrix<bf16> c(64, 80);
  a.fill_random(31);
  b.fill_random(32);
  DeviceMatrix<bf16> da(a, stream), db(b, stream), dc(c, stream);
  CHECK(lt.stats().plans_built == 0);
  blas::gemm(lt, Op::kN, Op::kT, da.cview(), db.cview(), dc.view(), stream);
  CHECK(lt.stats().plans_built == 1);
  CHECK(lt.stats().cache_hits == 0);
  for (int i = 0; i < 3; ++i)
    blas::gemm(lt, Op::kN, Op::kT, da.cview(), db.cview(), dc.view(), stream);
  CHECK(lt.stats().plans_built == 1);
  CHECK(lt.stats().cache_hits == 3);
  // Another transpose is another plan; a view one element in is another alignment, another plan.
  Matrix<bf16> bt(96, 80);
  DeviceMatrix<bf16> dbt(bt, stream);
  blas::gemm(lt, Op::kN, Op::kN, da.cview(), dbt.cview(), dc.view(), stream);
  CHECK(lt.stats().plans_built == 2);
  const DeviceView<const bf16, 2> shifted(da.buffer.data() + 1, {{63, 96}}, {{96, 1}});
  const DeviceView<bf16, 2> c_rows(dc.buffer.data(), {{63, 80}}, {{80, 1}});
  blas::gemm(lt, Op::kN, Op::kT, shifted, db.cview(), c_rows, stream);
  CHECK(lt.stats().plans_built == 3);
  stream.synchronize();
  CHECK(lt.cached_plans() == 3);
  lt.clear_cache();
  CHECK(lt.cached_plans() == 0);
}

TEST_CASE("cuBLASLt gemm rejects what it cannot do with a trainkit::Error") {
  cuda::Stream stream;
  blas::CublasLt lt;
  Matrix<bf16> a(8, 8), b(8, 8), c(8, 8);
  DeviceMatrix<bf16> da(a, stream), db(b, stream), dc(c, stream);
  CHECK_THROWS_AS(blas::gemm(lt, Op::kN, Op::kN, da.cview(), db.cview(), dc.view(),
                             {.compute = ComputeType::kTf32}, stream),
                  trainkit::Error);
  Matrix<bf16> b_bad(7, 8);
  DeviceMatrix<bf16> dbad(b_bad, stream);
  CHECK_THROWS_AS(blas::gemm(lt, Op::kN, Op::kN, da.cview(), dbad.cview(), dc.view(), stream),
                  trainkit::Error);
  Matrix<bf16> aux(8, 8);
  DeviceMatrix<bf16> daux(aux, stream);
  CHECK_THROWS_AS(
      blas::gemm(lt, Op::kN, Op::kN, da.cview(), db.cview(), dc.view(),
                 {.epilogue = Epilogue::kGelu, .aux = daux.buffer.data(), .aux_ld = 12}, stream),
      trainkit::Error);
}
