// SPDX-License-Identifier: MIT
// trainkit/core/rng.hpp: the counter-based Philox4x32-10 generator (Salmon et al., SC11, Random123)
// for host and device code. A random number is a pure function of (seed, stream, index), so
// dropout masks and initialisations do not depend on thread timing or launch order, and host and
// device produce the same 32-bit words and uniforms bit for bit.
#pragma once

#include <cmath>
#include <cstdint>

#include "trainkit/config.hpp"

TRAINKIT_NAMESPACE_BEGIN

/// Four 32-bit words: one Philox block (a POD rather than std::array so device code can use it).
struct U32x4 {
  std::uint32_t v[4];
};

/// Two floats, e.g. the pair of normals one Box–Muller transform yields.
struct F32x2 {
  float v[2];
};

/// Philox4x32 with 10 rounds, exactly as Random123's `philox4x32_10` and cuRAND's
/// `curandStatePhilox4_32_10_t` (same constants, word order and key schedule).
///
/// Keying convention: the 64-bit key is the seed (low word first), the 128-bit counter is
/// (counter_hi, counter_lo) with counter_lo in words 0-1 and counter_hi in words 2-3, low word
/// first. trainkit uses counter_hi = stream id and counter_lo = element index / 4, which is
/// cuRAND's layout too: `philox_u32(seed, s, i)` equals the i-th `curand()` draw after
/// `curand_init(seed, s, 0, &state)`.
struct Philox4x32 {
  static constexpr std::uint32_t kMul0 = 0xD2511F53U;
  static constexpr std::uint32_t kMul1 = 0xCD9E8D57U;
  static constexpr std::uint32_t kWeyl0 = 0x9E3779B9U;  // golden ratio
  static constexpr std::uint32_t kWeyl1 = 0xBB67AE85U;  // sqrt(3) - 1
  static constexpr int kRounds = 10;

  /// One round: two 32x32->64 multiplies (one mul.wide.u32 each on the device) and a mix.
  TRAINKIT_HOST_DEVICE static constexpr U32x4 apply_round(const U32x4& c, std::uint32_t k0,
                                                          std::uint32_t k1) noexcept {
    const std::uint64_t p0 = static_cast<std::uint64_t>(kMul0) * c.v[0];
    const std::uint64_t p1 = static_cast<std::uint64_t>(kMul1) * c.v[2];
    return U32x4{
        {static_cast<std::uint32_t>(p1 >> 32) ^ c.v[1] ^ k0, static_cast<std::uint32_t>(p1),
         static_cast<std::uint32_t>(p0 >> 32) ^ c.v[3] ^ k1, static_cast<std::uint32_t>(p0)}};
  }

  /// The raw bijection on Random123's word layout: counter words ctr.v[0..3], key words k0, k1.
  /// Written out rather than looped: TRAINKIT_UNROLL's pragma warns in nvcc's host pass, and the
  /// ten rounds must be unrolled on the device.
  TRAINKIT_HOST_DEVICE static constexpr U32x4 block(U32x4 ctr, std::uint32_t k0,
                                                    std::uint32_t k1) noexcept {
    ctr = apply_round(ctr, k0, k1);  // the key is bumped before rounds 2..10
    ctr = apply_round(ctr, k0 += kWeyl0, k1 += kWeyl1);
    ctr = apply_round(ctr, k0 += kWeyl0, k1 += kWeyl1);
    ctr = apply_round(ctr, k0 += kWeyl0, k1 += kWeyl1);
    ctr = apply_round(ctr, k0 += kWeyl0, k1 += kWeyl1);
    ctr = apply_round(ctr, k0 += kWeyl0, k1 += kWeyl1);
    ctr = apply_round(ctr, k0 += kWeyl0, k1 += kWeyl1);
    ctr = apply_round(ctr, k0 += kWeyl0, k1 += kWeyl1);
    ctr = apply_round(ctr, k0 += kWeyl0, k1 += kWeyl1);
    return apply_round(ctr, k0 += kWeyl0, k1 += kWeyl1);
  }

  /// The block for key `key` at the 128-bit counter (counter_hi:counter_lo).
  TRAINKIT_HOST_DEVICE static constexpr U32x4 generate(std::uint64_t key, std::uint64_t counter_hi,
                                                       std::uint64_t counter_lo) noexcept {
    return block(
        U32x4{{static_cast<std::uint32_t>(counter_lo), static_cast<std::uint32_t>(counter_lo >> 32),
               static_cast<std::uint32_t>(counter_hi),
               static_cast<std::uint32_t>(counter_hi >> 32)}},
        static_cast<std::uint32_t>(key), static_cast<std::uint32_t>(key >> 32));
  }
};

/// A uniform float in [0, 1) from the top 24 bits of `u`: every value is a multiple of 2^-24, so
/// all 2^24 outcomes are equally likely and exact; the largest is 1 - 2^-24.
TRAINKIT_HOST_DEVICE inline constexpr float uniform_float(std::uint32_t u) noexcept {
  return static_cast<float>(u >> 8) * 0x1p-24f;
}

/// Like uniform_float but in (0, 1]: safe to pass to log().
TRAINKIT_HOST_DEVICE inline constexpr float uniform_float_open0(std::uint32_t u) noexcept {
  return static_cast<float>((u >> 8) + 1U) * 0x1p-24f;
}

