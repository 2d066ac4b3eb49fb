// SPDX-License-Identifier: MIT
// trainkit/blas/cublaslt.hpp: the CUDA backend of blas::gemm (TRAINKIT_WITH_CUBLASLT=1).
// `CublasLt` owns a cuBLASLt handle, a workspace and a cache of plans (matmul descriptor, matrix
// layouts and the heuristic's algorithm) keyed by everything the heuristic looks at, so a
// training step's repeated shapes plan once and then only enqueue cublasLtMatmul. Row-major
// views map onto cuBLASLt's column-major API by computing C^T = op(B)^T @ op(A)^T (no copies).
// Host code only: usable from .cpp files as well as .cu files.
#pragma once

#include "trainkit/blas/gemm_options.hpp"
#include "trainkit/config.hpp"
#include "trainkit/error.hpp"

#if TRAINKIT_WITH_CUBLASLT
#include <cublasLt.h>
#include <cuda_runtime_api.h>

#include <array>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <memory>
#include <string>
#include <type_traits>
#include <unordered_map>
#include <utility>

#include "trainkit/core/half.hpp"
#include "trainkit/core/tensor_view.hpp"
#include "trainkit/cuda/stream.hpp"

TRAINKIT_NAMESPACE_BEGIN
namespace blas {

/// Counters of a CublasLt's plan cache; a steady-state training step only adds cache hits.
struct CublasLtStats {
  std::uint64_t plans_built = 0;  ///< Cache misses: descriptors created and heuristic queried.
  std::uint64_t cache_hits = 0;   ///< Calls that reused a plan (no planning at all).
};

namespace detail {

template <class T>
constexpr cudaDataType_t cuda_data_type() {
  using U = std::remove_cv_t<T>;
  if constexpr (std::is_same_v<U, float>) {
    return CUDA_R_32F;
  } else if constexpr (std::is_same_v<U, f16>) {
    return CUDA_R_16F;
  } else {
    static_assert(std::is_same_v<U, bf16>, "cuBLASLt gemm: float, f16 or bf16 only");
    return CUDA_R_16BF;
  }
}

/// Largest power of two (<= 256) dividing the address: cuBLASLt's heuristic assumes 256-byte
/// aligned operands unless told otherwise, and a kernel chosen for that fails on a sliced view.
inline std::uint32_t pointer_alignment(const void* p) noexcept {
  const auto address = reinterpret_cast<std::uintptr_t>(p);
  std::uint32_t alignment = 256;
  while (alignment > 1 && address % alignment != 0) alignment /= 2;
  return alignment;
}

/// Everything a plan depends on. Pointers enter only through their alignment.
struct CublasLtPlanKey {
  std::array<std::int64_t, 24> v{};
  friend bool operator==(const CublasLtPlanKey& a, const CublasLtPlanKey& b) noexcept {
    return a.v == b.v;
  }
};

struct CublasLtPlanKeyHash {
  std::size_t operator()(const CublasLtPlanKey& key) const noexcept {
    std::uint64_t h = 1469598103934665603ull;  // FNV-1a over the fields
    for (std::int64_t x : key.v) {
      h ^= static_cast<std::uint64_t>(x);
      h *= 1099511628211ull;
    }
    return static_cast<std::size_t>(h);
  }
};

/// One cached plan: the descriptors cublasLtMatmul needs and the algorithm picked for them.
class CublasLtPlan {
 public:
  CublasLtPlan() = default;
  CublasLtPlan(const CublasLtPlan&) = delete;
  CublasLtPlan& operator=(const CublasLtPlan&) = delete;
  ~CublasLtPlan() {
    if (a_ != nullptr) TRAINKIT_CUBLAS_CHECK_NOTHROW(cublasLtMatrixLayoutDestroy(a_));
    if (b_ != nullptr) TRAINKIT_CUBLAS_CHECK_NOTHROW(cublasLtMatrixLayoutDestroy(b_));
    if (c_ != nullptr) TRAINKIT_CUBLAS_CHECK_NOTHROW(cublasLtMatrixLayoutDestroy(c_));
    if (desc_ != nullptr) TRAINKIT_CUBLAS_CHECK_NOTHROW(cublasLtMatmulDescDestroy(desc_));
  }

