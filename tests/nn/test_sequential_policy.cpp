// Tests of nn::Sequential (compile-time stacks; PyTorch parity of an MLP + cross-entropy step) and
// of the amp precision policies: a 2-layer MLP step under Fp32, Tf32, Bf16 and Fp16 matches the
// f32 step within each policy's tolerance; the compile-time traits behave as documented.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <type_traits>
#include <vector>

#include <trainkit/amp/policy.hpp>
#include <trainkit/amp/scaler_fwd.hpp>
#include <trainkit/core/half.hpp>
#include <trainkit/exec/host.hpp>
#include <trainkit/nn/activation.hpp>
#include <trainkit/nn/cross_entropy.hpp>
#include <trainkit/nn/dropout.hpp>
#include <trainkit/nn/layer_norm.hpp>
#include <trainkit/nn/linear.hpp>
#include <trainkit/nn/param_arena.hpp>
#include <trainkit/nn/sequential.hpp>

#include "nn_test_util.hpp"

namespace {

namespace tk = trainkit;
namespace nn = trainkit::nn;
namespace amp = trainkit::amp;
using nntest::Reference;
using nntest::rel_err;

tk::exec::Host& pool() {
  static tk::exec::Host host(2);
  return host;
}

/// A scaler type for the compile-time checks (the real GradScaler comes with its own header).
struct FakeScaler {
  static constexpr bool scales_loss = true;
  static constexpr bool dynamic = true;
};

static_assert(std::is_same_v<amp::compute_t<amp::Bf16, amp::OpClass::kMatmul>, tk::bf16>);
static_assert(std::is_same_v<amp::compute_t<amp::Bf16, amp::OpClass::kAttention>, tk::bf16>);
static_assert(std::is_same_v<amp::compute_t<amp::Bf16, amp::OpClass::kNorm>, float>);
static_assert(std::is_same_v<amp::compute_t<amp::Fp16, amp::OpClass::kSoftmax>, float>);
static_assert(std::is_same_v<amp::compute_t<amp::Fp16, amp::OpClass::kLoss>, float>);
static_assert(std::is_same_v<amp::compute_t<amp::Fp16, amp::OpClass::kReduction>, float>);
static_assert(std::is_same_v<amp::compute_t<amp::Fp16, amp::OpClass::kElementwise>, tk::f16>);
static_assert(std::is_same_v<amp::compute_t<amp::Tf32, amp::OpClass::kMatmul>, float>);
static_assert(amp::Tf32::gemm_compute == tk::blas::ComputeType::kTf32);
static_assert(amp::uses_compute_copy_v<amp::Bf16> && !amp::uses_compute_copy_v<amp::Tf32>);
static_assert(!amp::is_loss_scaler_v<amp::NoScaler> && amp::is_loss_scaler_v<FakeScaler>);
static_assert(amp::is_dynamic_loss_scaler_v<FakeScaler>);
static_assert(!amp::is_loss_scaler_v<int>);
static_assert(amp::grad_compatible_v<float> && !amp::grad_compatible_v<tk::f16> &&
              !amp::grad_compatible_v<tk::bf16>);
// The positive forms of the compile-fail tests (tests/compile_fail/nn_*.cpp).
static_assert(std::is_same_v<amp::Precision<amp::Fp16, FakeScaler>::activation, tk::f16>);
static_assert(std::is_same_v<amp::Precision<amp::Bf16>::scaler, amp::NoScaler>);
static_assert(std::is_same_v<amp::Precision<amp::Fp32>::compute<amp::OpClass::kMatmul>, float>);

template <class T>
std::vector<T> convert(const std::vector<float>& v) {
  std::vector<T> out;
  for (float x : v) out.push_back(T(x));
  return out;
}

}  // namespace

