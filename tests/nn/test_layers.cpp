// Tests of the element-wise, linear, normalisation, embedding and loss layers of nn/ on the host:
// forward against float64 references, backward against float64 central finite differences and
// against PyTorch (tests/fixtures/nn/reference.*), plus the accumulate/write conventions.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include <trainkit/exec/host.hpp>
#include <trainkit/nn/activation.hpp>
#include <trainkit/nn/cross_entropy.hpp>
#include <trainkit/nn/dropout.hpp>
#include <trainkit/nn/embedding.hpp>
#include <trainkit/nn/layer_norm.hpp>
#include <trainkit/nn/linear.hpp>
#include <trainkit/nn/param_arena.hpp>
#include <trainkit/nn/residual.hpp>

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
tk::HostView<T, 2> mat(T* p, std::int64_t r, std::int64_t c) {
  return tk::make_view(p, {r, c});
}

// ---- float64 references -----------------------------------------------------------------------

std::vector<double> linear_ref(const std::vector<double>& x, const std::vector<double>& w,
                               const std::vector<double>& b, std::int64_t n, std::int64_t in,
                               std::int64_t out) {
  std::vector<double> y(static_cast<std::size_t>(n * out));
  for (std::int64_t i = 0; i < n; ++i)
    for (std::int64_t o = 0; o < out; ++o) {
      double s = b.empty() ? 0.0 : b[std::size_t(o)];
      for (std::int64_t k = 0; k < in; ++k)
        s += x[std::size_t(i * in + k)] * w[std::size_t(o * in + k)];
      y[std::size_t(i * out + o)] = s;
    }
  return y;
}

std::vector<double> layer_norm_ref(const std::vector<double>& x, const std::vector<double>& w,
                                   const std::vector<double>& b, std::int64_t n, std::int64_t c,
                                   double eps) {
  std::vector<double> y(x.size());
  for (std::int64_t i = 0; i < n; ++i) {
    double m = 0.0, v = 0.0;
    for (std::int64_t j = 0; j < c; ++j) m += x[std::size_t(i * c + j)];
    m /= double(c);
    for (std::int64_t j = 0; j < c; ++j)
      v += (x[std::size_t(i * c + j)] - m) * (x[std::size_t(i * c + j)] - m);
    const double s = 1.0 / std::sqrt(v / double(c) + eps);
    for (std::int64_t j = 0; j < c; ++j)
      y[std::size_t(i * c + j)] =
          (x[std::size_t(i * c + j)] - m) * s * w[std::size_t(j)] + b[std::size_t(j)];
  }
  return y;
}

double gelu_ref(double x) {
  const double u = std::sqrt(2.0 / M_PI) * (x + 0.044715 * x * x * x);
  return 0.5 * x * (1.0 + std::tanh(u));
}

/// Mean cross-entropy over valid rows, float64.
double cross_entropy_ref(const std::vector<double>& logits, const std::vector<std::int64_t>& t,
                         std::int64_t n, std::int64_t v, std::int64_t ignore) {
  double sum = 0.0;
  int valid = 0;
  for (std::int64_t i = 0; i < n; ++i) {
    if (t[std::size_t(i)] == ignore) continue;
    double m = -1e300;
    for (std::int64_t j = 0; j < v; ++j) m = std::max(m, logits[std::size_t(i * v + j)]);
    double s = 0.0;
    for (std::int64_t j = 0; j < v; ++j) s += std::exp(logits[std::size_t(i * v + j)] - m);
    sum += m + std::log(s) - logits[std::size_t(i * v + t[std::size_t(i)])];
    ++valid;
  }
  return sum / valid;
}

}  // namespace

// ---- Linear -----------------------------------------------------------------------------------

TEST_CASE("Linear: forward vs f64, backward vs finite differences (odd sizes)") {
  const std::int64_t n = 13, in = 19, out = 7;
  nn::ParamArena<> arena;
  nn::Linear lin(arena, "fc", {.in_features = in, .out_features = out});
  arena.finalize();
  arena.initialize(11);
  CHECK(arena.info(lin.weight()).name == "fc.weight");
  CHECK(arena.info(lin.bias()).name == "fc.bias");
  const auto x = nntest::random_floats(n * in, 1);
  const auto dy = nntest::random_floats(n * out, 2);
  std::vector<float> y(static_cast<std::size_t>(n * out)), dx(static_cast<std::size_t>(n * in));
  lin.forward(pool(), mat(x.data(), n, in), mat(y.data(), n, out));

  auto w = nntest::to_double(arena.param<2>(lin.weight()).data(), out * in);
  auto b = nntest::to_double(arena.param<1>(lin.bias()).data(), out);
  auto xd = nntest::to_double(x.data(), n * in);
  const auto dyd = nntest::to_double(dy.data(), n * out);
  CHECK(rel_err(y.data(), linear_ref(xd, w, b, n, in, out).data(), n * out) < 1e-6);

  lin.backward(pool(), mat(x.data(), n, in), mat(dy.data(), n, out), mat(dx.data(), n, in));
  const auto gx = nntest::finite_diff(
      [&](const std::vector<double>& v) {
        return nntest::dot(linear_ref(v, w, b, n, in, out), dyd);
      },
      xd);
  const auto gw = nntest::finite_diff(
      [&](const std::vector<double>& v) {
        return nntest::dot(linear_ref(xd, v, b, n, in, out), dyd);
      },
      w);
  const auto gb = nntest::finite_diff(
      [&](const std::vector<double>& v) {
        return nntest::dot(linear_ref(xd, w, v, n, in, out), dyd);
      },
      b);
  CHECK(rel_err(dx.data(), gx.data(), n * in) < 1e-5);
  CHECK(rel_err(arena.grad<2>(lin.weight()).data(), gw.data(), out * in) < 1e-5);
  CHECK(rel_err(arena.grad<1>(lin.bias()).data(), gb.data(), out) < 1e-5);

  SUBCASE("backward accumulates parameter grads and writes (or adds) dx") {
    const std::vector<float> dx1 = dx;
    lin.backward(pool(), mat(x.data(), n, in), mat(dy.data(), n, out), mat(dx.data(), n, in));
    CHECK(rel_err(dx.data(), dx1.data(), n * in) == 0.0);  // written, not added
    std::vector<double> twice(gw.size());
    for (std::size_t i = 0; i < gw.size(); ++i) twice[i] = 2.0 * gw[i];
    CHECK(rel_err(arena.grad<2>(lin.weight()).data(), twice.data(), out * in) < 1e-5);
    lin.backward(pool(), mat(x.data(), n, in), mat(dy.data(), n, out), mat(dx.data(), n, in),
                 nn::Write::kAccumulate);
    for (std::size_t i = 0; i < dx.size(); ++i)
      CHECK(dx[i] == doctest::Approx(2.0f * dx1[i]).epsilon(1e-5));
    arena.zero_grad();
    CHECK(arena.grad<1>(lin.bias())[0] == 0.0f);
  }
  SUBCASE("an absent dx skips the input gradient but still accumulates dW, db") {
    arena.zero_grad();
    lin.backward(pool(), mat(x.data(), n, in), mat(dy.data(), n, out), tk::HostView<float, 2>());
    CHECK(rel_err(arena.grad<2>(lin.weight()).data(), gw.data(), out * in) < 1e-5);
  }
  SUBCASE("shape errors throw") {
    std::vector<float> bad(static_cast<std::size_t>(n * (out + 1)));
    CHECK_THROWS_AS(lin.forward(pool(), mat(x.data(), n, in), mat(bad.data(), n, out + 1)),
                    tk::Error);
  }
}

