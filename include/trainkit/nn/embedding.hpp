// SPDX-License-Identifier: MIT
// trainkit/nn/embedding.hpp: `Embedding`, a lookup table out[n] = W[ids[n]] (torch.nn.Embedding),
// e.g. GPT-2's token (wte) and position (wpe) tables. Backward scatters rows of dout into dW
// without atomics: each element of dW gets its additions in position order, so repeated ids give
// the same bits every run, on the CPU and on the GPU (there: positions sorted by id, one block
// per id).
#pragma once

#include <algorithm>
#include <cstdint>
#include <string>
#include <type_traits>

#include "trainkit/amp/policy.hpp"
#include "trainkit/config.hpp"
#include "trainkit/core/tensor_view.hpp"
#include "trainkit/error.hpp"
#include "trainkit/exec/launch.hpp"
#include "trainkit/nn/init.hpp"
#include "trainkit/nn/layer.hpp"
#include "trainkit/nn/param_arena.hpp"

#if TRAINKIT_CUDA_COMPILER && TRAINKIT_WITH_CUDA
#include <cub/device/device_radix_sort.cuh>
#endif

TRAINKIT_NAMESPACE_BEGIN
namespace nn {
namespace detail {

template <class T, class I>
struct EmbeddingArgs {
  const I* ids;
  const float* w;  // [V, C] f32 master table
  T* out;          // forward
  const T* dout;   // backward
  float* dw;
  std::int64_t n;
  std::int64_t vocab;
  std::int64_t cols;
  bool accumulate;
};

/// Throws naming the first id outside [0, vocab) (rows of the table are addressed unchecked).
template <class T, class I>
void check_embedding_ids(const EmbeddingArgs<T, I>& a) {
  for (std::int64_t i = 0; i < a.n; ++i) {
    const auto id = static_cast<std::int64_t>(a.ids[i]);
    TRAINKIT_CHECK(id >= 0 && id < a.vocab, "nn::Embedding: id ", id, " at position ", i,
                   " is out of range [0, ", a.vocab, ")");
  }
}

template <class T, class I>
void embedding_forward(const exec::Host& host, const EmbeddingArgs<T, I>& a) {
  check_embedding_ids(a);
  for_rows(host, a.n, a.cols, [&](std::int64_t r0, std::int64_t r1) TRAINKIT_INLINE_LAMBDA {
    for (std::int64_t r = r0; r < r1; ++r) {
      const float* src = a.w + static_cast<std::int64_t>(a.ids[r]) * a.cols;
      T* dst = a.out + r * a.cols;
      if (a.accumulate) {
        for (std::int64_t c = 0; c < a.cols; ++c) dst[c] = store<T>(load(dst[c]) + src[c]);
      } else {
        for (std::int64_t c = 0; c < a.cols; ++c) dst[c] = store<T>(src[c]);
      }
    }
  });
}

template <class T, class I>
void embedding_backward(const exec::Host& host, const EmbeddingArgs<T, I>& a,
                        Scratch<Space::kHost>& /*scratch*/) {
  check_embedding_ids(a);  // backward may be given other ids than forward was
  // Column blocks in parallel; within a block, positions in order: deterministic.
  constexpr std::int64_t kBlock = 64;
  const std::int64_t blocks = (a.cols + kBlock - 1) / kBlock;
  for_rows(host, blocks, a.n * kBlock,
           [&](std::int64_t b0, std::int64_t b1) TRAINKIT_INLINE_LAMBDA {
             for (std::int64_t b = b0; b < b1; ++b) {
               const std::int64_t c0 = b * kBlock, c1 = std::min(a.cols, c0 + kBlock);
               for (std::int64_t r = 0; r < a.n; ++r) {
                 float* dst = a.dw + static_cast<std::int64_t>(a.ids[r]) * a.cols;
                 const T* src = a.dout + r * a.cols;
                 for (std::int64_t c = c0; c < c1; ++c) dst[c] += load(src[c]);
               }
             }
           });
}

#if TRAINKIT_CUDA_COMPILER && TRAINKIT_WITH_CUDA
inline namespace TRAINKIT_DETAIL_EXEC_ARCH_NS {

template <class T, class I>
__global__ void __launch_bounds__(256) embedding_forward_kernel(EmbeddingArgs<T, I> a) {
  const std::int64_t total = a.n * a.cols;
  const std::int64_t stride = static_cast<std::int64_t>(gridDim.x) * blockDim.x;
  for (std::int64_t i = static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < total;
       i += stride) {
    const std::int64_t r = i / a.cols, c = i % a.cols;
    const auto id = static_cast<std::int64_t>(a.ids[r]);
    // Out-of-range ids cannot throw on the device: they trap, as an index assertion would.
    if (id < 0 || id >= a.vocab) __trap();
    float v = a.w[id * a.cols + c];
    if (a.accumulate) v += load(a.out[i]);
    a.out[i] = store<T>(v);
  }
}

/// Columns per thread of the sorted backward (in registers), times the block's 256 threads.
inline constexpr int kEmbeddingColsPerThread = 4;

/// dW[id] += dout[p] for the positions p of one id, in ascending order: block i owns the run of
/// equal ids that starts at sorted index i (other blocks return), so each row of dW is written by
/// one block, and each element gets its additions in position order: the bits of the host's
/// loop, without atomics.
template <class T, class I>
__global__ void __launch_bounds__(256)
    embedding_backward_sorted_kernel(const I* __restrict__ keys,
                                     const std::int32_t* __restrict__ pos,
                                     const T* __restrict__ dout, float* __restrict__ dw,
                                     std::int64_t n, std::int64_t cols, std::int64_t vocab) {
  __shared__ std::int64_t run_end;
  const std::int64_t i = blockIdx.x;
  const I id = keys[i];
  // Out-of-range ids cannot throw on the device: they trap, as an index assertion would.
  if (static_cast<std::int64_t>(id) < 0 || static_cast<std::int64_t>(id) >= vocab) __trap();
  if (i > 0 && keys[i - 1] == id) return;
  if (threadIdx.x == 0) {
    std::int64_t e = i + 1;
    while (e < n && keys[e] == id) ++e;
    run_end = e;
  }
  __syncthreads();
  const std::int64_t end = run_end;
  float* row = dw + static_cast<std::int64_t>(id) * cols;
  constexpr int kPer = kEmbeddingColsPerThread;
  for (std::int64_t c0 = 0; c0 < cols; c0 += kPer * 256) {
    float acc[kPer];
#pragma unroll
    for (int k = 0; k < kPer; ++k) {
      const std::int64_t c = c0 + k * 256 + threadIdx.x;
      acc[k] = c < cols ? row[c] : 0.0f;
    }
    for (std::int64_t j = i; j < end; ++j) {
      const T* src = dout + static_cast<std::int64_t>(pos[j]) * cols;
#pragma unroll
      for (int k = 0; k < kPer; ++k) {
        const std::int64_t c = c0 + k * 256 + threadIdx.x;
        if (c < cols) acc[k] += load(src[c]);
      }
    }
#pragma unroll
    for (int k = 0; k < kPer; ++k) {
      const std::int64_t c = c0 + k * 256 + threadIdx.x;
      if (c < cols) row[c] = acc[k];
    }
  }
}

/// pos[i] = i (a template, like every kernel of the headers).
template <class I>
__global__ void __launch_bounds__(256) embedding_iota_kernel(std::int32_t* pos, std::int64_t n) {
  const std::int64_t i = static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i < n) pos[i] = static_cast<std::int32_t>(i);
}

template <class T, class I>
void embedding_forward(const exec::Cuda& exec, const EmbeddingArgs<T, I>& a) {
  const std::int64_t total = a.n * a.cols;
  if (total == 0) return;
  const auto blocks = static_cast<unsigned>(std::min<std::int64_t>((total + 255) / 256, 4096));
  embedding_forward_kernel<T, I><<<blocks, 256, 0, exec.stream().get()>>>(a);
  exec::detail::check_kernel_launch("nn::Embedding forward", "positions ", a.n, ", dim ", a.cols);
}

/// Device backward: the positions sorted by id (CUB's radix sort is stable, so each id's
/// positions stay ascending), then one block per run of equal ids. `scratch` holds the sorted
/// keys and positions and CUB's temporary storage (the caller's, reused between calls).
template <class T, class I>
void embedding_backward(const exec::Cuda& exec, const EmbeddingArgs<T, I>& a,
                        Scratch<Space::kDevice>& scratch) {
  if (a.n == 0 || a.cols == 0) return;
  TRAINKIT_CHECK(a.n < (std::int64_t{1} << 31), "nn::Embedding: ", a.n,
                 " positions are too many for the device backward (at most 2^31 - 1)");
  cudaStream_t stream = exec.stream().get();
  const int n = static_cast<int>(a.n);
  // ids are in [0, vocab): only their low bits need sorting (never more bits than I has).
  constexpr int kKeyBits = static_cast<int>(sizeof(I) * 8);
  int end_bit = 1;
  while (end_bit < kKeyBits && (std::int64_t{1} << end_bit) < a.vocab) ++end_bit;
  std::size_t temp_bytes = 0;
  TRAINKIT_CUDA_CHECK(
      cub::DeviceRadixSort::SortPairs(nullptr, temp_bytes, a.ids, static_cast<I*>(nullptr),
                                      static_cast<const std::int32_t*>(nullptr),
                                      static_cast<std::int32_t*>(nullptr), n, 0, end_bit, stream));
  const std::int64_t keys_bytes = (a.n * static_cast<std::int64_t>(sizeof(I)) + 255) / 256 * 256;
  const std::int64_t pos_bytes = (a.n * 4 + 255) / 256 * 256;
  auto* base = scratch.template get<unsigned char>(keys_bytes + 2 * pos_bytes +
                                                   static_cast<std::int64_t>(temp_bytes));
  auto* keys = reinterpret_cast<I*>(base);
  auto* pos_in = reinterpret_cast<std::int32_t*>(base + keys_bytes);
  auto* pos_out = reinterpret_cast<std::int32_t*>(base + keys_bytes + pos_bytes);
  void* temp = base + keys_bytes + 2 * pos_bytes;
  const unsigned iota_blocks = exec::detail::grid_blocks_x(a.n, 256, "nn::Embedding backward");
  embedding_iota_kernel<I><<<iota_blocks, 256, 0, stream>>>(pos_in, a.n);
  exec::detail::check_kernel_launch("nn::Embedding backward (positions)", "positions ", a.n);
  TRAINKIT_CUDA_CHECK(cub::DeviceRadixSort::SortPairs(temp, temp_bytes, a.ids, keys, pos_in,
                                                      pos_out, n, 0, end_bit, stream));
  embedding_backward_sorted_kernel<T, I><<<static_cast<unsigned>(a.n), 256, 0, stream>>>(
      keys, pos_out, a.dout, a.dw, a.n, a.cols, a.vocab);
  exec::detail::check_kernel_launch("nn::Embedding backward", "positions ", a.n, ", vocab ",
                                    a.vocab, ", dim ", a.cols);
}

}  // namespace TRAINKIT_DETAIL_EXEC_ARCH_NS
#else
TRAINKIT_DETAIL_NN_CUDA_ONLY(embedding_forward)
TRAINKIT_DETAIL_NN_CUDA_ONLY(embedding_backward)
#endif
}  // namespace detail