TEST_CASE("Sequential: MLP + cross-entropy step matches PyTorch") {
  const Reference& ref = Reference::get();
  nn::ParamArena<> arena;
  nn::Sequential net{nn::Linear(arena, "0", {.in_features = 6, .out_features = 9}), nn::ReLU{},
                     nn::Linear(arena, "2", {.in_features = 9, .out_features = 4})};
  arena.finalize();
  nntest::load_params(arena, "mlp");
  CHECK(net.out_features(6) == 4);
  CHECK(arena.infos()[0].name == "0.weight");  // registered in layer order
  CHECK(arena.infos()[3].name == "2.bias");
  CHECK(net.get<0>().out_features() == 9);
  CHECK_THROWS_AS(net.out_features(5), tk::Error);
  auto x = nntest::tensor_of(ref["mlp/x"]);
  std::vector<std::int64_t> t;
  for (double v : ref["mlp/targets"].values) t.push_back(static_cast<std::int64_t>(v));
  tk::Tensor<float> logits(tk::Shape{8, 4}), dlogits(tk::Shape{8, 4});
  float loss = 0.0f;
  nn::SoftmaxCrossEntropy ce;
  const tk::HostView<const std::int64_t, 1> tv(t.data(), tk::Extents<1>{{8}});
  decltype(net)::Context ctx;
  decltype(ce)::Context ce_ctx;
  net.forward(pool(), ctx, x.view<2>(), logits.view<2>());
  ce.forward(pool(), ce_ctx, logits.view<2>(), tv, tk::make_view(&loss, {1}));
  ce.backward(pool(), ce_ctx, logits.view<2>(), tv, dlogits.view<2>());
  net.backward(pool(), ctx, x.view<2>(), dlogits.view<2>(), tk::HostView<float, 2>());
  CHECK(loss == doctest::Approx(ref["mlp/loss"].values[0]).epsilon(1e-6));
  nntest::check_grads(arena, "mlp", 1e-5);

  // With dx: the first layer's input gradient (parameter grads accumulate a second time).
  tk::Tensor<float> dx(tk::Shape{8, 6});
  net.backward(pool(), ctx, x.view<2>(), dlogits.view<2>(), dx.view<2>());
  tk::Tensor<float> h(tk::Shape{8, 9}), r(tk::Shape{8, 9}), dr(tk::Shape{8, 9}),
      dh(tk::Shape{8, 9}), dx2(tk::Shape{8, 6});
  net.get<0>().forward(pool(), x.view<2>(), h.view<2>());
  net.get<1>().forward(pool(), h.view<2>(), r.view<2>());
  net.get<2>().backward(pool(), r.view<2>(), dlogits.view<2>(), dr.view<2>());
  net.get<1>().backward(pool(), h.view<2>(), dr.view<2>(), dh.view<2>());
  net.get<0>().backward(pool(), x.view<2>(), dh.view<2>(), dx2.view<2>());
  CHECK(rel_err(dx.data(), dx2.data(), 48) == 0.0);
  CHECK_THROWS_AS(net.backward(pool(), ctx, x.view<2>(), dlogits.view<2>(),
                               tk::Tensor<float>(tk::Shape{8, 5}).view<2>()),
                  tk::Error);
}

TEST_CASE("Sequential: parameters registered out of layer order are rejected") {
  nn::ParamArena<> arena;
  nn::Linear second(arena, "1", {.in_features = 3, .out_features = 2});
  nn::Linear first(arena, "0", {.in_features = 4, .out_features = 3});
  CHECK_THROWS_WITH_AS((nn::Sequential{first, nn::ReLU{}, second}), doctest::Contains("braces"),
                       tk::Error);
  CHECK_NOTHROW((nn::Sequential{second}));
  CHECK(arena.infos()[0].name == "1.weight");
}

TEST_CASE("Sequential: a layer with a tied weight passes the order check") {
  nn::ParamArena<> arena;
  nn::Linear emb(arena, "wte", {.in_features = 4, .out_features = 10, .bias = false});
  // A head tied to an earlier parameter (without a bias it owns nothing).
  CHECK_NOTHROW((nn::Sequential{
      nn::LayerNorm(arena, "ln_f", {.features = 4}),
      nn::Linear(
          arena, "lm_head",
          {.in_features = 4, .out_features = 10, .bias = false, .tied_weight = emb.weight()})}));
  // Two layers sharing a weight: the second's own parameter is its bias.
  nn::ParamArena<> a2;
  nn::Linear l0(a2, "0", {.in_features = 4, .out_features = 4});
  CHECK_NOTHROW((nn::Sequential{
      l0, nn::Linear(a2, "1", {.in_features = 4, .out_features = 4, .tied_weight = l0.weight()})}));
  // Out of order still fails when the later layer's own parameter came first.
  nn::ParamArena<> a3;
  nn::Linear shared(a3, "s", {.in_features = 4, .out_features = 4, .bias = false});
  nn::Linear second(a3, "1", {.in_features = 4, .out_features = 4, .tied_weight = shared.weight()});
  nn::Linear first(a3, "0", {.in_features = 4, .out_features = 4});
  CHECK_THROWS_WITH_AS((nn::Sequential{first, second}), doctest::Contains("braces"), tk::Error);
  CHECK_NOTHROW((nn::Sequential{second, first}));
}

