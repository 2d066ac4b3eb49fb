// The host fast paths of the nn layers: Linear's GELU pair in the gemm epilogue (against the
// separate GELU pass it replaces), lane_map (against a plain loop, bit for bit) and the host
// residual_backward (every write mode, absent gradients, odd lengths, thread counts), and the
// AVX2 causal softmax rows of the attention and LayerNorm rows (against the generic rows, bit
// for bit).
#include <doctest/doctest.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include <trainkit/exec/host.hpp>
#include <trainkit/nn/activation.hpp>
#include <trainkit/nn/attention.hpp>
#include <trainkit/nn/layer_norm.hpp>
#include <trainkit/nn/linear.hpp>
#include <trainkit/nn/math.hpp>
#include <trainkit/nn/param_arena.hpp>
#include <trainkit/nn/residual.hpp>

#include "nn_test_util.hpp"

namespace {

namespace tk = trainkit;
namespace nn = trainkit::nn;

template <class T>
tk::HostView<T, 2> mat(T* p, std::int64_t r, std::int64_t c) {
  return tk::HostView<T, 2>(p, tk::Extents<2>{{r, c}});
}

/// max_i |a[i] - b[i]| / max(1, |b[i]|).
double max_scaled_diff(const std::vector<float>& a, const std::vector<float>& b) {
  double m = 0.0;
  for (std::size_t i = 0; i < a.size(); ++i)
    m = std::max(m,
                 std::fabs(double(a[i]) - double(b[i])) / std::max(1.0, std::fabs(double(b[i]))));
  return m;
}

struct GeluPairResult {
  std::vector<float> pre, g, dpre, grads;
};

/// forward_gelu of fc and backward_dgelu of proj (the MLP of a GPT block) on x and dy.
GeluPairResult run_gelu_pair(const tk::exec::Host& host, std::int64_t n, std::int64_t c,
                             std::int64_t h, float x_scale) {
  nn::ParamArena<> arena;
  nn::Linear fc(arena, "c_fc", {.in_features = c, .out_features = h});
  nn::Linear proj(arena, "c_proj", {.in_features = h, .out_features = c});
  arena.finalize();
  arena.initialize(11);
  const auto x = nntest::random_floats(n * c, 12, x_scale);
  const auto dy = nntest::random_floats(n * c, 13);
  GeluPairResult r;
  r.pre.resize(std::size_t(n * h));
  r.g.resize(r.pre.size());
  r.dpre.resize(r.pre.size());
  fc.forward_gelu(host, mat(x.data(), n, c), mat(r.pre.data(), n, h), mat(r.g.data(), n, h));
  proj.backward_dgelu(host, mat(r.g.data(), n, h), mat(dy.data(), n, c), mat(r.pre.data(), n, h),
                      mat(r.dpre.data(), n, h));
  r.grads.assign(arena.grads_data(), arena.grads_data() + arena.buffer_numel());
  return r;
}

}  // namespace

TEST_CASE("Linear: the fused host GELU epilogue matches the separate GELU pass") {
  // Partial tiles in every direction (37 rows, 70 columns) and inputs up to |x| ~ 30, so the
  // epilogue's clamps are reached on both sides.
  const std::int64_t n = 37, c = 40, h = 70;
  tk::exec::Host host(1);
  for (const float scale : {1.0f, 30.0f}) {
    CAPTURE(scale);
    const GeluPairResult fused = run_gelu_pair(host, n, c, h, scale);
    // The unfused composition: the bias gemm, then nn::GELU / gelu_grad_approx element-wise.
    nn::ParamArena<> arena;
    nn::Linear fc(arena, "c_fc", {.in_features = c, .out_features = h});
    nn::Linear proj(arena, "c_proj", {.in_features = h, .out_features = c});
    arena.finalize();
    arena.initialize(11);
    const auto x = nntest::random_floats(n * c, 12, scale);
    const auto dy = nntest::random_floats(n * c, 13);
    std::vector<float> pre(fused.pre.size()), g(pre.size()), dpre(pre.size());
    fc.forward(host, mat(x.data(), n, c), mat(pre.data(), n, h));
    nn::GELU().forward(host, mat(static_cast<const float*>(pre.data()), n, h), mat(g.data(), n, h));
    std::vector<float> dg(pre.size());
    proj.backward(host, mat(static_cast<const float*>(g.data()), n, h), mat(dy.data(), n, c),
                  mat(dg.data(), n, h));
    for (std::size_t i = 0; i < dpre.size(); ++i)
      dpre[i] = dg[i] * nn::detail::gelu_grad_approx(pre[i]);

    // On the host forward_gelu saves the GELU's slope at the pre-activation (not the
    // pre-activation itself): backward_dgelu multiplies by it. Two approximations of the
    // derivative, each within 2e-6 of float64 (tests/blas), so within 4e-6 of each other.
    std::vector<float> slope(pre.size());
    for (std::size_t i = 0; i < pre.size(); ++i) slope[i] = nn::detail::gelu_grad_approx(pre[i]);
    CHECK(max_scaled_diff(fused.pre, slope) < 4e-6);
    CHECK(max_scaled_diff(fused.g, g) < 2e-6);
    CHECK(max_scaled_diff(fused.dpre, dpre) < 2e-6);
    for (float v : fused.g) REQUIRE(std::isfinite(v));
    for (float v : fused.dpre) REQUIRE(std::isfinite(v));
    // Far left of zero GELU is -0-ish, far right it is x.
    for (std::size_t i = 0; i < pre.size(); ++i) {
      if (pre[i] < -20.0f) CHECK(std::fabs(fused.g[i]) < 1e-30f);
      if (pre[i] > 20.0f) CHECK(fused.g[i] == pre[i]);
    }
  }
}

