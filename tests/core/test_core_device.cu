// Device tests for core/half.hpp and core/rng.hpp: the device code paths (PTX cvt instructions,
// CUDA math) must give the same bits as the host paths, and match CUDA's own intrinsics, native
// 16-bit arithmetic and cuRAND's Philox stream.
#include <doctest/doctest.h>

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime_api.h>
#include <curand_kernel.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <vector>

#include <trainkit/core/half.hpp>
#include <trainkit/core/rng.hpp>
#include <trainkit/error.hpp>

namespace {

using trainkit::bf16;
using trainkit::f16;

// Just enough of a device array for these tests.
template <class T>
class DeviceArray {
 public:
  explicit DeviceArray(std::size_t n) : n_(n) {
    TRAINKIT_CUDA_CHECK(cudaMalloc(reinterpret_cast<void**>(&ptr_), n * sizeof(T)));
  }
  explicit DeviceArray(const std::vector<T>& host) : DeviceArray(host.size()) {
    TRAINKIT_CUDA_CHECK(cudaMemcpy(ptr_, host.data(), n_ * sizeof(T), cudaMemcpyHostToDevice));
  }
  DeviceArray(const DeviceArray&) = delete;
  DeviceArray& operator=(const DeviceArray&) = delete;
  ~DeviceArray() { TRAINKIT_CUDA_CHECK_NOTHROW(cudaFree(ptr_)); }
  T* get() const { return ptr_; }
  std::vector<T> to_host() const {
    TRAINKIT_CUDA_CHECK(cudaDeviceSynchronize());
    std::vector<T> out(n_);
    TRAINKIT_CUDA_CHECK(cudaMemcpy(out.data(), ptr_, n_ * sizeof(T), cudaMemcpyDeviceToHost));
    return out;
  }

 private:
  T* ptr_ = nullptr;
  std::size_t n_;
};

std::uint32_t bits_of(float f) {
  std::uint32_t u = 0;
  std::memcpy(&u, &f, sizeof u);
  return u;
}

unsigned blocks_for(std::size_t n) { return static_cast<unsigned>((n + 255) / 256); }

// out: [ours f16->f32 | ours bf16->f32 | CUDA __half2float | CUDA __bfloat162float], 65536 each.
__global__ static void decode_all(float* out) {
  const unsigned i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i >= 0x10000U) return;
  const auto h = static_cast<std::uint16_t>(i);
  out[i] = trainkit::f16_bits_to_float(h);
  out[0x10000U + i] = trainkit::bf16_bits_to_float(h);
  out[0x20000U + i] = __half2float(trainkit::to_cuda(f16::from_bits(h)));
  out[0x30000U + i] = __bfloat162float(trainkit::to_cuda(bf16::from_bits(h)));
}

// out: [ours f16 | ours bf16 | CUDA f16 | CUDA bf16], n each.
__global__ static void encode(const float* in, std::uint16_t* out, unsigned n) {
  const unsigned i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i >= n) return;
  const float f = in[i];
  out[i] = f16(f).bits();
  out[n + i] = trainkit::float_to_bf16_bits(f);
  out[2 * n + i] = trainkit::from_cuda(__float2half_rn(f)).bits();
  out[3 * n + i] = trainkit::from_cuda(__float2bfloat16_rn(f)).bits();
}

// out[16 i + k]: k = 0..3 ours f16 + - * /, 4..7 ours bf16 + - * /, 8..10 native __hadd/__hsub/
// __hmul on __half, 11..13 the same on __nv_bfloat16.
__global__ static void arithmetic(const std::uint16_t* a, const std::uint16_t* b,
                                  std::uint16_t* out, unsigned n) {
  const unsigned i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i >= n) return;
  std::uint16_t* o = out + 16 * i;
  const f16 x = f16::from_bits(a[i]), y = f16::from_bits(b[i]);
  const bf16 p = bf16::from_bits(a[i]), q = bf16::from_bits(b[i]);
  o[0] = (x + y).bits();
  o[1] = (x - y).bits();
  o[2] = (x * y).bits();
  o[3] = (x / y).bits();
  o[4] = (p + q).bits();
  o[5] = (p - q).bits();
  o[6] = (p * q).bits();
  o[7] = (p / q).bits();
  const __half cx = trainkit::to_cuda(x), cy = trainkit::to_cuda(y);
  o[8] = trainkit::from_cuda(__hadd(cx, cy)).bits();
  o[9] = trainkit::from_cuda(__hsub(cx, cy)).bits();
  o[10] = trainkit::from_cuda(__hmul(cx, cy)).bits();
  const __nv_bfloat16 cp = trainkit::to_cuda(p), cq = trainkit::to_cuda(q);
  o[11] = trainkit::from_cuda(__hadd(cp, cq)).bits();
  o[12] = trainkit::from_cuda(__hsub(cp, cq)).bits();
  o[13] = trainkit::from_cuda(__hmul(cp, cq)).bits();
}

