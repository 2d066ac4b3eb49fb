// SPDX-License-Identifier: MIT
// trainkit/data/augment.hpp: image augmentations as host/device functors: random crop with zero
// padding, horizontal flip, per-channel normalisation. Per-sample randomness is one Philox block
// keyed by (seed, epoch, sample index), so a sample is augmented the same way on the CPU (in the
// Prefetcher's workers), on the GPU (a kernel over a device batch) and after a resume; the
// arithmetic is a single fmaf per element, so CPU and GPU results are bitwise identical.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "trainkit/config.hpp"
#include "trainkit/core/dtype.hpp"
#include "trainkit/core/rng.hpp"
#include "trainkit/data/dataset.hpp"
#include "trainkit/data/prefetcher.hpp"
#include "trainkit/error.hpp"

#if TRAINKIT_WITH_CUDA
#include <cuda_runtime_api.h>

#include "trainkit/cuda/stream.hpp"
#endif

TRAINKIT_NAMESPACE_BEGIN
namespace data {

/// The most channels Normalize stores (RGBA).
inline constexpr int kMaxImageChannels = 4;

/// How one image sample is laid out: [C, H, W] (channels_last = false, PyTorch) or [H, W, C].
struct ImageLayout {
  int channels = 3;
  int height = 32;
  int width = 32;
  bool channels_last = false;

  TRAINKIT_HOST_DEVICE constexpr std::size_t numel() const noexcept {
    return static_cast<std::size_t>(channels) * static_cast<std::size_t>(height) *
           static_cast<std::size_t>(width);
  }
  /// Offset of element (c, y, x) within one sample.
  TRAINKIT_HOST_DEVICE constexpr std::size_t offset(int c, int y, int x) const noexcept {
    return channels_last
               ? (static_cast<std::size_t>(y) * width + static_cast<std::size_t>(x)) * channels + c
               : (static_cast<std::size_t>(c) * height + static_cast<std::size_t>(y)) * width + x;
  }
};

/// The random choices for one sample, drawn from Philox(seed; counter = (epoch, index)).
struct AugmentDraw {
  std::uint32_t w[4];
};

TRAINKIT_HOST_DEVICE inline AugmentDraw augment_draw(std::uint64_t seed, std::uint64_t epoch,
                                                     std::int64_t index) noexcept {
  const U32x4 b = Philox4x32::generate(seed, epoch, static_cast<std::uint64_t>(index));
  return AugmentDraw{{b.v[0], b.v[1], b.v[2], b.v[3]}};
}

/// torchvision's RandomCrop(size = (H, W), padding = p, fill = 0): crop an H x W window at a
/// uniform offset in [0, 2p] of the zero-padded image. Maps output (y, x) to an input pixel.
struct RandomCrop {
  int padding = 4;

  TRAINKIT_HOST_DEVICE int offset_y(const AugmentDraw& d) const noexcept {
    return static_cast<int>(d.w[0] % static_cast<std::uint32_t>(2 * padding + 1)) - padding;
  }
  TRAINKIT_HOST_DEVICE int offset_x(const AugmentDraw& d) const noexcept {
    return static_cast<int>(d.w[1] % static_cast<std::uint32_t>(2 * padding + 1)) - padding;
  }
};

/// torchvision's RandomHorizontalFlip(p): mirror the columns with probability p.
struct HorizontalFlip {
  float probability = 0.5f;

  TRAINKIT_HOST_DEVICE bool flips(const AugmentDraw& d) const noexcept {
    return uniform_float(d.w[2]) < probability;
  }
};

/// Per-channel normalisation: out = (v * scale - mean[c]) / stddev[c], computed as one
/// fmaf(v, scale / stddev[c], -mean[c] / stddev[c]) so host and device round identically.
struct Normalize {
  float scale = 1.0f / 255.0f;
  float mean[kMaxImageChannels] = {0.0f, 0.0f, 0.0f, 0.0f};
  float stddev[kMaxImageChannels] = {1.0f, 1.0f, 1.0f, 1.0f};
};

/// What ImageAugment does; the defaults do nothing but normalise with scale 1/255.
struct ImageAugmentOptions {
  ImageLayout layout{};
  RandomCrop crop{0};
  HorizontalFlip flip{0.0f};
  Normalize normalize{};
  std::uint64_t seed = 0;
};

/// Crop + flip + normalise in one pass, usable per element on host and device (it is trivially
/// copyable: kernels take it by value). Output is f32 in the input's layout; the input element
/// type is uint8_t or float.
class ImageAugment {
 public:
  /// Validates the options and precomputes the per-channel fma coefficients. Throws
  /// trainkit::Error for a bad layout, a padding outside [0, 2^24], a zero stddev, or a
  /// normalisation whose coefficients are not finite (a NaN or infinite scale, mean or stddev).
  TRAINKIT_INLINE explicit ImageAugment(const ImageAugmentOptions& options);

