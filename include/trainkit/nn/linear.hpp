// SPDX-License-Identifier: MIT
// trainkit/nn/linear.hpp: `Linear`, y = x W^T + b with W [out, in] like torch.nn.Linear, on
// blas::gemm (the built-in host kernel or cuBLASLt). The bias is fused into the gemm epilogue,
// and so is a following GELU (forward_gelu / backward_dgelu), as llm.c does, on the CPU (AVX2
// kernel) as on the GPU; the bias gradient
// is a deterministic column sum (fixed order, no atomics) accumulated into the arena.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <optional>
#include <string>
#include <type_traits>
#include <utility>

#include "trainkit/amp/policy.hpp"
#include "trainkit/blas/gemm.hpp"
#include "trainkit/blas/host_gemm.hpp"
#include "trainkit/config.hpp"
#include "trainkit/core/tensor_view.hpp"
#include "trainkit/error.hpp"
#include "trainkit/exec/launch.hpp"
#include "trainkit/nn/activation.hpp"
#include "trainkit/nn/init.hpp"
#include "trainkit/nn/layer.hpp"
#include "trainkit/nn/math.hpp"
#include "trainkit/nn/param_arena.hpp"

TRAINKIT_NAMESPACE_BEGIN
namespace nn {
namespace detail {

/// db[j] += sum_i dy[i, j] for dy [rows, cols] (host). Columns are split among tasks; each column
/// is summed over rows in ascending order by one task, so the bits never depend on threads.
template <class T>
void bias_grad_accumulate(const exec::Host& host, TensorView<const T, 2, Space::kHost> dy,
                          float* db, Scratch<Space::kHost>& /*scratch*/) {
  const std::int64_t rows = dy.size(0), cols = dy.size(1);
  const std::int64_t ld = row_stride(dy);  // rows may be padded
  constexpr std::int64_t kBlock = 64;
  const std::int64_t blocks = (cols + kBlock - 1) / kBlock;
  auto run = [&](std::int64_t b0, std::int64_t b1) TRAINKIT_INLINE_LAMBDA {
    for (std::int64_t b = b0; b < b1; ++b) {
      const std::int64_t j0 = b * kBlock, w = std::min(kBlock, cols - j0);
      float acc[kBlock] = {};
      if (w == kBlock) {  // a constant trip count: vectorised at -O2 too
        for (std::int64_t i = 0; i < rows; ++i) {
          const T* row = dy.data() + i * ld + j0;
          for (std::int64_t j = 0; j < kBlock; ++j) acc[j] += load(row[j]);
        }
      } else {
        for (std::int64_t i = 0; i < rows; ++i) {
          const T* row = dy.data() + i * ld + j0;
          for (std::int64_t j = 0; j < w; ++j) acc[j] += load(row[j]);
        }
      }
      for (std::int64_t j = 0; j < w; ++j) db[j0 + j] += acc[j];
    }
  };
  for_rows(host, blocks, rows * kBlock, run);
}

/// Whether Linear's GELU variants run the GELU (or its derivative) in the gemm's epilogue, on
/// the tile while it is in registers, instead of in a second pass over [N, width]. On the GPU:
/// when cuBLASLt takes the aux matrix (its row stride, `width`, a multiple of 8). On the host:
/// when the built-in gemm runs its AVX2+FMA micro-kernel, whose epilogue evaluates the tanh GELU
/// 8 lanes at a time (the same function as gelu_approx, also within f32 rounding: relative error
/// ~1e-7 where |x| < 3, at most ~1e-5 below x = -9 where the exponent's argument itself is that
/// inexact); elsewhere its portable epilogue would call libm's expf per element, which the
/// separate pass over exp_approx beats. Either way the result is the same bits for any thread
/// count: each element is computed once, by one task.
template <Space S>
inline bool fused_gelu_epilogue(std::int64_t width) noexcept {
  if constexpr (S == Space::kDevice) {
    return width % 8 == 0;
  } else {
    (void)width;
#if TRAINKIT_DETAIL_GEMM_X86
    return blas::detail::cpu_has_avx2_fma();
#else
    return false;
#endif
  }
}

/// The unfused host forward's GELU, saving the slope: y = gelu(pre), then pre = gelu'(pre).
template <class T>
struct GeluSaveSlope {
  T* pre;
  T* y;
  TRAINKIT_HOST_DEVICE TRAINKIT_FORCEINLINE void operator()(std::int64_t i) const {
    const float x = load(pre[i]);
    y[i] = store<T>(gelu_approx(x));
    pre[i] = store<T>(gelu_grad_approx(x));
  }
};

/// d = d * slope, in place (the unfused host dgelu from a saved slope).
template <class T>
struct MulInPlace {
  const T* slope;
  T* d;
  TRAINKIT_HOST_DEVICE TRAINKIT_FORCEINLINE void operator()(std::int64_t i) const {
    d[i] = store<T>(load(d[i]) * load(slope[i]));
  }
};

/// dpre = dpre * gelu'(pre), in place (the unfused dgelu).
template <class T>
struct DGeluInPlace {
  const T* pre;
  T* d;
  TRAINKIT_HOST_DEVICE TRAINKIT_FORCEINLINE void operator()(std::int64_t i) const {
    d[i] = store<T>(load(d[i]) * gelu_grad_approx(load(pre[i])));
  }
};

#if TRAINKIT_CUDA_COMPILER && TRAINKIT_WITH_CUDA
inline namespace TRAINKIT_DETAIL_EXEC_ARCH_NS {

/// Rows of dy per block of the bias gradient: enough blocks to fill the GPU at N = 8 x 1024.
inline constexpr std::int64_t kBiasGradRows = 256;

/// Column sums of dy [rows, cols] (row stride ld) over one chunk of kBiasGradRows rows: a 32 x 8
/// block per 32 columns; thread (x, y) sums rows y, y + 8, ... of the chunk in order, then thread
/// row 0 adds the 8 partials in order and writes the chunk's partial sum (deterministic).
template <class T>
__global__ void __launch_bounds__(256)
    bias_grad_partial_kernel(const T* __restrict__ dy, float* __restrict__ partial,
                             std::int64_t rows, std::int64_t cols, std::int64_t ld) {
  __shared__ float part[8][33];
  const std::int64_t col = static_cast<std::int64_t>(blockIdx.x) * 32 + threadIdx.x;
  const std::int64_t r0 = static_cast<std::int64_t>(blockIdx.y) * kBiasGradRows;
  const std::int64_t r1 = min(rows, r0 + kBiasGradRows);
  float acc = 0.0f;
  if (col < cols)
    for (std::int64_t r = r0 + threadIdx.y; r < r1; r += 8) acc += load(dy[r * ld + col]);
  part[threadIdx.y][threadIdx.x] = acc;
  __syncthreads();
  if (threadIdx.y == 0 && col < cols) {
    float sum = 0.0f;
    for (int y = 0; y < 8; ++y) sum += part[y][threadIdx.x];
    partial[static_cast<std::int64_t>(blockIdx.y) * cols + col] = sum;
  }
}

/// db[c] += the chunks' partial sums of column c, in chunk order (a template, like every
/// kernel of the headers: one instantiation per program).
template <class T>
__global__ void __launch_bounds__(256)
    bias_grad_reduce_kernel(const float* __restrict__ partial, float* __restrict__ db,
                            std::int64_t chunks, std::int64_t cols) {
  const std::int64_t col = static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (col >= cols) return;
  float sum = 0.0f;
  for (std::int64_t k = 0; k < chunks; ++k) sum += partial[k * cols + col];
  db[col] += sum;
}

/// Column sums of dy added to db (device): per-chunk partials into `scratch` (caller's memory,
/// reused between calls), then one pass in chunk order. The bits depend on the shape only.
template <class T>
void bias_grad_accumulate(const exec::Cuda& exec, TensorView<const T, 2, Space::kDevice> dy,
                          float* db, Scratch<Space::kDevice>& scratch) {
  const std::int64_t rows = dy.size(0), cols = dy.size(1);
  if (rows == 0 || cols == 0) return;
  const std::int64_t ld = row_stride(dy);
  const std::int64_t chunks = (rows + kBiasGradRows - 1) / kBiasGradRows;
  TRAINKIT_CHECK(chunks <= exec::detail::kMaxGridYZ, "nn::Linear: ", rows,
                 " rows are too many for the device bias gradient (at most ",
                 exec::detail::kMaxGridYZ * kBiasGradRows, ")");
  float* partial = scratch.template get<float>(chunks * cols);
  cudaStream_t stream = exec.stream().get();
  constexpr const char* kName = "nn::Linear backward (bias)";
  const dim3 grid(exec::detail::grid_blocks_x(cols, 32, kName), static_cast<unsigned>(chunks));
  bias_grad_partial_kernel<T><<<grid, dim3(32, 8), 0, stream>>>(dy.data(), partial, rows, cols, ld);
  exec::detail::check_kernel_launch(kName, "rows ", rows, ", cols ", cols);
  bias_grad_reduce_kernel<T><<<exec::detail::grid_blocks_x(cols, 256, kName), 256, 0, stream>>>(
      partial, db, chunks, cols);
  exec::detail::check_kernel_launch("nn::Linear backward (bias sum)", "rows ", rows, ", cols ",
                                    cols);
}

}  // namespace TRAINKIT_DETAIL_EXEC_ARCH_NS
#else
TRAINKIT_DETAIL_NN_CUDA_ONLY(bias_grad_accumulate)
#endif
}  // namespace detail

/// Options of nn::Linear. Defaults initialise like torch.nn.Linear: W ~ kaiming_uniform(a =
/// sqrt(5)) = U(±1/sqrt(in)) (kTorchLinearKaimingA), b ~ U(±1/sqrt(in)).
struct LinearOptions {
  std::int64_t in_features = 0;
  std::int64_t out_features = 0;
  bool bias = true;
  Init weight_init = Init::kaiming_uniform(kTorchLinearKaimingA);
  /// Unset: U(-1/sqrt(in), 1/sqrt(in)), as PyTorch.
  std::optional<Init> bias_init = std::nullopt;
  /// Valid: use this [out_features, in_features] parameter of the arena as the weight instead
  /// of registering "<name>.weight" (weight tying, e.g. a language model's head and its token
  /// embedding); both users' gradients add up in its gradient. weight_init is then unused.
  ParamId tied_weight = {};
};

/// Fully connected layer y = x W^T + b (torch.nn.Linear). Parameters "<name>.weight" [out, in]
/// and "<name>.bias" [out] in the arena (no prefix when name is empty).
///
/// Shapes: x [N, in], y [N, out] (N = batch * sequence; dense rows, whose row stride may exceed
/// the width, e.g. logits padded to an aligned stride; the GELU variants need contiguous views).
/// Precision: under policy P the views hold amp::activation_t<P>; f32 policies use the f32
/// master weights (Tf32: TF32 tensor-core products on the GPU), Bf16/Fp16 the arena's compute
/// copy, which must have been refreshed (ParamArena::refresh_compute_copy) after the last update.
/// backward reads x (the forward input), dy and W; it adds dy^T x to dW and the column sums of
/// dy to db (f32, in the arena), and writes dx = dy W (or adds it, Write::kAccumulate).
/// An absent dx (default view) skips that gemm, e.g. for the first layer. dx may be x itself
/// (the parameter gradients are taken first); dx overlapping dy throws before anything is added.
/// The arena must outlive the layer and must not be moved after the layer registered.
template <Space S = Space::kHost>
class Linear {
 public:
  Linear(ParamArena<S>& arena, const std::string& name, LinearOptions options)
      : arena_(&arena), in_(options.in_features), out_(options.out_features) {
    detail::check_sizes_positive("nn::Linear", name, "in_features", in_, "out_features", out_);
    if (options.tied_weight.valid()) {
      const ParamInfo& tied = arena.info(options.tied_weight);
      TRAINKIT_CHECK(tied.shape == Shape({out_, in_}), "nn::Linear '", name, "': the tied weight '",
                     tied.name, "' is ", tied.shape.to_string(), ", the layer needs [", out_, ", ",
                     in_, "]");
      weight_ = options.tied_weight;
      weight_tied_ = true;
    } else {
      weight_ =
          arena.add(detail::child_name(name, "weight"), Shape{out_, in_}, options.weight_init);
    }
    if (options.bias) {
      const auto bound = static_cast<float>(1.0 / std::sqrt(static_cast<double>(in_)));
      bias_ = arena.add(detail::child_name(name, "bias"), Shape{out_},
                        options.bias_init.value_or(Init::uniform(-bound, bound)));
    }
  }