TEST_CASE("Sequential: LayerNorm, GELU and Dropout (eval) stack") {
  nn::ParamArena<> arena;
  nn::Sequential net{nn::Linear(arena, "a", {.in_features = 5, .out_features = 12}),
                     nn::LayerNorm(arena, "ln", {.features = 12}), nn::GELU{},
                     nn::Dropout({.p = 0.5f}),
                     nn::Linear(arena, "b", {.in_features = 12, .out_features = 3})};
  arena.finalize();
  arena.initialize(4);
  net.get<3>().eval();
  const auto x = nntest::random_floats(7 * 5, 81);
  std::vector<float> y(21), y2(21);
  const tk::HostView<const float, 2> xv(x.data(), tk::Extents<2>{{7, 5}});
  decltype(net)::Context ctx;
  net.forward(pool(), ctx, xv, tk::HostView<float, 2>(y.data(), tk::Extents<2>{{7, 3}}));
  // The same computation by hand.
  std::vector<float> h(7 * 12), g(7 * 12);
  const tk::HostView<float, 2> hv(h.data(), tk::Extents<2>{{7, 12}}),
      gv(g.data(), tk::Extents<2>{{7, 12}});
  net.get<0>().forward(pool(), xv, hv);
  nn::LayerNorm<>::Context ln_ctx;
  net.get<1>().forward(pool(), ln_ctx, tk::HostView<const float, 2>(hv), gv);
  net.get<2>().forward(pool(), gv, hv);
  net.get<4>().forward(pool(), hv, tk::HostView<float, 2>(y2.data(), tk::Extents<2>{{7, 3}}));
  CHECK(y == y2);
}