  TRAINKIT_HOST_DEVICE const ImageAugmentOptions& options() const noexcept { return o_; }
  TRAINKIT_HOST_DEVICE const ImageLayout& layout() const noexcept { return o_.layout; }
  TRAINKIT_HOST_DEVICE std::uint64_t seed() const noexcept { return o_.seed; }

  /// Output element (c, y, x) of the sample at `in` whose draw is `d`.
  template <class In>
  TRAINKIT_HOST_DEVICE float operator()(const In* in, const AugmentDraw& d, int c, int y,
                                        int x) const noexcept {
    const ImageLayout& l = o_.layout;
    const int xf = o_.flip.flips(d) ? l.width - 1 - x : x;
    const int sy = y + o_.crop.offset_y(d);
    const int sx = xf + o_.crop.offset_x(d);
    float v = 0.0f;
    if (sy >= 0 && sy < l.height && sx >= 0 && sx < l.width)
      v = static_cast<float>(in[l.offset(c, sy, sx)]);
#if defined(__CUDA_ARCH__)
    return __fmaf_rn(v, a_[c], b_[c]);
#else
    return std::fma(v, a_[c], b_[c]);
#endif
  }

  /// Augments one sample on the host.
  template <class In>
  void apply_host(const In* in, float* out, std::uint64_t epoch, std::int64_t index) const {
    const AugmentDraw d = augment_draw(o_.seed, epoch, index);
    const ImageLayout& l = o_.layout;
    for (int c = 0; c < l.channels; ++c)
      for (int y = 0; y < l.height; ++y)
        for (int x = 0; x < l.width; ++x) out[l.offset(c, y, x)] = (*this)(in, d, c, y, x);
  }

  /// Augments `rows` samples (a batch: in/out hold rows x layout.numel() elements) on the host;
  /// `indices` are the samples' dataset indices (Batch::indices()).
  template <class In>
  void apply_batch_host(const In* in, float* out, std::span<const std::int64_t> indices,
                        std::uint64_t epoch) const {
    const std::size_t n = o_.layout.numel();
    for (std::size_t r = 0; r < indices.size(); ++r)
      apply_host(in + r * n, out + r * n, epoch, indices[r]);
  }