  cublasLtMatmulDesc_t desc_ = nullptr;
  cublasLtMatrixLayout_t a_ = nullptr;  // cuBLASLt's A: our op(B)
  cublasLtMatrixLayout_t b_ = nullptr;  // cuBLASLt's B: our op(A)
  cublasLtMatrixLayout_t c_ = nullptr;  // C and D
  cublasLtMatmulAlgo_t algo_{};
  cublasLtEpilogue_t epilogue_ = CUBLASLT_EPILOGUE_DEFAULT;
};

/// A column-major layout of `rows` x `cols` with leading dimension ld, batched when batch > 1.
inline cublasLtMatrixLayout_t make_layout(cudaDataType_t type, std::int64_t rows, std::int64_t cols,
                                          std::int64_t ld, std::int64_t batch,
                                          std::int64_t batch_stride) {
  cublasLtMatrixLayout_t layout = nullptr;
  TRAINKIT_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&layout, type, static_cast<std::uint64_t>(rows),
                                                   static_cast<std::uint64_t>(cols), ld));
  if (batch > 1) {
    const auto count = static_cast<std::int32_t>(batch);
    TRAINKIT_CUBLAS_CHECK(cublasLtMatrixLayoutSetAttribute(
        layout, CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT, &count, sizeof(count)));
    TRAINKIT_CUBLAS_CHECK(cublasLtMatrixLayoutSetAttribute(
        layout, CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET, &batch_stride, sizeof(batch_stride)));
  }
  return layout;
}

template <class T>
void set_desc(cublasLtMatmulDesc_t desc, cublasLtMatmulDescAttributes_t attribute, const T& value) {
  TRAINKIT_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(desc, attribute, &value, sizeof(value)));
}

/// One gemm problem in cuBLASLt's column-major terms (see the header comment): cuBLASLt's A is
/// our B, its B is our A, its m is our n, its n is our m.
struct CublasLtProblem {
  Op op_a, op_b;
  std::int64_t m, n, k;        // ours: op(A) [m, k], op(B) [k, n], C [m, n]
  std::int64_t lda, ldb, ldc;  // our row strides
  std::int64_t batch;          // 1 for rank-2
  std::int64_t stride_a, stride_b, stride_c;
  cudaDataType_t type_ab, type_c;
  ComputeType compute;
  Epilogue epilogue;
  bool has_aux;
  std::int64_t aux_ld;
  const void* a;
  const void* b;
  void* c;
  const void* c_in;  // what beta multiplies (C's layout): c, or GemmOptions::c_in
  const void* bias;  // bias (kBias, kBiasGelu) or bias_grad (kBiasGrad)
  void* aux;
};

inline cublasLtEpilogue_t cublaslt_epilogue(Epilogue e, bool has_aux) {
  switch (e) {
    case Epilogue::kNone: return CUBLASLT_EPILOGUE_DEFAULT;
    case Epilogue::kBias: return CUBLASLT_EPILOGUE_BIAS;
    case Epilogue::kGelu: return has_aux ? CUBLASLT_EPILOGUE_GELU_AUX : CUBLASLT_EPILOGUE_GELU;
    case Epilogue::kBiasGelu:
      return has_aux ? CUBLASLT_EPILOGUE_GELU_AUX_BIAS : CUBLASLT_EPILOGUE_GELU_BIAS;
    case Epilogue::kBiasGrad: return CUBLASLT_EPILOGUE_BGRADB;
    case Epilogue::kDGelu: return CUBLASLT_EPILOGUE_DGELU;
  }
  return CUBLASLT_EPILOGUE_DEFAULT;
}

inline std::string describe(const CublasLtProblem& p) {
  return ::trainkit::detail::concat(
      "m=", p.m, " n=", p.n, " k=", p.k, " op(A)=", to_string(p.op_a), " op(B)=", to_string(p.op_b),
      " lda=", p.lda, " ldb=", p.ldb, " ldc=", p.ldc, " batch=", p.batch, " A/B type ",
      static_cast<int>(p.type_ab), " C type ", static_cast<int>(p.type_c), " epilogue ",
      to_string(p.epilogue), p.compute == ComputeType::kTf32 ? " tf32" : "");
}

}  // namespace detail