TEST_CASE("Linear: rows padded to a wider stride give the bits of dense rows (bias included)") {
  const std::int64_t n = 70, in = 33, out = 21, ld = 32;  // 70 rows: several bias-grad blocks
  nn::ParamArena<> dense_arena, padded_arena;
  nn::Linear dense(dense_arena, "fc", {.in_features = in, .out_features = out});
  nn::Linear padded(padded_arena, "fc", {.in_features = in, .out_features = out});
  for (auto* a : {&dense_arena, &padded_arena}) {
    a->finalize();
    a->initialize(5);
  }
  const auto x = nntest::random_floats(n * in, 7);
  const auto dy = nntest::random_floats(n * out, 8);
  std::vector<float> y(static_cast<std::size_t>(n * out)), dx(static_cast<std::size_t>(n * in));
  dense.forward(pool(), mat(x.data(), n, in), mat(y.data(), n, out));
  dense.backward(pool(), mat(x.data(), n, in), mat(dy.data(), n, out), mat(dx.data(), n, in));
  std::vector<float> py(static_cast<std::size_t>(n * ld), -7.0f), pdy(py.size(), -7.0f);
  for (std::int64_t r = 0; r < n; ++r)
    for (std::int64_t j = 0; j < out; ++j)
      pdy[std::size_t(r * ld + j)] = dy[std::size_t(r * out + j)];
  const tk::Extents<2> shape{{n, out}}, strides{{ld, 1}};
  std::vector<float> pdx(dx.size());
  padded.forward(pool(), mat(x.data(), n, in), tk::HostView<float, 2>(py.data(), shape, strides));
  padded.backward(pool(), mat(x.data(), n, in),
                  tk::HostView<const float, 2>(pdy.data(), shape, strides), mat(pdx.data(), n, in));
  bool same = true;
  for (std::int64_t r = 0; r < n; ++r)
    for (std::int64_t j = 0; j < ld; ++j)
      same = same && py[std::size_t(r * ld + j)] == (j < out ? y[std::size_t(r * out + j)] : -7.0f);
  CHECK(same);
  CHECK(pdx == dx);
  CHECK(std::vector<float>(padded_arena.grads_data(),
                           padded_arena.grads_data() + padded_arena.buffer_numel()) ==
        std::vector<float>(dense_arena.grads_data(),
                           dense_arena.grads_data() + dense_arena.buffer_numel()));
  // The fused GELU variants need dense rows.
  std::vector<float> pre(py.size());
  CHECK_THROWS_WITH_AS(padded.forward_gelu(pool(), mat(x.data(), n, in),
                                           tk::HostView<float, 2>(pre.data(), shape, strides),
                                           tk::HostView<float, 2>(py.data(), shape, strides)),
                       doctest::Contains("must be contiguous"), tk::Error);
}

TEST_CASE("Linear: matches PyTorch values") {
  const Reference& ref = Reference::get();
  nn::ParamArena<> arena;
  nn::Linear lin(arena, "", {.in_features = 7, .out_features = 4});
  arena.finalize();
  nntest::load_params(arena, "linear");
  auto x = nntest::tensor_of(ref["linear/x"]);
  auto dy = nntest::tensor_of(ref["linear/dy"]);
  tk::Tensor<float> y(tk::Shape{5, 4}), dx(tk::Shape{5, 7});
  lin.forward(pool(), x.view<2>(), y.view<2>());
  CHECK(rel_err(y.data(), ref["linear/y"].values.data(), 20) < 1e-6);
  lin.backward(pool(), x.view<2>(), dy.view<2>(), dx.view<2>());
  CHECK(rel_err(dx.data(), ref["linear/dx"].values.data(), 35) < 1e-6);
  nntest::check_grads(arena, "linear", 1e-6);
}

TEST_CASE("Linear without bias and the fused GELU pair") {
  const std::int64_t n = 6, c = 5, h = 9;
  nn::ParamArena<> arena;
  nn::Linear fc(arena, "c_fc", {.in_features = c, .out_features = h});
  nn::Linear proj(arena, "c_proj", {.in_features = h, .out_features = c, .bias = false});
  arena.finalize();
  arena.initialize(5);
  CHECK(!proj.has_bias());
  CHECK(arena.size() == 3);
  const auto x = nntest::random_floats(n * c, 3, 2.0f);
  const auto dy = nntest::random_floats(n * c, 4);
  std::vector<float> pre(static_cast<std::size_t>(n * h)), g(static_cast<std::size_t>(n * h)),
      y(static_cast<std::size_t>(n * c));
  std::vector<float> dpre(static_cast<std::size_t>(n * h)), dx(static_cast<std::size_t>(n * c));
  fc.forward_gelu(pool(), mat(x.data(), n, c), mat(pre.data(), n, h), mat(g.data(), n, h));
  proj.forward(pool(), mat(g.data(), n, h), mat(y.data(), n, c));
  proj.backward_dgelu(pool(), mat(g.data(), n, h), mat(dy.data(), n, c), mat(pre.data(), n, h),
                      mat(dpre.data(), n, h));
  fc.backward(pool(), mat(x.data(), n, c), mat(dpre.data(), n, h), mat(dx.data(), n, c));

  auto w1 = nntest::to_double(arena.param<2>(fc.weight()).data(), h * c);
  auto b1 = nntest::to_double(arena.param<1>(fc.bias()).data(), h);
  auto w2 = nntest::to_double(arena.param<2>(proj.weight()).data(), c * h);
  const auto dyd = nntest::to_double(dy.data(), n * c);
  auto model = [&](const std::vector<double>& xv, const std::vector<double>& w1v,
                   const std::vector<double>& w2v) {
    auto p = linear_ref(xv, w1v, b1, n, c, h);
    for (auto& v : p) v = gelu_ref(v);
    return linear_ref(p, w2v, {}, n, h, c);
  };
  const auto xd = nntest::to_double(x.data(), n * c);
  CHECK(rel_err(y.data(), model(xd, w1, w2).data(), n * c) < 1e-5);
  const auto gx = nntest::finite_diff(
      [&](const std::vector<double>& v) { return nntest::dot(model(v, w1, w2), dyd); }, xd);
  const auto gw1 = nntest::finite_diff(
      [&](const std::vector<double>& v) { return nntest::dot(model(xd, v, w2), dyd); }, w1);
  const auto gw2 = nntest::finite_diff(
      [&](const std::vector<double>& v) { return nntest::dot(model(xd, w1, v), dyd); }, w2);
  CHECK(rel_err(dx.data(), gx.data(), n * c) < 1e-5);
  CHECK(rel_err(arena.grad<2>(fc.weight()).data(), gw1.data(), h * c) < 1e-5);
  CHECK(rel_err(arena.grad<2>(proj.weight()).data(), gw2.data(), c * h) < 1e-5);
}

