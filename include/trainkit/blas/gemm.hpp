// SPDX-License-Identifier: MIT
// trainkit/blas/gemm.hpp: `blas::gemm`, the one matrix-multiply entry point, row-major like
// PyTorch: C = epilogue(alpha * op(A) @ op(B) + beta * C). Host views run the built-in blocked
// kernel (or cblas_sgemm when asked and TRAINKIT_WITH_CBLAS); device views run cuBLASLt
// (blas/cublaslt.hpp, TRAINKIT_WITH_CUBLASLT). Rank-3 views are batched: [batch, rows, cols].
#pragma once

#include <cstdint>
#include <type_traits>

#include "trainkit/blas/cblas.hpp"
#include "trainkit/blas/cublaslt.hpp"
#include "trainkit/blas/gemm_options.hpp"
#include "trainkit/blas/host_gemm.hpp"
#include "trainkit/config.hpp"
#include "trainkit/core/tensor_view.hpp"
#include "trainkit/error.hpp"
#include "trainkit/exec/host.hpp"

TRAINKIT_NAMESPACE_BEGIN
namespace blas {
namespace detail {

template <class T, class View>
OperandRef<T> operand_ref(Op op, const View& v, std::int64_t offset = 0) {
  constexpr int r = View::rank - 2;
  // A dimension of extent <= 1 may carry any stride; the kernels never step along it, but the
  // packing fast paths test for unit strides, so normalise it.
  const std::int64_t row_stride = v.size(r) <= 1 ? 0 : v.stride(r);
  return op == Op::kN ? OperandRef<T>{v.data() + offset, row_stride, 1}
                      : OperandRef<T>{v.data() + offset, 1, row_stride};
}

/// The driver's view of C and the epilogue; pointers the epilogue does not use are dropped, so
/// e.g. a bias passed with Epilogue::kGelu is ignored rather than added.
template <class TC>
GemmOutput<TC> gemm_output(TC* c, std::int64_t ldc, const GemmOptions<TC>& o, std::int64_t n) {
  const Epilogue e = o.epilogue;
  const bool bias = e == Epilogue::kBias || e == Epilogue::kBiasGelu;
  const bool aux = e == Epilogue::kGelu || e == Epilogue::kBiasGelu || e == Epilogue::kDGelu;
  GemmOutput<TC> out{c,
                     ldc,
                     o.alpha,
                     o.beta,
                     e,
                     bias ? o.bias : nullptr,
                     aux ? o.aux : nullptr,
                     o.aux_ld == 0 ? n : o.aux_ld};
  out.aux_slope = aux && o.gelu_aux == GeluAux::kSlope;
  if (o.beta != 0.0f && o.c_in != c) out.c_in = o.c_in;
  return out;
}

template <class TA, class TB, class TC>
void check_host_types() {
  static_assert(is_gemm_type_v<TA> && is_gemm_type_v<TB> && is_gemm_type_v<TC>,
                "blas::gemm: element types must be float, trainkit::f16 or trainkit::bf16");
  static_assert(!std::is_const_v<TC>, "blas::gemm: C is written; pass a view of non-const T");
}

/// The rank-2 host gemm after the views were checked.
template <class A, class B, class C>
void host_gemm_checked(const exec::Host& host, Op op_a, Op op_b, const HostView<A, 2>& a,
                       const HostView<B, 2>& b, const HostView<C, 2>& c, const GemmShape& s,
                       const GemmOptions<C>& o) {
  using TA = std::remove_const_t<A>;
  using TB = std::remove_const_t<B>;
  const OperandRef<TA> ra = operand_ref<TA>(op_a, a);
  const OperandRef<TB> rb = operand_ref<TB>(op_b, b);
  GemmOutput<C> out = gemm_output(c.data(), leading_dim(c), o, s.n);

  bool use_cblas = o.host_backend == HostBackend::kCblas;
  TRAINKIT_CHECK(!use_cblas || kHaveCblas, "blas::gemm: HostBackend::kCblas requested but this ",
                 "build has TRAINKIT_WITH_CBLAS=0 (link the CMake target trainkit::blas, "
                 "or define TRAINKIT_WITH_CBLAS=1 and link a CBLAS)");
  use_cblas = use_cblas && std::is_same_v<TA, float> && std::is_same_v<TB, float> &&
              std::is_same_v<C, float>;
  // kBiasGrad: the built-in gemm sums the rows of an f32 A^T while it packs them (one read of
  // A, e.g. dY in dW = dY^T X), the same sums as the separate pass, which does the rest.
  if (o.epilogue == Epilogue::kBiasGrad) {
    if constexpr (std::is_same_v<TA, float> && std::is_same_v<C, float>) {
      if (!use_cblas && ra.rs == 1 && ra.cs != 1 && s.n > 0 && s.k > 0 && o.alpha != 0.0f)
        out.bias_grad = o.bias_grad;
    }
    if (out.bias_grad == nullptr) host_bias_grad(&host, ra, s.m, s.k, o.bias_grad);
  }
#if TRAINKIT_WITH_CBLAS
  if constexpr (std::is_same_v<TA, float> && std::is_same_v<TB, float> &&
                std::is_same_v<C, float>) {
    if (use_cblas) {
      if (s.m == 0 || s.n == 0) return;
      if (out.c_in != nullptr) {  // the BLAS reads beta * C from C: copy c_in there first
        host.parallel_for(s.m, [&](std::int64_t i) {
          std::copy(out.c_in + i * out.ldc, out.c_in + i * out.ldc + s.n, c.data() + i * out.ldc);
        });
      }
      cblas_sgemm_row_major(op_a, op_b, s.m, s.n, s.k, o.alpha, a.data(), leading_dim(a), b.data(),
                            leading_dim(b), o.beta, c.data(), leading_dim(c));
      if (gemm_has_epilogue(out)) {
        host.parallel_for(s.m, [&](std::int64_t i) {
          gemm_finish_row(out, i, 0, s.n, c.data() + i * out.ldc, true);
        });
      }
      return;
    }
  }
#endif
  (void)use_cblas;
  host_gemm_2d(&host, s, ra, rb, out);
}

}  // namespace detail

/// C[m, n] = epilogue(alpha * op(A) @ op(B) + beta * C) on the CPU, row-major.
///
/// - A is [m, k] (Op::kN) or [k, m] (Op::kT); B is [k, n] (kN) or [n, k] (kT); C is [m, n].
///   PyTorch's `y = x @ W^T` (Linear, W [out, in]) is `gemm(host, Op::kN, Op::kT, x, W, y)`.
/// - Each view needs unit column stride and a row stride >= its width (the BLAS leading
///   dimension); anything else throws trainkit::Error naming the operand and its shape.
/// - Elements: float, f16 or bf16, mixed freely; products and sums are f32, C is rounded once.
/// - Runs on `host`'s threads. Deterministic: the same inputs give the same bits for any thread
///   count (each element of C is summed over k in one fixed order by one thread).
/// - C (and aux or bias_grad where the epilogue writes them) must not share memory with A, B,
///   bias, c_in (which may be C itself) or each other: such a call throws trainkit::Error
///   naming both operands. The options' pointers are host pointers.
template <class A, class B, class C>
void gemm(const exec::Host& host, Op op_a, Op op_b, HostView<A, 2> a, HostView<B, 2> b,
          HostView<C, 2> c, const GemmOptions<C>& options = {}) {
  detail::check_host_types<A, B, C>();
  const detail::GemmShape s = detail::check_gemm_shapes("blas::gemm", op_a, op_b, a, b, c);
  detail::check_epilogue("blas::gemm", options, s, false);
  detail::check_gemm_aliasing("blas::gemm", a, b, c, options, s);
  detail::host_gemm_checked(host, op_a, op_b, a, b, c, s, options);
}

/// Batched gemm on the CPU: C[i] = alpha * op(A[i]) @ op(B[i]) + beta * C[i] for every i of
/// the leading dimension, with the same rules as the rank-2 form. A or B may have batch 1 and
/// is then shared by every item (broadcast). Items of C must not overlap each other or an item
/// of A or B (trainkit::Error names the two items). Always the built-in kernel
/// (options.host_backend is ignored); only Epilogue::kNone is supported.
template <class A, class B, class C>
void gemm(const exec::Host& host, Op op_a, Op op_b, HostView<A, 3> a, HostView<B, 3> b,
          HostView<C, 3> c, const GemmOptions<C>& options = {}) {
  detail::check_host_types<A, B, C>();
  const detail::GemmShape s =
      detail::check_gemm_shapes("blas::gemm (batched)", op_a, op_b, a, b, c);
  detail::check_epilogue("blas::gemm (batched)", options, s, true);
  const std::int64_t batch = c.size(0);
  TRAINKIT_CHECK((a.size(0) == batch || a.size(0) == 1) && (b.size(0) == batch || b.size(0) == 1),
                 "blas::gemm (batched): batch sizes A ", a.size(0), ", B ", b.size(0), ", C ",
                 batch, " differ (A and B may also have batch 1)");
  if (batch == 0 || s.m == 0 || s.n == 0) return;
  detail::check_batched_output_items("blas::gemm (batched)", c, s);
  detail::check_batched_input_overlap("blas::gemm (batched)", c, a, "A");
  detail::check_batched_input_overlap("blas::gemm (batched)", c, b, "B");
  using TA = std::remove_const_t<A>;
  using TB = std::remove_const_t<B>;
  const std::int64_t sa = a.size(0) == 1 ? 0 : a.stride(0);
  const std::int64_t sb = b.size(0) == 1 ? 0 : b.stride(0);
  const std::int64_t sc = c.stride(0);
  const detail::GemmOutput<C> out =
      detail::gemm_output(c.data(), detail::leading_dim(c), options, s.n);
  auto item = [&](const exec::Host* on, std::int64_t i) {
    detail::GemmOutput<C> oi = out;
    oi.c = out.c + i * sc;
    detail::host_gemm_2d(on, s, detail::operand_ref<TA>(op_a, a, i * sa),
                         detail::operand_ref<TB>(op_b, b, i * sb), oi);
  };
  // Many small items: one item per task, each on one thread. Few big ones: one after another,
  // each spread over the threads.
  const double flops = 2.0 * double(s.m) * double(s.n) * double(s.k);
  if (host.num_threads() > 1 && (batch >= 4 * host.num_threads() || flops < (1 << 22))) {
    host.parallel_for(batch, [&](std::int64_t i) { item(nullptr, i); });
  } else {
    for (std::int64_t i = 0; i < batch; ++i) item(&host, i);
  }
}

/// gemm on exec::Host::default_instance().
template <class A, class B, class C, int Rank>
void gemm(Op op_a, Op op_b, HostView<A, Rank> a, HostView<B, Rank> b, HostView<C, Rank> c,
          const GemmOptions<C>& options = {}) {
  gemm(exec::Host::default_instance(), op_a, op_b, a, b, c, options);
}

}  // namespace blas
TRAINKIT_NAMESPACE_END