  ParamId weight() const noexcept { return weight_; }
  /// True when the weight is another layer's parameter (LinearOptions::tied_weight).
  bool weight_tied() const noexcept { return weight_tied_; }
  /// Invalid when the layer has no bias.
  ParamId bias() const noexcept { return bias_; }
  bool has_bias() const noexcept { return bias_.valid(); }
  std::int64_t in_features() const noexcept { return in_; }
  std::int64_t out_features() const noexcept { return out_; }
  /// For Sequential: the output width for an input width (throws unless it is in_features).
  std::int64_t out_features(std::int64_t in) const {
    TRAINKIT_CHECK(in == in_, "nn::Linear: input has ", in, " features, the layer expects ", in_);
    return out_;
  }

  /// y = x W^T + b, or y += x W^T + b with Write::kAccumulate (a residual connection fused into
  /// the gemm: seed y with the residual stream).
  template <amp::Policy P = amp::Fp32, class E, class TX, class TY>
  void forward(const E& exec, TensorView<TX, 2, S> x, TensorView<TY, 2, S> y,
               Write mode = Write::kOverwrite) const {
    using T = std::remove_const_t<TX>;
    detail::check_call<P, E, S, TX, TY>();
    check_io("nn::Linear::forward", x, y);
    project<P>(exec, TensorView<const T, 2, S>(x), y, mode == Write::kAccumulate ? 1.0f : 0.0f,
               static_cast<const T*>(nullptr));
  }