TEST_CASE("Linear: the fused GELU pair gives the same bits for 1 and 2 threads") {
  const std::int64_t n = 300, c = 64, h = 256;  // big enough for the gemm to use the pool
  tk::exec::Host one(1), two(2);
  const GeluPairResult a = run_gelu_pair(one, n, c, h, 2.0f);
  const GeluPairResult b = run_gelu_pair(two, n, c, h, 2.0f);
  CHECK(a.pre == b.pre);
  CHECK(a.g == b.g);
  CHECK(a.dpre == b.dpre);
  CHECK(a.grads == b.grads);
}

TEST_CASE("Linear and CausalSelfAttention with a residual: the bits of y seeded with it") {
  // forward(x, y, residual) reads the residual in the gemm's epilogue (y starts as NaN and is
  // only written): the same bits as y = residual followed by Write::kAccumulate, for random
  // sizes (partial tiles, rows padded), with and without bias, 1 and 2 threads; residual == y
  // is the accumulate form itself.
  std::mt19937_64 rng(5);
  auto pick = [&](std::int64_t lo, std::int64_t hi) {
    return std::uniform_int_distribution<std::int64_t>(lo, hi)(rng);
  };
  const float nan = std::numeric_limits<float>::quiet_NaN();
  for (int trial = 0; trial < 12; ++trial) {
    const std::int64_t n = pick(1, 300), in = pick(1, 90), out = pick(1, 90), ld = out + pick(0, 5);
    const bool bias = trial % 3 != 0;
    CAPTURE(trial);
    CAPTURE(n);
    CAPTURE(in);
    CAPTURE(out);
    nn::ParamArena<> arena;
    nn::Linear lin(arena, "proj", {.in_features = in, .out_features = out, .bias = bias});
    arena.finalize();
    arena.initialize(20 + trial);
    tk::exec::Host host(trial % 2 + 1);
    const auto x = nntest::random_floats(n * in, 30 + trial);
    const auto res = nntest::random_floats(n * ld, 40 + trial);
    const tk::HostView<const float, 2> xv = mat(x.data(), n, in);
    const auto padded = [&](auto* p) {
      using T = std::remove_pointer_t<decltype(p)>;
      return tk::HostView<T, 2>(p, tk::Extents<2>{{n, out}}, tk::Extents<2>{{ld, 1}});
    };
    std::vector<float> fused(res.size(), nan), seeded = res, in_place = res;
    lin.forward(host, xv, padded(fused.data()), padded(res.data()));
    lin.forward(host, xv, padded(seeded.data()), nn::Write::kAccumulate);
    lin.forward(host, xv, padded(in_place.data()),
                padded(static_cast<const float*>(in_place.data())));
    for (std::int64_t i = 0; i < n; ++i) {
      CHECK(std::memcmp(&fused[i * ld], &seeded[i * ld], out * sizeof(float)) == 0);
      CHECK(std::memcmp(&in_place[i * ld], &seeded[i * ld], out * sizeof(float)) == 0);
      for (std::int64_t j = out; j < ld; ++j) CHECK(std::isnan(fused[i * ld + j]));
    }
  }

  // The attention's residual form: c_proj's residual gemm on the saved heads.
  const std::int64_t B = 3, T = 37, C = 48;
  nn::ParamArena<> arena;
  nn::CausalSelfAttention attn(arena, "attn", {.n_embd = C, .n_head = 4});
  arena.finalize();
  arena.initialize(7);
  tk::exec::Host host(2);
  const auto x = nntest::random_floats(B * T * C, 8);
  const auto res = nntest::random_floats(B * T * C, 9);
  const tk::Extents<3> shape{{B, T, C}};
  std::vector<float> y(res.size(), nan), plain(res.size());
  nn::CausalSelfAttention<>::Context ctx, ctx_plain;
  attn.forward(host, ctx, tk::HostView<const float, 3>(x.data(), shape),
               tk::HostView<float, 3>(y.data(), shape),
               tk::HostView<const float, 3>(res.data(), shape));
  attn.forward(host, ctx_plain, tk::HostView<const float, 3>(x.data(), shape),
               tk::HostView<float, 3>(plain.data(), shape));
  std::vector<float> seeded = res;
  attn.c_proj().forward(host, mat(ctx.heads<float>(), B * T, C), mat(seeded.data(), B * T, C),
                        nn::Write::kAccumulate);
  CHECK(y == seeded);
  std::vector<float> sum(res.size());
  for (std::size_t i = 0; i < sum.size(); ++i) sum[i] = res[i] + plain[i];
  CHECK(max_scaled_diff(y, sum) < 1e-6);  // the same sum, rounded in another order
  // A residual of another shape is refused, naming it.
  std::vector<float> small(std::size_t(B * T * (C - 1)));
  CHECK_THROWS_AS(attn.forward(host, ctx, tk::HostView<const float, 3>(x.data(), shape),
                               tk::HostView<float, 3>(y.data(), shape),
                               tk::HostView<const float, 3>(small.data(), {{B, T, C - 1}})),
                  tk::Error);
  // So is a Linear residual whose row stride differs from the output's.
  std::vector<float> wide(std::size_t(B * T * (C + 3)));
  std::string message;
  try {
    attn.c_proj().forward(host, mat(ctx.heads<float>(), B * T, C), mat(y.data(), B * T, C),
                          tk::HostView<const float, 2>(wide.data(), tk::Extents<2>{{B * T, C}},
                                                       tk::Extents<2>{{C + 3, 1}}));
  } catch (const tk::Error& e) {
    message = e.what();
  }
  CHECK(message.find("residual's row stride 51 differs from the output's 48") != std::string::npos);
}

