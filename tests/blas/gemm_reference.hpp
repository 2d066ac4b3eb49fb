// Shared by the blas tests (host and CUDA): padded row-major test matrices and a float64
// reference gemm with the same epilogue semantics as blas::gemm.
#pragma once

#include <cmath>
#include <cstdint>
#include <limits>
#include <random>
#include <vector>

#include <trainkit/blas/gemm_options.hpp>
#include <trainkit/core/half.hpp>
#include <trainkit/core/tensor_view.hpp>

namespace gemm_test {

using trainkit::bf16;
using trainkit::f16;
using trainkit::blas::Epilogue;
using trainkit::blas::Op;

template <class T>
double to_double(T v) {
  return static_cast<double>(static_cast<float>(v));
}

template <class T>
T from_double(double v) {
  if constexpr (std::is_same_v<T, float>) {
    return static_cast<float>(v);
  } else {
    return T(static_cast<float>(v));
  }
}

/// A rows x cols row-major matrix with row stride ld >= cols; the padding holds `pad` (NaN by
/// default, so a kernel that reads it produces NaNs and one that writes it is caught).
template <class T>
struct Matrix {
  std::int64_t rows = 0, cols = 0, ld = 0;
  std::vector<T> data;

  Matrix(std::int64_t r, std::int64_t c, std::int64_t extra_ld = 0,
         float pad = std::numeric_limits<float>::quiet_NaN())
      : rows(r), cols(c), ld(c + extra_ld) {
    data.assign(static_cast<std::size_t>(std::max<std::int64_t>(1, rows * ld)),
                from_double<T>(pad));
  }

  T& at(std::int64_t i, std::int64_t j) { return data[static_cast<std::size_t>(i * ld + j)]; }
  const T& at(std::int64_t i, std::int64_t j) const {
    return data[static_cast<std::size_t>(i * ld + j)];
  }
  double get(std::int64_t i, std::int64_t j) const { return to_double(at(i, j)); }

  void fill_random(std::uint64_t seed, double lo = -1.0, double hi = 1.0) {
    std::mt19937_64 rng(seed);
    std::uniform_real_distribution<double> dist(lo, hi);
    for (std::int64_t i = 0; i < rows; ++i)
      for (std::int64_t j = 0; j < cols; ++j) at(i, j) = from_double<T>(dist(rng));
  }
  void fill(double v) {
    for (std::int64_t i = 0; i < rows; ++i)
      for (std::int64_t j = 0; j < cols; ++j) at(i, j) = from_double<T>(v);
  }

  trainkit::HostView<T, 2> view() { return {data.data(), {{rows, cols}}, {{ld, 1}}}; }
  trainkit::HostView<const T, 2> cview() const { return {data.data(), {{rows, cols}}, {{ld, 1}}}; }
};

/// Stored shape of an operand that enters as op(X) = [r, c].
inline std::int64_t stored_rows(Op op, std::int64_t r, std::int64_t c) {
  return op == Op::kN ? r : c;
}
inline std::int64_t stored_cols(Op op, std::int64_t r, std::int64_t c) {
  return op == Op::kN ? c : r;
}

template <class T>
double op_get(const Matrix<T>& x, Op op, std::int64_t i, std::int64_t j) {
  return op == Op::kN ? x.get(i, j) : x.get(j, i);
}

inline double gelu_ref(double x) {
  return 0.5 * x * (1.0 + std::tanh(0.7978845608028654 * (x + 0.044715 * x * x * x)));
}
inline double gelu_grad_ref(double x) {
  const double t = std::tanh(0.7978845608028654 * (x + 0.044715 * x * x * x));
  return 0.5 * (1.0 + t) +
         0.5 * x * (1.0 - t * t) * 0.7978845608028654 * (1.0 + 3 * 0.044715 * x * x);
}

/// The float64 result of blas::gemm: out (m x n), aux_out (pre-activation, for gelu forward),
/// bias_grad_out (m, for kBiasGrad). `c0` is C before the call (read only when beta != 0).
struct Reference {
  std::vector<double> out, aux, bias_grad;
  std::int64_t m = 0, n = 0;
  double at(std::int64_t i, std::int64_t j) const {
    return out[static_cast<std::size_t>(i * n + j)];
  }
};

template <class TA, class TB, class TC>
Reference reference_gemm(Op op_a, Op op_b, const Matrix<TA>& a, const Matrix<TB>& b,
                         const Matrix<TC>& c0, double alpha, double beta, Epilogue e,
                         const std::vector<double>& bias = {}, const Matrix<TC>* aux_in = nullptr) {
  Reference r;
  r.m = c0.rows;
  r.n = c0.cols;
  const std::int64_t k = op_a == Op::kN ? a.cols : a.rows;
  r.out.resize(static_cast<std::size_t>(r.m * r.n));
  r.aux.resize(r.out.size());
  for (std::int64_t i = 0; i < r.m; ++i) {
    for (std::int64_t j = 0; j < r.n; ++j) {
      double s = 0;
      for (std::int64_t p = 0; p < k; ++p) s += op_get(a, op_a, i, p) * op_get(b, op_b, p, j);
      double v = alpha * s + (beta != 0 ? beta * c0.get(i, j) : 0.0);
      if (e == Epilogue::kBias || e == Epilogue::kBiasGelu) v += bias[static_cast<std::size_t>(j)];
      r.aux[static_cast<std::size_t>(i * r.n + j)] = v;
      if (e == Epilogue::kGelu || e == Epilogue::kBiasGelu) v = gelu_ref(v);
      if (e == Epilogue::kDGelu) v *= gelu_grad_ref(aux_in->get(i, j));
      r.out[static_cast<std::size_t>(i * r.n + j)] = v;
    }
  }
  if (e == Epilogue::kBiasGrad) {
    r.bias_grad.assign(static_cast<std::size_t>(r.m), 0.0);
    for (std::int64_t i = 0; i < r.m; ++i)
      for (std::int64_t p = 0; p < k; ++p)
        r.bias_grad[static_cast<std::size_t>(i)] += op_get(a, op_a, i, p);
  }
  return r;
}

/// ||got - ref||_F / ||ref||_F over the m x n block (plain difference norm when ref is 0).
template <class TC>
double rel_error(const Matrix<TC>& got, const std::vector<double>& ref, std::int64_t m,
                 std::int64_t n) {
  double num = 0, den = 0;
  for (std::int64_t i = 0; i < m; ++i)
    for (std::int64_t j = 0; j < n; ++j) {
      const double g = got.get(i, j), r = ref[static_cast<std::size_t>(i * n + j)];
      num += (g - r) * (g - r);
      den += r * r;
    }
  if (std::isnan(num)) return std::numeric_limits<double>::infinity();
  return den > 0 ? std::sqrt(num / den) : std::sqrt(num);
}

template <class T>
double rel_error_vec(const std::vector<T>& got, const std::vector<double>& ref) {
  double num = 0, den = 0;
  for (std::size_t i = 0; i < ref.size(); ++i) {
    const double d = to_double(got[i]) - ref[i];
    num += d * d;
    den += ref[i] * ref[i];
  }
  if (std::isnan(num)) return std::numeric_limits<double>::infinity();
  return den > 0 ? std::sqrt(num / den) : std::sqrt(num);
}

/// True when every padding element of x (columns >= cols) still holds NaN.
template <class T>
bool padding_untouched(const Matrix<T>& x) {
  for (std::int64_t i = 0; i < x.rows; ++i)
    for (std::int64_t j = x.cols; j < x.ld; ++j)
      if (!std::isnan(x.get(i, j))) return false;
  return true;
}

}  // namespace gemm_test