/// Two independent standard normals from two words (Box–Muller): r = sqrt(-2 ln a), a in (0, 1]
/// from `u0`, angle 2*pi*b, b in [0, 1) from `u1`; returns {r cos, r sin}. |value| <= 5.77.
/// Deterministic per platform; host (libm) and device (CUDA math) results may differ by a few ulp
/// because their log/sin/cos differ, unlike the integer words and uniforms, which match exactly.
TRAINKIT_HOST_DEVICE inline F32x2 normal2(std::uint32_t u0, std::uint32_t u1) noexcept {
  constexpr float kTwoPi = 6.28318530717958647692f;
  const float a = uniform_float_open0(u0);
  const float angle = kTwoPi * uniform_float(u1);
#if defined(__CUDA_ARCH__)
  const float r = ::sqrtf(-2.0f * ::logf(a));
  float s = 0.0f;
  float c = 0.0f;
  ::sincosf(angle, &s, &c);
#else
  const float r = std::sqrt(-2.0f * std::log(a));
  const float s = std::sin(angle);
  const float c = std::cos(angle);
#endif
  return F32x2{{r * c, r * s}};
}

/// A stream id for the (step, site) pair when random numbers are keyed by (seed, step, element)
/// (docs/design.md, "Determinism"): `site` tells apart the random draws made at one step (e.g.
/// one id per dropout layer).
TRAINKIT_HOST_DEVICE inline constexpr std::uint64_t rng_stream_id(std::uint32_t step,
                                                                  std::uint32_t site) noexcept {
  return (static_cast<std::uint64_t>(step) << 32) | site;
}

/// The 32-bit word number `index` of stream `stream` under `seed`: word index % 4 of the block at
/// counter (stream, index / 4). A kernel drawing 4 consecutive words should call
/// Philox4x32::generate(seed, stream, index / 4) once instead.
TRAINKIT_HOST_DEVICE inline constexpr std::uint32_t philox_u32(std::uint64_t seed,
                                                               std::uint64_t stream,
                                                               std::uint64_t index) noexcept {
  return Philox4x32::generate(seed, stream, index >> 2).v[index & 3U];
}

/// uniform_float of word `index`: a float in [0, 1), e.g. `keep = philox_uniform(...) >= p`.
TRAINKIT_HOST_DEVICE inline constexpr float philox_uniform(std::uint64_t seed, std::uint64_t stream,
                                                           std::uint64_t index) noexcept {
  return uniform_float(philox_u32(seed, stream, index));
}

/// A standard normal for element `index`: normals 2j and 2j+1 are the cos and sin halves of
/// normal2(word 2j, word 2j+1), so each block of 4 words yields 4 normals.
TRAINKIT_HOST_DEVICE inline float philox_normal(std::uint64_t seed, std::uint64_t stream,
                                                std::uint64_t index) noexcept {
  const U32x4 w = Philox4x32::generate(seed, stream, index >> 2);
  const unsigned pair = static_cast<unsigned>(index & 2U);
  return normal2(w.v[pair], w.v[pair + 1U]).v[index & 1U];
}

/// A sequential view of one (seed, stream) for host loops (also usable in device code). Draw k,
/// of any kind, equals the per-element function at index k: the k-th `next_u32()` is
/// `philox_u32(seed, stream, k)`, and a `next_normal()` made as draw k is
/// `philox_normal(seed, stream, k)`. Normals at 2j and 2j+1 share words 2j and 2j+1, so for
/// independent kinds of draws use separate streams rather than interleaving them in one.
class PhiloxStream {
 public:
  TRAINKIT_HOST_DEVICE constexpr PhiloxStream(std::uint64_t seed, std::uint64_t stream = 0,
                                              std::uint64_t position = 0) noexcept
      : seed_(seed), stream_(stream), position_(position) {}

  TRAINKIT_HOST_DEVICE constexpr std::uint64_t seed() const noexcept { return seed_; }
  TRAINKIT_HOST_DEVICE constexpr std::uint64_t stream() const noexcept { return stream_; }
  /// The index of the next draw.
  TRAINKIT_HOST_DEVICE constexpr std::uint64_t position() const noexcept { return position_; }
  /// Jumps to draw `position` in O(1) (counter-based: no state to replay).
  TRAINKIT_HOST_DEVICE constexpr void seek(std::uint64_t position) noexcept {
    position_ = position;
  }

  TRAINKIT_HOST_DEVICE constexpr std::uint32_t next_u32() noexcept {
    const std::uint64_t k = position_++;
    return load_block(k >> 2).v[k & 3U];
  }

  /// A float in [0, 1) (uniform_float of the next word).
  TRAINKIT_HOST_DEVICE constexpr float next_uniform() noexcept { return uniform_float(next_u32()); }

  /// A standard normal (see the class comment for how it maps to words).
  TRAINKIT_HOST_DEVICE float next_normal() noexcept {
    const std::uint64_t k = position_++;
    const std::uint64_t first = k & ~std::uint64_t{1};
    if (!has_pair_ || pair_index_ != first) {
      const U32x4& w = load_block(k >> 2);
      const unsigned p = static_cast<unsigned>(k & 2U);
      pair_ = normal2(w.v[p], w.v[p + 1U]);
      pair_index_ = first;
      has_pair_ = true;
    }
    return pair_.v[k & 1U];
  }

 private:
  TRAINKIT_HOST_DEVICE constexpr const U32x4& load_block(std::uint64_t block_index) noexcept {
    if (!has_block_ || block_index_ != block_index) {
      block_ = Philox4x32::generate(seed_, stream_, block_index);
      block_index_ = block_index;
      has_block_ = true;
    }
    return block_;
  }

  std::uint64_t seed_;
  std::uint64_t stream_;
  std::uint64_t position_;
  std::uint64_t block_index_ = 0;
  std::uint64_t pair_index_ = 0;
  U32x4 block_{};
  F32x2 pair_{};
  bool has_block_ = false;
  bool has_pair_ = false;
};

TRAINKIT_NAMESPACE_END
