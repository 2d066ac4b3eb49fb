// Tests of nn::CausalSelfAttention and nn::TransformerBlock on the host: PyTorch parity (nanoGPT's
// modules, float64 reference), finite differences of a float64 attention, the saved causal
// probabilities, and thread-count independence.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <vector>

#include <trainkit/exec/host.hpp>
#include <trainkit/nn/attention.hpp>
#include <trainkit/nn/param_arena.hpp>
#include <trainkit/nn/transformer_block.hpp>

#include "nn_test_util.hpp"

namespace {

namespace tk = trainkit;
namespace nn = trainkit::nn;
using nntest::Reference;
using nntest::rel_err;

tk::exec::Host& pool() {
  static tk::exec::Host host(2);
  return host;
}

template <class T>
tk::HostView<T, 3> cube(T* p, std::int64_t b, std::int64_t t, std::int64_t c) {
  return tk::make_view(p, {b, t, c});
}

/// float64 nanoGPT attention: x [B, T, C] -> y [B, T, C]; wa [3C, C], ba [3C], wp [C, C], bp [C].
std::vector<double> attention_ref(const std::vector<double>& x, const std::vector<double>& wa,
                                  const std::vector<double>& ba, const std::vector<double>& wp,
                                  const std::vector<double>& bp, int B, int T, int C, int H) {
  const int hs = C / H;
  std::vector<double> qkv(std::size_t(B * T * 3 * C)), heads(std::size_t(B * T * C)),
      y(std::size_t(B * T * C));
  for (int n = 0; n < B * T; ++n)
    for (int o = 0; o < 3 * C; ++o) {
      double s = ba[std::size_t(o)];
      for (int k = 0; k < C; ++k) s += x[std::size_t(n * C + k)] * wa[std::size_t(o * C + k)];
      qkv[std::size_t(n * 3 * C + o)] = s;
    }
  for (int b = 0; b < B; ++b)
    for (int h = 0; h < H; ++h)
      for (int i = 0; i < T; ++i) {
        std::vector<double> p(std::size_t(i + 1));
        double m = -1e300;
        for (int j = 0; j <= i; ++j) {
          double s = 0.0;
          for (int d = 0; d < hs; ++d)
            s += qkv[std::size_t((b * T + i) * 3 * C + h * hs + d)] *
                 qkv[std::size_t((b * T + j) * 3 * C + C + h * hs + d)];
          p[std::size_t(j)] = s / std::sqrt(double(hs));
          m = std::max(m, p[std::size_t(j)]);
        }
        double z = 0.0;
        for (auto& v : p) z += (v = std::exp(v - m));
        for (int d = 0; d < hs; ++d) {
          double s = 0.0;
          for (int j = 0; j <= i; ++j)
            s += p[std::size_t(j)] / z * qkv[std::size_t((b * T + j) * 3 * C + 2 * C + h * hs + d)];
          heads[std::size_t((b * T + i) * C + h * hs + d)] = s;
        }
      }
  for (int n = 0; n < B * T; ++n)
    for (int o = 0; o < C; ++o) {
      double s = bp[std::size_t(o)];
      for (int k = 0; k < C; ++k) s += heads[std::size_t(n * C + k)] * wp[std::size_t(o * C + k)];
      y[std::size_t(n * C + o)] = s;
    }
  return y;
}

std::vector<double> param_d(const nn::ParamArena<>& arena, nn::ParamId id) {
  const auto& info = arena.info(id);
  return nntest::to_double(arena.params_data() + info.offset, info.numel);
}

}  // namespace

