// SPDX-License-Identifier: MIT
// Augmentations on the host: crop/flip against an explicit pad-crop-flip reference, normalise
// against float64, the Philox keying by (seed, epoch, index), layouts, and the Prefetcher
// transform (same augmented batch after a resume). prefetch_device.cu checks GPU == CPU bits.
#include <doctest/doctest.h>

#include <cmath>
#include <cstdint>
#include <limits>
#include <set>
#include <tuple>
#include <vector>

#include <trainkit/data/augment.hpp>
#include <trainkit/data/npy_dataset.hpp>
#include <trainkit/data/sampler.hpp>

#include "data_test_util.hpp"

namespace tk = trainkit;
using data_test::check_contains;
using data_test::error_of;
using data_test::fixture;

namespace {

constexpr int C = 3, H = 5, W = 6;

std::vector<std::uint8_t> test_image() {
  std::vector<std::uint8_t> img(C * H * W);
  for (std::size_t i = 0; i < img.size(); ++i)
    img[i] = static_cast<std::uint8_t>((i * 37 + 11) % 256);
  return img;
}

/// Pads by p with zeros, crops H x W at (oy, ox) of the padded image, flips if asked, and
/// normalises in float64: the torchvision pipeline written out step by step.
std::vector<double> reference(const std::vector<std::uint8_t>& img, int p, int oy, int ox,
                              bool flip, const tk::data::Normalize& n) {
  const int PH = H + 2 * p, PW = W + 2 * p;
  std::vector<double> padded(static_cast<std::size_t>(C * PH * PW), 0.0);
  for (int c = 0; c < C; ++c)
    for (int y = 0; y < H; ++y)
      for (int x = 0; x < W; ++x)
        padded[std::size_t((c * PH + y + p) * PW + x + p)] = img[std::size_t((c * H + y) * W + x)];
  std::vector<double> out(static_cast<std::size_t>(C * H * W));
  for (int c = 0; c < C; ++c)
    for (int y = 0; y < H; ++y)
      for (int x = 0; x < W; ++x) {
        const int cx = flip ? W - 1 - x : x;
        const double v = padded[std::size_t((c * PH + y + oy) * PW + cx + ox)];
        out[std::size_t((c * H + y) * W + x)] =
            (v * double(n.scale) - double(n.mean[c])) / double(n.stddev[c]);
      }
  return out;
}

tk::data::ImageAugmentOptions options(int padding, float flip_p) {
  tk::data::ImageAugmentOptions o;
  o.layout = {C, H, W, false};
  o.crop.padding = padding;
  o.flip.probability = flip_p;
  o.normalize = {1.0f / 255.0f, {0.4914f, 0.4822f, 0.4465f, 0}, {0.247f, 0.243f, 0.261f, 1}};
  o.seed = 1234;
  return o;
}

}  // namespace

TEST_CASE("augment: crop + flip + normalise equal the explicit pad/crop/flip reference") {
  const std::vector<std::uint8_t> img = test_image();
  const tk::data::ImageAugment aug(options(2, 0.5f));
  std::set<std::tuple<int, int, bool>> seen;
  for (std::int64_t index = 0; index < 300; ++index) {
    const tk::data::AugmentDraw d = tk::data::augment_draw(1234, 3, index);
    const int oy = int(d.w[0] % 5), ox = int(d.w[1] % 5);
    const bool flip = tk::uniform_float(d.w[2]) < 0.5f;
    seen.insert({oy, ox, flip});
    std::vector<float> out(C * H * W);
    aug.apply_host(img.data(), out.data(), 3, index);
    const std::vector<double> ref = reference(img, 2, oy, ox, flip, aug.options().normalize);
    for (std::size_t i = 0; i < out.size(); ++i) {
      // One fmaf: within 2 float ulps of the float64 pipeline.
      if (std::abs(double(out[i]) - ref[i]) > 2.5e-7 * std::max(1.0, std::abs(ref[i]))) {
        FAIL_CHECK("index " << index << " element " << i << ": " << out[i] << " vs " << ref[i]);
        break;
      }
    }
  }
  CHECK(seen.size() == 5 * 5 * 2);  // every offset and both flips occur
}