TEST_CASE("Linear: dx (and backward_dgelu's dpre) may be x itself; dx over dy is refused first") {
  // dW reads x: written over by dx before it, dW would be dy^T (dy W). Random sizes, bias or
  // none, both write modes; the gradients and dx must have the bits of separate buffers.
  tk::PhiloxStream rng(20261207, 5);
  for (int c = 0; c < 24; ++c) {
    const auto n = static_cast<std::int64_t>(1 + rng.next_u32() % 13);
    const auto in = static_cast<std::int64_t>(1 + rng.next_u32() % 19);
    const auto out = static_cast<std::int64_t>(1 + rng.next_u32() % 19);
    const bool bias = c % 2 == 0, gelu = c % 3 == 0;
    const nn::Write mode = c % 4 < 2 ? nn::Write::kOverwrite : nn::Write::kAccumulate;
    CAPTURE(n);
    CAPTURE(in);
    CAPTURE(out);
    CAPTURE(bias);
    CAPTURE(gelu);
    nn::ParamArena<> arena;
    nn::Linear lin(arena, "fc", {.in_features = in, .out_features = out, .bias = bias});
    arena.finalize();
    arena.initialize(std::uint64_t(c));
    const auto x = nntest::random_floats(n * in, 100 + c, 2.0f);
    const auto dy = nntest::random_floats(n * out, 200 + c);
    const auto saved = nntest::random_floats(n * in, 300 + c);  // a GELU slope per element
    const auto run = [&](std::vector<float>& xbuf, std::vector<float>& dxbuf) {
      arena.zero_grad();
      if (gelu) {
        lin.backward_dgelu(pool(), mat<const float>(xbuf.data(), n, in), mat(dy.data(), n, out),
                           mat(saved.data(), n, in), mat(dxbuf.data(), n, in));
      } else {
        lin.backward(pool(), mat<const float>(xbuf.data(), n, in), mat(dy.data(), n, out),
                     mat(dxbuf.data(), n, in), mode);
      }
      return std::vector<float>(arena.grads_data(), arena.grads_data() + arena.buffer_numel());
    };
    std::vector<float> xs = x, dx = x;  // dx seeded with x: kAccumulate adds to it
    const auto want = run(xs, dx);
    std::vector<float> same = x;
    const auto got = run(same, same);
    CHECK(got == want);
    CHECK(same == dx);
  }

  // dx overlapping dy (in == out): the product would read what it wrote. Refused before dW and
  // db change.
  const std::int64_t n = 4, f = 6;
  nn::ParamArena<> arena;
  nn::Linear lin(arena, "fc", {.in_features = f, .out_features = f});
  arena.finalize();
  arena.initialize(3);
  arena.zero_grad();
  const auto x = nntest::random_floats(n * f, 7);
  auto dy = nntest::random_floats(n * f, 8);
  auto saved = nntest::random_floats(n * f, 9);
  CHECK_THROWS_WITH_AS(lin.backward(pool(), mat(x.data(), n, f), mat<const float>(dy.data(), n, f),
                                    mat(dy.data(), n, f)),
                       doctest::Contains("nn::Linear::backward: dx [4, 6] overlaps dy [4, 6]"),
                       tk::Error);
  CHECK_THROWS_WITH_AS(
      lin.backward_dgelu(pool(), mat(x.data(), n, f), mat(dy.data(), n, f),
                         mat<const float>(saved.data(), n, f), mat(saved.data(), n, f)),
      doctest::Contains("nn::Linear::backward_dgelu: dpre [4, 6] overlaps saved [4, 6]"),
      tk::Error);
  CHECK(std::all_of(arena.grads_data(), arena.grads_data() + arena.buffer_numel(),
                    [](float g) { return g == 0.0f; }));
  // forward_gelu's y over saved: the unfused GELU pass (CPUs without AVX2+FMA, device widths
  // not a multiple of 8) would write the slope over y; refused on every path, naming the layer.
  std::vector<float> both(static_cast<std::size_t>(n * f));
  CHECK_THROWS_WITH_AS(
      lin.forward_gelu(pool(), mat(x.data(), n, f), mat(both.data(), n, f), mat(both.data(), n, f)),
      doctest::Contains("nn::Linear::forward_gelu: y [4, 6] overlaps saved"), tk::Error);
}

TEST_CASE("Linear: results do not depend on the thread count") {
  const std::int64_t n = 300, in = 130, out = 70;
  std::vector<float> grads[2];
  std::vector<float> outs[2];
  for (int t = 0; t < 2; ++t) {
    tk::exec::Host host(t + 1);
    nn::ParamArena<> arena;
    nn::Linear lin(arena, "l", {.in_features = in, .out_features = out});
    arena.finalize();
    arena.initialize(3);
    const auto x = nntest::random_floats(n * in, 8);
    const auto dy = nntest::random_floats(n * out, 9);
    outs[t].resize(std::size_t(n * out));
    std::vector<float> dx(static_cast<std::size_t>(n * in));
    lin.forward(host, mat(x.data(), n, in), mat(outs[t].data(), n, out));
    lin.backward(host, mat(x.data(), n, in), mat(dy.data(), n, out), mat(dx.data(), n, in));
    grads[t].assign(arena.grads_data(), arena.grads_data() + arena.buffer_numel());
  }
  CHECK(outs[0] == outs[1]);
  CHECK(grads[0] == grads[1]);
}

// ---- LayerNorm --------------------------------------------------------------------------------

TEST_CASE("LayerNorm: forward vs f64 (saved statistics), backward vs finite differences") {
  const std::int64_t n = 70, c = 23;  // > one 32-row chunk, odd width
  nn::ParamArena<> arena;
  nn::LayerNorm ln(arena, "ln", {.features = c});
  arena.finalize();
  const auto wv = nntest::random_floats(c, 21, 0.5f);
  const auto bv = nntest::random_floats(c, 22, 0.5f);
  for (std::int64_t j = 0; j < c; ++j) {
    arena.param<1>(ln.weight())[j] = 1.0f + wv[std::size_t(j)];
    arena.param<1>(ln.bias())[j] = bv[std::size_t(j)];
  }
  auto x = nntest::random_floats(n * c, 23, 3.0f);
  for (auto& v : x) v += 5.0f;  // an offset: the variance must be centred
  const auto dy = nntest::random_floats(n * c, 24);
  std::vector<float> y(x.size()), dx(x.size());
  decltype(ln)::Context ctx;
  ln.forward(pool(), ctx, mat(x.data(), n, c), mat(y.data(), n, c));
  const auto xd = nntest::to_double(x.data(), n * c);
  const auto w = nntest::to_double(arena.param<1>(ln.weight()).data(), c);
  const auto b = nntest::to_double(arena.param<1>(ln.bias()).data(), c);
  const auto dyd = nntest::to_double(dy.data(), n * c);
  CHECK(rel_err(y.data(), layer_norm_ref(xd, w, b, n, c, 1e-5).data(), n * c) < 1e-6);
  double m0 = 0.0;
  for (std::int64_t j = 0; j < c; ++j) m0 += xd[std::size_t(j)];
  CHECK(ctx.rows() == n);
  CHECK(ctx.mean()[0] == doctest::Approx(m0 / double(c)).epsilon(1e-6));

  ln.backward(pool(), ctx, mat(x.data(), n, c), mat(dy.data(), n, c), mat(dx.data(), n, c));
  auto loss = [&](const std::vector<double>& xv, const std::vector<double>& wv2,
                  const std::vector<double>& bv2) {
    return nntest::dot(layer_norm_ref(xv, wv2, bv2, n, c, 1e-5), dyd);
  };
  const auto gx =
      nntest::finite_diff([&](const std::vector<double>& v) { return loss(v, w, b); }, xd, 1e-5);
  const auto gw =
      nntest::finite_diff([&](const std::vector<double>& v) { return loss(xd, v, b); }, w);
  const auto gb =
      nntest::finite_diff([&](const std::vector<double>& v) { return loss(xd, w, v); }, b);
  CHECK(rel_err(dx.data(), gx.data(), n * c) < 1e-4);
  CHECK(rel_err(arena.grad<1>(ln.weight()).data(), gw.data(), c) < 1e-5);
  CHECK(rel_err(arena.grad<1>(ln.bias()).data(), gb.data(), c) < 1e-5);

  // Accumulate mode adds to dx.
  std::vector<float> acc(dx.size(), 1.0f);
  ln.backward(pool(), ctx, mat(x.data(), n, c), mat(dy.data(), n, c), mat(acc.data(), n, c),
              nn::Write::kAccumulate);
  for (std::size_t i = 0; i < dx.size(); i += 17)
    CHECK(acc[i] == doctest::Approx(1.0f + dx[i]).epsilon(1e-5));
}