 private:
  ImageAugmentOptions o_;
  float a_[kMaxImageChannels] = {};
  float b_[kMaxImageChannels] = {};
};

/// A Prefetcher transform that augments field `field` (uint8 or f32, matching aug.layout()) into
/// an f32 field of the same name and copies the other fields. Set both results in the options:
/// `std::tie(opts.transform, opts.output_fields) = image_transform(aug, ds.fields(), "image");`
/// (an f32 field may also be augmented in place, without output_fields; a uint8 field given no
/// output_fields is refused by the transform, whose floats would not fit its bytes).
TRAINKIT_INLINE std::pair<SampleTransform, std::vector<FieldSpec>> image_transform(
    const ImageAugment& aug, std::span<const FieldSpec> fields, std::string_view field);

#if TRAINKIT_CUDA_COMPILER
namespace detail {
template <class In>
__global__ void __launch_bounds__(256)
    augment_batch_kernel(ImageAugment aug, const In* in, float* out, const std::int64_t* indices,
                         std::size_t rows, std::uint64_t epoch) {
  const ImageLayout& l = aug.layout();
  const std::size_t n = l.numel();
  const std::size_t total = rows * n;
  const int H = l.height, W = l.width, C = l.channels;
  for (std::size_t i = blockIdx.x * std::size_t(blockDim.x) + threadIdx.x; i < total;
       i += std::size_t(gridDim.x) * blockDim.x) {
    const std::size_t r = i / n;
    const std::size_t e = i % n;
    int c, y, x;
    if (l.channels_last) {
      c = static_cast<int>(e % C);
      x = static_cast<int>((e / C) % W);
      y = static_cast<int>(e / (std::size_t(C) * W));
    } else {
      x = static_cast<int>(e % W);
      y = static_cast<int>((e / W) % H);
      c = static_cast<int>(e / (std::size_t(W) * H));
    }
    const AugmentDraw d = augment_draw(aug.seed(), epoch, indices[r]);
    out[i] = aug(in + r * n, d, c, y, x);
  }
}
}  // namespace detail

/// Augments a device batch on `stream`: `in`/`out` hold rows x layout.numel() elements in
/// device memory, `indices` the rows' dataset indices (Batch::device_indices()). Produces the
/// same bits as apply_batch_host. Throws trainkit::Error if the launch fails.
template <class In>
void augment_batch_device(const ImageAugment& aug, const In* in, float* out,
                          const std::int64_t* indices, std::size_t rows, std::uint64_t epoch,
                          cuda::StreamRef stream) {
  const std::size_t total = rows * aug.layout().numel();
  if (total == 0) return;
  const unsigned threads = 256;
  const std::size_t blocks = std::min<std::size_t>((total + threads - 1) / threads, 65535);
  detail::augment_batch_kernel<In><<<static_cast<unsigned>(blocks), threads, 0, stream.get()>>>(
      aug, in, out, indices, rows, epoch);
  const cudaError_t err = cudaGetLastError();
  TRAINKIT_CHECK(err == cudaSuccess, "data::augment_batch_device (", rows, " samples of ",
                 aug.layout().channels, " x ", aug.layout().height, " x ", aug.layout().width,
                 ") failed to launch: ", cudaGetErrorString(err));
}
#endif

#if TRAINKIT_IMPL

TRAINKIT_INLINE ImageAugment::ImageAugment(const ImageAugmentOptions& options) : o_(options) {
  const ImageLayout& l = o_.layout;
  TRAINKIT_CHECK(l.channels >= 1 && l.channels <= kMaxImageChannels,
                 "ImageAugment: channels must be in [1, ", kMaxImageChannels, "], got ",
                 l.channels);
  TRAINKIT_CHECK(l.height >= 1 && l.width >= 1, "ImageAugment: bad image size ", l.height, "x",
                 l.width);
  TRAINKIT_CHECK(o_.crop.padding >= 0 && o_.crop.padding <= (1 << 24),
                 "ImageAugment: crop padding ", o_.crop.padding,
                 " is not in [0, 2^24] (a padding wider than any image)");
  for (int c = 0; c < l.channels; ++c) {
    TRAINKIT_CHECK(o_.normalize.stddev[c] != 0.0f, "ImageAugment: stddev[", c, "] is zero");
    a_[c] = o_.normalize.scale / o_.normalize.stddev[c];
    b_[c] = -o_.normalize.mean[c] / o_.normalize.stddev[c];
    // A NaN or infinite scale, mean or stddev (or a stddev so small the ratio overflows) would
    // turn every output of the channel into NaN or infinity.
    TRAINKIT_CHECK(std::isfinite(a_[c]) && std::isfinite(b_[c]), "ImageAugment: channel ", c,
                   " normalises with scale ", o_.normalize.scale, ", mean ", o_.normalize.mean[c],
                   " and stddev ", o_.normalize.stddev[c],
                   ", which give a non-finite factor; all three must be finite");
  }
}

TRAINKIT_INLINE std::pair<SampleTransform, std::vector<FieldSpec>> image_transform(
    const ImageAugment& aug, std::span<const FieldSpec> fields, std::string_view field) {
  const std::size_t k = field_index(fields, field);
  const FieldSpec& f = fields[k];
  TRAINKIT_CHECK(f.dtype == DType::kU8 || f.dtype == DType::kF32, "image_transform: field '", field,
                 "' is ", dtype_name(f.dtype), "; expected U8 or F32");
  TRAINKIT_CHECK(f.numel() == aug.layout().numel(), "image_transform: field '", field, "' has ",
                 f.numel(), " elements per sample but the layout says ", aug.layout().numel());
  std::vector<FieldSpec> out(fields.begin(), fields.end());
  out[k].dtype = DType::kF32;
  const bool u8 = f.dtype == DType::kU8;
  const std::size_t n = f.numel();
  SampleTransform t = [aug, k, u8, n, name = std::string(field)](
                          const SampleInfo& info, const SampleRef& in, const SampleRef& o) {
    // Without the output fields in the options the Prefetcher hands the dataset's own (U8)
    // field as the output, too small for the floats written into it.
    const std::size_t got = k < o.size() ? o[k].size() : 0;
    TRAINKIT_CHECK(in.size() == o.size() && k < in.size() && in[k].size() == n * (u8 ? 1 : 4) &&
                       got == n * sizeof(float),
                   "image_transform: field '", name, "' is ", got,
                   " bytes per sample in the batch, not ", n, " f32 values: set ",
                   "PrefetchOptions::output_fields to the fields image_transform returns");
    for (std::size_t j = 0; j < in.size(); ++j) {
      if (j == k) {
        if (u8) {
          aug.apply_host(reinterpret_cast<const std::uint8_t*>(in[j].data()),
                         reinterpret_cast<float*>(o[j].data()), info.epoch, info.index);
        } else {
          const auto* src = reinterpret_cast<const float*>(in[j].data());
          if (in[j].data() == o[j].data()) {
            // In place (an f32 field needs no output_fields): crops and flips read pixels that
            // this pass has already written, so read a copy of the sample instead.
            thread_local std::vector<float> copy;
            copy.assign(src, src + n);
            src = copy.data();
          }
          aug.apply_host(src, reinterpret_cast<float*>(o[j].data()), info.epoch, info.index);
        }
      } else if (!in[j].empty() && in[j].data() != o[j].data()) {
        std::memcpy(o[j].data(), in[j].data(), in[j].size());
      }
    }
  };
  return {std::move(t), std::move(out)};
}

#endif  // TRAINKIT_IMPL

}  // namespace data
TRAINKIT_NAMESPACE_END
