// Device tests for the executors: launch, reduce/reduce_into and multi_tensor_apply on
// exec::Cuda give the same results as the same functors on exec::Host (exactly where the
// arithmetic is exact, within the pairwise-summation bound otherwise), every element is visited
// once, and the CUDA reduction is bitwise reproducible. Needs a GPU (exits 77 without one).
#include <doctest/doctest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <random>
#include <vector>

#include <trainkit/cuda/stream.hpp>
#include <trainkit/exec/launch.hpp>
#include <trainkit/exec/multi_tensor_apply.hpp>
#include <trainkit/exec/reduce.hpp>

namespace {

namespace exec = trainkit::exec;

// A minimal owning device array for the test (cuda/ has the real buffers).
template <class T>
class DeviceArray {
 public:
  explicit DeviceArray(std::size_t n) : n_(n) {
    TRAINKIT_CUDA_CHECK(cudaMalloc(reinterpret_cast<void**>(&data_), (n == 0 ? 1 : n) * sizeof(T)));
    TRAINKIT_CUDA_CHECK(cudaMemset(data_, 0, (n == 0 ? 1 : n) * sizeof(T)));
  }
  explicit DeviceArray(const std::vector<T>& host) : DeviceArray(host.size()) {
    TRAINKIT_CUDA_CHECK(cudaMemcpy(data_, host.data(), n_ * sizeof(T), cudaMemcpyHostToDevice));
  }
  DeviceArray(const DeviceArray&) = delete;
  DeviceArray& operator=(const DeviceArray&) = delete;
  ~DeviceArray() { TRAINKIT_CUDA_CHECK_NOTHROW(cudaFree(data_)); }
  T* get() const { return data_; }
  std::vector<T> download() const {
    std::vector<T> host(n_);
    TRAINKIT_CUDA_CHECK(cudaDeviceSynchronize());
    TRAINKIT_CUDA_CHECK(cudaMemcpy(host.data(), data_, n_ * sizeof(T), cudaMemcpyDeviceToHost));
    return host;
  }

 private:
  T* data_ = nullptr;
  std::size_t n_;
};

struct CountHits {
  unsigned* hits;
  TRAINKIT_DEVICE void operator()(std::int64_t i) const { atomicAdd(hits + i, 1u); }
};

struct Axpy {
  float a;
  const float* x;
  float* y;
  TRAINKIT_HOST_DEVICE void operator()(std::int64_t i) const { y[i] = a * x[i] + y[i]; }
};

struct ValueAt {
  const float* x;
  TRAINKIT_HOST_DEVICE float operator()(std::int64_t i) const { return x[i]; }
};

struct NanAt {
  const float* x;
  std::int64_t at;
  TRAINKIT_HOST_DEVICE float operator()(std::int64_t i) const {
    return i == at ? std::numeric_limits<float>::quiet_NaN() : x[i];
  }
};

// Depth 4 with mixed types: hits += tensor + 1, and exact arithmetic from the read-only input.
struct MtaVisit {
  TRAINKIT_HOST_DEVICE void operator()(int t, std::int64_t i, unsigned* hits, const float* in,
                                       double* wide, int* ints) const {
#if defined(__CUDA_ARCH__)
    atomicAdd(hits + i, static_cast<unsigned>(t + 1));
#else
    hits[i] += static_cast<unsigned>(t + 1);
#endif
    wide[i] = static_cast<double>(in[i]) * 0.5 + t;
    ints[i] = static_cast<int>(in[i]) - t;
  }
};

std::vector<float> ordering_sensitive_values(std::int64_t n, std::uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<double> exponent(-8.0, 8.0);
  std::vector<float> values(static_cast<std::size_t>(n));
  for (auto& v : values) {
    const double magnitude = std::pow(10.0, exponent(rng));
    v = static_cast<float>((rng() & 1) != 0 ? magnitude : -magnitude);
  }
  return values;
}

std::uint32_t bits_of(float f) {
  std::uint32_t u = 0;
  std::memcpy(&u, &f, sizeof u);
  return u;
}

}  // namespace

