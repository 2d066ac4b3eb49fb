// SPDX-License-Identifier: MIT
// trainkit/nn/layer.hpp: the conventions every nn/ layer follows, and their shared helpers.
//
// Layers are llm.c-style: explicit forward and backward calls on caller-owned activation views,
// parameters in a ParamArena. A layer whose backward needs more than its input (LayerNorm's row
// statistics, attention's probabilities, ...) has a nested `Context` type: the CALLER owns one,
// `forward(exec, ctx, x, y)` fills it and `backward(exec, ctx, x, dy, dx)` reads it. The layer
// object itself keeps no state of any forward, so one layer can run several forwards (an
// evaluation batch in the middle of a step, a recomputation) before the backward of each; the
// context's buffers only grow, so a context kept across steps is refilled without allocating.
// Layers without such state (Linear, Embedding, ReLU, GELU, Dropout) take no context:
// `forward(exec, x, y)`, `backward(exec, x, dy, dx)`. Backward ACCUMULATES (+=) into the arena's
// parameter gradients (so micro-batches add up until zero_grad) and WRITES (=) the input
// gradient dx, or adds to it when passed Write::kAccumulate (residual branches); outputs that
// can be accumulated take the same Write argument. Scratch used only inside one call (never
// read by a later call) belongs to the layer, so calls on one layer run one at a time.
#pragma once

#include <algorithm>
#include <cstdint>
#include <string>
#include <type_traits>

#include "trainkit/amp/policy.hpp"
#include "trainkit/blas/gemm.hpp"
#include "trainkit/config.hpp"
#include "trainkit/core/dtype.hpp"
#include "trainkit/core/half.hpp"
#include "trainkit/core/tensor.hpp"
#include "trainkit/nn/math.hpp"
#include "trainkit/core/tensor_view.hpp"
#include "trainkit/error.hpp"
#include "trainkit/exec/executor.hpp"
#include "trainkit/exec/host.hpp"

#if TRAINKIT_WITH_CUDA
#include <memory>
#include <unordered_map>

#include "trainkit/exec/cuda.hpp"
#endif