__global__ static void philox_elements(std::uint64_t seed, std::uint64_t stream, std::uint32_t* u,
                                       float* uni, float* nrm, std::uint32_t* curand_u,
                                       unsigned n) {
  const unsigned i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i >= n) return;
  u[i] = trainkit::philox_u32(seed, stream, i);
  uni[i] = trainkit::philox_uniform(seed, stream, i);
  nrm[i] = trainkit::philox_normal(seed, stream, i);
  curandStatePhilox4_32_10_t state;
  curand_init(seed, stream, i, &state);
  curand_u[i] = curand(&state);
}

// One thread walks a PhiloxStream, mixing kinds of draws like the host test does.
__global__ static void philox_sequential(std::uint64_t seed, std::uint64_t stream, float* out,
                                         unsigned n) {
  if (blockIdx.x != 0 || threadIdx.x != 0) return;
  trainkit::PhiloxStream s(seed, stream);
  for (unsigned k = 0; k < n; ++k) {
    switch (k % 3) {
      case 0: out[k] = static_cast<float>(s.next_u32() >> 8); break;
      case 1: out[k] = s.next_uniform(); break;
      default: out[k] = s.next_normal(); break;
    }
  }
}

}  // namespace

TEST_CASE("device f16/bf16 decoding matches the host bit for bit") {
  DeviceArray<float> d(4 * 0x10000);
  decode_all<<<blocks_for(0x10000), 256>>>(d.get());
  TRAINKIT_CUDA_CHECK(cudaGetLastError());
  const std::vector<float> out = d.to_host();
  std::size_t bad = 0, bad_cuda = 0;
  for (std::uint32_t i = 0; i < 0x10000U; ++i) {
    const auto h = static_cast<std::uint16_t>(i);
    bad += bits_of(out[i]) != bits_of(trainkit::f16_bits_to_float(h));
    bad += bits_of(out[0x10000U + i]) != bits_of(trainkit::bf16_bits_to_float(h));
    // CUDA's device intrinsics may give other NaN bits; everything else must agree exactly.
    const float cf = out[0x20000U + i], cb = out[0x30000U + i];
    bad_cuda += std::isnan(cf) ? !std::isnan(out[i]) : bits_of(cf) != bits_of(out[i]);
    bad_cuda +=
        std::isnan(cb) ? !std::isnan(out[0x10000U + i]) : bits_of(cb) != bits_of(out[0x10000U + i]);
  }
  CHECK(bad == 0);
  CHECK(bad_cuda == 0);
}

TEST_CASE("device float -> f16/bf16 rounding matches the host and CUDA's intrinsics") {
  // Random patterns plus values within 2 ulps of f16 and bf16 halfway points.
  std::vector<float> in;
  std::uint64_t s = 7;
  for (int i = 0; i < (1 << 20); ++i) {
    s = s * 6364136223846793005ULL + 1442695040888963407ULL;
    std::uint32_t u = static_cast<std::uint32_t>(s >> 32);
    const int off = static_cast<int>((s >> 8) % 5) - 2;
    if (i % 3 == 1) {  // f16 halfway: f16 bits h -> float, plus half an f16 ulp (2^12 float ulps)
      const float base = trainkit::f16_bits_to_float(static_cast<std::uint16_t>(u & 0x7bfeU));
      u = (bits_of(base) + 0x1000U + static_cast<std::uint32_t>(off)) | (u & 0x80000000U);
    } else if (i % 3 == 2) {
      u = ((u & 0xffff0000U) | 0x8000U) + static_cast<std::uint32_t>(off);
    }
    float f = 0;
    std::memcpy(&f, &u, sizeof f);
    in.push_back(f);
  }
  const auto n = static_cast<unsigned>(in.size());
  DeviceArray<float> d_in(in);
  DeviceArray<std::uint16_t> d_out(4 * in.size());
  encode<<<blocks_for(n), 256>>>(d_in.get(), d_out.get(), n);
  TRAINKIT_CUDA_CHECK(cudaGetLastError());
  const std::vector<std::uint16_t> out = d_out.to_host();
  std::size_t bad = 0, bad_cuda = 0;
  for (unsigned i = 0; i < n; ++i) {
    const std::uint16_t h = trainkit::float_to_f16_bits(in[i]);
    const std::uint16_t b = trainkit::float_to_bf16_bits(in[i]);
    bad += out[i] != h;
    bad += out[n + i] != b;
    const bool nan = std::isnan(in[i]);
    bad_cuda += nan ? !trainkit::is_nan(f16::from_bits(out[2 * n + i])) : out[2 * n + i] != h;
    bad_cuda += nan ? !trainkit::is_nan(bf16::from_bits(out[3 * n + i])) : out[3 * n + i] != b;
  }
  CHECK(bad == 0);
  CHECK(bad_cuda == 0);
}

