// Tests for core/rng.hpp: Random123's published known answers for philox4x32_10, the documented
// (seed, stream, index) -> counter mapping, stream/element equivalence, and statistical moments.
#include <doctest/doctest.h>

#include <cmath>
#include <cstdint>
#include <vector>

#include <trainkit/core/rng.hpp>

namespace {

using trainkit::F32x2;
using trainkit::Philox4x32;
using trainkit::PhiloxStream;
using trainkit::U32x4;

bool same(const U32x4& a, const U32x4& b) {
  return a.v[0] == b.v[0] && a.v[1] == b.v[1] && a.v[2] == b.v[2] && a.v[3] == b.v[3];
}

}  // namespace

// Random123 kat_vectors, lines "philox4x32 10 <ctr x4> <key x2> <expected x4>".
TEST_CASE("Philox4x32-10 matches Random123's known-answer vectors") {
  static_assert(Philox4x32::block(U32x4{{0, 0, 0, 0}}, 0, 0).v[0] == 0x6627e8d5U);
  CHECK(same(Philox4x32::block(U32x4{{0, 0, 0, 0}}, 0, 0),
             U32x4{{0x6627e8d5, 0xe169c58d, 0xbc57ac4c, 0x9b00dbd8}}));
  CHECK(same(Philox4x32::block(U32x4{{0xffffffff, 0xffffffff, 0xffffffff, 0xffffffff}}, 0xffffffff,
                               0xffffffff),
             U32x4{{0x408f276d, 0x41c83b0e, 0xa20bc7c6, 0x6d5451fd}}));
  CHECK(same(Philox4x32::block(U32x4{{0x243f6a88, 0x85a308d3, 0x13198a2e, 0x03707344}}, 0xa4093822,
                               0x299f31d0),
             U32x4{{0xd16cfe09, 0x94fdcceb, 0x5001e420, 0x24126ea1}}));
  // The same vectors through the 64-bit API: low words first.
  CHECK(
      same(Philox4x32::generate(0, 0, 0), U32x4{{0x6627e8d5, 0xe169c58d, 0xbc57ac4c, 0x9b00dbd8}}));
  CHECK(same(Philox4x32::generate(~0ULL, ~0ULL, ~0ULL),
             U32x4{{0x408f276d, 0x41c83b0e, 0xa20bc7c6, 0x6d5451fd}}));
  CHECK(same(
      Philox4x32::generate(0x299f31d0a4093822ULL, 0x0370734413198a2eULL, 0x85a308d3243f6a88ULL),
      U32x4{{0xd16cfe09, 0x94fdcceb, 0x5001e420, 0x24126ea1}}));
}

TEST_CASE("per-element functions follow the documented counter layout") {
  const std::uint64_t seed = 0x0123456789abcdefULL;
  const std::uint64_t stream = trainkit::rng_stream_id(7, 3);
  CHECK(stream == ((7ULL << 32) | 3ULL));
  for (std::uint64_t i : {0ULL, 1ULL, 2ULL, 3ULL, 4ULL, 1001ULL, (1ULL << 34) + 6ULL, ~0ULL}) {
    const std::uint64_t block = i / 4;
    const U32x4 expect = Philox4x32::block(
        U32x4{{static_cast<std::uint32_t>(block), static_cast<std::uint32_t>(block >> 32),
               static_cast<std::uint32_t>(stream), static_cast<std::uint32_t>(stream >> 32)}},
        static_cast<std::uint32_t>(seed), static_cast<std::uint32_t>(seed >> 32));
    CHECK(trainkit::philox_u32(seed, stream, i) == expect.v[i % 4]);
    CHECK(trainkit::philox_uniform(seed, stream, i) == trainkit::uniform_float(expect.v[i % 4]));
    const unsigned p = static_cast<unsigned>(i % 4) & 2U;
    CHECK(trainkit::philox_normal(seed, stream, i) ==
          trainkit::normal2(expect.v[p], expect.v[p + 1]).v[i % 2]);
  }
  // Different seeds, streams and indices give different words.
  CHECK(trainkit::philox_u32(1, 0, 0) != trainkit::philox_u32(2, 0, 0));
  CHECK(trainkit::philox_u32(1, 0, 0) != trainkit::philox_u32(1, 1, 0));
  CHECK(trainkit::philox_u32(1, 0, 0) != trainkit::philox_u32(1, 0, 4));
}