TEST_CASE("LayerNorm: rows of equal values, and a large offset with a small spread") {
  // The mean is corrected by a second pass, so a constant row normalises to exactly 0 (y = b,
  // dx = 0) instead of its mean's rounding error times 1/sqrt(eps); a near-constant row keeps the
  // float64 result to within what its f32 inputs allow.
  std::mt19937 gen(61);
  for (const std::int64_t c : {1, 7, 9, 16, 17, 23, 64, 129, 768}) {
    CAPTURE(c);
    const std::int64_t n = 6;
    nn::ParamArena<> arena;
    nn::LayerNorm ln(arena, "ln", {.features = c});
    arena.finalize();
    const auto wv = nntest::random_floats(c, 64, 0.5f);
    const auto bv = nntest::random_floats(c, 62, 0.5f);
    for (std::int64_t j = 0; j < c; ++j) {
      arena.param<1>(ln.weight())[j] = 1.0f + wv[std::size_t(j)];
      arena.param<1>(ln.bias())[j] = bv[std::size_t(j)];
    }
    const float offsets[] = {10000001.0f, 1234.567f, -3.3e7f, 0.1f, -7.5e-3f, 1e18f};
    std::vector<float> x(std::size_t(n * c)), y(x.size()), dx(x.size());
    for (std::int64_t r = 0; r < n; ++r)
      for (std::int64_t j = 0; j < c; ++j) x[std::size_t(r * c + j)] = offsets[r];
    decltype(ln)::Context ctx;
    ln.forward(pool(), ctx, mat(x.data(), n, c), mat(y.data(), n, c));
    for (std::int64_t r = 0; r < n; ++r) {
      CAPTURE(offsets[r]);
      CHECK(ctx.mean()[std::size_t(r)] == offsets[r]);
      for (std::int64_t j = 0; j < c; ++j) REQUIRE(y[std::size_t(r * c + j)] == bv[std::size_t(j)]);
    }
    const auto dy = nntest::random_floats(n * c, 63);
    ln.backward(pool(), ctx, mat(x.data(), n, c), mat(dy.data(), n, c), mat(dx.data(), n, c));
    // A constant row: dx = rstd * (w dy - mean(w dy)) (xhat = 0), rstd = 1 / sqrt(eps).
    for (std::int64_t r = 0; r < n; ++r) {
      CAPTURE(r);
      const auto g = [&](std::int64_t j) {
        return double(dy[std::size_t(r * c + j)]) * (1.0 + double(wv[std::size_t(j)]));
      };
      double mg = 0.0;
      for (std::int64_t j = 0; j < c; ++j) mg += g(j);
      mg /= double(c);
      for (std::int64_t j = 0; j < c; ++j) {
        const double want = (g(j) - mg) / std::sqrt(1e-5);
        REQUIRE(dx[std::size_t(r * c + j)] == doctest::Approx(want).epsilon(1e-4).scale(1e-2));
      }
    }

    // Past |x| ~ 1.8e19 the squares overflow f32: the variance is infinite, y = b (never NaN).
    std::fill(x.begin(), x.end(), -1e30f);
    ln.forward(pool(), ctx, mat(x.data(), n, c), mat(y.data(), n, c));
    for (std::int64_t j = 0; j < c; ++j) CHECK(y[std::size_t(j)] == bv[std::size_t(j)]);

    // Offset 1234 with a spread of 1e-2: y against float64 of the same f32 inputs.
    std::uniform_real_distribution<float> spread(-1e-2f, 1e-2f);
    for (auto& v : x) v = 1234.0f + spread(gen);
    ln.forward(pool(), ctx, mat(x.data(), n, c), mat(y.data(), n, c));
    const auto xd = nntest::to_double(x.data(), n * c);
    const auto w = nntest::to_double(arena.param<1>(ln.weight()).data(), c);
    const auto b = nntest::to_double(arena.param<1>(ln.bias()).data(), c);
    const auto ref = layer_norm_ref(xd, w, b, n, c, 1e-5);
    double worst = 0.0;
    for (std::size_t i = 0; i < x.size(); ++i) worst = std::max(worst, std::abs(y[i] - ref[i]));
    CHECK(worst < 2e-2);  // |x| * eps_f32 / spread ~ 1e-2 is what the inputs' rounding allows
  }
}

TEST_CASE("LayerNorm: matches PyTorch values; bits independent of threads") {
  const Reference& ref = Reference::get();
  nn::ParamArena<> arena;
  nn::LayerNorm ln(arena, "", {.features = 10});
  arena.finalize();
  nntest::load_params(arena, "layer_norm");
  auto x = nntest::tensor_of(ref["layer_norm/x"]);
  auto dy = nntest::tensor_of(ref["layer_norm/dy"]);
  tk::Tensor<float> y(tk::Shape{6, 10}), dx(tk::Shape{6, 10});
  decltype(ln)::Context ctx;
  ln.forward(pool(), ctx, x.view<2>(), y.view<2>());
  CHECK(rel_err(y.data(), ref["layer_norm/y"].values.data(), 60) < 1e-6);
  ln.backward(pool(), ctx, x.view<2>(), dy.view<2>(), dx.view<2>());
  CHECK(rel_err(dx.data(), ref["layer_norm/dx"].values.data(), 60) < 1e-5);
  nntest::check_grads(arena, "layer_norm", 1e-6);

  const std::int64_t n = 1000, c = 64;
  const auto xs = nntest::random_floats(n * c, 5);
  const auto dys = nntest::random_floats(n * c, 6);
  std::vector<float> grads[2];
  for (int t = 0; t < 2; ++t) {
    tk::exec::Host host(t + 1);
    nn::ParamArena<> a2;
    nn::LayerNorm l2(a2, "ln", {.features = c});
    a2.finalize();
    a2.initialize(1);
    std::vector<float> ys(xs.size()), dxs(xs.size());
    decltype(l2)::Context c2;
    l2.forward(host, c2, mat(xs.data(), n, c), mat(ys.data(), n, c));
    l2.backward(host, c2, mat(xs.data(), n, c), mat(dys.data(), n, c), mat(dxs.data(), n, c));
    grads[t].assign(a2.grads_data(), a2.grads_data() + a2.buffer_numel());
  }
  CHECK(grads[0] == grads[1]);
}