TEST_CASE("Sequential: backward checks x, dy and dx first, so a refused call adds no gradient") {
  // The first layer runs last in backward: a dx (or x) it would refuse must be refused before
  // the later layers add their gradients.
  const std::int64_t n = 4, c = 6;
  const auto x = nntest::random_floats(n * c, 31);
  const auto dy = nntest::random_floats(n * 3, 32);
  const auto view = [](const float* p, std::int64_t rows, std::int64_t cols, std::int64_t ld) {
    return tk::HostView<const float, 2>(p, tk::Extents<2>{{rows, cols}}, tk::Extents<2>{{ld, 1}});
  };
  const auto out = [](float* p, std::int64_t rows, std::int64_t cols, std::int64_t ld) {
    return tk::HostView<float, 2>(p, tk::Extents<2>{{rows, cols}}, tk::Extents<2>{{ld, 1}});
  };
  const auto no_grads = [](const nn::ParamArena<>& arena) {
    return std::all_of(arena.grads_data(), arena.grads_data() + arena.buffer_numel(),
                       [](float g) { return g == 0.0f; });
  };

  SUBCASE("LayerNorm first: padded dx, dx over x in part") {
    nn::ParamArena<> arena;
    nn::Sequential net{nn::LayerNorm(arena, "ln", {.features = c}),
                       nn::Linear(arena, "fc", {.in_features = c, .out_features = 3})};
    arena.finalize();
    arena.initialize(5);
    decltype(net)::Context ctx;
    std::vector<float> y(n * 3);
    net.forward(pool(), ctx, view(x.data(), n, c, c), out(y.data(), n, 3, 3));
    std::vector<float> padded(n * 8);
    CHECK_THROWS_WITH_AS(
        net.backward(pool(), ctx, view(x.data(), n, c, c), view(dy.data(), n, 3, 3),
                     out(padded.data(), n, c, 8)),
        doctest::Contains("nn::Sequential::backward: dx with shape [4, 6] and strides [8, 1] "
                          "must be contiguous (row-major, dense) for layer 0 (nn::LayerNorm)"),
        tk::Error);
    CHECK(no_grads(arena));
    std::vector<float> buf((n + 1) * c);
    std::copy(x.begin(), x.end(), buf.begin());
    CHECK_THROWS_WITH_AS(net.backward(pool(), ctx, view(buf.data(), n, c, c),
                                      view(dy.data(), n, 3, 3), out(buf.data() + c, n, c, c)),
                         doctest::Contains("nn::Sequential::backward: dx [4, 6] partly overlaps x "
                                           "[4, 6], which layer 0 (nn::LayerNorm) reads"),
                         tk::Error);
    CHECK(no_grads(arena));
    // dx over x itself stays allowed: the bits of a separate dx.
    std::vector<float> dx(n * c), same = x;
    net.backward(pool(), ctx, view(x.data(), n, c, c), view(dy.data(), n, 3, 3),
                 out(dx.data(), n, c, c));
    const std::vector<float> want(arena.grads_data(), arena.grads_data() + arena.buffer_numel());
    arena.zero_grad();
    net.backward(pool(), ctx, view(same.data(), n, c, c), view(dy.data(), n, 3, 3),
                 out(same.data(), n, c, c));
    CHECK(same == dx);
    CHECK(std::equal(want.begin(), want.end(), arena.grads_data()));
  }

  SUBCASE("Linear first: rows that overlap are refused, padded rows give the dense bits") {
    nn::ParamArena<> arena;
    nn::Sequential net{nn::Linear(arena, "a", {.in_features = c, .out_features = 5}), nn::ReLU{},
                       nn::Linear(arena, "b", {.in_features = 5, .out_features = 3})};
    arena.finalize();
    arena.initialize(6);
    decltype(net)::Context ctx;
    std::vector<float> y(n * 3);
    net.forward(pool(), ctx, view(x.data(), n, c, c), out(y.data(), n, 3, 3));
    std::vector<float> dx(n * c);
    CHECK_THROWS_WITH_AS(net.backward(pool(), ctx, view(x.data(), n, c, c),
                                      view(dy.data(), n, 3, 3), out(dx.data(), n, c, 3)),
                         doctest::Contains("nn::Sequential::backward: dx with shape [4, 6] and "
                                           "strides [3, 1] must have dense rows (column stride 1, "
                                           "row stride >= its width) for layer 0 (nn::Linear)"),
                         tk::Error);
    CHECK(no_grads(arena));
    CHECK_THROWS_WITH_AS(net.backward(pool(), ctx, view(x.data(), n, c, 2),
                                      view(dy.data(), n, 3, 3), tk::HostView<float, 2>()),
                         doctest::Contains("nn::Sequential::backward: x with shape [4, 6] and "
                                           "strides [2, 1] must have dense rows"),
                         tk::Error);
    CHECK(no_grads(arena));
    // x and dx with padded rows (and a padded dy for the last Linear): the bits of dense views.
    net.backward(pool(), ctx, view(x.data(), n, c, c), view(dy.data(), n, 3, 3),
                 out(dx.data(), n, c, c));
    const std::vector<float> want(arena.grads_data(), arena.grads_data() + arena.buffer_numel());
    arena.zero_grad();
    std::vector<float> xp(n * 9), dyp(n * 4), dxp(n * 9, -1.0f);
    for (std::int64_t i = 0; i < n; ++i) {
      std::copy_n(x.begin() + i * c, c, xp.begin() + i * 9);
      std::copy_n(dy.begin() + i * 3, 3, dyp.begin() + i * 4);
    }
    net.backward(pool(), ctx, view(xp.data(), n, c, 9), view(dyp.data(), n, 3, 4),
                 out(dxp.data(), n, c, 9));
    CHECK(std::equal(want.begin(), want.end(), arena.grads_data()));
    for (std::int64_t i = 0; i < n; ++i)
      CHECK(std::equal(dx.begin() + i * c, dx.begin() + (i + 1) * c, dxp.begin() + i * 9));
  }

  SUBCASE("a Sequential first and a ReLU last: named through the nested stack") {
    nn::ParamArena<> arena;
    nn::Sequential net{nn::Sequential{nn::LayerNorm(arena, "ln", {.features = c}), nn::GELU{}},
                       nn::Linear(arena, "fc", {.in_features = c, .out_features = 3}), nn::ReLU{}};
    arena.finalize();
    arena.initialize(7);
    decltype(net)::Context ctx;
    std::vector<float> y(n * 3);
    net.forward(pool(), ctx, view(x.data(), n, c, c), out(y.data(), n, 3, 3));
    std::vector<float> padded(n * 8);
    CHECK_THROWS_WITH_AS(net.backward(pool(), ctx, view(x.data(), n, c, c),
                                      view(dy.data(), n, 3, 3), out(padded.data(), n, c, 8)),
                         doctest::Contains("for layer 0 (nn::Sequential, whose layer 0 is "
                                           "nn::LayerNorm)"),
                         tk::Error);
    CHECK(no_grads(arena));
    std::vector<float> dyp(n * 4);
    CHECK_THROWS_WITH_AS(net.backward(pool(), ctx, view(x.data(), n, c, c),
                                      view(dyp.data(), n, 3, 4), tk::HostView<float, 2>()),
                         doctest::Contains("nn::Sequential::backward: dy with shape [4, 3] and "
                                           "strides [4, 1] must be contiguous (row-major, dense) "
                                           "for layer 2 (nn::ReLU)"),
                         tk::Error);
    CHECK(no_grads(arena));
  }
}