TRAINKIT_NAMESPACE_BEGIN
namespace nn {

/// How a call stores what it computes, an output or an input gradient: `kOverwrite` replaces the
/// destination (the default), `kAccumulate` adds to it (+=): an input gradient of an input that
/// also feeds a residual branch, an output seeded with the residual stream.
enum class Write : std::uint8_t { kOverwrite, kAccumulate };

/// The context type of layer L (what its forward saves for its backward), for layers that have
/// one (`has_context_v<L>`).
template <class L>
using context_t = typename L::Context;
template <class L>
inline constexpr bool has_context_v = requires {
  typename L::Context;
};

/// The row stride train::CausalLmTask gives logits and dlogits of `vocab` columns: rounded up to
/// a multiple of 64 elements, so that every row starts on a 16-byte boundary, which cuBLASLt's
/// fast kernels need for the lm_head's products (GPT-2's 50257 is odd).
inline constexpr std::int64_t logits_row_stride(std::int64_t vocab) noexcept {
  return (vocab + 63) / 64 * 64;
}

namespace detail {

/// Element types activations may have (those of the gemms: float, bf16, f16).
template <class T>
inline constexpr bool is_activation_element_v = blas::detail::is_gemm_type_v<T>;

/// Widening load / rounding store for float, bf16 and f16 (host and device).
template <class T>
TRAINKIT_HOST_DEVICE inline float load(T v) noexcept {
  return blas::detail::to_f32(v);
}
template <class T>
TRAINKIT_HOST_DEVICE inline T store(float v) noexcept {
  return blas::detail::from_f32<T>(v);
}

/// The executor type matches the memory space of the layer's views.
template <class E, Space S>
inline constexpr bool executor_matches_v = (exec::is_host_executor_v<E> && S == Space::kHost) ||
                                           (exec::is_cuda_executor_v<E> && S == Space::kDevice);

/// Checks at compile time that a layer call is well-formed: exec matches the space, the view
/// element types agree (up to const) and are the policy's activation type.
template <class P, class E, Space S, class... Ts>
constexpr void check_call() {
  static_assert(exec::Executor<E>, "trainkit::nn: pass an exec::Host or an exec::Cuda executor");
  static_assert(executor_matches_v<E, S>,
                "trainkit::nn: host layers (ParamArena<Space::kHost>) run on exec::Host, device "
                "layers (ParamArena<Space::kDevice>) on exec::Cuda");
  static_assert((is_activation_element_v<Ts> && ...),
                "trainkit::nn: activations are float, trainkit::bf16 or trainkit::f16");
  static_assert((amp::is_activation_type_v<P, Ts> && ...),
                "trainkit::nn: activation views must hold the policy's activation type "
                "(amp::activation_t<P>: float for Fp32/Tf32, bf16 for Bf16, f16 for Fp16)");
}

/// "[a, b, c]" of a view for messages.
template <class V>
std::string shape_of(const V& v) {
  return v.shape().to_string();
}

/// Throws unless `v` is contiguous (layers index activations densely).
template <class V>
void check_contiguous(const char* who, const char* name, const V& v) {
  TRAINKIT_CHECK(v.is_contiguous(), who, ": ", name, " with shape ", shape_of(v),
                 " must be contiguous (row-major, dense)");
}

/// True when the rank-2 view `v` has dense rows (column stride 1) that do not overlap: a row
/// stride of at least its width (check_rows).
template <class V>
bool has_dense_rows(const V& v) noexcept {
  static_assert(V::rank == 2, "trainkit::nn: dense rows are a property of [N, width] views");
  const bool dense_columns = v.size(1) <= 1 || v.stride(1) == 1;
  const bool apart = v.size(0) <= 1 || v.stride(0) >= v.size(1);
  return dense_columns && apart;
}

/// Throws unless the rank-2 view `v` has dense rows (column stride 1) that do not overlap: a row
/// stride of at least its width. Rows may be padded, e.g. logits whose row stride is the
/// vocabulary rounded up for aligned matrix products (logits_row_stride).
template <class V>
void check_rows(const char* who, const char* name, const V& v) {
  TRAINKIT_CHECK(has_dense_rows(v), who, ": ", name, " with shape ", shape_of(v),
                 " must have dense rows (column stride 1, row stride >= its width)");
}

/// The row stride of a [N, width] view with dense rows (see check_rows): its width when N <= 1,
/// where the view's own stride may be anything.
template <class V>
std::int64_t row_stride(const V& v) noexcept {
  return v.size(0) > 1 ? v.stride(0) : v.size(1);
}

/// Throws unless x and y have one shape, [N, width] or [B, T, width], and are contiguous (the
/// input and output of a layer that keeps the width).
template <class VX, class VY>
void check_same_io(const char* who, const VX& x, const VY& y, std::int64_t width) {
  static_assert(VX::rank == 2 || VX::rank == 3, "trainkit::nn: [N, C] or [B, T, C] views");
  TRAINKIT_CHECK(x.size(VX::rank - 1) == width && x.sizes() == y.sizes(), who, ": expected ",
                 VX::rank == 2 ? "[N, " : "[B, T, ", width, "] views of one shape, got ",
                 shape_of(x), " and ", shape_of(y));
  check_contiguous(who, "input", x);
  check_contiguous(who, "output", y);
}

/// True for a view that was not given (default-constructed: null data).
template <class V>
bool absent(const V& v) noexcept {
  return v.data() == nullptr && v.numel() == 0;
}

/// True when `out`, which a call writes row by row, shares memory with `in`, which it reads,
/// other than by being `in` itself (the same first element, width and row stride): a row of out
/// that lies over another row of in would overwrite that row before it is read. Both views have
/// dense rows (check_rows).
template <class VO, class VI>
bool overlaps_in_part(const VO& out, const VI& in) noexcept {
  const blas::detail::ByteRows o = blas::detail::byte_rows("", out);
  const blas::detail::ByteRows i = blas::detail::byte_rows("", in);
  const bool same =
      o.base == i.base && o.rows == i.rows && o.width == i.width && (o.rows <= 1 || o.ld == i.ld);
  return !same && blas::detail::byte_rows_overlap(o, i);
}

/// Throws when overlaps_in_part(out, in). Layers call it before they add anything, so a refused
/// call changes nothing.
template <class VO, class VI>
void check_not_partly_over(const char* who, const char* out_name, const VO& out,
                           const char* in_name, const VI& in) {
  TRAINKIT_CHECK(!overlaps_in_part(out, in), who, ": ", out_name, " ", shape_of(out),
                 " partly overlaps ", in_name, " ", shape_of(in), ", whose rows are read while ",
                 out_name, " is written");
}

/// Throws unless x, dy and dx (unless absent) are contiguous [B, T, width] views of one shape,
/// each named in the message: a composite's backward checks all of them before its first layer
/// adds a parameter gradient, so a refused call leaves the gradients as they were.
template <class VX, class VD, class VG>
void check_backward_views(const char* who, const VX& x, const VD& dy, const VG& dx,
                          std::int64_t width) {
  const bool has_dx = !absent(dx);
  TRAINKIT_CHECK(x.size(VX::rank - 1) == width && dy.sizes() == x.sizes() &&
                     (!has_dx || dx.sizes() == x.sizes()),
                 who, ": x ", shape_of(x), ", dy ", shape_of(dy),
                 has_dx ? ::trainkit::detail::concat(" and dx ", shape_of(dx)) : std::string(),
                 " must all be [B, T, ", width, "]");
  check_contiguous(who, "x", x);
  check_contiguous(who, "dy", dy);
  if (has_dx) check_contiguous(who, "dx", dx);
}

/// Splits rows [0, rows) into contiguous ranges and runs f(r0, r1) on the Host pool (as AVX2
/// code where the CPU has it, host_simd). `cost` is the work per row in elements touched; small
/// problems run on the calling thread. Each row is handled by one call, so per-row results never
/// depend on the thread count.
template <class F>
void for_rows(const exec::Host& host, std::int64_t rows, std::int64_t cost, F&& f) {
  if (rows <= 0) return;
  constexpr std::int64_t kMinTaskWork = std::int64_t{1} << 14;
  const std::int64_t threads = host.num_threads();
  std::int64_t tasks =
      std::min<std::int64_t>(rows, std::max<std::int64_t>(1, rows * cost / kMinTaskWork));
  tasks = std::min<std::int64_t>(tasks, 4 * threads);
  if (threads <= 1 || tasks <= 1) {
    host_simd([&]() TRAINKIT_INLINE_LAMBDA { f(std::int64_t{0}, rows); });
    return;
  }
  host.parallel_for(tasks, [&](std::int64_t t) {
    const std::int64_t r0 = rows * t / tasks, r1 = rows * (t + 1) / tasks;
    if (r0 < r1) host_simd([&]() TRAINKIT_INLINE_LAMBDA { f(r0, r1); });
  });
}

/// Grow-only untyped storage in memory space S: a context's saved tensors, a layer's scratch.
/// The element type is chosen at each use (it follows the policy of the call). Reallocated only
/// when a larger size is requested; contents are kept otherwise.
template <Space S>
class Bytes {
 public:
  /// At least n elements of T, contents unspecified.
  template <class T>
  T* get(std::int64_t n) {
    const std::int64_t bytes = n * static_cast<std::int64_t>(sizeof(T));
    if (bytes > mem_.numel()) mem_ = Tensor<unsigned char, S>(Shape{bytes});
    return data<T>();
  }
  template <class T>
  T* data() noexcept {
    return reinterpret_cast<T*>(mem_.data());
  }
  template <class T>
  const T* data() const noexcept {
    return reinterpret_cast<const T*>(mem_.data());
  }
  std::int64_t bytes() const noexcept { return mem_.numel(); }

