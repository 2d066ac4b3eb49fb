// Tests for core/half.hpp: every 16-bit pattern, >= 10^7 floats rich in rounding edge cases, and
// arithmetic, against an independent float64 reference and, when the CUDA headers are available,
// bit-for-bit against CUDA's own host conversions (__float2half_rn, __float2bfloat16_rn, ...).
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <vector>

#include <trainkit/core/half.hpp>

#if TRAINKIT_WITH_CUDA
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#endif

namespace {

using trainkit::bf16;
using trainkit::f16;

std::uint32_t bits_of(float f) {
  std::uint32_t u = 0;
  std::memcpy(&u, &f, sizeof u);
  return u;
}
float float_of(std::uint32_t u) {
  float f = 0;
  std::memcpy(&f, &u, sizeof f);
  return f;
}

// A binary format with `m` stored mantissa bits and `e` exponent bits (f16: 10/5, bf16: 7/8).
struct Format {
  int m;
  int e;
};
constexpr Format kF16{10, 5};
constexpr Format kBF16{7, 8};

// Independent reference: rounds the exact double `d` to the format by scaling with a power of two
// (exact) and std::nearbyint (round-half-even in the default rounding mode). NaN -> 0x7fff, the
// canonical NaN the library promises (it is all-ones exponent and mantissa in both formats).
std::uint16_t ref_encode(double d, Format f) {
  const int bias = (1 << (f.e - 1)) - 1;
  const int emin = 1 - bias;
  const std::uint32_t inf = ((1U << f.e) - 1U) << f.m;
  if (std::isnan(d)) return 0x7fff;
  const std::uint32_t sign = std::signbit(d) ? 0x8000U : 0U;
  const double a = std::fabs(d);
  if (std::isinf(a)) return static_cast<std::uint16_t>(sign | inf);
  if (a == 0.0) return static_cast<std::uint16_t>(sign);
  int e2 = 0;
  (void)std::frexp(a, &e2);  // a in [2^(e2-1), 2^e2)
  const int ex = std::max(e2 - 1, emin);
  const double q = std::nearbyint(std::ldexp(a, f.m - ex));  // in [0, 2^(m+1)]
  const auto r = static_cast<std::uint64_t>(q);
  std::uint64_t bits = 0;
  if (e2 - 1 < emin) bits = r;  // subnormal; r == 2^m is exactly the smallest normal's encoding
  else bits = (static_cast<std::uint64_t>(ex + bias) << f.m) + (r - (1ULL << f.m));
  if (bits >= inf) return static_cast<std::uint16_t>(sign | inf);
  return static_cast<std::uint16_t>(sign | bits);
}

double ref_decode(std::uint16_t h, Format f) {
  const int bias = (1 << (f.e - 1)) - 1;
  const unsigned exp_field = (h >> f.m) & ((1U << f.e) - 1U);
  const unsigned mant = h & ((1U << f.m) - 1U);
  const double sign = (h & 0x8000U) ? -1.0 : 1.0;
  if (exp_field == (1U << f.e) - 1U)
    return mant ? std::numeric_limits<double>::quiet_NaN()
                : sign * std::numeric_limits<double>::infinity();
  if (exp_field == 0) return sign * std::ldexp(static_cast<double>(mant), 1 - bias - f.m);
  return sign * std::ldexp(static_cast<double>(mant + (1U << f.m)),
                           static_cast<int>(exp_field) - bias - f.m);
}

// Deterministic test inputs (independent of core/rng.hpp, which has its own tests).
struct SplitMix64 {
  std::uint64_t s;
  std::uint64_t next() {
    std::uint64_t z = (s += 0x9e3779b97f4a7c15ULL);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
    return z ^ (z >> 31);
  }
  std::uint32_t u32() { return static_cast<std::uint32_t>(next() >> 32); }
  int in(int lo, int hi) {
    return lo + static_cast<int>(next() % static_cast<unsigned>(hi - lo + 1));
  }
};

// Float bit patterns that stress the conversions: random patterns (all exponents, NaN payloads),
// values within a few ulps of representable f16/bf16 values and of the exact halfway points
// between them, the f16 subnormal/underflow range, the overflow thresholds, and fixed specials.
std::vector<std::uint32_t> edge_rich_floats(std::size_t n, std::uint64_t seed) {
  const std::uint32_t specials[] = {
      0x00000000, 0x80000000, 0x7f800000, 0xff800000, 0x7fc00000, 0xffc00000, 0x7f800001,
      0xff800001, 0x7fbfffff, 0xffffffff, 0x7fffffff, 0x7f7fffff, 0xff7fffff, 0x00800000,
      0x00000001, 0x807fffff, 0x477fe000, 0x477fefff, 0x477ff000, 0x477ff001, 0x47800000,
      0xc77ff000, 0x33000000, 0x33000001, 0x32ffffff, 0x33800000, 0x33c00000, 0x38800000,
      0x387fffff, 0x38000000, 0x3f800000, 0x3f801000, 0x3f803000, 0x3f808000, 0x3f818000,
      0x7f7f8000, 0x7f7f7fff, 0x7f7f8001, 0x00008000, 0x00018000, 0x80008000};
  std::vector<std::uint32_t> out(std::begin(specials), std::end(specials));
  out.reserve(n);
  SplitMix64 g{seed};
  while (out.size() < n) {
    const std::uint32_t r = g.u32();
    const std::uint32_t sign = r & 0x80000000U;
    switch (g.next() % 8) {
      case 0:  // any pattern
        out.push_back(r);
        break;
      case 1: {  // near a finite f16 value
        const std::uint16_t h = static_cast<std::uint16_t>(r & 0x7bffU);
        const std::uint32_t v = bits_of(static_cast<float>(ref_decode(h, kF16)));
        out.push_back(sign | ((v + static_cast<std::uint32_t>(g.in(0, 6)) - 3U) & 0x7fffffffU));
        break;
      }
      case 2: {  // near the halfway point between two adjacent f16 values (exact in float)
        const std::uint16_t h = static_cast<std::uint16_t>(g.u32() % 0x7bffU);
        const double mid = 0.5 * (ref_decode(h, kF16) + ref_decode(h + 1, kF16));
        const std::uint32_t v = bits_of(static_cast<float>(mid));
        out.push_back(sign | (v + static_cast<std::uint32_t>(g.in(0, 4)) - 2U));
        break;
      }
      case 3:  // near a bf16 value
        out.push_back((r & 0xffff0000U) + static_cast<std::uint32_t>(g.in(0, 6)) - 3U);
        break;
      case 4:  // near a bf16 halfway point
        out.push_back(((r & 0xffff0000U) | 0x8000U) + static_cast<std::uint32_t>(g.in(0, 4)) - 2U);
        break;
      case 5: {  // f16 subnormals and underflow: exponents 2^-28 .. 2^-13
        const std::uint32_t exp = static_cast<std::uint32_t>(g.in(99, 114));
        out.push_back(sign | (exp << 23) | (g.u32() & 0x7fffffU));
        break;
      }
      case 6:  // around f16's largest finite value and overflow threshold (65504, 65520)
        out.push_back(sign | (0x477fc000U + (g.u32() % 0xa000U)));
        break;
      default: {  // bf16 extremes: float subnormals, smallest normals, largest finite, Inf/NaN
        const std::uint32_t exps[] = {0, 1, 2, 253, 254, 255};
        out.push_back(sign | (exps[g.next() % 6] << 23) | (g.u32() & 0x7fffffU));
        break;
      }
    }
  }
  return out;
}

}  // namespace