TEST_CASE("lane_map: the plain loop's values and bits, every length, nothing past n") {
  const auto x = nntest::random_floats(64, 21, 20.0f);
  for (std::int64_t n = 0; n <= 41; ++n) {
    CAPTURE(n);
    std::vector<float> want(48, -7.0f), got(48, -7.0f);
    for (std::int64_t j = 0; j < n; ++j) want[std::size_t(j)] = nn::detail::gelu_approx(x[j]);
    nn::detail::lane_map(
        n, [&](std::int64_t j) { return nn::detail::gelu_approx(x[std::size_t(j)]); },
        [&](std::int64_t j, float v) { got[std::size_t(j)] = v; });
    bool same_bits = true;
    for (std::size_t j = 0; j < want.size(); ++j)
      same_bits = same_bits &&
                  std::bit_cast<std::uint32_t>(want[j]) == std::bit_cast<std::uint32_t>(got[j]);
    CHECK(same_bits);
  }
}

TEST_CASE("residual_backward (host): write modes, absent gradients, odd lengths, threads") {
  for (const std::int64_t n : {std::int64_t{1}, std::int64_t{13}, std::int64_t{100003}}) {
    CAPTURE(n);
    const auto dout = nntest::random_floats(n, 31);
    const auto a0 = nntest::random_floats(n, 32);
    const auto b0 = nntest::random_floats(n, 33);
    const tk::HostView<const float, 1> dv(dout.data(), tk::Extents<1>{{n}});
    auto view = [&](std::vector<float>& v) { return tk::HostView<float, 1>(v.data(), {{n}}); };
    for (const int threads : {1, 2}) {
      tk::exec::Host host(threads);
      std::vector<float> da = a0, db = b0;
      nn::residual_backward(host, dv, view(da), view(db), nn::Write::kAccumulate,
                            nn::Write::kOverwrite);
      bool ok = true;
      for (std::int64_t i = 0; i < n; ++i) {
        const auto k = std::size_t(i);
        ok = ok && da[k] == a0[k] + dout[k] && db[k] == dout[k];
      }
      CHECK(ok);
      // One destination absent: the other is still written, in either mode.
      std::vector<float> only = b0;
      nn::residual_backward(host, dv, tk::HostView<float, 1>(), view(only), nn::Write::kOverwrite,
                            nn::Write::kAccumulate);
      ok = true;
      for (std::int64_t i = 0; i < n; ++i)
        ok = ok && only[std::size_t(i)] == b0[std::size_t(i)] + dout[std::size_t(i)];
      CHECK(ok);
      std::vector<float> first = a0;
      nn::residual_backward(host, dv, view(first), tk::HostView<float, 1>());
      CHECK(first == dout);
    }
  }
}