TEST_CASE("LayerNorm: dx over x, dy or the residual in part is refused; dx over x itself works") {
  // Rows are read before they are written, but only their own: a dx one row ahead of x, dy or
  // the residual would overwrite the next row before it is read. Refused before dw and db change.
  const std::int64_t n = 5, c = 6;
  nn::ParamArena<> arena;
  nn::LayerNorm ln(arena, "ln", {.features = c});
  arena.finalize();
  arena.initialize(4);
  const auto x = nntest::random_floats(n * c, 21);
  const auto dy = nntest::random_floats(n * c, 22);
  const auto res = nntest::random_floats(n * c, 23);
  std::vector<float> y(x.size());
  decltype(ln)::Context ctx;
  ln.forward(pool(), ctx, mat(x.data(), n, c), mat(y.data(), n, c));
  const auto grads = [&] {
    return std::vector<float>(arena.grads_data(), arena.grads_data() + arena.buffer_numel());
  };
  std::vector<float> dx(x.size());
  ln.backward(pool(), ctx, mat(x.data(), n, c), mat(dy.data(), n, c), mat(dx.data(), n, c),
              mat(res.data(), n, c));
  const auto want = grads();
  arena.zero_grad();

  // One buffer of n + 1 rows: the input view at row 0, dx at row 1.
  const char* names[] = {"x", "dy", "residual"};
  for (int which = 0; which < 3; ++which) {
    CAPTURE(which);
    std::vector<float> buf(static_cast<std::size_t>((n + 1) * c));
    const std::vector<float>& in = which == 0 ? x : which == 1 ? dy : res;
    std::copy(in.begin(), in.end(), buf.begin());
    const float* xp = which == 0 ? buf.data() : x.data();
    const float* dyp = which == 1 ? buf.data() : dy.data();
    const float* rp = which == 2 ? buf.data() : res.data();
    CHECK_THROWS_WITH_AS(
        ln.backward(pool(), ctx, mat(xp, n, c), mat(dyp, n, c), mat(buf.data() + c, n, c),
                    mat(rp, n, c)),
        doctest::Contains((std::string("nn::LayerNorm::backward: dx [5, 6] partly overlaps ") +
                           names[which] + " [5, 6]")
                              .c_str()),
        tk::Error);
    CHECK(std::all_of(arena.grads_data(), arena.grads_data() + arena.buffer_numel(),
                      [](float g) { return g == 0.0f; }));
  }
  // Without a residual too.
  std::vector<float> buf(static_cast<std::size_t>((n + 1) * c));
  std::copy(dy.begin(), dy.end(), buf.begin() + c);
  CHECK_THROWS_WITH_AS(ln.backward(pool(), ctx, mat(x.data(), n, c),
                                   mat<const float>(buf.data() + c, n, c), mat(buf.data(), n, c)),
                       doctest::Contains("dx [5, 6] partly overlaps dy [5, 6]"), tk::Error);

  // dx written over x itself (what TransformerBlock does when its dx is its x): the bits of a
  // separate dx, and the same dw and db.
  std::vector<float> same = x;
  ln.backward(pool(), ctx, mat(same.data(), n, c), mat(dy.data(), n, c), mat(same.data(), n, c),
              mat(res.data(), n, c));
  CHECK(same == dx);
  CHECK(grads() == want);
}

// ---- activations ------------------------------------------------------------------------------