/// A cuBLASLt handle with its workspace and plan cache, bound to the device current when it is
/// constructed. Move-only. Not thread-safe, and the workspace is shared by all its calls: use one
/// CublasLt per stream that runs gemms concurrently with others.
class CublasLt {
 public:
  /// 32 MiB, what NVIDIA recommends for Hopper (cuBLAS docs, cublasSetWorkspace).
  static constexpr std::size_t kDefaultWorkspaceBytes = std::size_t{32} << 20;

  /// Creates the handle and allocates the workspace (cudaMalloc) on the current device.
  /// Throws trainkit::Error when either fails.
  explicit CublasLt(std::size_t workspace_bytes = kDefaultWorkspaceBytes)
      : workspace_bytes_(workspace_bytes) {
    TRAINKIT_CUDA_CHECK(cudaGetDevice(&device_));
    TRAINKIT_CUBLAS_CHECK(cublasLtCreate(&handle_));
    if (workspace_bytes_ > 0) {
      const cudaError_t status = cudaMalloc(&workspace_, workspace_bytes_);
      if (status != cudaSuccess) {
        TRAINKIT_CUBLAS_CHECK_NOTHROW(cublasLtDestroy(handle_));
        handle_ = nullptr;
        TRAINKIT_CUDA_CHECK(status);
      }
    }
  }

  CublasLt(const CublasLt&) = delete;
  CublasLt& operator=(const CublasLt&) = delete;
  CublasLt(CublasLt&& other) noexcept { swap(other); }
  CublasLt& operator=(CublasLt&& other) noexcept {
    if (this != &other) {
      CublasLt moved(std::move(other));
      swap(moved);
    }
    return *this;
  }

  /// Frees the plans, the workspace (cudaFree waits for work using it) and the handle.
  ~CublasLt() {
    plans_.clear();
    if (workspace_ != nullptr) TRAINKIT_CUDA_CHECK_NOTHROW(cudaFree(workspace_));
    if (handle_ != nullptr) TRAINKIT_CUBLAS_CHECK_NOTHROW(cublasLtDestroy(handle_));
  }

  cublasLtHandle_t get() const noexcept { return handle_; }
  int device() const noexcept { return device_; }
  std::size_t workspace_bytes() const noexcept { return workspace_bytes_; }
  const CublasLtStats& stats() const noexcept { return stats_; }
  std::size_t cached_plans() const noexcept { return plans_.size(); }
  /// Drops every cached plan (the next call of each shape plans again).
  void clear_cache() { plans_.clear(); }

  /// Enqueues one matmul on `stream`. Internal: blas::gemm checks the views and calls this.
  void run(const detail::CublasLtProblem& p, float alpha, float beta, cuda::StreamRef stream) {
    int current = -1;
    TRAINKIT_CUDA_CHECK(cudaGetDevice(&current));
    TRAINKIT_CHECK(current == device_,
                   "blas::gemm (cuBLASLt): this CublasLt was created on device ", device_,
                   " but device ", current, " is current");
    detail::CublasLtPlan& plan = plan_for(p);
    if (p.epilogue == Epilogue::kBias || p.epilogue == Epilogue::kBiasGelu ||
        p.epilogue == Epilogue::kBiasGrad)
      detail::set_desc(plan.desc_, CUBLASLT_MATMUL_DESC_BIAS_POINTER, p.bias);
    if (p.has_aux) detail::set_desc(plan.desc_, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER, p.aux);
    TRAINKIT_CUBLAS_CHECK(cublasLtMatmul(handle_, plan.desc_, &alpha, p.b, plan.a_, p.a, plan.b_,
                                         &beta, p.c_in, plan.c_, p.c, plan.c_, &plan.algo_,
                                         workspace_, workspace_bytes_, stream.get()));
  }

 private:
  // Member by member, like every swap of a class's own members (io::EventFileWriter's has the same
  // shape): nothing to share.
  void swap(CublasLt& other) noexcept {
    std::swap(handle_, other.handle_);
    std::swap(workspace_, other.workspace_);
    std::swap(workspace_bytes_, other.workspace_bytes_);
    std::swap(device_, other.device_);
    std::swap(plans_, other.plans_);
    std::swap(stats_, other.stats_);
  }