 private:
  Tensor<unsigned char, S> mem_;
};

/// A layer's scratch memory in space S (Bytes that are not part of its state): a copy of the
/// layer starts with empty scratch of its own, so layers stay copyable handles.
template <Space S>
class Scratch {
 public:
  Scratch() = default;
  Scratch(const Scratch&) noexcept {}
  Scratch& operator=(const Scratch&) noexcept { return *this; }
  Scratch(Scratch&&) noexcept = default;
  Scratch& operator=(Scratch&&) noexcept = default;
  ~Scratch() = default;

  /// At least n elements of T, contents unspecified.
  template <class T>
  T* get(std::int64_t n) {
    return bytes_.template get<T>(n);
  }

 private:
  Bytes<S> bytes_;
};

/// What a context records of the forward that filled it, checked by its backward: the
/// activation type and the two leading sizes of the input ([N, C], or [B, T] of [B, T, C]).
struct ForwardRecord {
  DType dtype = DType::kF32;
  std::int64_t d0 = -1;
  std::int64_t d1 = -1;
  std::int64_t width = -1;  // the layer's width, for a context sized by it (-1: not recorded)

  template <class T>
  void set(std::int64_t a, std::int64_t b, std::int64_t w = -1) noexcept {
    dtype = dtype_of<T>;
    d0 = a;
    d1 = b;
    width = w;
  }
  bool filled() const noexcept { return d0 >= 0; }

