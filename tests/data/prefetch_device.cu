// SPDX-License-Identifier: MIT
// Device mode of the Prefetcher (pinned slots, copy stream, event hand-off with no host sync) and
// device augmentations: the GPU sees exactly the host batch, slots are never overwritten while
// a slow consumer kernel still reads them, a resume gives the same device batches, and the
// augmentation kernel produces the host path's bits.
#include <doctest/doctest.h>

#include <cuda_runtime_api.h>

#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include <trainkit/cuda/buffer.hpp>
#include <trainkit/cuda/stream.hpp>
#include <trainkit/data/augment.hpp>
#include <trainkit/data/npy_dataset.hpp>
#include <trainkit/data/prefetcher.hpp>
#include <trainkit/data/sampler.hpp>

namespace tk = trainkit;

namespace {

/// Sample i: "x" = 256 int32 values i * 1000 + j.
class Rows {
 public:
  explicit Rows(std::size_t n) : n_(n) {}
  std::size_t size() const { return n_; }
  const std::vector<tk::data::FieldSpec>& fields() const { return fields_; }
  void read(std::size_t i, const tk::data::SampleRef& out) const {
    auto x = out.as<std::int32_t>(0);
    for (std::size_t j = 0; j < x.size(); ++j) x[j] = static_cast<std::int32_t>(i * 1000 + j);
  }
  std::string describe(std::size_t i) const { return "row " + std::to_string(i); }

 private:
  std::size_t n_;
  std::vector<tk::data::FieldSpec> fields_{{"x", tk::DType::kI32, {256}}};
};

/// Spins ~`spin` clock cycles (so the consumer stream lags behind the copy stream), then sums
/// the batch and checks every element against its row index; bad elements are counted.
__global__ void slow_check(const std::int32_t* x, const std::int64_t* idx, int rows, long long spin,
                           unsigned long long* bad) {
  const long long t0 = clock64();
  while (clock64() - t0 < spin) {
  }
  for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < rows * 256; i += gridDim.x * blockDim.x) {
    const int r = i / 256, j = i % 256;
    if (x[i] != static_cast<std::int32_t>(idx[r] * 1000 + j)) atomicAdd(bad, 1ULL);
  }
}

}  // namespace

TEST_CASE("Prefetcher device mode: the device sees each batch intact, in order, no host sync") {
  const Rows ds(1000);
  const tk::data::RandomSampler sampler(ds.size(), 4);
  tk::cuda::Stream stream;
  tk::cuda::DeviceBuffer<unsigned long long> bad(1);
  bad.zero(stream);
  tk::data::Prefetcher p(ds, sampler, {.batch_size = 32, .num_workers = 4, .depth = 3}, stream);
  CHECK(p.device_mode());
  CHECK(p.pinned());
  std::vector<std::int64_t> order;
  for (int k = 0; k < 80; ++k) {  // 2.5 epochs of 32 batches
    const tk::data::Batch b = p.next();
    REQUIRE(b.on_device());
    order.insert(order.end(), b.indices().begin(), b.indices().end());
    slow_check<<<4, 256, 0, stream.get()>>>(b.device<const std::int32_t, 2>("x").data(),
                                            b.device_indices(), static_cast<int>(b.size()),
                                            k % 3 == 0 ? 2'000'000 : 0, bad.data());
    TRAINKIT_CUDA_CHECK(cudaGetLastError());
  }
  unsigned long long host_bad = 1;
  bad.copy_to_host(&host_bad, 1, stream);
  stream.synchronize();
  CHECK(host_bad == 0);
  std::vector<std::int64_t> want;
  for (std::uint64_t e = 0; e < 3; ++e) {
    const auto idx = sampler.indices(e);
    want.insert(want.end(), idx.begin(), idx.end());
  }
  want.resize(order.size());
  CHECK(order == want);

  // Resume in device mode: batch 8 of epoch 1 of a fresh loader equals this one's. An epoch of
  // 1000 samples is 31 batches of 32 and one of 8, so that batch starts at sample 1000 + 8 * 32
  // of the concatenated epochs.
  tk::data::Prefetcher q(ds, sampler, {.batch_size = 32, .num_workers = 2, .depth = 2}, stream);
  q.restore({1, 8});
  const std::size_t first = 1000 + 8 * 32;
  const tk::data::Batch b = q.next();
  std::vector<std::int32_t> host(b.size() * 256);
  TRAINKIT_CUDA_CHECK(cudaMemcpyAsync(host.data(), b.device_bytes(0), host.size() * 4,
                                      cudaMemcpyDeviceToHost, stream.get()));
  stream.synchronize();
  REQUIRE(b.size() == 32);
  for (std::size_t r = 0; r < b.size(); ++r) CHECK(b.indices()[r] == want[first + r]);
  CHECK(host[5 * 256 + 7] == static_cast<std::int32_t>(want[first + 5] * 1000 + 7));
}

TEST_CASE("augment: the device kernel gives the host path's bits") {
  const tk::data::NpyDataset ds(
      {{"image", std::string(TRAINKIT_TEST_DATA_DIR) + "/data/npy/images_u8.npy"}});
  tk::data::ImageAugmentOptions o;
  o.layout = {3, 4, 5, false};
  o.crop.padding = 2;
  o.flip.probability = 0.5f;
  o.normalize = {1.0f / 255.0f, {0.5f, 0.4f, 0.3f, 0}, {0.2f, 0.25f, 0.3f, 1}};
  o.seed = 77;
  const tk::data::ImageAugment aug(o);
  tk::cuda::Stream stream;
  tk::data::Prefetcher p(ds, tk::data::RandomSampler(ds.size(), 1), {.batch_size = 16}, stream);
  for (int k = 0; k < 6; ++k) {
    const tk::data::Batch b = p.next();
    const std::size_t n = b.size() * 60;
    tk::cuda::DeviceBuffer<float> out(n);
    tk::data::augment_batch_device(aug, b.device<const std::uint8_t, 4>("image").data(), out.data(),
                                   b.device_indices(), b.size(), b.epoch(), stream);
    std::vector<float> device(n), host(n);
    out.copy_to_host(device.data(), n, stream);
    aug.apply_batch_host(b.host<const std::uint8_t, 4>("image").data(), host.data(), b.indices(),
                         b.epoch());
    stream.synchronize();
    CHECK(std::memcmp(device.data(), host.data(), n * sizeof(float)) == 0);
  }
}
