// SPDX-License-Identifier: MIT
// trainkit/blas/cblas.hpp: the CBLAS backend of the host gemm (TRAINKIT_WITH_CBLAS=1, e.g.
// OpenBLAS from Debian's libopenblas-dev). Only f32 x f32 -> f32 goes to cblas_sgemm; trainkit
// applies the epilogue afterwards. The library runs on its own threads (OPENBLAS_NUM_THREADS),
// not on exec::Host's, and its results may depend on its thread count.
#pragma once

#include <cstdint>
#include <limits>

#include "trainkit/blas/gemm_options.hpp"
#include "trainkit/config.hpp"
#include "trainkit/error.hpp"

#if TRAINKIT_WITH_CBLAS
#include <cblas.h>
#endif

TRAINKIT_NAMESPACE_BEGIN
namespace blas {
namespace detail {

/// True when this build can call cblas_sgemm.
inline constexpr bool kHaveCblas = TRAINKIT_WITH_CBLAS != 0;

#if TRAINKIT_WITH_CBLAS
/// Row-major cblas_sgemm: C[m, n] = alpha * op(A) @ op(B) + beta * C with row strides lda, ldb,
/// ldc. Throws trainkit::Error when a size does not fit the library's 32-bit integers.
inline void cblas_sgemm_row_major(Op op_a, Op op_b, std::int64_t m, std::int64_t n, std::int64_t k,
                                  float alpha, const float* a, std::int64_t lda, const float* b,
                                  std::int64_t ldb, float beta, float* c, std::int64_t ldc) {
  constexpr std::int64_t kMax = std::numeric_limits<int>::max();
  TRAINKIT_CHECK(m <= kMax && n <= kMax && k <= kMax && lda <= kMax && ldb <= kMax && ldc <= kMax,
                 "gemm (CBLAS): sizes m=", m, " n=", n, " k=", k, " or strides lda=", lda,
                 " ldb=", ldb, " ldc=", ldc,
                 " exceed CBLAS's 32-bit int; use HostBackend::kBuiltin");
  cblas_sgemm(CblasRowMajor, op_a == Op::kN ? CblasNoTrans : CblasTrans,
              op_b == Op::kN ? CblasNoTrans : CblasTrans, static_cast<int>(m), static_cast<int>(n),
              static_cast<int>(k), alpha, a, static_cast<int>(lda), b, static_cast<int>(ldb), beta,
              c, static_cast<int>(ldc));
}
#endif

}  // namespace detail
}  // namespace blas
TRAINKIT_NAMESPACE_END