TEST_CASE("GELU and ReLU: forward vs f64, backward vs finite differences and PyTorch") {
  const Reference& ref = Reference::get();
  const std::int64_t n = 2000;
  auto x = nntest::random_floats(n, 31, 6.0f);
  x[0] = 0.0f;
  x[1] = -20.0f;
  x[2] = 20.0f;
  const auto dy = nntest::random_floats(n, 32);
  std::vector<float> y(static_cast<std::size_t>(n)), dx(static_cast<std::size_t>(n));
  const tk::HostView<float, 1> xv(x.data(), tk::Extents<1>{{n}});
  const tk::HostView<float, 1> yv(y.data(), tk::Extents<1>{{n}});
  const tk::HostView<const float, 1> dyv(dy.data(), tk::Extents<1>{{n}});
  const tk::HostView<float, 1> dxv(dx.data(), tk::Extents<1>{{n}});

  nn::GELU gelu;
  gelu.forward(pool(), xv, yv);
  gelu.backward(pool(), xv, dyv, dxv);
  double max_err = 0.0, max_gerr = 0.0;
  for (std::int64_t i = 0; i < n; ++i) {
    const double xi = x[std::size_t(i)];
    max_err = std::max(max_err,
                       std::abs(y[std::size_t(i)] - gelu_ref(xi)) / (1.0 + std::abs(gelu_ref(xi))));
    const double fd = (gelu_ref(xi + 1e-6) - gelu_ref(xi - 1e-6)) / 2e-6;
    max_gerr = std::max(
        max_gerr, std::abs(dx[std::size_t(i)] - dy[std::size_t(i)] * fd) / (1.0 + std::abs(fd)));
  }
  CHECK(max_err < 1e-6);
  CHECK(max_gerr < 1e-5);
  CHECK(std::abs(y[1]) < 1e-30f);  // gelu(-20) underflows (true value ~ -1e-248)
  CHECK(y[2] == 20.0f);

  // Far out (x^2 and x^3 overflow f32 past ~1.8e19 and ~7e12): the value and slope stay what
  // they are to f32 precision (0 and x; 0 and 1), never NaN or huge; NaN stays NaN.
  {
    const float far[] = {-3.4e38f,
                         -1e30f,
                         -2e19f,
                         -1e13f,
                         -1e11f,
                         -50.0f,
                         50.0f,
                         1e11f,
                         1e13f,
                         2e19f,
                         1e30f,
                         3.4e38f,
                         std::numeric_limits<float>::infinity(),
                         -std::numeric_limits<float>::infinity(),
                         std::numeric_limits<float>::quiet_NaN()};
    const std::int64_t m = std::size(far);
    std::vector<float> fx(far, far + m), fy(std::size_t(m), 0.0f), fdx(std::size_t(m), 0.0f);
    const std::vector<float> ones(std::size_t(m), 1.0f);
    gelu.forward(pool(), tk::HostView<float, 1>(fx.data(), tk::Extents<1>{{m}}),
                 tk::HostView<float, 1>(fy.data(), tk::Extents<1>{{m}}));
    gelu.backward(pool(), tk::HostView<float, 1>(fx.data(), tk::Extents<1>{{m}}),
                  tk::HostView<const float, 1>(ones.data(), tk::Extents<1>{{m}}),
                  tk::HostView<float, 1>(fdx.data(), tk::Extents<1>{{m}}));
    for (std::int64_t i = 0; i + 1 < m; ++i) {
      const float xi = fx[std::size_t(i)];
      CAPTURE(xi);
      if (xi < 0.0f) {
        CHECK(std::abs(fy[std::size_t(i)]) < 1e-30f);
        CHECK(std::abs(fdx[std::size_t(i)]) < 1e-30f);
      } else {
        CHECK(fy[std::size_t(i)] == xi);
        CHECK(fdx[std::size_t(i)] == 1.0f);
      }
    }
    CHECK(std::isnan(fy[std::size_t(m - 1)]));
    CHECK(std::isnan(fdx[std::size_t(m - 1)]));
  }

  nn::ReLU relu;
  relu.forward(pool(), xv, yv);
  relu.backward(pool(), xv, dyv, dxv);
  for (std::int64_t i = 0; i < n; ++i) {
    CHECK(y[std::size_t(i)] == std::max(0.0f, x[std::size_t(i)]));
    CHECK(dx[std::size_t(i)] == (x[std::size_t(i)] > 0.0f ? dy[std::size_t(i)] : 0.0f));
  }
  {  // NaN: forward NaN, and the gradient passes (PyTorch: zero only where x <= 0); x = 0 and
     // -0 give 0, +-inf give 0 and dy.
    const float nan = std::numeric_limits<float>::quiet_NaN(),
                inf = std::numeric_limits<float>::infinity();
    std::vector<float> ex = {nan, 0.0f, -0.0f, inf, -inf}, ey(5), edx(5, 0.0f);
    const std::vector<float> edy = {2.0f, 3.0f, 4.0f, 5.0f, 6.0f};
    const auto v = [](auto& a) {
      return tk::HostView<std::remove_reference_t<decltype(a[0])>, 1>(a.data(),
                                                                      tk::Extents<1>{{5}});
    };
    relu.forward(pool(), v(ex), v(ey));
    relu.backward(pool(), v(ex), tk::HostView<const float, 1>(edy.data(), tk::Extents<1>{{5}}),
                  v(edx));
    CHECK(std::isnan(ey[0]));
    CHECK(edx == std::vector<float>{2.0f, 0.0f, 0.0f, 5.0f, 0.0f});
  }

  for (const char* name : {"gelu", "relu"}) {
    const std::string c = name;
    auto rx = nntest::tensor_of(ref[c + "/x"]);
    auto rdy = nntest::tensor_of(ref[c + "/dy"]);
    tk::Tensor<float> ry(rx.shape()), rdx(rx.shape());
    if (c == "gelu") {
      gelu.forward(pool(), rx.view<2>(), ry.view<2>());
      gelu.backward(pool(), rx.view<2>(), rdy.view<2>(), rdx.view<2>());
    } else {
      relu.forward(pool(), rx.view<2>(), ry.view<2>());
      relu.backward(pool(), rx.view<2>(), rdy.view<2>(), rdx.view<2>());
    }
    INFO(c);
    CHECK(rel_err(ry.data(), ref[c + "/y"].values.data(), ry.numel()) < 1e-6);
    CHECK(rel_err(rdx.data(), ref[c + "/dx"].values.data(), rdx.numel()) < 1e-5);
  }
}

// ---- Dropout ----------------------------------------------------------------------------------

TEST_CASE("GELU and ReLU: outputs partly over their inputs are refused, in place works") {
  // Threads of an element-wise launch would read elements another one had written already.
  const std::int64_t n = 1000;
  std::vector<float> buf = nntest::random_floats(n + 1, 41, 4.0f);
  const std::vector<float> dy = nntest::random_floats(n, 42);
  const auto view = [n](float* p) { return tk::HostView<float, 1>(p, tk::Extents<1>{{n}}); };
  const tk::HostView<const float, 1> dyv(dy.data(), tk::Extents<1>{{n}});
  nn::GELU gelu;
  CHECK_THROWS_WITH_AS(gelu.forward(pool(), view(buf.data()), view(buf.data() + 1)),
                       doctest::Contains("y [1000] partly overlaps x [1000]"), tk::Error);
  CHECK_THROWS_WITH_AS(gelu.backward(pool(), view(buf.data()), dyv, view(buf.data() + 1)),
                       doctest::Contains("dx [1000] partly overlaps x [1000]"), tk::Error);
  nn::ReLU relu;
  CHECK_THROWS_WITH_AS(relu.forward(pool(), view(buf.data() + 1), view(buf.data())),
                       doctest::Contains("partly overlaps"), tk::Error);
  // In place: the bits of separate buffers.
  std::vector<float> x(buf.begin(), buf.begin() + n), y(static_cast<std::size_t>(n));
  std::vector<float> dx(static_cast<std::size_t>(n));
  gelu.backward(pool(), view(x.data()), dyv, view(dx.data()));
  gelu.backward(pool(), view(x.data()), dyv, view(x.data()));
  CHECK(x == dx);
  std::vector<float> z(buf.begin(), buf.begin() + n);
  relu.forward(pool(), view(z.data()), view(y.data()));
  relu.forward(pool(), view(z.data()), view(z.data()));
  CHECK(z == y);
}