TEST_CASE("CausalSelfAttention: forward vs f64, backward vs finite differences, saved probs") {
  const int B = 2, T = 5, C = 6, H = 2;
  nn::ParamArena<> arena;
  nn::CausalSelfAttention attn(arena, "attn", {.n_embd = C, .n_head = H});
  arena.finalize();
  arena.initialize(17);
  CHECK(arena.find("attn.c_attn.weight").has_value());
  CHECK(arena.find("attn.c_proj.bias").has_value());
  const auto x = nntest::random_floats(B * T * C, 61, 1.5f);
  const auto dy = nntest::random_floats(B * T * C, 62);
  std::vector<float> y(x.size()), dx(x.size());
  decltype(attn)::Context ctx;
  attn.forward(pool(), ctx, cube(x.data(), B, T, C), cube(y.data(), B, T, C));
  attn.backward(pool(), ctx, cube(x.data(), B, T, C), cube(dy.data(), B, T, C),
                cube(dx.data(), B, T, C));

  const auto wa = param_d(arena, attn.c_attn().weight()), ba = param_d(arena, attn.c_attn().bias());
  const auto wp = param_d(arena, attn.c_proj().weight()), bp = param_d(arena, attn.c_proj().bias());
  const auto xd = nntest::to_double(x.data(), B * T * C);
  const auto dyd = nntest::to_double(dy.data(), B * T * C);
  CHECK(rel_err(y.data(), attention_ref(xd, wa, ba, wp, bp, B, T, C, H).data(), B * T * C) < 1e-6);

  auto loss = [&](const std::vector<double>& xv, const std::vector<double>& wav,
                  const std::vector<double>& bav, const std::vector<double>& wpv) {
    return nntest::dot(attention_ref(xv, wav, bav, wpv, bp, B, T, C, H), dyd);
  };
  const auto gx =
      nntest::finite_diff([&](const std::vector<double>& v) { return loss(v, wa, ba, wp); }, xd);
  const auto gwa =
      nntest::finite_diff([&](const std::vector<double>& v) { return loss(xd, v, ba, wp); }, wa);
  const auto gba =
      nntest::finite_diff([&](const std::vector<double>& v) { return loss(xd, wa, v, wp); }, ba);
  const auto gwp =
      nntest::finite_diff([&](const std::vector<double>& v) { return loss(xd, wa, ba, v); }, wp);
  CHECK(rel_err(dx.data(), gx.data(), B * T * C) < 1e-5);
  const auto grad = [&](nn::ParamId id) { return arena.grads_data() + arena.info(id).offset; };
  CHECK(rel_err(grad(attn.c_attn().weight()), gwa.data(), 3 * C * C) < 1e-5);
  CHECK(rel_err(grad(attn.c_attn().bias()), gba.data(), 3 * C) < 1e-5);
  CHECK(rel_err(grad(attn.c_proj().weight()), gwp.data(), C * C) < 1e-5);

  // Probabilities: rows sum to one, exact zeros above the diagonal.
  const float* p = ctx.probs<float>();
  for (int r = 0; r < B * H * T; ++r) {
    const int i = r % T;
    double s = 0.0;
    for (int j = 0; j < T; ++j) {
      s += p[r * T + j];
      if (j > i) CHECK(p[r * T + j] == 0.0f);
    }
    CHECK(s == doctest::Approx(1.0).epsilon(1e-6));
  }
}

TEST_CASE("CausalSelfAttention: sequences longer than one causal block (directional FD)") {
  const int B = 1, T = 150, C = 8, H = 2;  // blocks of 64 queries: 64, 64, 22
  nn::ParamArena<> arena;
  nn::CausalSelfAttention attn(arena, "", {.n_embd = C, .n_head = H});
  arena.finalize();
  arena.initialize(3);
  const auto x = nntest::random_floats(B * T * C, 63, 2.0f);
  const auto dy = nntest::random_floats(B * T * C, 64);
  std::vector<float> y(x.size()), dx(x.size());
  decltype(attn)::Context ctx;
  attn.forward(pool(), ctx, cube(x.data(), B, T, C), cube(y.data(), B, T, C));
  attn.backward(pool(), ctx, cube(x.data(), B, T, C), cube(dy.data(), B, T, C),
                cube(dx.data(), B, T, C));
  const auto wa = param_d(arena, attn.c_attn().weight()), ba = param_d(arena, attn.c_attn().bias());
  const auto wp = param_d(arena, attn.c_proj().weight()), bp = param_d(arena, attn.c_proj().bias());
  const auto xd = nntest::to_double(x.data(), B * T * C);
  const auto dyd = nntest::to_double(dy.data(), B * T * C);
  CHECK(rel_err(y.data(), attention_ref(xd, wa, ba, wp, bp, B, T, C, H).data(), B * T * C) < 1e-6);
  // d/dt L(theta + t v) at 0 equals <grad, v> for a random direction v.
  auto directional = [&](std::vector<double> theta, const std::vector<double>& v, auto loss) {
    const double h = 1e-5;
    std::vector<double> plus = theta, minus = theta;
    for (std::size_t i = 0; i < theta.size(); ++i) {
      plus[i] += h * v[i];
      minus[i] -= h * v[i];
    }
    return (loss(plus) - loss(minus)) / (2 * h);
  };
  const auto vx = nntest::to_double(nntest::random_floats(B * T * C, 65).data(), B * T * C);
  const auto vw = nntest::to_double(nntest::random_floats(3 * C * C, 66).data(), 3 * C * C);
  const double fx = directional(xd, vx, [&](const std::vector<double>& t) {
    return nntest::dot(attention_ref(t, wa, ba, wp, bp, B, T, C, H), dyd);
  });
  const double fw = directional(wa, vw, [&](const std::vector<double>& t) {
    return nntest::dot(attention_ref(xd, t, ba, wp, bp, B, T, C, H), dyd);
  });
  const double gx = nntest::dot(nntest::to_double(dx.data(), B * T * C), vx);
  const double gw = nntest::dot(
      nntest::to_double(arena.grads_data() + arena.info(attn.c_attn().weight()).offset, 3 * C * C),
      vw);
  CHECK(gx == doctest::Approx(fx).epsilon(1e-4));
  CHECK(gw == doctest::Approx(fw).epsilon(1e-4));
}