TEST_CASE("f16 and bf16 are layout-compatible value types with a DType") {
  static_assert(sizeof(f16) == 2 && alignof(f16) == 2 && sizeof(bf16) == 2 && alignof(bf16) == 2);
  static_assert(trainkit::dtype_of<f16> == trainkit::DType::kF16);
  static_assert(trainkit::dtype_of<const bf16> == trainkit::DType::kBF16);
  // Conversions are usable in constant expressions.
  static_assert(trainkit::float_to_f16_bits(1.0f) == 0x3c00);
  static_assert(trainkit::f16_bits_to_float(0x0001) == 0x1p-24f);
  static_assert(trainkit::float_to_bf16_bits(-2.0f) == 0xc000);
  static_assert(static_cast<float>(f16(65504.0f)) == 65504.0f);
  static_assert((f16(1.5f) + f16(0.25f)).bits() == f16(1.75f).bits());
  CHECK(f16{}.bits() == 0);
  CHECK(bf16{}.bits() == 0);
#if TRAINKIT_WITH_CUDA
  static_assert(sizeof(__half) == sizeof(f16) && alignof(__half) == alignof(f16));
  static_assert(sizeof(__nv_bfloat16) == sizeof(bf16) && alignof(__nv_bfloat16) == alignof(bf16));
  const f16 h = f16::from_bits(0x7d23);  // a NaN with a payload: bit copies keep it
  CHECK(trainkit::from_cuda(trainkit::to_cuda(h)).bits() == 0x7d23);
  CHECK(static_cast<__half_raw>(trainkit::to_cuda(f16(-3.0f))).x == 0xc200);
  CHECK(trainkit::from_cuda(__float2bfloat16_rn(0.1f)).bits() == bf16(0.1f).bits());
  CHECK(__bfloat162float(trainkit::to_cuda(bf16(3.0f))) == 3.0f);
#endif
}