TEST_CASE("uniform_float maps words onto a 2^-24 grid in [0, 1)") {
  static_assert(trainkit::uniform_float(0) == 0.0f);
  CHECK(trainkit::uniform_float(0xffffffffU) == 1.0f - 0x1p-24f);
  CHECK(trainkit::uniform_float(0x80000000U) == 0.5f);
  CHECK(trainkit::uniform_float(0x000000ffU) == 0.0f);  // low 8 bits are ignored
  CHECK(trainkit::uniform_float(0x00000100U) == 0x1p-24f);
  CHECK(trainkit::uniform_float_open0(0) == 0x1p-24f);
  CHECK(trainkit::uniform_float_open0(0xffffffffU) == 1.0f);
  // Box–Muller against a float64 evaluation of the same formula, including the extreme radius.
  for (std::uint32_t u0 : {0U, 1U << 8, 0x12345678U, 0x80000000U, 0xffffffffU}) {
    for (std::uint32_t u1 : {0U, 0x40000000U, 0x9abcdef0U, 0xffffffffU}) {
      const double a = (static_cast<double>(u0 >> 8) + 1.0) / 16777216.0;
      const double t = 2.0 * 3.14159265358979323846 * static_cast<double>(u1 >> 8) / 16777216.0;
      const double r = std::sqrt(-2.0 * std::log(a));
      const F32x2 n = trainkit::normal2(u0, u1);
      CHECK(n.v[0] == doctest::Approx(r * std::cos(t)).epsilon(1e-5).scale(1.0));
      CHECK(n.v[1] == doctest::Approx(r * std::sin(t)).epsilon(1e-5).scale(1.0));
    }
  }
  CHECK(std::fabs(trainkit::normal2(0, 0).v[0]) < 5.78f);
}

TEST_CASE("PhiloxStream equals the per-element functions, whatever the draw order") {
  const std::uint64_t seed = 99, stream = 5;
  PhiloxStream s(seed, stream);
  CHECK(s.seed() == seed);
  CHECK(s.stream() == stream);
  for (std::uint64_t k = 0; k < 64; ++k) {
    switch (k % 5) {  // mixes the kinds of draws and misaligns them against blocks and pairs
      case 0:
      case 3: CHECK(s.next_u32() == trainkit::philox_u32(seed, stream, k)); break;
      case 1: CHECK(s.next_uniform() == trainkit::philox_uniform(seed, stream, k)); break;
      default: CHECK(s.next_normal() == trainkit::philox_normal(seed, stream, k)); break;
    }
  }
  CHECK(s.position() == 64);
  s.seek(3);
  CHECK(s.next_normal() == trainkit::philox_normal(seed, stream, 3));
  CHECK(s.next_normal() == trainkit::philox_normal(seed, stream, 4));
  CHECK(s.next_normal() == trainkit::philox_normal(seed, stream, 5));
  PhiloxStream late(seed, stream, 1'000'003);
  CHECK(late.next_u32() == trainkit::philox_u32(seed, stream, 1'000'003));

  // Determinism: two streams with the same key produce the same sequence.
  PhiloxStream a(12345, 1), b(12345, 1);
  bool identical = true;
  for (int i = 0; i < 1000; ++i) identical = identical && a.next_u32() == b.next_u32();
  CHECK(identical);
}