/// Options of nn::Embedding. Default init N(0, 1), as torch.nn.Embedding (GPT-2 uses 0.02).
struct EmbeddingOptions {
  std::int64_t num_embeddings = 0;  ///< V, rows of the table
  std::int64_t embedding_dim = 0;   ///< C
  Init init = Init::normal(0.0f, 1.0f);
};

/// Lookup table (torch.nn.Embedding): out[n, :] = W[ids[n], :]. Parameter "<name>.weight" [V, C].
/// Shapes: ids [N] (int32 or int64 token ids in [0, V)), out [N, C] in the activation type.
/// forward writes out (or adds the rows to it with Write::kAccumulate: token + position
/// embeddings in one buffer) and throws (host) / traps (device) on an id out of range.
/// backward reads ids and dout and adds dout[n] to dW[ids[n]]; there is no input gradient.
template <Space S = Space::kHost>
class Embedding {
 public:
  Embedding(ParamArena<S>& arena, const std::string& name, EmbeddingOptions options)
      : arena_(&arena), vocab_(options.num_embeddings), dim_(options.embedding_dim) {
    detail::check_sizes_positive("nn::Embedding", name, "num_embeddings", vocab_, "embedding_dim",
                                 dim_);
    weight_ = arena.add(detail::child_name(name, "weight"), Shape{vocab_, dim_}, options.init);
  }