namespace {

template <class P>
std::vector<float> policy_step(float* loss_out) {
  using T = amp::activation_t<P>;
  const std::int64_t n = 32, in = 48, hidden = 64, classes = 10;
  nn::ParamArena<> arena;
  nn::Sequential net{nn::Linear(arena, "0", {.in_features = in, .out_features = hidden}),
                     nn::ReLU{},
                     nn::Linear(arena, "2", {.in_features = hidden, .out_features = classes})};
  arena.finalize();
  arena.initialize(2024);
  if constexpr (amp::uses_compute_copy_v<P>) arena.refresh_compute_copy<T>(pool());
  const auto xf = nntest::random_floats(n * in, 91);
  const auto x = convert<T>(xf);
  std::vector<std::int32_t> targets(static_cast<std::size_t>(n));
  for (std::int64_t i = 0; i < n; ++i)
    targets[std::size_t(i)] = static_cast<std::int32_t>((i * 7) % classes);
  std::vector<T> logits(static_cast<std::size_t>(n * classes)), dlogits(logits.size());
  const tk::HostView<const T, 2> xv(x.data(), tk::Extents<2>{{n, in}});
  const tk::HostView<T, 2> lv(logits.data(), tk::Extents<2>{{n, classes}});
  const tk::HostView<T, 2> dlv(dlogits.data(), tk::Extents<2>{{n, classes}});
  const tk::HostView<const std::int32_t, 1> tv(targets.data(), tk::Extents<1>{{n}});
  nn::SoftmaxCrossEntropy ce;
  typename decltype(net)::Context ctx;
  typename decltype(ce)::Context ce_ctx;
  net.template forward<P>(pool(), ctx, xv, lv);
  ce.template forward<P>(pool(), ce_ctx, tk::HostView<const T, 2>(lv), tv,
                         tk::make_view(loss_out, {1}));
  ce.template backward<P>(pool(), ce_ctx, tk::HostView<const T, 2>(lv), tv, dlv);
  net.template backward<P>(pool(), ctx, xv, tk::HostView<const T, 2>(dlv), tk::HostView<T, 2>());
  return std::vector<float>(arena.grads_data(), arena.grads_data() + arena.buffer_numel());
}

template <class P>
void check_policy() {
  float ref_loss = 0.0f, loss = 0.0f;
  const auto ref = policy_step<amp::Fp32>(&ref_loss);
  const auto got = policy_step<P>(&loss);
  const double err = rel_err(got.data(), ref.data(), static_cast<std::int64_t>(ref.size()));
  INFO(std::string(P::name), ": grad rel err ", err, ", loss ", loss, " vs ", ref_loss);
  CHECK(err < P::tolerance);
  CHECK(std::abs(loss - ref_loss) < P::tolerance * std::abs(ref_loss) + 1e-6);
  if constexpr (!std::is_same_v<P, amp::Fp32> && !std::is_same_v<P, amp::Tf32>) {
    // A low-precision step is not accidentally the f32 one.
    CHECK(err > 1e-6);
  }
}

}  // namespace

TEST_CASE("Policies: a 2-layer MLP step under each policy matches the f32 step") {
  check_policy<amp::Fp32>();
  check_policy<amp::Tf32>();  // TF32 is a tensor-core mode: the host computes full f32
  check_policy<amp::Bf16>();
  check_policy<amp::Fp16>();
}