  static detail::CublasLtPlanKey key_of(const detail::CublasLtProblem& p) {
    detail::CublasLtPlanKey key;
    const std::int64_t fields[] = {static_cast<std::int64_t>(p.op_a),
                                   static_cast<std::int64_t>(p.op_b),
                                   p.m,
                                   p.n,
                                   p.k,
                                   p.lda,
                                   p.ldb,
                                   p.ldc,
                                   p.batch,
                                   p.stride_a,
                                   p.stride_b,
                                   p.stride_c,
                                   static_cast<std::int64_t>(p.type_ab),
                                   static_cast<std::int64_t>(p.type_c),
                                   static_cast<std::int64_t>(p.compute),
                                   static_cast<std::int64_t>(p.epilogue),
                                   p.has_aux ? 1 : 0,
                                   p.aux_ld,
                                   detail::pointer_alignment(p.a),
                                   detail::pointer_alignment(p.b),
                                   detail::pointer_alignment(p.c),
                                   p.bias == nullptr ? 0 : detail::pointer_alignment(p.bias),
                                   p.aux == nullptr ? 0 : detail::pointer_alignment(p.aux)};
    static_assert(sizeof(fields) / sizeof(fields[0]) <= std::tuple_size_v<decltype(key.v)>);
    for (std::size_t i = 0; i < sizeof(fields) / sizeof(fields[0]); ++i) key.v[i] = fields[i];
    return key;
  }

  detail::CublasLtPlan& plan_for(const detail::CublasLtProblem& p) {
    const detail::CublasLtPlanKey key = key_of(p);
    const auto found = plans_.find(key);
    if (found != plans_.end()) {
      ++stats_.cache_hits;
      return *found->second;
    }
    auto plan = std::make_unique<detail::CublasLtPlan>();
    build(p, *plan);
    ++stats_.plans_built;
    return *plans_.emplace(key, std::move(plan)).first->second;
  }

  void build(const detail::CublasLtProblem& p, detail::CublasLtPlan& plan) {
    const cublasComputeType_t compute =
        p.compute == ComputeType::kTf32 ? CUBLAS_COMPUTE_32F_FAST_TF32 : CUBLAS_COMPUTE_32F;
    TRAINKIT_CUBLAS_CHECK(cublasLtMatmulDescCreate(&plan.desc_, compute, CUDA_R_32F));
    const cublasOperation_t trans_a = p.op_b == Op::kN ? CUBLAS_OP_N : CUBLAS_OP_T;
    const cublasOperation_t trans_b = p.op_a == Op::kN ? CUBLAS_OP_N : CUBLAS_OP_T;
    detail::set_desc(plan.desc_, CUBLASLT_MATMUL_DESC_TRANSA, trans_a);
    detail::set_desc(plan.desc_, CUBLASLT_MATMUL_DESC_TRANSB, trans_b);
    plan.epilogue_ = detail::cublaslt_epilogue(p.epilogue, p.has_aux);
    detail::set_desc(plan.desc_, CUBLASLT_MATMUL_DESC_EPILOGUE, plan.epilogue_);
    // The heuristic reads the epilogue pointers' values for their alignment.
    if (p.bias != nullptr) detail::set_desc(plan.desc_, CUBLASLT_MATMUL_DESC_BIAS_POINTER, p.bias);
    if (p.has_aux) {
      detail::set_desc(plan.desc_, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER, p.aux);
      detail::set_desc(plan.desc_, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_LD, p.aux_ld);
    }

    // Row-major X[r, c] with row stride ld is column-major [c, r] with leading dimension ld.
    const std::int64_t b_rows = p.op_b == Op::kN ? p.n : p.k;  // stored columns of our B
    const std::int64_t b_cols = p.op_b == Op::kN ? p.k : p.n;
    const std::int64_t a_rows = p.op_a == Op::kN ? p.k : p.m;
    const std::int64_t a_cols = p.op_a == Op::kN ? p.m : p.k;
    plan.a_ = detail::make_layout(p.type_ab, b_rows, b_cols, p.ldb, p.batch, p.stride_b);
    plan.b_ = detail::make_layout(p.type_ab, a_rows, a_cols, p.lda, p.batch, p.stride_a);
    plan.c_ = detail::make_layout(p.type_c, p.n, p.m, p.ldc, p.batch, p.stride_c);

    cublasLtMatmulPreference_t pref = nullptr;
    TRAINKIT_CUBLAS_CHECK(cublasLtMatmulPreferenceCreate(&pref));
    struct PrefGuard {
      cublasLtMatmulPreference_t p;
      ~PrefGuard() { TRAINKIT_CUBLAS_CHECK_NOTHROW(cublasLtMatmulPreferenceDestroy(p)); }
    } guard{pref};
    auto set_pref = [&](cublasLtMatmulPreferenceAttributes_t attribute, auto value) {
      TRAINKIT_CUBLAS_CHECK(
          cublasLtMatmulPreferenceSetAttribute(pref, attribute, &value, sizeof(value)));
    };
    set_pref(CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES,
             static_cast<std::uint64_t>(workspace_bytes_));
    set_pref(CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, detail::pointer_alignment(p.b));
    set_pref(CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, detail::pointer_alignment(p.a));
    set_pref(CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, detail::pointer_alignment(p.c));
    set_pref(CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, detail::pointer_alignment(p.c));

    cublasLtMatmulHeuristicResult_t result{};
    int found = 0;
    TRAINKIT_CUBLAS_CHECK(cublasLtMatmulAlgoGetHeuristic(
        handle_, plan.desc_, plan.a_, plan.b_, plan.c_, plan.c_, pref, 1, &result, &found));
    TRAINKIT_CHECK(found > 0, "blas::gemm (cuBLASLt): no algorithm supports ", detail::describe(p),
                   "; try another epilogue (e.g. run it separately), aligned or contiguous views");
    plan.algo_ = result.algo;
  }