  ParamId weight() const noexcept { return weight_; }
  std::int64_t num_embeddings() const noexcept { return vocab_; }
  std::int64_t embedding_dim() const noexcept { return dim_; }

  template <amp::Policy P = amp::Fp32, class E, class I, class TO>
  void forward(const E& exec, TensorView<I, 1, S> ids, TensorView<TO, 2, S> out,
               Write mode = Write::kOverwrite) const {
    static_assert(std::is_same_v<std::remove_const_t<I>, std::int32_t> ||
                      std::is_same_v<std::remove_const_t<I>, std::int64_t>,
                  "nn::Embedding: ids are int32 or int64");
    detail::check_call<P, E, S, TO>();
    check_io("nn::Embedding::forward", ids, out);
    auto a = args<TO>(ids.data(), ids.size(0));
    a.out = out.data();
    a.accumulate = mode == Write::kAccumulate;
    detail::embedding_forward(exec, a);
  }

  template <amp::Policy P = amp::Fp32, class E, class I, class TD>
  void backward(const E& exec, TensorView<I, 1, S> ids, TensorView<TD, 2, S> dout) {
    using T = std::remove_const_t<TD>;
    detail::check_call<P, E, S, TD>();
    check_io("nn::Embedding::backward", ids, dout);
    auto a = args<T>(ids.data(), ids.size(0));
    a.dout = dout.data();
    a.dw = arena_->grad_flat(weight_).data();
    detail::embedding_backward(exec, a, scratch_);
  }

