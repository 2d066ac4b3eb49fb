// Tests for exec/reduce.hpp on the Host: results are bitwise identical for 1..8 threads and
// repeated runs, equal bit for bit to an independent implementation of the documented order,
// accurate against float64/long double references, and Max/Min handle NaN as documented.
#include <doctest/doctest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <random>
#include <stdexcept>
#include <vector>

#include <trainkit/exec/reduce.hpp>

namespace {

namespace exec = trainkit::exec;

std::uint32_t bits_of(float f) {
  std::uint32_t u = 0;
  std::memcpy(&u, &f, sizeof u);
  return u;
}
std::uint64_t bits_of(double f) {
  std::uint64_t u = 0;
  std::memcpy(&u, &f, sizeof u);
  return u;
}

// Magnitudes 1e-8 .. 1e8 with random signs: the float sum depends strongly on the order.
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

// The documented order, written independently of the implementation: chunks of 4096, 16
// interleaved lanes per chunk combined by a halving tree, then a stride-doubling pairwise tree
// over the chunk partials, then op(init, .).
template <class T, class F, class Op>
T reference_reduce(std::int64_t n, const F& f, const Op& op, T init) {
  if (n <= 0) return init;
  std::vector<T> level;
  for (std::int64_t begin = 0; begin < n; begin += 4096) {
    const std::int64_t end = std::min(n, begin + 4096);
    if (end - begin < 16) {
      T value = static_cast<T>(f(begin));
      for (std::int64_t i = begin + 1; i < end; ++i) value = op(value, static_cast<T>(f(i)));
      level.push_back(value);
      continue;
    }
    std::vector<T> lanes;
    for (std::int64_t i = begin; i < begin + 16; ++i) lanes.push_back(static_cast<T>(f(i)));
    for (std::int64_t i = begin + 16; i < end; ++i) {
      T& lane = lanes[static_cast<std::size_t>((i - begin) % 16)];
      lane = op(lane, static_cast<T>(f(i)));
    }
    for (std::size_t width = 8; width > 0; width /= 2)
      for (std::size_t j = 0; j < width; ++j) lanes[j] = op(lanes[j], lanes[j + width]);
    level.push_back(lanes[0]);
  }
  for (std::size_t stride = 1; stride < level.size(); stride *= 2)
    for (std::size_t i = 0; i + stride < level.size(); i += 2 * stride)
      level[i] = op(level[i], level[i + stride]);
  return op(init, level[0]);
}

// A non-commutative, non-associative "op" that records the shape of the combination: the hash
// identifies the tree; `ordered` checks that the left operand always starts before the right one
// (earlier values on the left of op) and `count` that every leaf is combined exactly once.
struct Span {
  std::int64_t first = 0;
  std::int64_t count = 0;
  std::uint64_t hash = 0;
  bool ordered = true;
};
struct SpanOp {
  Span operator()(const Span& a, const Span& b) const {
    Span r;
    r.first = a.first;
    r.count = a.count + b.count;
    r.ordered = a.ordered && b.ordered && a.first < b.first;
    r.hash = (a.hash * 0x9E3779B97F4A7C15ull) ^ (b.hash + 0x632BE59BD9B4E019ull + (a.hash << 7));
    return r;
  }
};

}  // namespace

TEST_CASE("reduce(Host): bitwise identical for 1..8 threads and runs, equal to the spec") {
  const std::vector<std::int64_t> sizes = {1,    2,    15,    16,     17,     4095,
                                           4096, 4097, 65537, 100000, 1000003};
  const std::vector<float> values = ordering_sensitive_values(1000003, 42);
  const float* x = values.data();
  const auto f = [x](std::int64_t i) { return x[i]; };
  std::vector<exec::Host> hosts;
  for (int threads = 1; threads <= 8; ++threads) hosts.emplace_back(threads);
  for (const std::int64_t n : sizes) {
    CAPTURE(n);
    const float expected = reference_reduce(n, f, exec::Sum{}, 0.0f);
    long double exact = 0;
    long double magnitude = 0;
    for (std::int64_t i = 0; i < n; ++i) {
      exact += x[i];
      magnitude += std::fabs(x[i]);
    }
    for (const exec::Host& host : hosts) {
      for (int run = 0; run < 2; ++run) {
        const float got = exec::reduce(host, n, f, exec::Sum{}, 0.0f);
        CHECK_MESSAGE(bits_of(got) == bits_of(expected), host.num_threads(), " threads: ", got,
                      " vs ", expected);
      }
    }
    // 256-long lanes then pairwise trees: the worst case is ~270 ulps of the magnitude sum, a
    // random-sign input stays near sqrt of that (the data is seeded: no flakiness).
    CHECK(std::fabs(static_cast<long double>(expected) - exact) <= 2e-6L * magnitude);
    // Accumulating the floats in double is far more accurate, and deterministic too.
    const double wide = exec::reduce(hosts[2], n, f, exec::Sum{}, 0.0);
    CHECK(bits_of(wide) == bits_of(exec::reduce(hosts[7], n, f, exec::Sum{}, 0.0)));
    CHECK(std::fabs(static_cast<long double>(wide) - exact) <= 1e-13L * magnitude);
  }
}