  /// y = residual + (x W^T + b): a residual connection fused into the gemm, which reads the
  /// residual stream in its epilogue (beta = 1, GemmOptions::c_in) and only writes y, instead of
  /// a copy of the stream into y first. residual is [N, out] with y's row stride; it may be y
  /// itself (then the same as Write::kAccumulate), otherwise it must not overlap y. On the host
  /// each element is (x W^T + residual) + b.
  template <amp::Policy P = amp::Fp32, class E, class TX, class TY, class TR>
  void forward(const E& exec, TensorView<TX, 2, S> x, TensorView<TY, 2, S> y,
               TensorView<TR, 2, S> residual) const {
    using T = std::remove_const_t<TX>;
    detail::check_call<P, E, S, TX, TY, TR>();
    check_io("nn::Linear::forward", x, y);
    TRAINKIT_CHECK(residual.sizes() == y.sizes(), "nn::Linear::forward: residual has shape ",
                   detail::shape_of(residual), " but y has shape ", detail::shape_of(y));
    detail::check_rows("nn::Linear::forward", "residual", residual);
    TRAINKIT_CHECK(y.size(0) <= 1 || detail::row_stride(residual) == detail::row_stride(y),
                   "nn::Linear::forward: the residual's row stride ", detail::row_stride(residual),
                   " differs from the output's ", detail::row_stride(y));
    project<P>(exec, TensorView<const T, 2, S>(x), y, 1.0f, residual.data());
  }