TEST_CASE("all 65536 f16 patterns decode exactly and round-trip") {
  std::size_t bad_decode = 0, bad_roundtrip = 0, bad_cuda = 0, nans = 0;
  for (std::uint32_t i = 0; i < 0x10000U; ++i) {
    const auto h = static_cast<std::uint16_t>(i);
    const float f = trainkit::f16_bits_to_float(h);
    const double ref = ref_decode(h, kF16);
    if (std::isnan(ref)) {
      ++nans;
      if (bits_of(f) != 0x7fffffffU) ++bad_decode;  // CUDA's canonical float NaN
      if (trainkit::float_to_f16_bits(f) != 0x7fff || !trainkit::is_nan(f16::from_bits(h)))
        ++bad_roundtrip;
    } else {
      if (static_cast<double>(f) != ref || std::signbit(f) != std::signbit(ref)) ++bad_decode;
      if (trainkit::float_to_f16_bits(f) != h || f16(f).bits() != h) ++bad_roundtrip;
    }
#if TRAINKIT_WITH_CUDA
    __half_raw raw;
    raw.x = h;
    if (bits_of(__half2float(__half(raw))) != bits_of(f)) ++bad_cuda;
    if (static_cast<__half_raw>(__float2half_rn(f)).x != trainkit::float_to_f16_bits(f)) ++bad_cuda;
#endif
  }
  CHECK(nans == 2 * 1023);
  CHECK(bad_decode == 0);
  CHECK(bad_roundtrip == 0);
  CHECK(bad_cuda == 0);
}

TEST_CASE("all 65536 bf16 patterns decode exactly and round-trip") {
  std::size_t bad_decode = 0, bad_roundtrip = 0, bad_cuda = 0, nans = 0;
  for (std::uint32_t i = 0; i < 0x10000U; ++i) {
    const auto h = static_cast<std::uint16_t>(i);
    const float f = trainkit::bf16_bits_to_float(h);
    const double ref = ref_decode(h, kBF16);
    if (bits_of(f) != (i << 16)) ++bad_decode;  // exact, NaN payloads kept
    if (std::isnan(ref)) {
      ++nans;
      if (!std::isnan(f) || trainkit::float_to_bf16_bits(f) != 0x7fff ||
          !trainkit::is_nan(bf16::from_bits(h)))
        ++bad_roundtrip;
    } else {
      if (static_cast<double>(f) != ref || std::signbit(f) != std::signbit(ref)) ++bad_decode;
      if (trainkit::float_to_bf16_bits(f) != h || bf16(f).bits() != h) ++bad_roundtrip;
    }
#if TRAINKIT_WITH_CUDA
    __nv_bfloat16_raw raw;
    raw.x = h;
    if (bits_of(__bfloat162float(__nv_bfloat16(raw))) != bits_of(f)) ++bad_cuda;
    if (static_cast<__nv_bfloat16_raw>(__float2bfloat16_rn(f)).x != trainkit::float_to_bf16_bits(f))
      ++bad_cuda;
#endif
  }
  CHECK(nans == 2 * 127);
  CHECK(bad_decode == 0);
  CHECK(bad_roundtrip == 0);
  CHECK(bad_cuda == 0);
}

