// The GPU's fused causal attention core (trainkit/nn/fused_attention.hpp) run on the host under
// an emulation of its thread blocks, against a float64 attention: random shapes around the 64
// tile (ragged last tiles, T = 1, head sizes that do not fill the tile depth), large logits, and
// bf16 operands. The same block bodies are what the CUDA kernels run.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <type_traits>
#include <vector>

#include <trainkit/core/half.hpp>
#include <trainkit/nn/fused_attention.hpp>

#include "fused_attention_emulation.hpp"
#include "nn_test_util.hpp"

namespace {

namespace tk = trainkit;
namespace nd = trainkit::nn::detail;

/// Which block bodies: the f32 (CUDA core) ones, or the tensor-core ones the GPU runs for 16-bit
/// activations.
enum class Bodies { kSimt, kTensorCore };

/// Runs the emulated fused forward and backward for shape s with operands of type T and
/// magnitude `mag`; checks them against float64 within `tol` (relative, L2).
template <class T>
void check_shape(const nntest::AttentionShape& s, std::uint64_t seed, float mag, double tol,
                 Bodies bodies = Bodies::kSimt) {
  CAPTURE(s.B);
  CAPTURE(s.H);
  CAPTURE(s.T);
  CAPTURE(s.hs);
  CAPTURE(mag);
  CAPTURE(bodies == Bodies::kTensorCore);
  const std::int64_t C = s.H * s.hs, N = s.B * s.T;
  std::vector<T> qkv(std::size_t(N * 3 * C)), dout(std::size_t(N * C));
  const auto rq = nntest::random_floats(N * 3 * C, seed, mag);
  const auto rd = nntest::random_floats(N * C, seed + 1, 1.0f);
  for (std::size_t i = 0; i < qkv.size(); ++i) qkv[i] = T(rq[i]);
  for (std::size_t i = 0; i < dout.size(); ++i) dout[i] = T(rd[i]);
  // Outputs start as NaN: every element the core owns must be written.
  std::vector<T> out(std::size_t(N * C), T(NAN)), dqkv(std::size_t(N * 3 * C), T(NAN));
  std::vector<float> lse(std::size_t(s.B * s.H * s.T), NAN), delta(lse.size(), NAN);
  const auto a = nntest::fused_args(s, qkv.data(), out.data(), lse.data(), delta.data(),
                                    dout.data(), dqkv.data());
  if constexpr (!std::is_same_v<T, float>) {
    if (bodies == Bodies::kTensorCore) nntest::emulate_fused_attention<true>(a);
  }
  if (bodies == Bodies::kSimt) nntest::emulate_fused_attention<false>(a);
  const nntest::AttentionExpected r =
      nntest::attention_reference(s, nntest::widen(qkv), nntest::widen(dout));
  const auto got_out = nntest::widen(out), got_dqkv = nntest::widen(dqkv);
  for (double v : got_out) REQUIRE(std::isfinite(v));
  for (double v : got_dqkv) REQUIRE(std::isfinite(v));
  CHECK(nntest::rel_err(got_out, r.out) < tol);
  CHECK(nntest::rel_err(got_dqkv, r.dqkv) < tol);
  double lse_err = 0.0;
  for (std::size_t i = 0; i < lse.size(); ++i)
    lse_err = std::max(lse_err, std::abs(double(lse[i]) - r.lse2[i]));
  CHECK(lse_err < (std::is_same_v<T, float> ? 1e-4 : 1e-2) * std::max(1.0, double(mag * mag)));
}

}  // namespace

TEST_CASE("fused attention (emulated GPU blocks): fixed edges around the 64-position tile") {
  // T = 1; one ragged tile; exactly one tile; one past it; three tiles with a ragged end; head
  // sizes below, at and past each tile depth (32, 64, 128).
  const nntest::AttentionShape shapes[] = {{1, 1, 1, 8},    {2, 3, 7, 5},    {1, 2, 64, 32},
                                           {1, 1, 65, 64},  {1, 2, 130, 16}, {1, 1, 70, 40},
                                           {1, 1, 66, 128}, {1, 1, 33, 96}};
  std::uint64_t seed = 11;
  for (const nntest::AttentionShape& s : shapes) check_shape<float>(s, seed++, 1.0f, 2e-5);
}

TEST_CASE("fused attention (emulated GPU blocks): random shapes, large logits, bf16") {
  tk::PhiloxStream rng(2026, 12);
  auto pick = [&](std::int64_t lo, std::int64_t hi) {
    return lo + static_cast<std::int64_t>(rng.next_uniform() * double(hi - lo + 1)) % (hi - lo + 1);
  };
  for (int round = 0; round < 4; ++round) {
    const nntest::AttentionShape s{pick(1, 2), pick(1, 3), pick(1, 140), pick(1, 72)};
    check_shape<float>(s, 100 + round, 1.0f, 2e-5);
  }
  // Large logits (|q.k| * scale up to ~100): the online softmax's running maximum keeps every
  // exponential in range.
  check_shape<float>({1, 2, 90, 24}, 7, 6.0f, 1e-4);
  // bf16 operands and outputs (f32 inside), against float64 of the same rounded inputs.
  check_shape<tk::bf16>({2, 2, 75, 32}, 9, 1.0f, 2e-2);
}

TEST_CASE("fused attention (emulated GPU blocks): the tensor-core bodies of bf16 and f16") {
  // P and dS are rounded to the activation type before their products (as on the GPU), so the
  // tolerance is the 16-bit types' (bf16: 8 bits of mantissa, f16: 11).
  const nntest::AttentionShape shapes[] = {{1, 1, 1, 16},   {1, 2, 64, 64},  {2, 1, 70, 40},
                                           {1, 1, 130, 32}, {1, 1, 66, 128}, {1, 2, 19, 7}};
  std::uint64_t seed = 40;
  for (const nntest::AttentionShape& s : shapes) {
    check_shape<tk::bf16>(s, seed++, 1.0f, 2e-2, Bodies::kTensorCore);
    check_shape<tk::f16>(s, seed++, 1.0f, 4e-3, Bodies::kTensorCore);
  }
  check_shape<tk::bf16>({1, 1, 100, 64}, 77, 5.0f, 3e-2, Bodies::kTensorCore);  // large logits
}