TEST_CASE("reduce(Host): the combination order is the documented tree, left before right") {
  for (const std::int64_t n : {std::int64_t{1}, std::int64_t{31}, std::int64_t{4096 * 5 + 7},
                               std::int64_t{4096 * 40 + 1}, std::int64_t{777777}}) {
    CAPTURE(n);
    const auto leaf = [](std::int64_t i) {
      Span s;
      s.first = i;
      s.count = 1;
      s.hash = static_cast<std::uint64_t>(i) * 0xD6E8FEB86659FD93ull + 1;
      return s;
    };
    Span init;
    init.first = -1;
    init.count = 0;
    const Span expected = reference_reduce(n, leaf, SpanOp{}, init);
    REQUIRE(expected.ordered);
    REQUIRE(expected.count == n);
    for (int threads : {1, 2, 3, 5, 8}) {
      const Span got = exec::reduce(exec::Host(threads), n, leaf, SpanOp{}, init);
      CHECK(got.ordered);
      CHECK(got.first == -1);
      CHECK(got.count == n);
      CHECK(got.hash == expected.hash);
    }
  }
}

TEST_CASE("reduce(Host): init, empty ranges and integers") {
  const exec::Host host(4);
  const auto one = [](std::int64_t) { return std::int64_t{1}; };
  CHECK(exec::reduce(host, 0, one, exec::Sum{}, std::int64_t{10}) == 10);
  CHECK(exec::reduce(host, -3, one, exec::Sum{}, std::int64_t{10}) == 10);
  CHECK(exec::reduce(host, 1, one, exec::Sum{}, std::int64_t{10}) == 11);
  const std::int64_t n = 5000011;
  const auto index = [](std::int64_t i) { return i; };
  CHECK(exec::reduce(host, n, index, exec::Sum{}, std::int64_t{7}) == n * (n - 1) / 2 + 7);
  // The sum of squares a gradient norm needs, in double (integers: exact).
  const auto square = [](std::int64_t i) {
    const double v = static_cast<double>(i % 3);
    return v * v;
  };
  double expected = 0;
  for (std::int64_t i = 0; i < n; ++i) expected += square(i);
  CHECK(exec::reduce(host, n, square, exec::Sum{}, 0.0) == expected);
}

TEST_CASE("reduce(Host): Max and Min, with NaN propagation") {
  const std::vector<float> values = ordering_sensitive_values(300007, 7);
  const float* x = values.data();
  const auto f = [x](std::int64_t i) { return x[i]; };
  float max_value = -std::numeric_limits<float>::infinity();
  float min_value = std::numeric_limits<float>::infinity();
  for (float v : values) {
    max_value = std::max(max_value, v);
    min_value = std::min(min_value, v);
  }
  const float lowest = -std::numeric_limits<float>::infinity();
  const float highest = std::numeric_limits<float>::infinity();
  for (int threads : {1, 3, 8}) {
    const exec::Host host(threads);
    const std::int64_t n = static_cast<std::int64_t>(values.size());
    CHECK(exec::reduce(host, n, f, exec::Max{}, lowest) == max_value);
    CHECK(exec::reduce(host, n, f, exec::Min{}, highest) == min_value);
    CHECK(exec::reduce(host, n, f, exec::Max{}, 1e30f) == 1e30f);  // init takes part
    // A single NaN anywhere (first, middle, last element) makes Max and Min NaN.
    for (const std::int64_t at : {std::int64_t{0}, n / 2 + 3, n - 1}) {
      const auto g = [x, at](std::int64_t i) {
        return i == at ? std::numeric_limits<float>::quiet_NaN() : x[i];
      };
      CHECK(std::isnan(exec::reduce(host, n, g, exec::Max{}, lowest)));
      CHECK(std::isnan(exec::reduce(host, n, g, exec::Min{}, highest)));
    }
  }
  CHECK(exec::Max{}(3, 5) == 5);
  CHECK(exec::Min{}(3, 5) == 3);
  CHECK(std::isnan(exec::Max{}(std::numeric_limits<double>::quiet_NaN(), 1.0)));
  CHECK(std::isnan(exec::Min{}(1.0, std::numeric_limits<double>::quiet_NaN())));
}

TEST_CASE("reduce(Host): exceptions propagate") {
  for (int threads : {1, 4}) {
    const exec::Host host(threads);
    CHECK_THROWS_AS(exec::reduce(
                        host, 1000000,
                        [](std::int64_t i) {
                          if (i == 654321) throw std::range_error("bad element");
                          return 1.0;
                        },
                        exec::Sum{}, 0.0),
                    std::range_error);
  }
}