TEST_CASE("augment: randomness is a pure function of (seed, epoch, index)") {
  const std::vector<std::uint8_t> img = test_image();
  const tk::data::ImageAugment aug(options(3, 0.5f));
  std::vector<float> a(C * H * W), b(C * H * W), c(C * H * W);
  aug.apply_host(img.data(), a.data(), 7, 42);
  aug.apply_host(img.data(), b.data(), 7, 42);
  CHECK(a == b);
  int differ = 0;
  for (std::uint64_t e = 0; e < 8; ++e) {
    aug.apply_host(img.data(), c.data(), e, 42);
    differ += c != a;
  }
  CHECK(differ >= 5);  // 7 of 8 epochs draw a different crop/flip almost surely
  int flips = 0;
  for (std::int64_t i = 0; i < 2000; ++i)
    flips += aug.options().flip.flips(tk::data::augment_draw(1234, 0, i));
  CHECK(flips > 900);
  CHECK(flips < 1100);
}

TEST_CASE("augment: channels-last layout is the transpose of channels-first") {
  const std::vector<std::uint8_t> chw = test_image();
  std::vector<std::uint8_t> hwc(chw.size());
  for (int c = 0; c < C; ++c)
    for (int y = 0; y < H; ++y)
      for (int x = 0; x < W; ++x)
        hwc[std::size_t((y * W + x) * C + c)] = chw[std::size_t((c * H + y) * W + x)];
  tk::data::ImageAugmentOptions o = options(2, 0.5f);
  const tk::data::ImageAugment first(o);
  o.layout.channels_last = true;
  const tk::data::ImageAugment last(o);
  std::vector<float> a(chw.size()), b(chw.size());
  for (std::int64_t index : {0, 1, 2, 99}) {
    first.apply_host(chw.data(), a.data(), 1, index);
    last.apply_host(hwc.data(), b.data(), 1, index);
    for (int c = 0; c < C; ++c)
      for (int y = 0; y < H; ++y)
        for (int x = 0; x < W; ++x)
          CHECK(b[std::size_t((y * W + x) * C + c)] == a[std::size_t((c * H + y) * W + x)]);
  }
}

TEST_CASE("augment: as a Prefetcher transform, identical after a resume") {
  tk::data::NpyDataset ds({{"image", fixture("npy/images_u8.npy")}});
  tk::data::ImageAugmentOptions o;
  o.layout = {3, 4, 5, false};
  o.crop.padding = 1;
  o.flip.probability = 0.5f;
  o.seed = 9;
  const tk::data::ImageAugment aug(o);
  tk::data::PrefetchOptions opts{.batch_size = 8, .num_workers = 3};
  std::tie(opts.transform, opts.output_fields) =
      tk::data::image_transform(aug, ds.fields(), "image");
  CHECK(opts.output_fields[0].dtype == tk::DType::kF32);
  const tk::data::RandomSampler sampler(ds.size(), 2);
  tk::data::Prefetcher a(ds, sampler, opts);
  std::vector<std::vector<float>> batches;
  tk::data::PrefetchState at;
  for (int k = 0; k < 9; ++k) {
    if (k == 6) at = a.state();
    const tk::data::Batch b = a.next();
    const auto img = b.host<float, 4>("image");
    std::vector<float> expect(60), raw(60);
    for (std::size_t r = 0; r < b.size(); ++r) {
      std::vector<std::byte> bytes(60);
      std::span<std::byte> span[1] = {bytes};
      ds.read(static_cast<std::size_t>(b.indices()[r]), tk::data::SampleRef(span));
      aug.apply_host(reinterpret_cast<const std::uint8_t*>(bytes.data()), expect.data(), b.epoch(),
                     b.indices()[r]);
      for (std::size_t e = 0; e < 60; ++e) CHECK(img.data()[r * 60 + e] == expect[e]);
    }
    batches.emplace_back(img.data(), img.data() + b.size() * 60);
  }
  tk::data::Prefetcher resumed(ds, sampler, opts);
  resumed.restore(at);
  for (int k = 6; k < 9; ++k) {
    const tk::data::Batch b = resumed.next();
    CHECK(std::vector<float>(b.host<float, 4>("image").data(),
                             b.host<float, 4>("image").data() + b.size() * 60) ==
          batches[std::size_t(k)]);
  }
  tk::data::ImageAugmentOptions bad = o;
  bad.layout.width = 6;
  check_contains(error_of([&] {
                   (void)tk::data::image_transform(tk::data::ImageAugment(bad), ds.fields(),
                                                   "image");
                 }),
                 {"60 elements per sample", "layout says 72"});
}