TEST_CASE("CausalSelfAttention and TransformerBlock: match PyTorch (nanoGPT) values") {
  const Reference& ref = Reference::get();
  {
    nn::ParamArena<> arena;
    nn::CausalSelfAttention attn(arena, "", {.n_embd = 8, .n_head = 2});
    arena.finalize();
    nntest::load_params(arena, "attention");
    auto x = nntest::tensor_of(ref["attention/x"]);
    auto dy = nntest::tensor_of(ref["attention/dy"]);
    tk::Tensor<float> y(x.shape()), dx(x.shape());
    decltype(attn)::Context ctx;
    attn.forward(pool(), ctx, x.view<3>(), y.view<3>());
    attn.backward(pool(), ctx, x.view<3>(), dy.view<3>(), dx.view<3>());
    CHECK(rel_err(y.data(), ref["attention/y"].values.data(), y.numel()) < 1e-6);
    CHECK(rel_err(dx.data(), ref["attention/dx"].values.data(), dx.numel()) < 1e-5);
    nntest::check_grads(arena, "attention", 1e-5);
  }
  {
    nn::ParamArena<> arena;
    nn::TransformerBlock block(arena, "", {.n_embd = 8, .n_head = 2});
    arena.finalize();
    CHECK(arena.size() == 12);
    CHECK(arena.infos()[0].name == "ln_1.weight");
    CHECK(arena.infos()[11].name == "mlp.c_proj.bias");
    nntest::load_params(arena, "block");
    auto x = nntest::tensor_of(ref["block/x"]);
    auto dy = nntest::tensor_of(ref["block/dy"]);
    tk::Tensor<float> y(x.shape()), dx(x.shape());
    decltype(block)::Context ctx;
    block.forward(pool(), ctx, x.view<3>(), y.view<3>());
    block.backward(pool(), ctx, x.view<3>(), dy.view<3>(), dx.view<3>());
    CHECK(rel_err(y.data(), ref["block/y"].values.data(), y.numel()) < 1e-6);
    CHECK(rel_err(dx.data(), ref["block/dx"].values.data(), dx.numel()) < 1e-5);
    nntest::check_grads(arena, "block", 1e-5);

    // kAccumulate adds the block's input gradient to what dx held.
    tk::Tensor<float> acc = tk::Tensor<float>::full(x.shape(), 0.5f);
    block.backward(pool(), ctx, x.view<3>(), dy.view<3>(), acc.view<3>(), nn::Write::kAccumulate);
    for (std::int64_t i = 0; i < acc.numel(); i += 7)
      CHECK(acc.data()[i] == doctest::Approx(0.5f + dx.data()[i]).epsilon(1e-5));
  }
}