  /// y = gelu(x W^T + b) (tanh GELU), fused: the MLP's first layer of a GPT block. `saved`
  /// receives what backward_dgelu of the next layer needs, per element of y: on the GPU the
  /// pre-activation x W^T + b (cuBLASLt's GELU aux), on the host the GELU's slope at it, which
  /// the forward gets from the exponential it computes anyway (the backward then multiplies,
  /// without a second one). saved and y are [N, out].
  template <amp::Policy P = amp::Fp32, class E, class TX, class TP, class TY>
  void forward_gelu(const E& exec, TensorView<TX, 2, S> x, TensorView<TP, 2, S> saved,
                    TensorView<TY, 2, S> y) const {
    using T = std::remove_const_t<TX>;
    detail::check_call<P, E, S, TX, TP, TY>();
    check_io("nn::Linear::forward_gelu", x, y);
    detail::check_same_shape("nn::Linear::forward_gelu", "saved", saved, "y", y);
    detail::check_contiguous("nn::Linear::forward_gelu", "saved", saved);
    detail::check_contiguous("nn::Linear::forward_gelu", "output", y);
    // The fused epilogue's gemm refuses this too, the unfused pass would not (it writes both).
    check_apart("nn::Linear::forward_gelu", "y", y, "saved", saved);
    blas::GemmOptions<T> o = bias_options<P, T>();
    if (!detail::fused_gelu_epilogue<S>(out_)) {
      // Unfused: bias in the gemm epilogue, then a GELU pass.
      detail::gemm_on(exec, blas::Op::kN, blas::Op::kT, TensorView<const T, 2, S>(x),
                      weight_view<T>(), saved, o);
      if constexpr (S == Space::kHost) {
        exec::launch(exec, saved.numel(), detail::GeluSaveSlope<T>{saved.data(), y.data()});
      } else {
        exec::launch(exec, saved.numel(), detail::GeluForward<T>{saved.data(), y.data()});
      }
    } else {
      o.epilogue = has_bias() ? blas::Epilogue::kBiasGelu : blas::Epilogue::kGelu;
      o.aux = saved.data();
      if constexpr (S == Space::kHost) o.gelu_aux = blas::GeluAux::kSlope;
      detail::gemm_on(exec, blas::Op::kN, blas::Op::kT, TensorView<const T, 2, S>(x),
                      weight_view<T>(), y, o);
    }
  }