TEST_CASE("augment: bad options") {
  tk::data::ImageAugmentOptions o = options(1, 0.5f);
  o.layout.channels = 5;
  check_contains(error_of([&] { tk::data::ImageAugment a(o); }), {"channels must be in [1, 4]"});
  o = options(1, 0.5f);
  o.normalize.stddev[1] = 0;
  check_contains(error_of([&] { tk::data::ImageAugment a(o); }), {"stddev[1] is zero"});
  // Options that made every value of a channel NaN or infinite: refused, naming the channel
  // (the first one, for a bad scale).
  const float nan = std::numeric_limits<float>::quiet_NaN();
  const float inf = std::numeric_limits<float>::infinity();
  for (const auto& [scale, mean, stddev] :
       {std::tuple{1.0f, 0.5f, nan}, std::tuple{1.0f, nan, 0.5f}, std::tuple{nan, 0.5f, 0.5f},
        std::tuple{inf, 0.5f, 0.5f}, std::tuple{1.0f, 0.5f, 1e-45f}}) {
    o = options(1, 0.5f);
    o.normalize.scale = scale;
    o.normalize.mean[2] = mean;
    o.normalize.stddev[2] = stddev;
    check_contains(error_of([&] { tk::data::ImageAugment a(o); }),
                   {std::isfinite(scale) ? "channel 2 normalises with scale"
                                         : "channel 0 normalises with scale",
                    "non-finite factor"});
  }
  o = options(1, 0.5f);
  o.normalize.mean[3] = nan;  // channel 3 is not used by a 3-channel layout
  CHECK_NOTHROW(tk::data::ImageAugment{o});
  for (const int padding : {-1, (1 << 24) + 1, 1 << 30}) {  // 2 * 2^30 + 1 overflowed int
    o = options(padding, 0.5f);
    check_contains(error_of([&] { tk::data::ImageAugment a(o); }),
                   {"crop padding " + std::to_string(padding) + " is not in [0, 2^24]"});
  }
  CHECK_NOTHROW(tk::data::ImageAugment(options(1 << 24, 0.5f)));
}

namespace {

/// Four 1 x 4 x 4 images of `dtype` (U8 or F32) in memory, pixel e of sample i = 16 i + e + 1.
struct SmallImages {
  std::vector<tk::data::FieldSpec> f;
  explicit SmallImages(tk::DType dtype) : f{{"image", dtype, {1, 4, 4}}} {}
  std::size_t size() const { return 4; }
  const std::vector<tk::data::FieldSpec>& fields() const { return f; }
  void read(std::size_t i, const tk::data::SampleRef& out) const {
    for (std::size_t e = 0; e < 16; ++e) {
      if (f[0].dtype == tk::DType::kU8) out.as<std::uint8_t>(0)[e] = std::uint8_t(16 * i + e + 1);
      else out.as<float>(0)[e] = float(16 * i + e + 1);
    }
  }
  std::string describe(std::size_t i) const { return "image " + std::to_string(i); }
};

}  // namespace

TEST_CASE("augment: image_transform without output_fields") {
  tk::data::ImageAugmentOptions o;
  o.layout = {1, 4, 4, false};
  o.crop.padding = 2;
  o.flip.probability = 0.5f;
  o.normalize.scale = 1.0f;
  o.seed = 7;
  const tk::data::ImageAugment aug(o);
  // An f32 field is augmented in place: the same values as from a separate input (crops and
  // flips read pixels the pass had already overwritten).
  const SmallImages f32(tk::DType::kF32);
  tk::data::PrefetchOptions opts{.batch_size = 4, .num_workers = 1};
  opts.transform = tk::data::image_transform(aug, f32.fields(), "image").first;
  tk::data::Prefetcher loader(f32, tk::data::SequentialSampler(4), opts);
  const tk::data::Batch b = loader.next();
  const float* got = b.host<float, 4>("image").data();
  for (std::size_t r = 0; r < 4; ++r) {
    std::vector<float> in(16), expect(16);
    std::span<std::byte> span[1] = {std::as_writable_bytes(std::span(in))};
    f32.read(r, tk::data::SampleRef(span));
    aug.apply_host(in.data(), expect.data(), 0, std::int64_t(r));
    CHECK(std::vector<float>(got + r * 16, got + r * 16 + 16) == expect);
  }
  // A uint8 field has no room for the floats: refused (it wrote past the field).
  const SmallImages u8(tk::DType::kU8);
  opts.transform = tk::data::image_transform(aug, u8.fields(), "image").first;
  opts.batch_size = 1;
  tk::data::Prefetcher bad(u8, tk::data::SequentialSampler(4), opts);
  check_contains(error_of([&] { (void)bad.next(); }),
                 {"image 0", "field 'image' is 16 bytes per sample in the batch, not 16 f32 values",
                  "set PrefetchOptions::output_fields"});
}