TEST_CASE("TransformerBlock: GPT-2 initialisation and thread-count independence") {
  const int B = 2, T = 33, C = 32, H = 4;
  std::vector<float> results[2];
  for (int t = 0; t < 2; ++t) {
    tk::exec::Host host(t + 1);
    nn::ParamArena<> arena;
    nn::TransformerBlock block(arena, "h.0", {.n_embd = C, .n_head = H, .n_layer = 12});
    arena.finalize();
    arena.initialize(99);
    const auto& fc = arena.info(arena.at("h.0.mlp.c_fc.weight"));
    double ss = 0.0;
    for (std::int64_t i = 0; i < fc.numel; ++i)
      ss += double(arena.params_data()[fc.offset + i]) * arena.params_data()[fc.offset + i];
    CHECK(std::sqrt(ss / double(fc.numel)) == doctest::Approx(0.02).epsilon(0.1));
    CHECK(arena.param<1>(arena.at("h.0.ln_1.weight"))[3] == 1.0f);
    CHECK(arena.param<1>(arena.at("h.0.attn.c_attn.bias"))[3] == 0.0f);
    const auto x = nntest::random_floats(B * T * C, 71);
    const auto dy = nntest::random_floats(B * T * C, 72);
    std::vector<float> y(x.size()), dx(x.size());
    decltype(block)::Context ctx;
    block.forward(host, ctx, cube(x.data(), B, T, C), cube(y.data(), B, T, C));
    block.backward(host, ctx, cube(x.data(), B, T, C), cube(dy.data(), B, T, C),
                   cube(dx.data(), B, T, C));
    results[t] = y;
    results[t].insert(results[t].end(), dx.begin(), dx.end());
    results[t].insert(results[t].end(), arena.grads_data(),
                      arena.grads_data() + arena.buffer_numel());
  }
  CHECK(results[0] == results[1]);
}

TEST_CASE("CausalSelfAttention and TransformerBlock: refused options leave the arena as it was") {
  nn::ParamArena<> arena;
  CHECK_THROWS_WITH_AS(nn::CausalSelfAttention(arena, "attn", {.n_embd = 8, .n_head = 3}),
                       doctest::Contains("'attn': n_embd 8 is not a multiple of n_head 3"),
                       tk::Error);
  CHECK_THROWS_WITH_AS(nn::CausalSelfAttention(arena, "attn", {.n_embd = 8, .n_head = 0}),
                       doctest::Contains("n_embd and n_head must be > 0, got 8 and 0"), tk::Error);
  CHECK_THROWS_WITH_AS(nn::TransformerBlock(arena, "h.0", {.n_embd = 8, .n_head = 3}),
                       doctest::Contains("'h.0.attn': n_embd 8 is not a multiple of n_head 3"),
                       tk::Error);
  CHECK(arena.size() == 0);
  nn::CausalSelfAttention attn(arena, "attn", {.n_embd = 8, .n_head = 2});
  nn::TransformerBlock block(arena, "h.0", {.n_embd = 8, .n_head = 2});
  CHECK(arena.size() == 16);
}

TEST_CASE("CausalSelfAttention and TransformerBlock: a context of another width is an error") {
  nn::ParamArena<> arena;
  nn::CausalSelfAttention a(arena, "a", {.n_embd = 8, .n_head = 2});
  nn::CausalSelfAttention b(arena, "b", {.n_embd = 64, .n_head = 2});
  nn::TransformerBlock ba(arena, "ba", {.n_embd = 8, .n_head = 2});
  nn::TransformerBlock bb(arena, "bb", {.n_embd = 64, .n_head = 2});
  arena.finalize();
  arena.initialize(3);
  const std::int64_t B = 1, T = 4;
  std::vector<float> x8(B * T * 8, 0.5f), y8(x8.size());
  std::vector<float> x64(B * T * 64, 0.5f), dy64(x64.size(), 1.0f), dx64(x64.size());
  decltype(a)::Context ctx;
  a.forward(pool(), ctx, cube(x8.data(), B, T, 8), cube(y8.data(), B, T, 8));
  CHECK_THROWS_WITH_AS(b.backward(pool(), ctx, cube(x64.data(), B, T, 64),
                                  cube(dy64.data(), B, T, 64), cube(dx64.data(), B, T, 64)),
                       doctest::Contains("the context holds the forward of a [1, 4, 8] input of "
                                         "F32, but backward got [1, 4, 64]"),
                       tk::Error);
  decltype(ba)::Context bctx;
  ba.forward(pool(), bctx, cube(x8.data(), B, T, 8), cube(y8.data(), B, T, 8));
  CHECK_THROWS_WITH_AS(bb.backward(pool(), bctx, cube(x64.data(), B, T, 64),
                                   cube(dy64.data(), B, T, 64), cube(dx64.data(), B, T, 64)),
                       doctest::Contains("nn::TransformerBlock::backward"), tk::Error);
  // The matching layer still takes it.
  std::vector<float> dy8(x8.size(), 1.0f), dx8(x8.size());
  CHECK_NOTHROW(a.backward(pool(), ctx, cube(x8.data(), B, T, 8), cube(dy8.data(), B, T, 8),
                           cube(dx8.data(), B, T, 8)));
}