  /// dW += dy^T x, db += sum_rows dy, dx = dy W (or dx += dy W). dx may be absent.
  template <amp::Policy P = amp::Fp32, class E, class TX, class TD, class TG>
  void backward(const E& exec, TensorView<TX, 2, S> x, TensorView<TD, 2, S> dy,
                TensorView<TG, 2, S> dx, Write mode = Write::kOverwrite) {
    using T = std::remove_const_t<TX>;
    detail::check_call<P, E, S, TX, TD, TG>();
    check_io("nn::Linear::backward", x, dy);
    if (!detail::absent(dx)) {
      check_io("nn::Linear::backward", dx, dy);
      check_apart("nn::Linear::backward", "dx", dx, "dy", dy);
    }
    // dW and db first: they read x, which dx may overwrite (dx may be x itself).
    accumulate_param_grads<P>(exec, TensorView<const T, 2, S>(x), TensorView<const T, 2, S>(dy));
    if (!detail::absent(dx)) {
      blas::GemmOptions<T> o;
      o.compute = P::gemm_compute;
      o.beta = mode == Write::kAccumulate ? 1.0f : 0.0f;
      detail::gemm_on(exec, blas::Op::kN, blas::Op::kN, TensorView<const T, 2, S>(dy),
                      weight_view<T>(), dx, o);
    }
  }

  /// Backward of this layer when its input was x = gelu(pre) (see forward_gelu): accumulates dW
  /// and db as backward() and writes dpre = (dy W) * gelu'(pre) — the gradient of the previous
  /// layer's pre-activation, with the GELU backward fused into the gemm. `saved` is what that
  /// forward_gelu saved (on the same device). x, saved, dpre: [N, in].
  template <amp::Policy P = amp::Fp32, class E, class TX, class TD, class TP, class TG>
  void backward_dgelu(const E& exec, TensorView<TX, 2, S> x, TensorView<TD, 2, S> dy,
                      TensorView<TP, 2, S> saved, TensorView<TG, 2, S> dpre) {
    using T = std::remove_const_t<TX>;
    detail::check_call<P, E, S, TX, TD, TP, TG>();
    check_io("nn::Linear::backward_dgelu", x, dy);
    check_io("nn::Linear::backward_dgelu", dpre, dy);
    detail::check_same_shape("nn::Linear::backward_dgelu", "saved", saved, "dpre", dpre);
    detail::check_contiguous("nn::Linear::backward_dgelu", "saved", saved);
    detail::check_contiguous("nn::Linear::backward_dgelu", "dpre", dpre);
    check_apart("nn::Linear::backward_dgelu", "dpre", dpre, "dy", dy);
    check_apart("nn::Linear::backward_dgelu", "dpre", dpre, "saved", saved);
    // dW and db first: they read x, which dpre may overwrite (dpre may be x itself).
    accumulate_param_grads<P>(exec, TensorView<const T, 2, S>(x), TensorView<const T, 2, S>(dy));
    blas::GemmOptions<T> o;
    o.compute = P::gemm_compute;
    if (!detail::fused_gelu_epilogue<S>(in_)) {
      detail::gemm_on(exec, blas::Op::kN, blas::Op::kN, TensorView<const T, 2, S>(dy),
                      weight_view<T>(), dpre, o);
      if constexpr (S == Space::kHost) {
        exec::launch(exec, dpre.numel(), detail::MulInPlace<T>{saved.data(), dpre.data()});
      } else {
        exec::launch(exec, dpre.numel(), detail::DGeluInPlace<T>{saved.data(), dpre.data()});
      }
    } else {
      o.epilogue = blas::Epilogue::kDGelu;
      o.aux = const_cast<T*>(saved.data());
      if constexpr (S == Space::kHost) o.gelu_aux = blas::GeluAux::kSlope;
      detail::gemm_on(exec, blas::Op::kN, blas::Op::kN, TensorView<const T, 2, S>(dy),
                      weight_view<T>(), dpre, o);
    }
  }