TEST_CASE("launch(Cuda): each index exactly once, and axpy equals the Host's") {
  const trainkit::cuda::Stream stream;
  const exec::Cuda gpu(stream);
  for (const std::int64_t n : {0, 1, 7, 8191, 1000003, 10000000}) {
    DeviceArray<unsigned> hits(static_cast<std::size_t>(n) + 1);
    exec::launch(gpu, n, CountHits{hits.get()});
    stream.synchronize();
    const std::vector<unsigned> got = hits.download();
    std::int64_t wrong = 0;
    for (std::int64_t i = 0; i < n; ++i) wrong += got[static_cast<std::size_t>(i)] != 1;
    CHECK_MESSAGE(wrong == 0, "n=", n);
    CHECK(got.back() == 0);
  }
  const std::int64_t n = 3000017;
  std::vector<float> x(static_cast<std::size_t>(n)), y(static_cast<std::size_t>(n));
  for (std::int64_t i = 0; i < n; ++i) {
    x[static_cast<std::size_t>(i)] = static_cast<float>(i % 1024);
    y[static_cast<std::size_t>(i)] = static_cast<float>(i % 7);
  }
  DeviceArray<float> dx(x), dy(y);
  exec::launch(exec::Cuda{}, n, Axpy{0.5f, dx.get(), dy.get()});  // legacy default stream
  exec::launch(exec::Host(4), n, Axpy{0.5f, x.data(), y.data()});
  const std::vector<float> got = dy.download();
  CHECK(std::memcmp(got.data(), y.data(), y.size() * sizeof(float)) == 0);
}

TEST_CASE("reduce(Cuda): reproducible bits, close to float64 and to the Host") {
  const trainkit::cuda::Stream stream;
  const exec::Cuda gpu(stream);
  const std::vector<float> values = ordering_sensitive_values(3000017, 42);
  DeviceArray<float> dx(values);
  const exec::Host host(4);
  for (const std::int64_t n : {1, 255, 256, 257, 65537, 262145, 1000003, 3000017}) {
    CAPTURE(n);
    long double exact = 0;
    long double magnitude = 0;
    for (std::int64_t i = 0; i < n; ++i) {
      exact += values[static_cast<std::size_t>(i)];
      magnitude += std::fabs(values[static_cast<std::size_t>(i)]);
    }
    const float first = exec::reduce(gpu, n, ValueAt{dx.get()}, exec::Sum{}, 0.0f);
    const float second = exec::reduce(gpu, n, ValueAt{dx.get()}, exec::Sum{}, 0.0f);
    CHECK(bits_of(first) == bits_of(second));
    CHECK(std::fabs(static_cast<long double>(first) - exact) <= 3e-6L * magnitude);
    const float on_host = exec::reduce(host, n, ValueAt{values.data()}, exec::Sum{}, 0.0f);
    CHECK(std::fabs(first - on_host) <= 5e-6L * magnitude);
    const double wide = exec::reduce(gpu, n, ValueAt{dx.get()}, exec::Sum{}, 0.0);
    CHECK(std::fabs(static_cast<long double>(wide) - exact) <= 1e-13L * magnitude);
    // Max/Min do not depend on the order: exactly the Host's.
    const float lowest = -std::numeric_limits<float>::infinity();
    const float highest = std::numeric_limits<float>::infinity();
    CHECK(exec::reduce(gpu, n, ValueAt{dx.get()}, exec::Max{}, lowest) ==
          exec::reduce(host, n, ValueAt{values.data()}, exec::Max{}, lowest));
    CHECK(exec::reduce(gpu, n, ValueAt{dx.get()}, exec::Min{}, highest) ==
          exec::reduce(host, n, ValueAt{values.data()}, exec::Min{}, highest));
    CHECK(std::isnan(exec::reduce(gpu, n, NanAt{dx.get(), n - 1}, exec::Max{}, lowest)));
  }
  CHECK(exec::reduce(gpu, 0, ValueAt{dx.get()}, exec::Sum{}, 5.0f) == 5.0f);
}