TEST_CASE("Dropout: Philox mask, scaling, determinism, eval, p = 0 and p = 1") {
  const std::int64_t n = 100000;
  std::vector<float> x(static_cast<std::size_t>(n), 2.0f), y(static_cast<std::size_t>(n)),
      dx(static_cast<std::size_t>(n));
  const auto dy = nntest::random_floats(n, 41);
  const tk::HostView<float, 1> xv(x.data(), tk::Extents<1>{{n}});
  const tk::HostView<float, 1> yv(y.data(), tk::Extents<1>{{n}});
  nn::Dropout drop({.p = 0.25f, .seed = 1234, .site = 3});
  drop.set_step(7);
  drop.forward(pool(), xv, yv);
  std::int64_t kept = 0;
  for (std::int64_t i = 0; i < n; ++i) {
    const bool k = drop.kept(i);
    kept += k;
    CHECK(y[std::size_t(i)] == (k ? 2.0f * (1.0f / 0.75f) : 0.0f));
    if (!(y[std::size_t(i)] == (k ? 2.0f * (1.0f / 0.75f) : 0.0f))) break;
  }
  CHECK(double(kept) / double(n) == doctest::Approx(0.75).epsilon(0.01));

  // backward: the same mask (same step), dx = dy * mask / (1 - p).
  drop.backward(pool(), xv, tk::HostView<const float, 1>(dy.data(), tk::Extents<1>{{n}}),
                tk::HostView<float, 1>(dx.data(), tk::Extents<1>{{n}}));
  for (std::int64_t i = 0; i < n; i += 97)
    CHECK(dx[std::size_t(i)] == (drop.kept(i) ? dy[std::size_t(i)] * (1.0f / 0.75f) : 0.0f));

  // Same (seed, step, site) -> same mask on any thread count; another step or site differs.
  std::vector<float> y1(static_cast<std::size_t>(n));
  tk::exec::Host one(1);
  drop.forward(one, xv, tk::HostView<float, 1>(y1.data(), tk::Extents<1>{{n}}));
  CHECK(y1 == y);
  drop.set_step(8);
  drop.forward(one, xv, tk::HostView<float, 1>(y1.data(), tk::Extents<1>{{n}}));
  CHECK(y1 != y);
  nn::Dropout other({.p = 0.25f, .seed = 1234, .site = 4});
  other.set_step(7);
  other.forward(one, xv, tk::HostView<float, 1>(y1.data(), tk::Extents<1>{{n}}));
  CHECK(y1 != y);

  drop.eval();
  drop.forward(pool(), xv, yv);
  CHECK(y == x);
  nn::Dropout zero({.p = 0.0f});
  zero.forward(pool(), xv, yv);
  CHECK(y == x);
  nn::Dropout all({.p = 1.0f});
  all.forward(pool(), xv, yv);
  for (std::int64_t i = 0; i < n; i += 101) CHECK(y[std::size_t(i)] == 0.0f);
  CHECK_THROWS_AS(nn::Dropout({.p = 1.5f}), tk::Error);

  // As torch's x * mask: a dropped inf or NaN gives NaN, a dropped negative -0 (an overflowed
  // gradient stays visible to the loss scaler); kept ones are scaled.
  const float inf = std::numeric_limits<float>::infinity();
  const float nan = std::numeric_limits<float>::quiet_NaN();
  std::vector<float> odd = {inf, -inf, nan, -3.0f, 5.0f, inf, nan, -1.0f};
  std::vector<float> out(odd.size());
  const tk::HostView<float, 1> ov(odd.data(), tk::Extents<1>{{8}});
  const tk::HostView<float, 1> outv(out.data(), tk::Extents<1>{{8}});
  all.forward(pool(), ov, outv);
  for (std::size_t i = 0; i < odd.size(); ++i) {
    CAPTURE(i);
    if (std::isfinite(odd[i])) {
      CHECK(out[i] == 0.0f);
      CHECK(std::signbit(out[i]) == std::signbit(odd[i]));
    } else {
      CHECK(std::isnan(out[i]));
    }
  }
  nn::Dropout half({.p = 0.5f, .seed = 9});
  half.forward(pool(), ov, outv);
  for (std::size_t i = 0; i < odd.size(); ++i) {
    CAPTURE(i);
    if (half.kept(std::int64_t(i)) || std::isfinite(odd[i])) {
      const float want = odd[i] * (half.kept(std::int64_t(i)) ? 2.0f : 0.0f);
      CHECK((out[i] == want || (std::isnan(out[i]) && std::isnan(want))));
    } else {
      CHECK(std::isnan(out[i]));
    }
  }
}

// ---- residual ---------------------------------------------------------------------------------

TEST_CASE("Dropout: one probability check, naming the option that was out of range") {
  for (const float p : {-0.1f, 1.5f, std::numeric_limits<float>::quiet_NaN(),
                        std::numeric_limits<float>::infinity()}) {
    CAPTURE(p);
    CHECK_THROWS_WITH_AS(nn::Dropout({.p = p}), doctest::Contains("nn::Dropout: p "), tk::Error);
    CHECK_THROWS_WITH_AS(nn::Dropout({.p = p}),
                         doctest::Contains(" is not a probability in [0, 1]"), tk::Error);
    CHECK_THROWS_WITH_AS(nn::detail::check_dropout_probability(p, "nn::Gpt", "dropout"),
                         doctest::Contains("nn::Gpt: dropout "), tk::Error);
  }
  CHECK_THROWS_WITH_AS(nn::Dropout({.p = 1.5f}),
                       doctest::Contains("nn::Dropout: p 1.5 is not a probability in [0, 1]"),
                       tk::Error);
  for (const float p : {0.0f, 0.1f, 1.0f}) {
    CHECK_NOTHROW(nn::Dropout({.p = p}));
    CHECK_NOTHROW(nn::detail::check_dropout_probability(p, "nn::Gpt", "dropout"));
  }
}

TEST_CASE("LayerNorm: the device backward's partial-sum grid stays within a grid's limits") {
  // Block y of the partial-sum kernel takes chunks y, y + grid.y, ...: every chunk of 32 rows
  // once, and grid.y <= 65535 (it was the chunk count: > 65535 past 2,097,120 rows).
  const std::int64_t chunk = nn::detail::kLayerNormChunk;
  const std::int64_t threads = nn::detail::kLayerNormPartialThreads;
  std::mt19937_64 rng(5);
  std::vector<std::int64_t> rows_list = {
      1, 31, 32, 33, 65536, 65535 * 32, 65535 * 32 + 1, 65536 * 32, 4 * 65536 * 32 + 17};
  for (int i = 0; i < 20; ++i)
    rows_list.push_back(std::int64_t(1 + rng() % (std::int64_t{1} << 26)));
  for (const std::int64_t rows : rows_list) {
    for (const std::int64_t cols : {std::int64_t{1}, std::int64_t{127}, std::int64_t{768},
                                    static_cast<std::int64_t>(1 + rng() % 5000)}) {
      CAPTURE(rows);
      CAPTURE(cols);
      const auto g = nn::detail::layer_norm_partial_grid(rows, cols);
      const std::int64_t chunks = (rows + chunk - 1) / chunk;
      CHECK(g.y >= 1u);
      CHECK(g.y <= 65535u);
      CHECK(std::int64_t(g.y) == std::min<std::int64_t>(chunks, 65535));
      CHECK(std::int64_t(g.x) * threads >= cols);
      CHECK(std::int64_t(g.x - 1) * threads < cols);
      // The kernel's chunk loop, run on the host: each chunk visited exactly once.
      std::vector<int> seen(static_cast<std::size_t>(chunks), 0);
      for (std::int64_t y = 0; y < std::int64_t(g.y); ++y)
        for (std::int64_t k = y; k < chunks; k += g.y) ++seen[static_cast<std::size_t>(k)];
      CHECK(std::all_of(seen.begin(), seen.end(), [](int s) { return s == 1; }));
    }
  }
}

TEST_CASE("residual_forward / residual_backward") {
  std::vector<float> a = {1, 2, 3, 4}, b = {10, 20, 30, 40}, out(4), da(4, 1.0f), db(4, 5.0f);
  const std::vector<float> dout = {0.5f, -1, 2, 0};
  auto v = [](auto& s) {
    return tk::HostView<std::remove_reference_t<decltype(s[0])>, 1>(s.data(), tk::Extents<1>{{4}});
  };
  nn::residual_forward(pool(), v(a), v(b), v(out));
  CHECK(out == std::vector<float>{11, 22, 33, 44});
  nn::residual_backward(pool(), tk::HostView<const float, 1>(dout.data(), tk::Extents<1>{{4}}),
                        v(da), v(db), nn::Write::kOverwrite, nn::Write::kAccumulate);
  CHECK(da == dout);
  CHECK(db == std::vector<float>{5.5f, 4, 7, 5});
}

// ---- Embedding --------------------------------------------------------------------------------