TEST_CASE(
    "CausalSelfAttention and TransformerBlock: backward checks every view before adding a "
    "gradient; dx may be x") {
  nn::ParamArena<> arena;
  nn::CausalSelfAttention attn(arena, "a", {.n_embd = 8, .n_head = 2});
  nn::TransformerBlock block(arena, "h", {.n_embd = 8, .n_head = 2});
  arena.finalize();
  arena.initialize(4);
  const std::int64_t B = 2, T = 3, C = 8;
  const auto x = nntest::random_floats(B * T * C, 81);
  const auto dy = nntest::random_floats(B * T * C, 82);
  std::vector<float> y(x.size()), dx(x.size()), wide(x.size() * 2);
  decltype(attn)::Context actx;
  decltype(block)::Context bctx;
  attn.forward(pool(), actx, cube(x.data(), B, T, C), cube(y.data(), B, T, C));
  block.forward(pool(), bctx, cube(x.data(), B, T, C), cube(y.data(), B, T, C));
  arena.zero_grad();
  const auto all_zero = [&] {
    return std::all_of(arena.grads_data(), arena.grads_data() + arena.buffer_numel(),
                       [](float g) { return g == 0.0f; });
  };
  // [B, T, C] with a row stride of 2C: right shape, not contiguous.
  const tk::HostView<float, 3> strided(wide.data(), tk::Extents<3>{{B, T, C}},
                                       tk::Extents<3>{{T * 2 * C, 2 * C, 1}});
  const tk::HostView<const float, 3> cstrided(strided);
  // A non-contiguous x, dy or dx, and a dx of another shape: refused naming the view, with the
  // arena's gradients untouched (they were added layer by layer before the last view was read).
  CHECK_THROWS_WITH_AS(
      block.backward(pool(), bctx, cstrided, cube(dy.data(), B, T, C), cube(dx.data(), B, T, C)),
      doctest::Contains("nn::TransformerBlock::backward: x with shape [2, 3, 8] "
                        "must be contiguous"),
      tk::Error);
  CHECK_THROWS_WITH_AS(
      block.backward(pool(), bctx, cube(x.data(), B, T, C), cstrided, cube(dx.data(), B, T, C)),
      doctest::Contains("nn::TransformerBlock::backward: dy with shape"), tk::Error);
  CHECK_THROWS_WITH_AS(
      block.backward(pool(), bctx, cube(x.data(), B, T, C), cube(dy.data(), B, T, C), strided),
      doctest::Contains("nn::TransformerBlock::backward: dx with shape"), tk::Error);
  CHECK_THROWS_WITH_AS(block.backward(pool(), bctx, cube(x.data(), B, T, C),
                                      cube(dy.data(), B, T, C), cube(dx.data(), B * T, 1, C)),
                       doctest::Contains("x [2, 3, 8], dy [2, 3, 8] and dx [6, 1, 8] must all be "
                                         "[B, T, 8]"),
                       tk::Error);
  CHECK_THROWS_WITH_AS(
      attn.backward(pool(), actx, cube(x.data(), B, T, C), cube(dy.data(), B, T, C), strided),
      doctest::Contains("nn::CausalSelfAttention::backward: dx with shape"), tk::Error);
  CHECK_THROWS_WITH_AS(attn.backward(pool(), actx, cube(x.data(), B, T, C),
                                     cube(dy.data(), B, T, C), cube(dx.data(), B * T, 1, C)),
                       doctest::Contains("nn::CausalSelfAttention::backward: x [2, 3, 8], dy "
                                         "[2, 3, 8] and dx [6, 1, 8]"),
                       tk::Error);
  CHECK(all_zero());

  // dx over x: c_attn's weight gradient reads x, so it must be taken before dx is written.
  const auto grads = [&] {
    return std::vector<float>(arena.grads_data(), arena.grads_data() + arena.buffer_numel());
  };
  attn.backward(pool(), actx, cube(x.data(), B, T, C), cube(dy.data(), B, T, C),
                cube(dx.data(), B, T, C));
  const auto want = grads();
  arena.zero_grad();
  std::vector<float> same = x;
  attn.backward(pool(), actx, cube(same.data(), B, T, C), cube(dy.data(), B, T, C),
                cube(same.data(), B, T, C));
  CHECK(grads() == want);
  CHECK(same == dx);
}