  cublasLtHandle_t handle_ = nullptr;
  void* workspace_ = nullptr;
  std::size_t workspace_bytes_ = 0;
  int device_ = -1;
  std::unordered_map<detail::CublasLtPlanKey, std::unique_ptr<detail::CublasLtPlan>,
                     detail::CublasLtPlanKeyHash>
      plans_;
  CublasLtStats stats_;
};

namespace detail {

template <class A, class B, class C>
constexpr void check_cublaslt_types() {
  using TA = std::remove_cv_t<A>;
  using TB = std::remove_cv_t<B>;
  static_assert(std::is_same_v<TA, TB>,
                "blas::gemm (cuBLASLt): A and B must have one element type");
  static_assert(
      is_gemm_type_v<TA> && is_gemm_type_v<C>,
      "blas::gemm (cuBLASLt): element types must be float, trainkit::f16 or trainkit::bf16");
  static_assert(!std::is_const_v<C>, "blas::gemm (cuBLASLt): C is written; pass a non-const view");
  static_assert(std::is_same_v<C, TA> || std::is_same_v<C, float>,
                "blas::gemm (cuBLASLt): C must have A's element type or be float "
                "(f32 output of f16/bf16 inputs)");
}

template <class A, class B, class C, int Rank>
void cublaslt_gemm(CublasLt& lt, Op op_a, Op op_b, const DeviceView<A, Rank>& a,
                   const DeviceView<B, Rank>& b, const DeviceView<C, Rank>& c,
                   const GemmOptions<C>& o, cuda::StreamRef stream) {
  check_cublaslt_types<A, B, C>();
  constexpr bool batched = Rank == 3;
  const char* who = batched ? "blas::gemm (cuBLASLt, batched)" : "blas::gemm (cuBLASLt)";
  const GemmShape s = check_gemm_shapes(who, op_a, op_b, a, b, c);
  check_epilogue(who, o, s, batched);
  constexpr bool f32_inputs = std::is_same_v<std::remove_cv_t<A>, float>;
  TRAINKIT_CHECK(o.compute != ComputeType::kTf32 || f32_inputs, who,
                 ": ComputeType::kTf32 needs float inputs");
  TRAINKIT_CHECK(o.host_backend != HostBackend::kCblas, who,
                 ": HostBackend::kCblas asked for a device gemm");
  TRAINKIT_CHECK(o.gelu_aux == GeluAux::kInput, who,
                 ": options.gelu_aux = GeluAux::kSlope is a host gemm option (cuBLASLt's GELU "
                 "epilogues save their input)");
  // Outputs that share memory with an input give wrong numbers, as on the host: refused.
  if constexpr (batched) {
    check_batched_output_items(who, c, s);
    check_batched_input_overlap(who, c, a, "A");
    check_batched_input_overlap(who, c, b, "B");
  } else {
    check_gemm_aliasing(who, a, b, c, o, s);
  }

  CublasLtProblem p{};
  p.op_a = op_a;
  p.op_b = op_b;
  p.m = s.m;
  p.n = s.n;
  p.k = s.k;
  p.lda = leading_dim(a);
  p.ldb = leading_dim(b);
  p.ldc = leading_dim(c);
  p.batch = 1;
  if constexpr (batched) {
    p.batch = c.size(0);
    TRAINKIT_CHECK(
        (a.size(0) == p.batch || a.size(0) == 1) && (b.size(0) == p.batch || b.size(0) == 1), who,
        ": batch sizes A ", a.size(0), ", B ", b.size(0), ", C ", p.batch,
        " differ (A and B may also have batch 1)");
    p.stride_a = a.size(0) == 1 ? 0 : a.stride(0);
    p.stride_b = b.size(0) == 1 ? 0 : b.stride(0);
    p.stride_c = c.stride(0);
    if (p.batch == 0) return;
  }
  if (s.m == 0 || s.n == 0) return;
  p.type_ab = cuda_data_type<A>();
  p.type_c = cuda_data_type<C>();
  p.compute = o.compute;
  p.epilogue = o.epilogue;
  p.a = a.data();
  p.b = b.data();
  p.c = c.data();
  p.c_in = o.c_in != nullptr ? static_cast<const void*>(o.c_in) : p.c;
  if (o.epilogue == Epilogue::kBias || o.epilogue == Epilogue::kBiasGelu) p.bias = o.bias;
  if (o.epilogue == Epilogue::kBiasGrad) p.bias = o.bias_grad;
  const bool gelu_forward = o.epilogue == Epilogue::kGelu || o.epilogue == Epilogue::kBiasGelu;
  p.has_aux = o.aux != nullptr && (gelu_forward || o.epilogue == Epilogue::kDGelu);
  if (p.has_aux) {
    p.aux = o.aux;
    p.aux_ld = o.aux_ld == 0 ? s.n : o.aux_ld;
    TRAINKIT_CHECK(p.aux_ld % 8 == 0, who, ": cuBLASLt needs the GELU aux row stride (", p.aux_ld,
                   ") to be a multiple of 8; pad aux_ld");
  }
  lt.run(p, o.alpha, o.beta, stream);
}

}  // namespace detail

