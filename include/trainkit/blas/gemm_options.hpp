// SPDX-License-Identifier: MIT
// trainkit/blas/gemm_options.hpp: the vocabulary every gemm backend shares: transposes, fused
// epilogues, compute types, per-call options, the shape checks that turn a wrong view into a
// trainkit::Error naming the operand and shapes, and the tanh-GELU the epilogues apply. Split out
// of gemm.hpp so the host, CBLAS and cuBLASLt backends can each include it alone.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <string>
#include <type_traits>
#include <utility>

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
  kBuiltin,  ///< The built-in blocked kernel: AVX-512 or AVX2+FMA by CPUID, portable C++ elsewhere.
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

/// The bytes an operand occupies: `rows` rows of `width` bytes, `ld` bytes apart (ld >= width
/// when rows > 1), the first at `base`. `name` and `shape` (rows, columns, row stride, column
/// stride in elements; a vector has rows == 0) describe it in an error message.
/// (No member initializers: the driver's arrays of them are filled before use, and zeroing them
/// on every call would cost more than the check.)
struct ByteRows {
  std::uintptr_t base;
  std::int64_t rows, width, ld;
  const char* name;
  std::int64_t shape[4];
};

/// The rows of a host matrix view (its last two dimensions).
template <class V>
ByteRows byte_rows(const char* name, const V& v) {
  const int r = V::rank - 2, c = V::rank - 1;
  constexpr auto elem = static_cast<std::int64_t>(sizeof(typename V::element_type));
  return {reinterpret_cast<std::uintptr_t>(v.data()),
          v.size(r),
          v.size(c) * elem,
          v.stride(r) * elem,
          name,
          {v.size(r), v.size(c), v.stride(r), v.stride(c)}};
}

/// True when two ByteRows share a byte. O(1) when their spans are disjoint (the usual case:
/// different buffers), else O(min(rows)): for each row of the one with fewer rows, the only row
/// of the other that can meet it is the first one ending after it starts.
inline bool byte_rows_overlap(const ByteRows& a, const ByteRows& b) noexcept {
  if (a.rows <= 0 || a.width <= 0 || b.rows <= 0 || b.width <= 0) return false;
  const auto end = [](const ByteRows& v) {  // a single row may carry any stride
    return v.base +
           static_cast<std::uintptr_t>(v.rows == 1 ? v.width : (v.rows - 1) * v.ld + v.width);
  };
  if (end(a) <= b.base || end(b) <= a.base) return false;
  ByteRows x = a, y = b;
  if (x.rows == 1) x.ld = x.width;
  if (y.rows == 1) y.ld = y.width;
  if (x.rows > y.rows) std::swap(x, y);
  const auto w = static_cast<std::uintptr_t>(y.width), ld = static_cast<std::uintptr_t>(y.ld);
  for (std::int64_t r = 0; r < x.rows; ++r) {
    const std::uintptr_t s = x.base + static_cast<std::uintptr_t>(r * x.ld);
    const std::uintptr_t e = s + static_cast<std::uintptr_t>(x.width);
    // The first row j of y with y.base + j * ld + w > s.
    const std::uintptr_t j = s < y.base + w ? 0 : (s - y.base - w) / ld + 1;
    if (j < static_cast<std::uintptr_t>(y.rows) && y.base + j * ld < e) return true;
  }
  return false;
}

/// "A [4, 5] (row stride 8, column stride 1)" or "options.bias [5]".
inline std::string describe_byte_rows(const ByteRows& v) {
  if (v.shape[0] == 0) return ::trainkit::detail::concat(v.name, " [", v.shape[1], "]");
  return ::trainkit::detail::concat(v.name, " [", v.shape[0], ", ", v.shape[1], "] (row stride ",
                                    v.shape[2], ", column stride ", v.shape[3], ")");
}