  /// Throws unless a forward of element type T with leading sizes [a, b] (and width w, when
  /// recorded) filled the context.
  template <class T>
  void check(const char* who, std::int64_t a, std::int64_t b, std::int64_t w = -1) const {
    TRAINKIT_CHECK(filled(), who, ": the context was not filled by a forward");
    TRAINKIT_CHECK(dtype == dtype_of<T> && d0 == a && d1 == b && width == w, who,
                   ": the context holds the forward of a ", sizes(d0, d1, width), " input of ",
                   dtype_name(dtype), ", but backward got ", sizes(a, b, w), " of ",
                   dtype_name(dtype_of<T>));
  }

 private:
  static std::string sizes(std::int64_t a, std::int64_t b, std::int64_t w) {
    return ::trainkit::detail::concat(
        "[", a, ", ", b, w >= 0 ? ::trainkit::detail::concat(", ", w) : std::string(), "]");
  }
};

/// What a composite keeps for a layer that has no Context.
struct NoContext {};

/// The context a composite keeps for layer L: context_t<L>, or NoContext.
template <class L>
struct ContextSlot {
  using type = NoContext;
};
template <class L>
requires has_context_v<L>
struct ContextSlot<L> {
  using type = context_t<L>;
};
template <class L>
using context_slot_t = typename ContextSlot<L>::type;

/// layer.forward<P>(exec, ctx, x, y), or layer.forward<P>(exec, x, y) for a layer without a
/// context: how a composite calls a layer it does not know.
template <class P, class L, class E, class C, class X, class Y>
void forward_with(L& layer, const E& exec, C& ctx, X x, Y y) {
  if constexpr (has_context_v<L>) {
    layer.template forward<P>(exec, ctx, x, y);
  } else {
    layer.template forward<P>(exec, x, y);
  }
}

/// layer.backward<P>(exec, ctx, x, dy, dx), or without ctx for a layer that has none.
template <class P, class L, class E, class C, class X, class D, class G>
void backward_with(L& layer, const E& exec, const C& ctx, X x, D dy, G dx) {
  if constexpr (has_context_v<L>) {
    layer.template backward<P>(exec, ctx, x, dy, dx);
  } else {
    layer.template backward<P>(exec, x, dy, dx);
  }
}

/// The context of a layer that saves f32 statistics per row (LayerNorm, SoftmaxCrossEntropy).
template <Space S>
class RowStatsContext {
 public:
  /// Rows of the forward that filled it (0 before any).
  std::int64_t rows() const noexcept { return rec_.filled() ? rec_.d0 : 0; }