/// C = epilogue(alpha * op(A) @ op(B) + beta * C) on the GPU with cuBLASLt, enqueued on `stream`
/// (asynchronous: returns before the GPU is done). Same shape rules as the host gemm (row-major;
/// unit column stride; row stride >= width). A and B share one element type; C has that type or
/// float. Accumulation is f32 (`options.compute = ComputeType::kTf32` allows TF32 products for
/// float inputs). Options' pointers (bias, bias_grad, aux) are device pointers of C's type;
/// cuBLASLt needs aux_ld % 8 == 0. The first call of each shape plans (descriptor + heuristic);
/// later calls reuse the plan (see CublasLt::stats). Throws trainkit::Error on bad views or when
/// cuBLASLt supports no algorithm for the combination.
/// Rank 3 is the strided-batched gemm ([batch, rows, cols] views; A or B may have batch 1 =
/// broadcast), with Epilogue::kNone only.
template <class A, class B, class C, int Rank>
requires(Rank == 2 || Rank == 3) void gemm(CublasLt& lt, Op op_a, Op op_b, DeviceView<A, Rank> a,
                                           DeviceView<B, Rank> b, DeviceView<C, Rank> c,
                                           const GemmOptions<C>& options, cuda::StreamRef stream) {
  detail::cublaslt_gemm(lt, op_a, op_b, a, b, c, options, stream);
}

/// gemm with default options (C = op(A) @ op(B)) on `stream`.
template <class A, class B, class C, int Rank>
requires(Rank == 2 || Rank == 3) void gemm(CublasLt& lt, Op op_a, Op op_b, DeviceView<A, Rank> a,
                                           DeviceView<B, Rank> b, DeviceView<C, Rank> c,
                                           cuda::StreamRef stream) {
  detail::cublaslt_gemm(lt, op_a, op_b, a, b, c, GemmOptions<C>{}, stream);
}

}  // namespace blas
TRAINKIT_NAMESPACE_END

#endif  // TRAINKIT_WITH_CUBLASLT