TEST_CASE("Embedding: matches PyTorch (repeated ids), accumulate mode, id range checks") {
  const Reference& ref = Reference::get();
  nn::ParamArena<> arena;
  nn::Embedding emb(arena, "", {.num_embeddings = 6, .embedding_dim = 4});
  arena.finalize();
  nntest::load_params(arena, "embedding");
  const auto& rids = ref["embedding/ids"];
  std::vector<std::int32_t> ids;
  for (double v : rids.values) ids.push_back(static_cast<std::int32_t>(v));
  const tk::HostView<const std::int32_t, 1> idv(ids.data(), tk::Extents<1>{{9}});
  auto dout = nntest::tensor_of(ref["embedding/dout"]);
  tk::Tensor<float> out(tk::Shape{9, 4});
  emb.forward(pool(), idv, out.view<2>());
  CHECK(rel_err(out.data(), ref["embedding/out"].values.data(), 36) == 0.0);
  emb.backward(pool(), idv, dout.view<2>());
  nntest::check_grads(arena, "embedding", 1e-6);

  // Accumulate: out += W[ids] (token + position embeddings).
  emb.forward(pool(), idv, out.view<2>(), nn::Write::kAccumulate);
  CHECK(out.data()[5] == doctest::Approx(2.0 * ref["embedding/out"].values[5]));

  std::vector<std::int64_t> bad = {0, 6};
  CHECK_THROWS_AS(
      emb.forward(pool(), tk::HostView<const std::int64_t, 1>(bad.data(), tk::Extents<1>{{2}}),
                  out.view<2>().slice(0, 0, 2)),
      tk::Error);
  // Backward checks its own ids (they may not be forward's), before any gradient changes.
  const std::vector<float> grads_before(arena.grads_data(),
                                        arena.grads_data() + arena.buffer_numel());
  for (const std::int64_t wrong : {std::int64_t{6}, std::int64_t{-1}, std::int64_t{1} << 40}) {
    CAPTURE(wrong);
    std::vector<std::int64_t> ids2 = {0, 3, wrong};
    CHECK_THROWS_WITH_AS(
        emb.backward(pool(), tk::HostView<const std::int64_t, 1>(ids2.data(), tk::Extents<1>{{3}}),
                     dout.view<2>().slice(0, 0, 3)),
        doctest::Contains("at position 2 is out of range [0, 6)"), tk::Error);
  }
  CHECK(std::equal(grads_before.begin(), grads_before.end(), arena.grads_data()));
}

// ---- SoftmaxCrossEntropy ----------------------------------------------------------------------

TEST_CASE("SoftmaxCrossEntropy: PyTorch parity with ignore_index, finite differences, edge cases") {
  const Reference& ref = Reference::get();
  auto logits = nntest::tensor_of(ref["cross_entropy/logits"]);
  std::vector<std::int64_t> targets;
  for (double v : ref["cross_entropy/targets"].values)
    targets.push_back(static_cast<std::int64_t>(v));
  const tk::HostView<const std::int64_t, 1> tv(targets.data(), tk::Extents<1>{{7}});
  float loss = 0.0f;
  const tk::HostView<float, 1> lv(&loss, tk::Extents<1>{{1}});
  nn::SoftmaxCrossEntropy ce;
  decltype(ce)::Context ctx;
  ce.forward(pool(), ctx, logits.view<2>(), tv, lv);
  CHECK(loss == doctest::Approx(ref["cross_entropy/loss"].values[0]).epsilon(1e-6));
  tk::Tensor<float> dl(tk::Shape{7, 5});
  ce.backward(pool(), ctx, logits.view<2>(), tv, dl.view<2>());
  CHECK(rel_err(dl.data(), ref["cross_entropy/dlogits"].values.data(), 35) < 1e-6);

  // Finite differences of the f64 loss on random logits; dloss scales the gradient.
  const std::int64_t n = 9, v = 13;
  const auto lr = nntest::random_floats(n * v, 51, 4.0f);
  std::vector<std::int64_t> t(static_cast<std::size_t>(n));
  for (std::int64_t i = 0; i < n; ++i) t[std::size_t(i)] = (i * 5) % v;
  t[3] = -1;
  nn::SoftmaxCrossEntropy ce2({.ignore_index = -1});
  const tk::HostView<const float, 2> lrv(lr.data(), tk::Extents<2>{{n, v}});
  const tk::HostView<const std::int64_t, 1> trv(t.data(), tk::Extents<1>{{n}});
  ce2.forward(pool(), ctx, lrv, trv, lv);
  const auto ld = nntest::to_double(lr.data(), n * v);
  CHECK(loss == doctest::Approx(cross_entropy_ref(ld, t, n, v, -1)).epsilon(1e-6));
  std::vector<float> g(static_cast<std::size_t>(n * v));
  ce2.backward(pool(), ctx, lrv, trv, mat(g.data(), n, v), 2.0f);
  auto fd = nntest::finite_diff(
      [&](const std::vector<double>& x) { return 2.0 * cross_entropy_ref(x, t, n, v, -1); }, ld);
  CHECK(rel_err(g.data(), fd.data(), n * v) < 1e-5);
  for (std::int64_t j = 0; j < v; ++j) CHECK(g[std::size_t(3 * v + j)] == 0.0f);

  // Stable for huge logits.
  std::vector<float> big(static_cast<std::size_t>(n * v));
  for (std::size_t i = 0; i < big.size(); ++i) big[i] = lr[i] + 1e4f;
  ce2.forward(pool(), ctx, tk::HostView<const float, 2>(big.data(), tk::Extents<2>{{n, v}}), trv,
              lv);
  CHECK(std::isfinite(loss));
  CHECK(loss == doctest::Approx(cross_entropy_ref(ld, t, n, v, -1)).epsilon(1e-2));

  // All ignored: NaN loss (0/0, as PyTorch) and zero gradient.
  std::vector<std::int64_t> none(static_cast<std::size_t>(n), -1);
  const tk::HostView<const std::int64_t, 1> nv(none.data(), tk::Extents<1>{{n}});
  ce2.forward(pool(), ctx, lrv, nv, lv);
  CHECK(std::isnan(loss));
  ce2.backward(pool(), ctx, lrv, nv, mat(g.data(), n, v));
  for (float gi : g) CHECK(gi == 0.0f);

  // A target out of range throws.
  std::vector<std::int64_t> bad(static_cast<std::size_t>(n), 0);
  bad[2] = v;
  CHECK_THROWS_AS(
      ce2.forward(pool(), ctx, lrv,
                  tk::HostView<const std::int64_t, 1>(bad.data(), tk::Extents<1>{{n}}), lv),
      tk::Error);
  // Backward checks its own targets (they may not be forward's), before writing a gradient.
  ce2.forward(pool(), ctx, lrv, nv, lv);
  std::fill(g.begin(), g.end(), 7.0f);
  for (const std::int64_t wrong : {std::int64_t{v}, std::int64_t{-5}, std::int64_t{1} << 40}) {
    CAPTURE(wrong);
    bad[2] = wrong;
    CHECK_THROWS_WITH_AS(
        ce2.backward(pool(), ctx, lrv,
                     tk::HostView<const std::int64_t, 1>(bad.data(), tk::Extents<1>{{n}}),
                     mat(g.data(), n, v)),
        doctest::Contains("target"), tk::Error);
  }
  for (float gi : g) CHECK(gi == 7.0f);
}