TEST_CASE("residual_forward (host): odd lengths, threads, out aliasing an input") {
  for (const std::int64_t n : {std::int64_t{1}, std::int64_t{13}, std::int64_t{100003}}) {
    CAPTURE(n);
    const auto a0 = nntest::random_floats(n, 41);
    const auto b0 = nntest::random_floats(n, 42);
    auto view = [&](std::vector<float>& v) { return tk::HostView<float, 1>(v.data(), {{n}}); };
    auto cview = [&](const std::vector<float>& v) {
      return tk::HostView<const float, 1>(v.data(), {{n}});
    };
    for (const int threads : {1, 2}) {
      tk::exec::Host host(threads);
      std::vector<float> out(std::size_t(n), -1.0f);
      nn::residual_forward(host, cview(a0), cview(b0), view(out));
      bool ok = true;
      for (std::size_t i = 0; i < out.size(); ++i) ok = ok && out[i] == a0[i] + b0[i];
      CHECK(ok);
      // In place: out is a (and then b).
      std::vector<float> in_a = a0, in_b = b0;
      nn::residual_forward(host, view(in_a), cview(b0), view(in_a));
      nn::residual_forward(host, cview(a0), view(in_b), view(in_b));
      CHECK(in_a == out);
      CHECK(in_b == out);
    }
  }
}

TEST_CASE("causal softmax rows (host, f32): the AVX2 rows give the scalar rows' bits") {
  // causal_softmax_rows / causal_softmax_backward_rows take an AVX2 path where the CPU has it,
  // with the last partial 8-lane block of each row masked. Against the scalar row functions:
  // heads of odd and multiple-of-8 lengths, scores up to +-200 (exp clamps), NaN and infinities,
  // and garbage above the diagonal (never read: the outputs there are exact zeros).
  std::mt19937 rng(91);
  std::uniform_real_distribution<float> uni(-1.0f, 1.0f);
  const float nan = std::numeric_limits<float>::quiet_NaN();
  const float inf = std::numeric_limits<float>::infinity();
  for (const std::int64_t Tn : {1, 2, 7, 8, 9, 16, 31, 64, 67}) {
    for (const float range : {1.0f, 30.0f, 200.0f}) {
      CAPTURE(Tn);
      CAPTURE(range);
      std::vector<float> s(std::size_t(Tn * Tn)), dp(s.size());
      for (std::int64_t i = 0; i < Tn; ++i)
        for (std::int64_t j = 0; j < Tn; ++j) {
          const std::size_t at = std::size_t(i * Tn + j);
          s[at] = j <= i ? range * uni(rng) : nan;  // above the diagonal: never read
          dp[at] = j <= i ? uni(rng) : nan;
        }
      if (Tn > 9) {
        s[std::size_t(5 * Tn + 3)] = nan;   // a NaN score poisons its row
        s[std::size_t(7 * Tn + 2)] = inf;   // +inf is the row's max
        s[std::size_t(8 * Tn + 8)] = -inf;  // -inf gets probability 0
        dp[std::size_t(9 * Tn + 4)] = inf;
      }
      std::vector<float> s_ref = s, p_ref(s.size(), -1.0f), s_got = s, p_got(s.size(), -1.0f);
      for (std::int64_t i = 0; i < Tn; ++i)
        nn::detail::causal_softmax_row<float>(s_ref.data() + i * Tn, p_ref.data() + i * Tn, i, Tn);
      nn::detail::causal_softmax_rows(s_got.data(), p_got.data(), Tn);
      std::vector<float> ds_ref(s.size(), -1.0f), ds_got(s.size(), -1.0f);
      for (std::int64_t i = 0; i < Tn; ++i)
        nn::detail::causal_softmax_backward_row<float>(p_ref.data() + i * Tn, dp.data() + i * Tn,
                                                       ds_ref.data() + i * Tn, i, Tn, 0.125f);
      nn::detail::causal_softmax_backward_rows(p_ref.data(), dp.data(), ds_got.data(), Tn, 0.125f);
      for (std::int64_t i = 0; i < Tn; ++i) {
        for (std::int64_t j = 0; j < Tn; ++j) {
          const std::size_t at = std::size_t(i * Tn + j);
          CAPTURE(i);
          CAPTURE(j);
          CHECK(std::bit_cast<std::uint32_t>(p_got[at]) == std::bit_cast<std::uint32_t>(p_ref[at]));
          CHECK(std::bit_cast<std::uint32_t>(ds_got[at]) ==
                std::bit_cast<std::uint32_t>(ds_ref[at]));
          if (j <= i)  // the scores hold exp(s - max), as the scalar row leaves them
            CHECK(std::bit_cast<std::uint32_t>(s_got[at]) ==
                  std::bit_cast<std::uint32_t>(s_ref[at]));
          if (j > i) CHECK(p_got[at] == 0.0f);
        }
      }
    }
  }
}