TEST_CASE("device arithmetic matches the host and native 16-bit arithmetic") {
  constexpr unsigned kN = 1 << 18;
  std::vector<std::uint16_t> a(kN), b(kN);
  std::uint64_t s = 11;
  for (unsigned i = 0; i < kN; ++i) {
    s = s * 6364136223846793005ULL + 1442695040888963407ULL;
    a[i] = static_cast<std::uint16_t>(s >> 48);
    b[i] = static_cast<std::uint16_t>(s >> 32);
  }
  DeviceArray<std::uint16_t> da(a), db(b), d_out(16 * kN);
  arithmetic<<<blocks_for(kN), 256>>>(da.get(), db.get(), d_out.get(), kN);
  TRAINKIT_CUDA_CHECK(cudaGetLastError());
  const std::vector<std::uint16_t> out = d_out.to_host();
  std::size_t bad = 0, bad_native = 0;
  for (unsigned i = 0; i < kN; ++i) {
    const std::uint16_t* o = out.data() + 16 * i;
    const f16 x = f16::from_bits(a[i]), y = f16::from_bits(b[i]);
    const bf16 p = bf16::from_bits(a[i]), q = bf16::from_bits(b[i]);
    const std::uint16_t host[8] = {(x + y).bits(), (x - y).bits(), (x * y).bits(), (x / y).bits(),
                                   (p + q).bits(), (p - q).bits(), (p * q).bits(), (p / q).bits()};
    for (int k = 0; k < 8; ++k) bad += o[k] != host[k];
    for (int k = 0; k < 3; ++k) {
      bad_native += trainkit::is_nan(f16::from_bits(host[k]))
                        ? !trainkit::is_nan(f16::from_bits(o[8 + k]))
                        : o[8 + k] != host[k];
      bad_native += trainkit::is_nan(bf16::from_bits(host[4 + k]))
                        ? !trainkit::is_nan(bf16::from_bits(o[11 + k]))
                        : o[11 + k] != host[4 + k];
    }
  }
  CHECK(bad == 0);
  CHECK(bad_native == 0);
}

TEST_CASE("device Philox equals the host and cuRAND's Philox4_32_10") {
  constexpr unsigned kN = 1 << 16;
  const std::uint64_t seed = 0xfeedface12345678ULL, stream = trainkit::rng_stream_id(3, 1);
  DeviceArray<std::uint32_t> d_u(kN), d_curand(kN);
  DeviceArray<float> d_uni(kN), d_nrm(kN), d_seq(4096);
  philox_elements<<<blocks_for(kN), 256>>>(seed, stream, d_u.get(), d_uni.get(), d_nrm.get(),
                                           d_curand.get(), kN);
  TRAINKIT_CUDA_CHECK(cudaGetLastError());
  philox_sequential<<<1, 1>>>(seed, stream, d_seq.get(), 4096);
  TRAINKIT_CUDA_CHECK(cudaGetLastError());
  const auto u = d_u.to_host(), cu = d_curand.to_host();
  const auto uni = d_uni.to_host(), nrm = d_nrm.to_host(), seq = d_seq.to_host();
  std::size_t bad_u = 0, bad_curand = 0, bad_uni = 0, bad_nrm = 0, bad_seq = 0;
  for (unsigned i = 0; i < kN; ++i) {
    bad_u += u[i] != trainkit::philox_u32(seed, stream, i);
    bad_curand += cu[i] != u[i];
    bad_uni += bits_of(uni[i]) != bits_of(trainkit::philox_uniform(seed, stream, i));
    // log/sin/cos differ by a few ulp between libm and CUDA: normals agree closely, not exactly.
    const float h = trainkit::philox_normal(seed, stream, i);
    bad_nrm += !(std::fabs(nrm[i] - h) <= 2e-6f * (1.0f + std::fabs(h)));
  }
  trainkit::PhiloxStream s(seed, stream);
  for (unsigned k = 0; k < 4096; ++k) {
    if (k % 3 == 0) {
      bad_seq += seq[k] != static_cast<float>(s.next_u32() >> 8);
    } else if (k % 3 == 1) {
      bad_seq += seq[k] != s.next_uniform();
    } else {
      const float h = s.next_normal();
      bad_seq += !(std::fabs(seq[k] - h) <= 2e-6f * (1.0f + std::fabs(h)));
    }
  }
  CHECK(bad_u == 0);
  CHECK(bad_curand == 0);
  CHECK(bad_uni == 0);
  CHECK(bad_nrm == 0);
  CHECK(bad_seq == 0);
}