 private:
  template <class T, class I>
  detail::EmbeddingArgs<T, std::remove_const_t<I>> args(I* ids, std::int64_t n) const {
    detail::EmbeddingArgs<T, std::remove_const_t<I>> a{};
    a.ids = ids;
    a.w = arena_->params_data() + arena_->info(weight_).offset;
    a.n = n;
    a.vocab = vocab_;
    a.cols = dim_;
    return a;
  }

  template <class VI, class VO>
  void check_io(const char* who, const VI& ids, const VO& out) const {
    TRAINKIT_CHECK(out.size(0) == ids.size(0) && out.size(1) == dim_, who, ": ids ",
                   detail::shape_of(ids), " and out ", detail::shape_of(out),
                   " do not fit [N] and [N, ", dim_, "]");
    detail::check_contiguous(who, "ids", ids);
    detail::check_contiguous(who, "out", out);
  }

  ParamArena<S>* arena_;
  std::int64_t vocab_;
  std::int64_t dim_;
  ParamId weight_;
  detail::Scratch<S> scratch_;  // the device backward's sorted ids and positions
};

template <Space S>
Embedding(ParamArena<S>&, const std::string&, EmbeddingOptions) -> Embedding<S>;

}  // namespace nn
TRAINKIT_NAMESPACE_END