TEST_CASE("reduce_into(Cuda): asynchronous result in device memory") {
  const trainkit::cuda::Stream stream;
  const exec::Cuda gpu(stream);
  const std::vector<float> values = ordering_sensitive_values(1000003, 9);
  DeviceArray<float> dx(values);
  DeviceArray<float> out(3);
  exec::reduce_into(gpu, 1000003, ValueAt{dx.get()}, exec::Sum{}, 0.0f, out.get());
  exec::reduce_into(gpu, 0, ValueAt{dx.get()}, exec::Sum{}, 7.0f, out.get() + 1);
  exec::reduce_into(gpu, 1000003, ValueAt{dx.get()}, exec::Max{},
                    -std::numeric_limits<float>::infinity(), out.get() + 2);
  stream.synchronize();
  const std::vector<float> got = out.download();
  CHECK(bits_of(got[0]) ==
        bits_of(exec::reduce(gpu, 1000003, ValueAt{dx.get()}, exec::Sum{}, 0.0f)));
  CHECK(got[1] == 7.0f);
  CHECK(got[2] == exec::reduce(exec::Host(2), 1000003, ValueAt{values.data()}, exec::Max{},
                               -std::numeric_limits<float>::infinity()));
}

TEST_CASE("multi_tensor_apply(Cuda): 500 tensors and odd sizes, 4 KB and 32 KB tables") {
  std::vector<std::int64_t> sizes = {0, 1, 65535, 65536, 65537, 3 * 65536 + 5, 1000003, 7, 0, 33};
  std::mt19937 rng(1234);
  for (int t = 0; t < 500; ++t)
    sizes.push_back(t % 50 == 49 ? 70000 + static_cast<std::int64_t>(rng() % 130000)
                                 : static_cast<std::int64_t>(rng() % 5000));
  std::int64_t total = 0;
  for (std::int64_t s : sizes) total += s;
  std::vector<float> in(static_cast<std::size_t>(total));
  for (std::int64_t i = 0; i < total; ++i)
    in[static_cast<std::size_t>(i)] = static_cast<float>(i % 1000);

  // Host reference: one layout, tensors end to end.
  std::vector<unsigned> hits(static_cast<std::size_t>(total), 0);
  std::vector<double> wide(static_cast<std::size_t>(total), 0);
  std::vector<int> ints(static_cast<std::size_t>(total), 0);
  exec::TensorList<unsigned, const float, double, int> host_list;
  DeviceArray<float> d_in(in);
  for (int variant = 0; variant < 2; ++variant) {
    DeviceArray<unsigned> d_hits(static_cast<std::size_t>(total));
    DeviceArray<double> d_wide(static_cast<std::size_t>(total));
    DeviceArray<int> d_ints(static_cast<std::size_t>(total));
    exec::TensorList<unsigned, const float, double, int> device_list;
    std::int64_t offset = 0;
    for (std::int64_t s : sizes) {
      device_list.add(s, d_hits.get() + offset, d_in.get() + offset, d_wide.get() + offset,
                      d_ints.get() + offset);
      if (variant == 0)
        host_list.add(s, hits.data() + offset, in.data() + offset, wide.data() + offset,
                      ints.data() + offset);
      offset += s;
    }
    if (variant == 0) {
      exec::multi_tensor_apply(exec::Host(4), host_list, MtaVisit{});
      exec::multi_tensor_apply(exec::Cuda{}, device_list, MtaVisit{});  // the launcher's choice
    } else {
      exec::detail::mta_launch_all<exec::detail::MtaLimitsSmall>(device_list, MtaVisit{},
                                                                 cudaStream_t{});
    }
    const std::vector<unsigned> got_hits = d_hits.download();
    const std::vector<double> got_wide = d_wide.download();
    const std::vector<int> got_ints = d_ints.download();
    std::int64_t wrong = 0;
    for (int t = 0; t < host_list.size(); ++t)
      for (std::int64_t i = host_list.offset(t); i < host_list.offset(t) + host_list.numel(t); ++i)
        wrong += hits[static_cast<std::size_t>(i)] != static_cast<unsigned>(t + 1);
    CHECK(wrong == 0);  // the Host reference itself
    CHECK(got_hits == hits);
    CHECK(got_wide == wide);
    CHECK(got_ints == ints);
  }
}