TEST_CASE("uniform draws have the moments, range and balance of U[0,1)") {
  constexpr int kN = 1 << 20;
  PhiloxStream s(2024, 0);
  double sum = 0, sum2 = 0, lag = 0, prev = 0;
  float lo = 1.0f, hi = 0.0f;
  std::vector<int> bins(64, 0);
  std::vector<int> ones(32, 0);
  int stream_mismatch = 0;
  for (int i = 0; i < kN; ++i) {
    const std::uint32_t w = trainkit::philox_u32(2024, 0, static_cast<std::uint64_t>(i));
    for (int bit = 0; bit < 32; ++bit) ones[bit] += (w >> bit) & 1U;
    const float u = s.next_uniform();
    stream_mismatch += u != trainkit::uniform_float(w);
    lo = std::fmin(lo, u);
    hi = std::fmax(hi, u);
    const double x = u - 0.5;
    sum += x;
    sum2 += x * x;
    lag += x * prev;
    prev = x;
    ++bins[static_cast<int>(u * 64.0f)];
  }
  // Bounds are 5-6 standard errors of the estimator (seeded, so the outcome is fixed, but a
  // generator with a bias at the 1e-3 level would fail).
  const double mean = sum / kN, var = sum2 / kN - mean * mean;
  CHECK(std::fabs(mean) < 5 * std::sqrt(1.0 / 12 / kN));                          // 1.4e-3
  CHECK(std::fabs(var - 1.0 / 12) < 5 * std::sqrt((1.0 / 80 - 1.0 / 144) / kN));  // 3.6e-4
  CHECK(std::fabs(lag / kN) < 5 * (1.0 / 12) / std::sqrt(kN));  // lag-1 covariance
  CHECK(stream_mismatch == 0);
  CHECK(lo >= 0.0f);
  CHECK(lo < 1e-5f);
  CHECK(hi < 1.0f);
  CHECK(hi > 1.0f - 1e-5f);
  double chi2 = 0;
  const double expect = kN / 64.0;
  for (int c : bins) chi2 += (c - expect) * (c - expect) / expect;
  CHECK(chi2 < 63 + 6 * std::sqrt(2.0 * 63));  // 63 degrees of freedom
  for (int bit = 0; bit < 32; ++bit) {
    CAPTURE(bit);
    CHECK(std::abs(ones[bit] - kN / 2) < 5 * std::sqrt(kN / 4.0));
  }
}

TEST_CASE("normal draws have the moments of N(0,1)") {
  constexpr int kN = 1 << 20;
  double sum = 0, sum2 = 0, sum4 = 0, within1 = 0, pair_cov = 0, maxabs = 0;
  for (int i = 0; i < kN; i += 2) {
    const float a = trainkit::philox_normal(77, 9, static_cast<std::uint64_t>(i));
    const float b = trainkit::philox_normal(77, 9, static_cast<std::uint64_t>(i + 1));
    for (double x : {static_cast<double>(a), static_cast<double>(b)}) {
      sum += x;
      sum2 += x * x;
      sum4 += x * x * x * x;
      within1 += std::fabs(x) < 1.0;
      maxabs = std::fmax(maxabs, std::fabs(x));
    }
    pair_cov += static_cast<double>(a) * b;  // the two halves of one Box–Muller pair
  }
  const double mean = sum / kN, var = sum2 / kN - mean * mean;
  CHECK(std::fabs(mean) < 5 / std::sqrt(kN));                  // 4.9e-3
  CHECK(std::fabs(var - 1) < 5 * std::sqrt(2.0 / kN));         // 6.9e-3
  CHECK(std::fabs(sum4 / kN - 3) < 5 * std::sqrt(96.0 / kN));  // 4.8e-2
  CHECK(std::fabs(within1 / kN - 0.682689492) < 5 * std::sqrt(0.2166 / kN));
  CHECK(std::fabs(pair_cov / (kN / 2)) < 5 / std::sqrt(kN / 2.0));
  CHECK(maxabs > 4.0);
  CHECK(maxabs < 5.78);
}

TEST_CASE("streams and seeds are uncorrelated") {
  constexpr int kN = 1 << 18;
  double c_stream = 0, c_seed = 0;
  for (int i = 0; i < kN; ++i) {
    const auto k = static_cast<std::uint64_t>(i);
    const double x = trainkit::philox_uniform(5, 0, k) - 0.5;
    c_stream += x * (trainkit::philox_uniform(5, 1, k) - 0.5);
    c_seed += x * (trainkit::philox_uniform(6, 0, k) - 0.5);
  }
  const double bound = 5 * (1.0 / 12) / std::sqrt(kN);
  CHECK(std::fabs(c_stream / kN) < bound);
  CHECK(std::fabs(c_seed / kN) < bound);
}