TEST_CASE("LayerNorm rows (host, f32): the AVX2 rows give the generic rows' bits") {
  // layer_norm_forward / layer_norm_backward run layer_norm_*_avx2 where the CPU has AVX2.
  // Against the generic row loops (this file's build, 8 lanes, no FMA): widths with and
  // without a partial last block, a partial last chunk of rows, with and without a bias, every
  // combination of accumulate and residual, dx absent, large offsets (cancellation in x - mean).
#if TRAINKIT_DETAIL_HOST_AVX2
  if (!nn::detail::cpu_has_avx2()) {
    MESSAGE("no AVX2 on this CPU; nothing to compare");
    return;
  }
  std::mt19937 rng(5);
  std::uniform_real_distribution<float> uni(-1.0f, 1.0f);
  const auto bits_equal = [](const std::vector<float>& a, const std::vector<float>& b) {
    return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
  };
  for (const std::int64_t C : {1, 5, 8, 13, 64, 128, 130}) {
    const std::int64_t rows = 70;  // chunks of 32: the last one partial
    for (int variant = 0; variant < 8; ++variant) {
      CAPTURE(C);
      CAPTURE(variant);
      const bool bias = variant & 1, accumulate = variant & 2, residual = variant & 4;
      const float offset = variant == 5 ? 300.0f : 0.0f;
      auto fill = [&](std::size_t n, float scale, float shift) {
        std::vector<float> v(n);
        for (float& e : v) e = shift + scale * uni(rng);
        return v;
      };
      const std::size_t n = std::size_t(rows * C);
      const auto x = fill(n, 3.0f, offset), dy = fill(n, 1.0f, 0.0f), res = fill(n, 1.0f, 0.0f);
      const auto w = fill(std::size_t(C), 1.0f, 1.0f), b = fill(std::size_t(C), 0.5f, 0.0f);
      const auto dx0 = fill(n, 1.0f, 0.0f);
      const std::int64_t chunks =
          (rows + nn::detail::kLayerNormChunk - 1) / nn::detail::kLayerNormChunk;
      struct Out {
        std::vector<float> y, stats, dx, partial;
      };
      auto run = [&](bool avx2, bool with_dx) {
        Out o{std::vector<float>(n), std::vector<float>(std::size_t(2 * rows)), dx0,
              std::vector<float>(std::size_t(chunks * 2 * C))};
        nn::detail::LayerNormArgs<float> a{};
        a.x = x.data();
        a.y = o.y.data();
        a.w = w.data();
        a.b = bias ? b.data() : nullptr;
        a.mean = o.stats.data();
        a.rstd = o.stats.data() + rows;
        a.rows = rows;
        a.cols = C;
        a.eps = 1e-5f;
        if (avx2) {
          nn::detail::layer_norm_forward_rows_avx2(a, 0, rows);
        } else {
          nn::detail::layer_norm_forward_rows(a, 0, rows);
        }
        a.dy = dy.data();
        a.dx = with_dx ? o.dx.data() : nullptr;
        a.residual = residual && with_dx ? res.data() : nullptr;
        a.accumulate = accumulate;
        a.partial = o.partial.data();
        for (std::int64_t k = 0; k < chunks; ++k) {
          if (avx2) {
            nn::detail::layer_norm_backward_chunk_avx2(a, k);
          } else {
            nn::detail::layer_norm_backward_chunk(a, k);
          }
        }
        return o;
      };
      for (const bool with_dx : {true, false}) {
        const Out want = run(false, with_dx), got = run(true, with_dx);
        CHECK(bits_equal(got.y, want.y));
        CHECK(bits_equal(got.stats, want.stats));
        CHECK(bits_equal(got.dx, want.dx));
        CHECK(bits_equal(got.partial, want.partial));
      }
    }
  }
#else
  MESSAGE("not an x86-64 GNU build; the AVX2 rows are not compiled");
#endif
}