/// Throws trainkit::Error when an operand the gemm writes (C; aux or bias_grad where the epilogue
/// writes them) shares memory with another: the kernels would read values they have already
/// overwritten, or store one element twice, and give wrong results without an error. Once per
/// call, in the driver: O(1) unless two operands lie in one buffer.
inline void check_no_overlap(const char* who, const ByteRows* written, int n_written,
                             const ByteRows* others, int n_others) {
  for (int i = 0; i < n_written; ++i) {
    for (int j = 0; j < n_others + n_written; ++j) {
      if (j >= n_others && j - n_others <= i) continue;  // each pair of outputs once
      const ByteRows& o = j < n_others ? others[j] : written[j - n_others];
      TRAINKIT_CHECK(!byte_rows_overlap(written[i], o), who, ": ", describe_byte_rows(written[i]),
                     " overlaps ", describe_byte_rows(o), "; the gemm writes ", written[i].name,
                     ", so it must not share memory with another operand (only options.c_in may "
                     "be C itself)");
    }
  }
}

/// The overlap check of a rank-2 gemm: C, and aux or bias_grad where the epilogue writes them,
/// against A, B, bias, aux where kDGelu reads it, c_in unless it is C itself, and each other.
template <class VA, class VB, class VC, class T>
void check_gemm_aliasing(const char* who, const VA& a, const VB& b, const VC& c,
                         const GemmOptions<T>& o, const GemmShape& s) {
  if (s.m == 0 || s.n == 0) return;
  constexpr auto elem = static_cast<std::int64_t>(sizeof(T));
  const Epilogue e = o.epilogue;
  const auto at = [](const char* name, const void* p, std::int64_t rows, std::int64_t cols,
                     std::int64_t ld) {
    return ByteRows{reinterpret_cast<std::uintptr_t>(p),
                    rows == 0 ? 1 : rows,
                    cols * elem,
                    ld * elem,
                    name,
                    {rows, cols, ld, 1}};
  };
  ByteRows written[3], others[5];
  int nw = 0, no = 0;
  written[nw++] = byte_rows("C", c);
  others[no++] = byte_rows("A", a);
  others[no++] = byte_rows("B", b);
  if ((e == Epilogue::kBias || e == Epilogue::kBiasGelu) && o.bias != nullptr)
    others[no++] = at("options.bias", o.bias, 0, s.n, s.n);
  const bool aux_written = e == Epilogue::kGelu || e == Epilogue::kBiasGelu;
  if (o.aux != nullptr && (aux_written || e == Epilogue::kDGelu)) {
    const ByteRows aux = at("options.aux", o.aux, s.m, s.n, o.aux_ld == 0 ? s.n : o.aux_ld);
    if (aux_written) {
      written[nw++] = aux;
    } else {
      others[no++] = aux;
    }
  }
  if (e == Epilogue::kBiasGrad && o.bias_grad != nullptr)
    written[nw++] = at("options.bias_grad", o.bias_grad, 0, s.m, s.m);
  if (o.c_in != nullptr && o.beta != 0.0f && o.c_in != c.data())
    others[no++] = at("options.c_in", o.c_in, s.m, s.n, leading_dim(c));
  check_no_overlap(who, written, nw, others, no);
}

/// Throws trainkit::Error when two items of a batched C share memory. Items i and i + d overlap
/// exactly when items 0 and d do (the same rows, moved by d * stride), so only the d below the
/// first whose items lie apart are compared: items side by side within one row stride (heads in
/// [T, H * hs]) are fine.
template <class VC>
void check_batched_output_items(const char* who, const VC& c, const GemmShape& s) {
  const std::int64_t batch = c.size(0), sc = c.stride(0), ld = leading_dim(c);
  const std::int64_t extent = (s.m - 1) * ld + s.n;
  if (batch <= 1 || s.m == 0 || s.n == 0 || sc >= extent) return;
  const ByteRows first = byte_rows("C", c);
  for (std::int64_t d = 1; d < batch && d * (sc < 0 ? -sc : sc) < extent; ++d) {
    ByteRows item = first;
    item.base += static_cast<std::uintptr_t>(d * sc) * sizeof(typename VC::element_type);
    TRAINKIT_CHECK(!byte_rows_overlap(first, item), who, ": C's batch stride ", sc,
                   " makes items 0 and ", d, " of ", s.m, " x ", s.n, " (row stride ", ld,
                   ") overlap");
  }
}

