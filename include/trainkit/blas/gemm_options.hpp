// SPDX-License-Identifier: MIT
// trainkit/blas/gemm_options.hpp: the vocabulary every gemm backend shares: transposes, fused
// epilogues, compute types, per-call options, the shape checks that turn a wrong view into a
// trainkit::Error naming the operand and shapes, and the tanh-GELU the epilogues apply. Split out
// of gemm.hpp so the host, CBLAS and cuBLASLt backends can each include it alone.
#pragma once

#include <cmath>
#include <cstdint>
#include <string>
#include <type_traits>

#include "trainkit/config.hpp"
#include "trainkit/core/half.hpp"
#include "trainkit/core/tensor_view.hpp"
#include "trainkit/error.hpp"

TRAINKIT_NAMESPACE_BEGIN
namespace blas {

/// How an operand enters the product: as stored (kN) or transposed (kT), like BLAS's 'N'/'T'.
enum class Op : std::uint8_t { kN, kT };

/// What happens to `alpha * op(A) @ op(B) + beta * C` before it is stored in C (row-major
/// [M, N]); the names follow cuBLASLt's epilogues. `bias` has N elements (one per output column,
/// i.e. per output feature of `y = x @ W^T + b`), `aux` is an [M, N] matrix.
enum class Epilogue : std::uint8_t {
  kNone,      ///< C = v, where v = alpha * op(A) @ op(B) + beta * C (C: options.c_in if set).
  kBias,      ///< C = v + bias.
  kGelu,      ///< C = gelu(v); aux (optional output) = v.
  kBiasGelu,  ///< C = gelu(v + bias); aux (optional output) = v + bias.
  kBiasGrad,  ///< C = v and bias_grad[i] = sum_k op(A)[i, k] (M elements, overwritten): the
              ///< bias gradient of `dW = dY^T @ X` when A = dY is passed with Op::kT.
  kDGelu,     ///< C = v * gelu'(aux), aux (input) = the pre-activation saved by kBiasGelu.
};

/// What the GELU epilogues keep in `aux` for the backward pass.
enum class GeluAux : std::uint8_t {
  kInput,  ///< kGelu/kBiasGelu save their input v; kDGelu evaluates gelu'(aux) (cuBLASLt's way).
  kSlope,  ///< kGelu/kBiasGelu save gelu'(v), from the exponential the GELU computes anyway;
           ///< kDGelu multiplies by aux: the backward pays no second exponential. Host only.
};

/// How products are computed. Accumulation is always in f32.
enum class ComputeType : std::uint8_t {
  kF32,   ///< Full f32 products (f16/bf16 inputs are exact in f32).
  kTf32,  ///< f32 inputs rounded to TF32 on tensor cores (cuBLASLt only; the host computes kF32).
};

/// Which host implementation runs f32 gemms (f16/bf16 operands always use the built-in one).
enum class HostBackend : std::uint8_t {
  kAuto,     ///< The built-in kernel (deterministic, uses exec::Host's threads).
  kBuiltin,  ///< The built-in blocked AVX2/FMA kernel (portable C++ on other CPUs).
  kCblas,    ///< cblas_sgemm + trainkit's epilogue; needs TRAINKIT_WITH_CBLAS, else throws.
};

/// Per-call options. T is C's element type; `bias`, `bias_grad` and `aux` hold T as well and
/// live where C lives (host or device memory). Use designated initializers:
/// `gemm(host, Op::kN, Op::kT, x, w, y, {.epilogue = Epilogue::kBias, .bias = b})`.
template <class T>
struct GemmOptions {
  /// alpha == 0 means the host gemm reads neither A nor B, as in BLAS.
  float alpha = 1.0f;
  /// beta == 0 means C is not read (it may hold NaNs), as in BLAS.
  float beta = 0.0f;
  /// [M, N] with C's row stride, or null: when set, beta scales c_in instead of C, and C is
  /// only written (cuBLASLt's separate C and D; PyTorch's `addmm(input, ...)`), e.g. a residual
  /// stream added by the gemm instead of copied into C first. c_in may be C itself; otherwise it
  /// must not overlap C. Rank-2 gemms only.
  const T* c_in = nullptr;
  Epilogue epilogue = Epilogue::kNone;
  /// [N], contiguous: kBias, kBiasGelu.
  const T* bias = nullptr;
  /// [M], contiguous, overwritten: kBiasGrad.
  T* bias_grad = nullptr;
  /// [M, N] with row stride aux_ld (0 means N): written by kGelu/kBiasGelu when not null, read
  /// by kDGelu (required there).
  T* aux = nullptr;
  std::int64_t aux_ld = 0;
  /// What aux holds for the GELU epilogues (the forward and its kDGelu must agree).
  GeluAux gelu_aux = GeluAux::kInput;
  ComputeType compute = ComputeType::kF32;
  HostBackend host_backend = HostBackend::kAuto;
};

inline constexpr const char* to_string(Op op) noexcept { return op == Op::kN ? "N" : "T"; }

// A switch, not a table, like the other enum-name functions: -Wswitch flags a new enumerator.
inline constexpr const char* to_string(Epilogue e) noexcept {
  switch (e) {
    case Epilogue::kNone: return "none";
    case Epilogue::kBias: return "bias";
    case Epilogue::kGelu: return "gelu";
    case Epilogue::kBiasGelu: return "bias+gelu";
    case Epilogue::kBiasGrad: return "bias-grad";
    case Epilogue::kDGelu: return "dgelu";
  }
  return "?";
}

/// GELU, tanh approximation (GPT-2, cuBLASLt's GELU epilogue, PyTorch approximate='tanh'):
/// 0.5 x (1 + tanh(u)), u = sqrt(2/pi) (x + 0.044715 x^3). Evaluated as x * sigmoid(2u), the
/// same function without tanh's cancellation for negative x. Inputs below -12 (where the
/// result is below 1e-33) are evaluated at -12 and the exponent is capped, so no finite input
/// gives Inf or NaN; NaN propagates.
TRAINKIT_HOST_DEVICE inline float gelu_tanh(float x) noexcept {
  x = x < -12.0f ? -12.0f : x;
  const float u = 0.7978845608028654f * (x + 0.044715f * x * x * x);
  const float z = -2.0f * u;
  return x / (1.0f + expf(z > 80.0f ? 80.0f : z));
}

/// gelu_tanh(x) and, in *slope, its derivative gelu_tanh_grad(x), from one exponential:
/// x * s with s = sigmoid(2u) (the same function as x / (1 + e), within an ulp), the derivative
/// as gelu_tanh_grad. For x > 12 the clamped s is exactly 1 and the result x, as gelu_tanh's.
TRAINKIT_HOST_DEVICE inline float gelu_tanh_slope(float x, float* slope) noexcept {
  x = x < -12.0f ? -12.0f : x;
  const float xd = x > 12.0f ? 12.0f : x;
  const float x2 = xd * xd;
  const float u = 0.7978845608028654f * (xd + 0.044715f * x2 * xd);
  const float z = -2.0f * u;
  const float e = expf(z > 80.0f ? 80.0f : z);
  const float s = 1.0f / (1.0f + e);
  const float du = 0.7978845608028654f * (1.0f + 3.0f * 0.044715f * x2);
  *slope = s + 2.0f * xd * du * s * (e * s);
  return x * s;
}

/// d gelu_tanh(x) / dx = s + 2 x e s^2 u'(x), with s = sigmoid(2u) = 1 / (1 + e), e = exp(-2u)
/// (e s^2 = s (1 - s) without the cancellation of 1 - s near 1). Inputs are clamped to
/// [-12, 12], where the derivative is already 0 or 1 to float precision; NaN propagates.
TRAINKIT_HOST_DEVICE inline float gelu_tanh_grad(float x) noexcept {
  float slope;
  (void)gelu_tanh_slope(x, &slope);  // the same clamps and formula
  return slope;
}

namespace detail {

/// Element types the gemm backends take: float, f16, bf16 (const or not).
template <class T>
inline constexpr bool is_gemm_type_v =
    std::is_same_v<std::remove_cv_t<T>, float> || std::is_same_v<std::remove_cv_t<T>, f16> ||
    std::is_same_v<std::remove_cv_t<T>, bf16>;

template <class T>
TRAINKIT_HOST_DEVICE inline float to_f32(T v) noexcept {
  if constexpr (std::is_same_v<std::remove_cv_t<T>, float>) {
    return v;
  } else {
    return static_cast<float>(v);
  }
}

template <class T>
TRAINKIT_HOST_DEVICE inline T from_f32(float v) noexcept {
  if constexpr (std::is_same_v<T, float>) {
    return v;
  } else {
    return T(v);
  }
}

/// The problem size of one gemm: op(A) is [m, k], op(B) is [k, n], C is [m, n].
struct GemmShape {
  std::int64_t m = 0, n = 0, k = 0;
};

/// "[r, c] (row stride s)" for error messages.
template <class V>
std::string describe_matrix(const V& v) {
  return ::trainkit::detail::concat("[", v.size(V::rank - 2), ", ", v.size(V::rank - 1),
                                    "] (row stride ", v.stride(V::rank - 2), ", column stride ",
                                    v.stride(V::rank - 1), ")");
}

/// Checks one operand's last two dimensions: unit column stride and a row stride of at least
/// the width (what BLAS calls the leading dimension), so rows never overlap.
template <class V>
void check_matrix_layout(const char* who, const char* name, const V& v) {
  const int r = V::rank - 2, c = V::rank - 1;
  TRAINKIT_CHECK(v.size(c) <= 1 || v.stride(c) == 1, who, ": ", name, " ", describe_matrix(v),
                 " must have unit column stride (rows contiguous); "
                 "pass Op::kT instead of a transposed view, or copy it");
  TRAINKIT_CHECK(v.size(r) <= 1 || v.stride(r) >= v.size(c), who, ": ", name, " ",
                 describe_matrix(v), " has a row stride smaller than its width");
  TRAINKIT_CHECK(v.size(r) == 0 || v.size(c) == 0 || v.data() != nullptr, who, ": ", name,
                 " is a null view of shape ", describe_matrix(v));
}

/// The row stride to hand a BLAS library: the view's, or the width when there is one row
/// (a single-row view may carry any stride, BLAS wants ld >= max(1, cols)).
template <class V>
std::int64_t leading_dim(const V& v) {
  const int r = V::rank - 2, c = V::rank - 1;
  const std::int64_t width = v.size(c) > 1 ? v.size(c) : 1;
  return v.size(r) <= 1 ? width : v.stride(r);
}

/// Checks that op(A) @ op(B) fits C and returns (m, n, k). Throws trainkit::Error naming the
/// operands and shapes otherwise.
template <class VA, class VB, class VC>
GemmShape check_gemm_shapes(const char* who, Op op_a, Op op_b, const VA& a, const VB& b,
                            const VC& c) {
  static_assert(VA::rank == VB::rank && VB::rank == VC::rank,
                "gemm: A, B and C must have one rank");
  const int r = VA::rank - 2, col = VA::rank - 1;
  check_matrix_layout(who, "A", a);
  check_matrix_layout(who, "B", b);
  check_matrix_layout(who, "C", c);
  GemmShape s;
  s.m = op_a == Op::kN ? a.size(r) : a.size(col);
  s.k = op_a == Op::kN ? a.size(col) : a.size(r);
  const std::int64_t kb = op_b == Op::kN ? b.size(r) : b.size(col);
  s.n = op_b == Op::kN ? b.size(col) : b.size(r);
  TRAINKIT_CHECK(kb == s.k, who, ": op(A) is [", s.m, ", ", s.k, "] (A ", describe_matrix(a),
                 ", op ", to_string(op_a), ") but op(B) is [", kb, ", ", s.n, "] (B ",
                 describe_matrix(b), ", op ", to_string(op_b), "): inner dimensions differ");
  TRAINKIT_CHECK(c.size(r) == s.m && c.size(col) == s.n, who, ": C is ", describe_matrix(c),
                 " but op(A) @ op(B) is [", s.m, ", ", s.n, "] (A op ", to_string(op_a), ", B op ",
                 to_string(op_b), ")");
  return s;
}

/// Checks the pointers an epilogue needs; `batched` epilogues are not supported.
template <class T>
void check_epilogue(const char* who, const GemmOptions<T>& o, const GemmShape& s, bool batched) {
  const Epilogue e = o.epilogue;
  TRAINKIT_CHECK(!batched || e == Epilogue::kNone, who, ": epilogue '", to_string(e),
                 "' is only supported for rank-2 (unbatched) gemm");
  TRAINKIT_CHECK(!batched || o.c_in == nullptr, who,
                 ": options.c_in is only supported for rank-2 (unbatched) gemm");
  const bool wants_bias = e == Epilogue::kBias || e == Epilogue::kBiasGelu;
  TRAINKIT_CHECK(!wants_bias || o.bias != nullptr || s.n == 0, who, ": epilogue '", to_string(e),
                 "' needs options.bias (", s.n, " elements)");
  TRAINKIT_CHECK(e != Epilogue::kBiasGrad || o.bias_grad != nullptr || s.m == 0, who,
                 ": epilogue 'bias-grad' needs options.bias_grad (", s.m, " elements)");
  TRAINKIT_CHECK(e != Epilogue::kDGelu || o.aux != nullptr || s.m == 0 || s.n == 0, who,
                 ": epilogue 'dgelu' needs options.aux, the [", s.m, ", ", s.n,
                 "] pre-activation saved by the forward gelu epilogue");
  const bool uses_aux = e == Epilogue::kGelu || e == Epilogue::kBiasGelu || e == Epilogue::kDGelu;
  TRAINKIT_CHECK(o.aux == nullptr || !uses_aux || o.aux_ld == 0 || o.aux_ld >= s.n, who,
                 ": options.aux_ld ", o.aux_ld, " is smaller than N = ", s.n);
}

}  // namespace detail
}  // namespace blas
TRAINKIT_NAMESPACE_END