TEST_CASE("10^7 edge-rich floats round like the float64 reference and CUDA's host code") {
  const std::vector<std::uint32_t> inputs = edge_rich_floats(10'000'000, 0x5eed);
  std::size_t bad_f16 = 0, bad_bf16 = 0, cuda_f16 = 0, cuda_bf16 = 0, halfway = 0, nan_in = 0;
  std::uint32_t first_bad = 0;
  for (const std::uint32_t u : inputs) {
    const float f = float_of(u);
    const std::uint16_t h = trainkit::float_to_f16_bits(f);
    const std::uint16_t b = trainkit::float_to_bf16_bits(f);
    if (h != ref_encode(f, kF16)) {
      if (bad_f16++ == 0) first_bad = u;
    }
    if (b != ref_encode(f, kBF16)) {
      if (bad_bf16++ == 0) first_bad = u;
    }
    // Coverage counters, so a broken generator cannot make this test vacuous.
    if ((u & 0x7fffffffU) > 0x7f800000U) ++nan_in;
    if ((u & 0xffffU) == 0x8000U) ++halfway;
#if TRAINKIT_WITH_CUDA
    if (static_cast<__half_raw>(__float2half_rn(f)).x != h) {
      if (cuda_f16++ == 0) first_bad = u;
    }
    if (static_cast<__nv_bfloat16_raw>(__float2bfloat16_rn(f)).x != b) {
      if (cuda_bf16++ == 0) first_bad = u;
    }
#endif
  }
  INFO("first mismatching float bits: 0x" << std::hex << first_bad);
  CHECK(bad_f16 == 0);
  CHECK(bad_bf16 == 0);
  CHECK(cuda_f16 == 0);
  CHECK(cuda_bf16 == 0);
  CHECK(nan_in > 10'000);
  CHECK(halfway > 100'000);
}

TEST_CASE("rounding edge cases by value") {
  using trainkit::float_to_bf16_bits;
  using trainkit::float_to_f16_bits;
  CHECK(float_to_f16_bits(65504.0f) == 0x7bff);
  CHECK(float_to_f16_bits(65519.996f) == 0x7bff);  // just below the overflow threshold
  CHECK(float_to_f16_bits(65520.0f) == 0x7c00);    // the tie rounds to even: Inf
  CHECK(float_to_f16_bits(-1e30f) == 0xfc00);
  CHECK(float_to_f16_bits(0x1p-24f) == 0x0001);
  CHECK(float_to_f16_bits(0x1p-25f) == 0x0000);             // tie to even zero
  CHECK(float_to_f16_bits(-0x1.000002p-25f) == 0x8001);     // just above the tie
  CHECK(float_to_f16_bits(0x1.8p-24f) == 0x0002);           // 1.5 ulp: tie to even 2
  CHECK(float_to_f16_bits(0x1.ff8p-15f) == 0x03ff);         // largest subnormal
  CHECK(float_to_f16_bits(0x1.ffcp-15f) == 0x0400);         // tie rounds up to min normal (even)
  CHECK(float_to_f16_bits(1.0f + 0x1p-11f) == 0x3c00);      // tie, even stays
  CHECK(float_to_f16_bits(1.0f + 3 * 0x1p-11f) == 0x3c02);  // tie, odd rounds up
  CHECK(float_to_f16_bits(-0.0f) == 0x8000);
  CHECK(float_to_f16_bits(-std::numeric_limits<float>::quiet_NaN()) == 0x7fff);
  CHECK(float_to_bf16_bits(std::numeric_limits<float>::max()) == 0x7f80);  // rounds to Inf
  CHECK(float_to_bf16_bits(float_of(0x7f7f7fff)) == 0x7f7f);
  CHECK(float_to_bf16_bits(float_of(0x3f808000)) == 0x3f80);  // tie, even
  CHECK(float_to_bf16_bits(float_of(0x3f818000)) == 0x3f82);  // tie, odd
  CHECK(float_to_bf16_bits(float_of(0xffc12345)) == 0x7fff);  // NaN sign and payload dropped
  CHECK(float_to_bf16_bits(float_of(0x00000001)) == 0x0000);  // float denorm_min
  CHECK(float_to_bf16_bits(float_of(0x00008000)) == 0x0000);  // tie to even zero
  CHECK(float_to_bf16_bits(float_of(0x00018000)) == 0x0002);
  // Construction from double goes through float, as documented: 1 + 2^-11 + 2^-40 rounds to
  // 1 + 2^-11 in float, a tie that goes to even (1.0) although direct rounding would give 1+2^-10.
  CHECK(f16(1.0 + 0x1p-11 + 0x1p-40).bits() == 0x3c00);
  CHECK(f16(3).bits() == 0x4200);
  CHECK(bf16(-1).bits() == 0xbf80);
  CHECK(f16(2049).bits() == 0x6800);  // 2049 is a tie between 2048 and 2050: even
}

TEST_CASE("comparisons, negation and numeric_limits") {
  const f16 nan = std::numeric_limits<f16>::quiet_NaN();
  CHECK(f16(-0.0f) == f16(0.0f));
  CHECK_FALSE(nan == nan);
  CHECK(nan != nan);
  CHECK_FALSE(nan < f16(1.0f));
  CHECK(f16(1.0f) < f16(2.0f));
  CHECK(f16(-2.0f) <= f16(-2.0f));
  CHECK(bf16(3.0f) > bf16(-3.0f));
  CHECK(bf16(0.5f) >= bf16(0.25f));
  CHECK((-f16(0.0f)).bits() == 0x8000);
  CHECK((-nan).bits() == 0xffff);
  CHECK((-bf16(1.0f)).bits() == 0xbf80);
  f16 acc(1.0f);
  acc += f16(2.0f);
  acc *= f16(4.0f);
  acc -= f16(2.0f);
  acc /= f16(5.0f);
  CHECK(static_cast<float>(acc) == 2.0f);
  CHECK(static_cast<double>(bf16(0.5f)) == 0.5);

  using L = std::numeric_limits<f16>;
  CHECK(static_cast<float>(L::max()) == 65504.0f);
  CHECK(static_cast<float>(L::lowest()) == -65504.0f);
  CHECK(static_cast<float>(L::min()) == 0x1p-14f);
  CHECK(static_cast<float>(L::epsilon()) == 0x1p-10f);
  CHECK(static_cast<float>(L::denorm_min()) == 0x1p-24f);
  CHECK(static_cast<float>(L::round_error()) == 0.5f);
  CHECK(trainkit::is_inf(L::infinity()));
  CHECK(trainkit::is_nan(L::signaling_NaN()));
  CHECK(f16(1.0f) + L::epsilon() != f16(1.0f));
  using LB = std::numeric_limits<bf16>;
  CHECK(bits_of(static_cast<float>(LB::max())) == 0x7f7f0000U);
  CHECK(static_cast<float>(LB::lowest()) == -static_cast<float>(LB::max()));
  CHECK(static_cast<float>(LB::min()) == std::numeric_limits<float>::min());
  CHECK(static_cast<float>(LB::epsilon()) == 0x1p-7f);
  CHECK(static_cast<float>(LB::denorm_min()) == 0x1p-133f);
  CHECK(trainkit::is_inf(LB::infinity()));
  CHECK(trainkit::is_nan(LB::quiet_NaN()));
  CHECK(trainkit::is_finite(LB::max()));
  CHECK_FALSE(trainkit::is_finite(L::infinity()));
  CHECK(bf16(1.0f) + LB::epsilon() != bf16(1.0f));
}

TEST_CASE("arithmetic equals correctly rounded 16-bit arithmetic") {
  SplitMix64 g{42};
  std::size_t bad = 0;
  for (int i = 0; i < 1'000'000; ++i) {
    const auto ha = static_cast<std::uint16_t>(g.u32());
    const auto hb = static_cast<std::uint16_t>(g.u32());
    {
      const f16 a = f16::from_bits(ha), b = f16::from_bits(hb);
      const double x = ref_decode(ha, kF16), y = ref_decode(hb, kF16);
      // Sums and products of f16 values are exact in double; the quotient's double rounding is
      // innocuous (53 >= 2 * 11 + 2).
      bad += (a + b).bits() != ref_encode(x + y, kF16);
      bad += (a - b).bits() != ref_encode(x - y, kF16);
      bad += (a * b).bits() != ref_encode(x * y, kF16);
      bad += (a / b).bits() != ref_encode(x / y, kF16);
    }
    {
      const bf16 a = bf16::from_bits(ha), b = bf16::from_bits(hb);
      const double x = ref_decode(ha, kBF16), y = ref_decode(hb, kBF16);
      // Not always exact in double, but double rounding is innocuous here (53 >= 2 * 8 + 2).
      bad += (a + b).bits() != ref_encode(x + y, kBF16);
      bad += (a - b).bits() != ref_encode(x - y, kBF16);
      bad += (a * b).bits() != ref_encode(x * y, kBF16);
      bad += (a / b).bits() != ref_encode(x / y, kBF16);
    }
  }
  CHECK(bad == 0);
}