/// floor(a / b) and ceil(a / b) for b != 0.
inline std::int64_t floor_div(std::int64_t a, std::int64_t b) noexcept {
  const std::int64_t q = a / b;
  return (a % b != 0 && ((a < 0) != (b < 0))) ? q - 1 : q;
}
inline std::int64_t ceil_div(std::int64_t a, std::int64_t b) noexcept { return -floor_div(-a, b); }

/// The overlap check of a batched gemm for one input `x` (A or B; batch 1: one item shared by
/// all): throws trainkit::Error when an item of C shares memory with an item of x. O(1) when the
/// two operands lie apart (the usual case); otherwise it compares the pairs of items whose spans
/// meet, found by arithmetic on the batch strides, and stops comparing (accepts the call) past a
/// budget rather than let the check cost more than a gemm.
template <class VC, class VX>
void check_batched_input_overlap(const char* who, const VC& c, const VX& x, const char* name) {
  ByteRows ci = byte_rows("C", c), xj = byte_rows(name, x);
  if (ci.rows <= 0 || ci.width <= 0 || xj.rows <= 0 || xj.width <= 0) return;
  if (ci.rows == 1) ci.ld = ci.width;
  if (xj.rows == 1) xj.ld = xj.width;
  const std::int64_t bc = c.size(0), bx = x.size(0);
  const std::int64_t sc = c.stride(0) * std::int64_t{sizeof(typename VC::element_type)};
  const std::int64_t sx =
      bx == 1 ? 0 : x.stride(0) * std::int64_t{sizeof(typename VX::element_type)};
  const std::int64_t ec = (ci.rows - 1) * ci.ld + ci.width, ex = (xj.rows - 1) * xj.ld + xj.width;
  // Positions relative to item 0 of C: item i of C at i * sc, item j of x at rel + j * sx.
  const std::uintptr_t c_base = ci.base, x_base = xj.base;
  const auto rel = static_cast<std::int64_t>(x_base - c_base);
  const std::int64_t c_lo = std::min<std::int64_t>(0, (bc - 1) * sc);
  const std::int64_t c_hi = std::max<std::int64_t>(0, (bc - 1) * sc) + ec;
  const std::int64_t x_lo = rel + std::min<std::int64_t>(0, (bx - 1) * sx);
  const std::int64_t x_hi = rel + std::max<std::int64_t>(0, (bx - 1) * sx) + ex;
  if (c_hi <= x_lo || x_hi <= c_lo) return;
  std::int64_t budget = std::int64_t{1} << 18;  // rows compared
  const std::int64_t cost = std::min(ci.rows, xj.rows);
  for (std::int64_t i = 0; i < bc; ++i) {
    // Items j of x whose span meets item i's: i * sc - ex < rel + j * sx < i * sc + ec.
    const std::int64_t lo = i * sc - ex - rel, hi = i * sc + ec - rel;
    std::int64_t j0 = 0, j1 = 0;
    if (sx > 0) {
      j0 = floor_div(lo, sx) + 1;
      j1 = ceil_div(hi, sx) - 1;
    } else if (sx < 0) {
      j0 = floor_div(hi, sx) + 1;
      j1 = ceil_div(lo, sx) - 1;
    } else if (!(lo < 0 && 0 < hi)) {
      continue;
    }
    j0 = std::max<std::int64_t>(j0, 0);
    j1 = std::min<std::int64_t>(j1, bx - 1);
    for (std::int64_t j = j0; j <= j1; ++j) {
      if ((budget -= cost) < 0) return;
      ci.base = c_base + static_cast<std::uintptr_t>(i * sc);
      xj.base = x_base + static_cast<std::uintptr_t>(j * sx);
      TRAINKIT_CHECK(!byte_rows_overlap(ci, xj), who, ": item ", i, " of ", describe_byte_rows(ci),
                     " overlaps item ", j, " of ", describe_byte_rows(xj),
                     "; the gemm writes C, so it must not share memory with A or B");
    }
  }
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