 protected:
  ForwardRecord rec_;
  Bytes<S> stats_;
};

/// Throws unless the two sizes a layer is built with are positive ("<who> '<name>': <a_name>
/// (a) and <b_name> (b) must be positive").
inline void check_sizes_positive(const char* who, const std::string& name, const char* a_name,
                                 std::int64_t a, const char* b_name, std::int64_t b) {
  TRAINKIT_CHECK(a > 0 && b > 0, who, " '", name, "': ", a_name, " (", a, ") and ", b_name, " (", b,
                 ") must be positive");
}

/// "<name>.<child>", or "<child>" for an empty name (the parameter names of nested layers).
inline std::string child_name(const std::string& name, const char* child) {
  return name.empty() ? std::string(child) : name + "." + child;
}

/// A dense [rows, cols] view of p.
template <Space S, class T>
TensorView<T, 2, S> mat(T* p, std::int64_t rows, std::int64_t cols) {
  return TensorView<T, 2, S>(p, Extents<2>{{rows, cols}});
}

/// [B, T, C] as [B * T, C] (contiguous views).
template <class T, Space S>
TensorView<T, 2, S> flat2(const TensorView<T, 3, S>& v) {
  return v.template reshape<2>(Extents<2>{{v.size(0) * v.size(1), v.size(2)}});
}

/// The static_assert every CUDA-only entry point has in TUs not compiled by nvcc.
template <class E>
inline constexpr bool needs_cuda_compiler_v = !exec::is_cuda_executor_v<E>;

/// Host gemm of the layers (blas::gemm on the Host pool).
template <class A, class B, class C, int R>
void gemm_on(const exec::Host& host, blas::Op op_a, blas::Op op_b, TensorView<A, R, Space::kHost> a,
             TensorView<B, R, Space::kHost> b, TensorView<C, R, Space::kHost> c,
             const blas::GemmOptions<C>& options) {
  blas::gemm(host, op_a, op_b, a, b, c, options);
}

#if TRAINKIT_WITH_CUBLASLT
/// The cuBLASLt handle (workspace and plan cache) the layers use on the calling thread for the
/// current device. Created on first use and deliberately never destroyed: it would otherwise be
/// freed after the CUDA runtime has shut down at exit.
inline blas::CublasLt& layer_cublaslt() {
  thread_local std::unordered_map<int, blas::CublasLt*> handles;
  int device = 0;
  TRAINKIT_CUDA_CHECK(cudaGetDevice(&device));
  blas::CublasLt*& lt = handles[device];
  if (lt == nullptr) lt = new blas::CublasLt();
  return *lt;
}

/// Device gemm of the layers: cuBLASLt on the executor's stream.
template <class A, class B, class C, int R>
void gemm_on(const exec::Cuda& exec, blas::Op op_a, blas::Op op_b,
             TensorView<A, R, Space::kDevice> a, TensorView<B, R, Space::kDevice> b,
             TensorView<C, R, Space::kDevice> c, const blas::GemmOptions<C>& options) {
  blas::gemm(layer_cublaslt(), op_a, op_b, a, b, c, options, exec.stream());
}
#else
template <class E, class... Args>
requires exec::is_cuda_executor_v<E>
void gemm_on(const E&, Args&&...) {
  static_assert(needs_cuda_compiler_v<E>,
                "trainkit::nn: layers with matmuls on exec::Cuda use cuBLASLt: build with "
                "TRAINKIT_WITH_CUBLASLT=1 (CMake: TRAINKIT_ENABLE_CUBLASLT) and link cublasLt");
}
#endif

#if TRAINKIT_CUDA_COMPILER && TRAINKIT_WITH_CUDA
inline namespace TRAINKIT_DETAIL_EXEC_ARCH_NS {

/// Warps per block of the one-warp-per-row kernels: launch them with
/// exec::detail::grid_blocks_x(rows, kRowWarps, name) blocks of kRowWarps * 32 threads and check
/// the launch with exec::detail::check_kernel_launch.
inline constexpr int kRowWarps = 8;

/// The row of the calling warp in a one-warp-per-row kernel, and the thread's lane in it.
__device__ inline std::int64_t warp_row() {
  return static_cast<std::int64_t>(blockIdx.x) * (blockDim.x / 32) + threadIdx.x / 32;
}
__device__ inline int warp_lane() { return static_cast<int>(threadIdx.x % 32); }

/// Sum / max over the 32 lanes of a warp (every lane gets the result; fixed butterfly order).
__device__ inline float warp_sum(float v) {
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffU, v, o);
  return v;
}
__device__ inline float warp_max(float v) {
  for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffU, v, o));
  return v;
}

}  // namespace TRAINKIT_DETAIL_EXEC_ARCH_NS
#endif
}  // namespace detail

}  // namespace nn
TRAINKIT_NAMESPACE_END

/// Declares, in a TU that cannot launch kernels, the exec::Cuda overload of nn::detail::NAME as
/// a template whose instantiation explains what to do (the real one exists under nvcc).
#define TRAINKIT_DETAIL_NN_CUDA_ONLY(NAME)                                                     \
  template <class E, class... Args>                                                            \
  requires ::trainkit::exec::is_cuda_executor_v<E>                                             \
  void NAME(const E&, Args&&...) {                                                             \
    static_assert(::trainkit::nn::detail::needs_cuda_compiler_v<E>,                            \
                  "trainkit::nn: this layer was called with exec::Cuda, which launches CUDA "  \
                  "kernels: compile this TU with nvcc (a .cu file), or run it on exec::Host"); \
  }