 private:
  /// y = x W^T + b + beta * (c_in, or y when c_in is null): the forward product.
  template <class P, class E, class T, class TY>
  void project(const E& exec, TensorView<const T, 2, S> x, TensorView<TY, 2, S> y, float beta,
               const T* c_in) const {
    blas::GemmOptions<T> o = bias_options<P, T>();
    o.beta = beta;
    o.c_in = c_in;
    detail::gemm_on(exec, blas::Op::kN, blas::Op::kT, x, weight_view<T>(), y, o);
  }

  /// Gemm options of the forward products: the policy's compute type, the bias in the epilogue.
  template <class P, class T>
  blas::GemmOptions<T> bias_options() const {
    blas::GemmOptions<T> o;
    o.compute = P::gemm_compute;
    if (has_bias()) {
      o.epilogue = blas::Epilogue::kBias;
      o.bias = weight_data<T>(bias_);
    }
    return o;
  }

  template <class P, class E, class T>
  void accumulate_param_grads(const E& exec, TensorView<const T, 2, S> x,
                              TensorView<const T, 2, S> dy) {
    blas::GemmOptions<float> o;
    o.beta = 1.0f;
    if constexpr (std::is_same_v<T, float>) o.compute = P::gemm_compute;
    if constexpr (S == Space::kHost && std::is_same_v<T, float>) {
      if (has_bias()) {
        // The host gemm sums dy's columns while it packs dy^T for dW (kBiasGrad, one read of
        // dy): the sums bias_grad_accumulate would make, added to the gradient the same way.
        float* sums = bias_scratch_.template get<float>(out_);
        o.epilogue = blas::Epilogue::kBiasGrad;
        o.bias_grad = sums;
        detail::gemm_on(exec, blas::Op::kT, blas::Op::kN, dy, x, arena_->template grad<2>(weight_),
                        o);
        float* db = arena_->grad_flat(bias_).data();
        for (std::int64_t j = 0; j < out_; ++j) db[j] += sums[j];
        return;
      }
    }
    detail::gemm_on(exec, blas::Op::kT, blas::Op::kN, dy, x, arena_->template grad<2>(weight_), o);
    if (has_bias())
      detail::bias_grad_accumulate(exec, dy, arena_->grad_flat(bias_).data(), bias_scratch_);
  }

  /// Throws unless the input gradient `out` shares no memory with `in`, which its product reads:
  /// checked before any parameter gradient is added, so a refused call changes nothing.
  template <class VO, class VI>
  static void check_apart(const char* who, const char* out_name, const VO& out, const char* in_name,
                          const VI& in) {
    TRAINKIT_CHECK(!blas::detail::byte_rows_overlap(blas::detail::byte_rows(out_name, out),
                                                    blas::detail::byte_rows(in_name, in)),
                   who, ": ", out_name, " ", detail::shape_of(out), " overlaps ", in_name, " ",
                   detail::shape_of(in), ", which is read while ", out_name, " is written");
  }

  template <class VX, class VY>
  void check_io(const char* who, const VX& x, const VY& y) const {
    TRAINKIT_CHECK(x.size(1) == in_ && y.size(1) == out_ && x.size(0) == y.size(0), who,
                   ": expected x [N, ", in_, "] and y/dy [N, ", out_, "], got ",
                   detail::shape_of(x), " and ", detail::shape_of(y));
    detail::check_rows(who, "input", x);
    detail::check_rows(who, "output", y);
  }

  /// W in the compute type: the f32 master for float, the compute copy otherwise.
  template <class T>
  TensorView<const T, 2, S> weight_view() const {
    if constexpr (std::is_same_v<T, float>) {
      return std::as_const(*arena_).template param<2>(weight_);
    } else {
      return arena_->template compute_param<T, 2>(weight_);
    }
  }
  template <class T>
  const T* weight_data(ParamId id) const {
    if constexpr (std::is_same_v<T, float>) {
      return std::as_const(*arena_).template param<1>(id).data();
    } else {
      return arena_->template compute_param<T, 1>(id).data();
    }
  }

  ParamArena<S>* arena_;
  std::int64_t in_;
  std::int64_t out_;
  ParamId weight_;
  ParamId bias_;
  bool weight_tied_ = false;
  detail::Scratch<S> bias_scratch_;  // the device bias gradient's per-chunk partial sums
};

template <Space S>
Linear(ParamArena<S>&, const std::string&, LinearOptions) -> Linear<S>;

}  // namespace nn
TRAINKIT_NAMESPACE_END
