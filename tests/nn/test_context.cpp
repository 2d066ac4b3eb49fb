// Tests of the layers' forward contexts: a second forward with other inputs into another context
// (an evaluation batch between a training forward and its backward) leaves the first context's
// backward bit for bit as it is without it, for LayerNorm, CausalSelfAttention,
// SoftmaxCrossEntropy, TransformerBlock and Sequential; a kept context is refilled in place; a
// backward whose input does not match the forward of its context throws.
#include <doctest/doctest.h>

#include <cstdint>
#include <functional>
#include <vector>

#include <trainkit/core/tensor_view.hpp>
#include <trainkit/exec/host.hpp>
#include <trainkit/nn/activation.hpp>
#include <trainkit/nn/attention.hpp>
#include <trainkit/nn/cross_entropy.hpp>
#include <trainkit/nn/layer_norm.hpp>
#include <trainkit/nn/linear.hpp>
#include <trainkit/nn/param_arena.hpp>
#include <trainkit/nn/sequential.hpp>
#include <trainkit/nn/transformer_block.hpp>

#include "nn_test_util.hpp"

namespace {

namespace tk = trainkit;
namespace nn = trainkit::nn;
using Floats = std::vector<float>;

tk::exec::Host& pool() {
  static tk::exec::Host host(2);
  return host;
}

template <int R>
tk::HostView<float, R> view(Floats& v, tk::Extents<R> shape) {
  return tk::HostView<float, R>(v.data(), shape);
}

/// What one backward produced: the input gradient and the arena's whole gradient buffer.
struct Grads {
  Floats dx;
  Floats params;
};

/// Runs, for a layer with context type Ctx:
///   reference:   forward(a, xa) -> backward(a, xa, dy)
///   interleaved: forward(a, xa) -> forward(b, xb) -> backward(a, xa, dy) -> backward(b, xb, dy)
/// and checks that the interleaved backward of a (and of b) gives exactly the reference bits.
/// fwd(ctx, x, y) and bwd(ctx, x, dy, dx) call the layer; x, dx have in_n elements, y, dy out_n.
template <class Ctx>
void check_interleaved(nn::ParamArena<>& arena, std::int64_t in_n, std::int64_t out_n,
                       const std::function<void(Ctx&, Floats&, Floats&)>& fwd,
                       const std::function<void(const Ctx&, Floats&, Floats&, Floats&)>& bwd) {
  Floats xa = nntest::random_floats(in_n, 301, 2.0f);
  Floats xb = nntest::random_floats(in_n, 302, 2.0f);
  Floats dy = nntest::random_floats(out_n, 303);
  const auto run_alone = [&](Floats& x) {
    arena.zero_grad();
    Ctx ctx;
    Floats y(static_cast<std::size_t>(out_n)), dx(static_cast<std::size_t>(in_n));
    fwd(ctx, x, y);
    bwd(ctx, x, dy, dx);
    return Grads{dx, Floats(arena.grads_data(), arena.grads_data() + arena.buffer_numel())};
  };
  const Grads ref_a = run_alone(xa);
  const Grads ref_b = run_alone(xb);

  arena.zero_grad();
  Ctx a, b;
  Floats ya(static_cast<std::size_t>(out_n)), yb(ya.size());
  Floats dxa(static_cast<std::size_t>(in_n)), dxb(dxa.size());
  fwd(a, xa, ya);
  fwd(b, xb, yb);
  CHECK(ya != yb);  // the second forward saw other inputs
  bwd(a, xa, dy, dxa);
  CHECK(dxa == ref_a.dx);
  CHECK(Floats(arena.grads_data(), arena.grads_data() + arena.buffer_numel()) == ref_a.params);
  arena.zero_grad();
  bwd(b, xb, dy, dxb);
  CHECK(dxb == ref_b.dx);
  CHECK(Floats(arena.grads_data(), arena.grads_data() + arena.buffer_numel()) == ref_b.params);
}

/// check_interleaved for a layer whose input and output have one shape (x, y, dy, dx: `shape`).
template <class L, int R>
void check_same_shape_layer(nn::ParamArena<>& arena, L& layer, tk::Extents<R> shape) {
  using Ctx = nn::context_t<L>;
  std::int64_t n = 1;
  for (int d = 0; d < R; ++d) n *= shape[d];
  check_interleaved<Ctx>(
      arena, n, n,
      [&](Ctx& ctx, Floats& x, Floats& y) {
        layer.forward(pool(), ctx, view(x, shape), view(y, shape));
      },
      [&](const Ctx& ctx, Floats& x, Floats& dy, Floats& dx) {
        layer.backward(pool(), ctx, view(x, shape), view(dy, shape), view(dx, shape));
      });
}

}  // namespace

TEST_CASE("contexts: an evaluation forward between forward and backward changes nothing") {
  const std::int64_t B = 2, T = 7, C = 16, N = B * T;
  const tk::Extents<2> rows{{N, C}};
  const tk::Extents<3> cube{{B, T, C}};

  SUBCASE("LayerNorm") {
    nn::ParamArena<> arena;
    nn::LayerNorm ln(arena, "ln", {.features = C});
    arena.finalize();
    arena.initialize(1);
    check_same_shape_layer(arena, ln, rows);
  }

  SUBCASE("CausalSelfAttention") {
    nn::ParamArena<> arena;
    nn::CausalSelfAttention attn(arena, "attn", {.n_embd = C, .n_head = 4});
    arena.finalize();
    arena.initialize(2);
    check_same_shape_layer(arena, attn, cube);
  }

  SUBCASE("SoftmaxCrossEntropy") {
    nn::ParamArena<> arena;
    arena.finalize();
    nn::SoftmaxCrossEntropy ce;
    std::vector<std::int32_t> targets(static_cast<std::size_t>(N));
    for (std::int64_t i = 0; i < N; ++i) targets[std::size_t(i)] = i % 5 == 2 ? -100 : (i * 3) % C;
    const tk::HostView<const std::int32_t, 1> tv(targets.data(), tk::Extents<1>{{N}});
    using Ctx = decltype(ce)::Context;
    check_interleaved<Ctx>(
        arena, N * C, 1,
        [&](Ctx& ctx, Floats& logits, Floats& loss) {
          ce.forward(pool(), ctx, view(logits, rows), tv, view(loss, tk::Extents<1>{{1}}));
        },
        [&](const Ctx& ctx, Floats& logits, Floats& dloss, Floats& dlogits) {
          ce.backward(pool(), ctx, view(logits, rows), tv, view(dlogits, rows), 1.0f + dloss[0]);
        });
  }
  SUBCASE("TransformerBlock") {
    nn::ParamArena<> arena;
    nn::TransformerBlock block(arena, "h.0", {.n_embd = C, .n_head = 2});
    arena.finalize();
    arena.initialize(3);
    check_same_shape_layer(arena, block, cube);
  }

  SUBCASE("Sequential") {
    nn::ParamArena<> arena;
    nn::Sequential net{nn::Linear(arena, "0", {.in_features = C, .out_features = 24}),
                       nn::LayerNorm(arena, "1", {.features = 24}), nn::GELU{},
                       nn::Linear(arena, "3", {.in_features = 24, .out_features = 5})};
    arena.finalize();
    arena.initialize(4);
    using Ctx = decltype(net)::Context;
    const tk::Extents<2> out{{N, 5}};
    check_interleaved<Ctx>(
        arena, N * C, N * 5,
        [&](Ctx& ctx, Floats& x, Floats& y) {
          net.forward(pool(), ctx, view(x, rows), view(y, out));
        },
        [&](const Ctx& ctx, Floats& x, Floats& dy, Floats& dx) {
          net.backward(pool(), ctx, view(x, rows), view(dy, out), view(dx, rows));
        });
  }
}

TEST_CASE("contexts: a kept context is refilled in place; mismatched backwards throw") {
  const std::int64_t B = 2, T = 9, C = 8, N = B * T;
  nn::ParamArena<> arena;
  nn::LayerNorm ln(arena, "ln", {.features = C});
  nn::CausalSelfAttention attn(arena, "attn", {.n_embd = C, .n_head = 2});
  arena.finalize();
  arena.initialize(5);
  Floats x = nntest::random_floats(N * C, 311), y(x.size()), dx(x.size());
  const tk::Extents<2> rows{{N, C}};
  const tk::Extents<3> cube{{B, T, C}};

  decltype(ln)::Context lc;
  CHECK(lc.rows() == 0);
  CHECK_THROWS_WITH_AS(ln.backward(pool(), lc, view(x, rows), view(y, rows), view(dx, rows)),
                       doctest::Contains("not filled by a forward"), tk::Error);
  ln.forward(pool(), lc, view(x, rows), view(y, rows));
  const float* mean = lc.mean();
  ln.forward(pool(), lc, view(x, rows), view(y, rows));
  CHECK(lc.mean() == mean);  // same size: no new allocation
  CHECK(lc.rows() == N);
  // A backward of fewer rows than the forward of its context.
  const tk::Extents<2> fewer{{N - 1, C}};
  CHECK_THROWS_WITH_AS(ln.backward(pool(), lc, view(x, fewer), view(y, fewer), view(dx, fewer)),
                       doctest::Contains("[18, 8]"), tk::Error);

  decltype(attn)::Context ac;
  attn.forward(pool(), ac, view(x, cube), view(y, cube));
  const float* probs = ac.probs<float>();
  attn.forward(pool(), ac, view(x, tk::Extents<3>{{1, T, C}}), view(y, tk::Extents<3>{{1, T, C}}));
  CHECK(ac.probs<float>() == probs);  // smaller: the buffer is kept
  CHECK_THROWS_AS(attn.backward(pool(), ac, view(x, cube), view(y, cube), view(dx, cube)),
                  tk::Error);
}
