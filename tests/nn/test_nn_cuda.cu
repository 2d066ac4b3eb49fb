// CUDA tests of nn/: every layer's device forward/backward against the host implementation (the
// oracle), device ParamArena initialisation and compute copies bit-identical to the host's,
// identical dropout masks, and a bf16/tf32 step on the GPU against the f32 one.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <vector>

#include <trainkit/amp/policy.hpp>
#include <trainkit/core/copy.hpp>
#include <trainkit/core/half.hpp>
#include <trainkit/core/tensor.hpp>
#include <trainkit/exec/cuda.hpp>
#include <trainkit/exec/host.hpp>
#include <trainkit/nn/activation.hpp>
#include <trainkit/nn/attention.hpp>
#include <trainkit/nn/cross_entropy.hpp>
#include <trainkit/nn/dropout.hpp>
#include <trainkit/nn/embedding.hpp>
#include <trainkit/nn/layer_norm.hpp>
#include <trainkit/nn/linear.hpp>
#include <trainkit/nn/param_arena.hpp>
#include <trainkit/nn/sequential.hpp>
#include <trainkit/nn/transformer_block.hpp>

#include "fused_attention_emulation.hpp"
#include "nn_test_util.hpp"

namespace {

namespace tk = trainkit;
namespace nn = trainkit::nn;
namespace amp = trainkit::amp;
using nntest::rel_err;

tk::exec::Host& host() {
  static tk::exec::Host h(2);
  return h;
}

// The legacy default stream: cudaMemcpy (tk::copy) orders itself after the kernels on it.
const tk::exec::Cuda gpu{};

template <class T>
tk::Tensor<T, tk::Space::kDevice> to_device(const std::vector<T>& v, tk::Shape shape) {
  tk::Tensor<T, tk::Space::kDevice> d(shape);
  TRAINKIT_CUDA_CHECK(cudaMemcpy(d.data(), v.data(), v.size() * sizeof(T), cudaMemcpyHostToDevice));
  return d;
}

template <class T>
std::vector<T> to_host(const T* p, std::int64_t n) {
  std::vector<T> v(static_cast<std::size_t>(n));
  TRAINKIT_CUDA_CHECK(cudaMemcpy(v.data(), p, v.size() * sizeof(T), cudaMemcpyDeviceToHost));
  return v;
}

template <class T, tk::Space S>
std::vector<float> as_float(const tk::Tensor<T, S>& t) {
  std::vector<float> out;
  if constexpr (S == tk::Space::kDevice) {
    for (const T& v : to_host(t.data(), t.numel())) out.push_back(static_cast<float>(v));
  } else {
    for (std::int64_t i = 0; i < t.numel(); ++i) out.push_back(static_cast<float>(t.data()[i]));
  }
  return out;
}

std::vector<float> grads_of(const nn::ParamArena<tk::Space::kDevice>& arena) {
  return to_host(arena.grads_data(), arena.buffer_numel());
}
std::vector<float> grads_of(const nn::ParamArena<>& arena) {
  return std::vector<float>(arena.grads_data(), arena.grads_data() + arena.buffer_numel());
}

double err(const std::vector<float>& a, const std::vector<float>& b) {
  REQUIRE(a.size() == b.size());
  return rel_err(a.data(), b.data(), static_cast<std::int64_t>(a.size()));
}

/// Runs `model(arena, exec, in, out, dout, din)` on a host and a device arena initialised alike
/// and compares outputs, input gradients and parameter gradients.
template <class Build, class Run>
void compare(const char* what, Build build, Run run, tk::Shape in_shape, tk::Shape out_shape,
             double tol) {
  nn::ParamArena<> ha;
  nn::ParamArena<tk::Space::kDevice> da;
  auto hm = build(ha);
  auto dm = build(da);
  ha.finalize();
  da.finalize();
  ha.initialize(42);
  da.initialize(42);
  const auto x = nntest::random_floats(in_shape.numel(), 1);
  const auto dy = nntest::random_floats(out_shape.numel(), 2);
  tk::Tensor<float> hx(in_shape), hy(out_shape), hdy(out_shape), hdx(in_shape);
  std::copy(x.begin(), x.end(), hx.data());
  std::copy(dy.begin(), dy.end(), hdy.data());
  auto dx_ = to_device(x, in_shape);
  auto ddy = to_device(dy, out_shape);
  tk::Tensor<float, tk::Space::kDevice> dyv(out_shape), ddx(in_shape);
  run(hm, host(), hx, hy, hdy, hdx);
  run(dm, gpu, dx_, dyv, ddy, ddx);
  TRAINKIT_CUDA_CHECK(cudaDeviceSynchronize());
  INFO(what);
  CHECK(err(as_float(dyv), as_float(hy)) < tol);
  CHECK(err(as_float(ddx), as_float(hdx)) < tol);
  CHECK(err(grads_of(da), grads_of(ha)) < tol);
}

}  // namespace

TEST_CASE("device ParamArena: same initial values, compute copies and zero_grad as the host") {
  nn::ParamArena<> ha;
  nn::ParamArena<tk::Space::kDevice> da;
  for (auto* names : {"a", "b"}) {
    ha.add(names, tk::Shape{33, 17}, nn::Init::kaiming_uniform(2.2f));
    da.add(names, tk::Shape{33, 17}, nn::Init::kaiming_uniform(2.2f));
  }
  ha.finalize();
  da.finalize();
  ha.initialize(7);
  da.initialize(7);
  CHECK(to_host(da.params_data(), da.buffer_numel()) ==
        std::vector<float>(ha.params_data(), ha.params_data() + ha.buffer_numel()));
  ha.refresh_compute_copy<tk::bf16>(host());
  da.refresh_compute_copy<tk::bf16>(gpu);
  const auto dc = to_host(da.compute_copy<tk::bf16>().data(), da.buffer_numel());
  const auto hc = ha.compute_copy<tk::bf16>();
  bool same = true;
  for (std::int64_t i = 0; i < ha.buffer_numel(); ++i)
    same = same && dc[std::size_t(i)].bits() == hc[i].bits();
  CHECK(same);
  TRAINKIT_CUDA_CHECK(cudaMemset(da.grads_data(), 0xff, sizeof(float) * 4));
  da.zero_grad(gpu);
  TRAINKIT_CUDA_CHECK(cudaDeviceSynchronize());
  CHECK(to_host(da.grads_data(), 4) == std::vector<float>(4, 0.0f));
  nn::ParamArena<> back;
  back.add("a", tk::Shape{33, 17});
  back.add("b", tk::Shape{33, 17});
  back.finalize();
  back.copy_params_from(da);
  CHECK(back.params_data()[100] == ha.params_data()[100]);
}

TEST_CASE("device layers match the host layers (f32)") {
  using Dev = tk::Space;
  compare(
      "Linear",
      [](auto& arena) { return nn::Linear(arena, "fc", {.in_features = 40, .out_features = 24}); },
      [](auto& m, const auto& ex, auto& x, auto& y, auto& dy, auto& dx) {
        m.forward(ex, x.template view<2>(), y.template view<2>());
        m.backward(ex, x.template view<2>(), dy.template view<2>(), dx.template view<2>());
      },
      tk::Shape{37, 40}, tk::Shape{37, 24}, 1e-5);
  compare(
      "LayerNorm", [](auto& arena) { return nn::LayerNorm(arena, "ln", {.features = 72}); },
      [](auto& m, const auto& ex, auto& x, auto& y, auto& dy, auto& dx) {
        typename std::remove_reference_t<decltype(m)>::Context ctx;
        m.forward(ex, ctx, x.template view<2>(), y.template view<2>());
        m.backward(ex, ctx, x.template view<2>(), dy.template view<2>(), dx.template view<2>());
      },
      tk::Shape{100, 72}, tk::Shape{100, 72}, 1e-5);
  compare(
      "GELU", [](auto&) { return nn::GELU{}; },
      [](auto& m, const auto& ex, auto& x, auto& y, auto& dy, auto& dx) {
        m.forward(ex, x.template view<2>(), y.template view<2>());
        m.backward(ex, x.template view<2>(), dy.template view<2>(), dx.template view<2>());
      },
      tk::Shape{50, 31}, tk::Shape{50, 31}, 1e-6);
  compare(
      "Linear+GELU fused pair",
      [](auto& arena) {
        using A = std::remove_reference_t<decltype(arena)>;
        struct Pair {
          nn::Linear<A::space> fc, proj;
          tk::Tensor<float, A::space> pre, g, dpre;
        };
        return Pair{nn::Linear(arena, "c_fc", {.in_features = 16, .out_features = 64}),
                    nn::Linear(arena, "c_proj", {.in_features = 64, .out_features = 16}),
                    tk::Tensor<float, A::space>(tk::Shape{9, 64}),
                    tk::Tensor<float, A::space>(tk::Shape{9, 64}),
                    tk::Tensor<float, A::space>(tk::Shape{9, 64})};
      },
      [](auto& m, const auto& ex, auto& x, auto& y, auto& dy, auto& dx) {
        m.fc.forward_gelu(ex, x.template view<2>(), m.pre.template view<2>(),
                          m.g.template view<2>());
        m.proj.forward(ex, m.g.template view<2>(), y.template view<2>());
        m.proj.backward_dgelu(ex, m.g.template view<2>(), dy.template view<2>(),
                              m.pre.template view<2>(), m.dpre.template view<2>());
        m.fc.backward(ex, x.template view<2>(), m.dpre.template view<2>(), dx.template view<2>());
      },
      tk::Shape{9, 16}, tk::Shape{9, 16}, 1e-5);
  compare(
      "CausalSelfAttention",
      [](auto& arena) {
        return nn::CausalSelfAttention(arena, "attn", {.n_embd = 32, .n_head = 4});
      },
      [](auto& m, const auto& ex, auto& x, auto& y, auto& dy, auto& dx) {
        typename std::remove_reference_t<decltype(m)>::Context ctx;
        m.forward(ex, ctx, x.template view<3>(), y.template view<3>());
        m.backward(ex, ctx, x.template view<3>(), dy.template view<3>(), dx.template view<3>());
      },
      tk::Shape{3, 17, 32}, tk::Shape{3, 17, 32}, 1e-5);
  // Past one 64-position tile of the fused core (ragged last tile), at head sizes 64 and 96
  // (tile depths 64 and 128), and the materialised core the option still offers.
  struct AttentionCase {
    const char* what;
    std::int64_t T, C;
    bool fused;
  };
  for (const AttentionCase& c :
       {AttentionCase{"CausalSelfAttention, fused core, T 150, hs 64", 150, 128, true},
        AttentionCase{"CausalSelfAttention, materialised core, T 150, hs 64", 150, 128, false},
        AttentionCase{"CausalSelfAttention, fused core, T 70, hs 96", 70, 192, true}}) {
    compare(
        c.what,
        [&c](auto& arena) {
          return nn::CausalSelfAttention(arena, "attn",
                                         {.n_embd = c.C, .n_head = 2, .fused_core = c.fused});
        },
        [](auto& m, const auto& ex, auto& x, auto& y, auto& dy, auto& dx) {
          typename std::remove_reference_t<decltype(m)>::Context ctx;
          m.forward(ex, ctx, x.template view<3>(), y.template view<3>());
          m.backward(ex, ctx, x.template view<3>(), dy.template view<3>(), dx.template view<3>());
        },
        tk::Shape{2, c.T, c.C}, tk::Shape{2, c.T, c.C}, 1e-5);
  }
  compare(
      "TransformerBlock",
      [](auto& arena) { return nn::TransformerBlock(arena, "h.0", {.n_embd = 64, .n_head = 4}); },
      [](auto& m, const auto& ex, auto& x, auto& y, auto& dy, auto& dx) {
        typename std::remove_reference_t<decltype(m)>::Context ctx;
        m.forward(ex, ctx, x.template view<3>(), y.template view<3>());
        m.backward(ex, ctx, x.template view<3>(), dy.template view<3>(), dx.template view<3>());
      },
      tk::Shape{2, 24, 64}, tk::Shape{2, 24, 64}, 1e-5);
  (void)sizeof(Dev);
}

TEST_CASE("device Dropout, Embedding and SoftmaxCrossEntropy") {
  const std::int64_t n = 5000;
  const auto x = nntest::random_floats(n, 3);
  auto dx_ = to_device(x, tk::Shape{n});
  tk::Tensor<float, tk::Space::kDevice> dy(tk::Shape{n});
  std::vector<float> hy(static_cast<std::size_t>(n));
  nn::Dropout drop({.p = 0.3f, .seed = 9, .site = 2});
  drop.set_step(11);
  drop.forward(gpu, dx_.view<1>(), dy.view<1>());
  drop.forward(host(), tk::HostView<const float, 1>(x.data(), tk::Extents<1>{{n}}),
               tk::HostView<float, 1>(hy.data(), tk::Extents<1>{{n}}));
  CHECK(to_host(dy.data(), n) == hy);  // the same mask, bit for bit

  nn::ParamArena<> ha;
  nn::ParamArena<tk::Space::kDevice> da;
  nn::Embedding he(ha, "wte", {.num_embeddings = 50, .embedding_dim = 24});
  nn::Embedding de(da, "wte", {.num_embeddings = 50, .embedding_dim = 24});
  ha.finalize();
  da.finalize();
  ha.initialize(1);
  da.initialize(1);
  std::vector<std::int32_t> ids(300);
  for (std::size_t i = 0; i < ids.size(); ++i) ids[i] = static_cast<std::int32_t>((i * 7) % 13);
  auto did = to_device(ids, tk::Shape{300});
  const auto g = nntest::random_floats(300 * 24, 4);
  auto dg = to_device(g, tk::Shape{300, 24});
  tk::Tensor<float> ho(tk::Shape{300, 24});
  tk::Tensor<float, tk::Space::kDevice> dout(tk::Shape{300, 24});
  const tk::HostView<const std::int32_t, 1> hid(ids.data(), tk::Extents<1>{{300}});
  he.forward(host(), hid, ho.view<2>());
  de.forward(gpu, did.view<1>(), dout.view<2>());
  he.backward(host(), hid, tk::HostView<const float, 2>(g.data(), tk::Extents<2>{{300, 24}}));
  de.backward(gpu, did.view<1>(), dg.view<2>());
  CHECK(as_float(dout) == as_float(ho));
  CHECK(grads_of(da) == grads_of(ha));  // positions in order on both: the same bits

  const std::int64_t rows = 37, vocab = 1000;
  const auto logits = nntest::random_floats(rows * vocab, 5, 8.0f);
  std::vector<std::int64_t> t(static_cast<std::size_t>(rows));
  for (std::int64_t i = 0; i < rows; ++i) t[std::size_t(i)] = i % 5 == 0 ? -100 : (i * 31) % vocab;
  auto dl = to_device(logits, tk::Shape{rows, vocab});
  auto dt = to_device(t, tk::Shape{rows});
  tk::Tensor<float, tk::Space::kDevice> dloss(tk::Shape{1}), dgrad(tk::Shape{rows, vocab});
  nn::SoftmaxCrossEntropy<tk::Space::kDevice> dce;
  decltype(dce)::Context dctx;
  dce.forward(gpu, dctx, dl.view<2>(), dt.view<1>(), dloss.view<1>());
  dce.backward(gpu, dctx, dl.view<2>(), dt.view<1>(), dgrad.view<2>());
  float hloss = 0.0f;
  std::vector<float> hgrad(static_cast<std::size_t>(rows * vocab));
  nn::SoftmaxCrossEntropy hce;
  const tk::HostView<const float, 2> hl(logits.data(), tk::Extents<2>{{rows, vocab}});
  const tk::HostView<const std::int64_t, 1> ht(t.data(), tk::Extents<1>{{rows}});
  decltype(hce)::Context hctx;
  hce.forward(host(), hctx, hl, ht, tk::make_view(&hloss, {1}));
  hce.backward(host(), hctx, hl, ht,
               tk::HostView<float, 2>(hgrad.data(), tk::Extents<2>{{rows, vocab}}));
  CHECK(to_host(dloss.data(), 1)[0] == doctest::Approx(hloss).epsilon(1e-5));
  CHECK(err(as_float(dgrad), hgrad) < 1e-5);
}

TEST_CASE("device SoftmaxCrossEntropy keeps f32 precision at logit offsets up to 1e6") {
  const std::int64_t rows = 29, vocab = 777;
  for (const float offset : {0.0f, 1e2f, 1e4f, 1e6f}) {
    CAPTURE(offset);
    auto logits = nntest::random_floats(rows * vocab, 8, 3.0f);
    for (float& x : logits) x += offset;
    std::vector<std::int32_t> t(static_cast<std::size_t>(rows));
    for (std::int64_t i = 0; i < rows; ++i)
      t[std::size_t(i)] = i % 7 == 3 ? -100 : static_cast<std::int32_t>((i * 131) % vocab);
    // float64 reference from the same f32 logits.
    double loss_ref = 0.0;
    std::vector<double> grad_ref(logits.size(), 0.0);
    int valid = 0;
    for (std::int64_t i = 0; i < rows; ++i) valid += t[std::size_t(i)] != -100 ? 1 : 0;
    for (std::int64_t i = 0; i < rows; ++i) {
      if (t[std::size_t(i)] == -100) continue;
      const float* l = logits.data() + i * vocab;
      double m = -INFINITY, sum = 0.0;
      for (std::int64_t j = 0; j < vocab; ++j) m = std::max(m, double(l[j]));
      for (std::int64_t j = 0; j < vocab; ++j) sum += std::exp(double(l[j]) - m);
      loss_ref += std::log(sum) - (double(l[t[std::size_t(i)]]) - m);
      for (std::int64_t j = 0; j < vocab; ++j)
        grad_ref[std::size_t(i * vocab + j)] =
            (std::exp(double(l[j]) - m) / sum - (j == t[std::size_t(i)] ? 1.0 : 0.0)) / valid;
    }
    loss_ref /= valid;
    auto dl = to_device(logits, tk::Shape{rows, vocab});
    auto dt = to_device(t, tk::Shape{rows});
    tk::Tensor<float, tk::Space::kDevice> dloss(tk::Shape{1}), dgrad(tk::Shape{rows, vocab});
    nn::SoftmaxCrossEntropy<tk::Space::kDevice> ce;
    decltype(ce)::Context ctx;
    ce.forward(gpu, ctx, dl.view<2>(), dt.view<1>(), dloss.view<1>());
    ce.backward(gpu, ctx, dl.view<2>(), dt.view<1>(), dgrad.view<2>());
    const std::vector<float> g = as_float(dgrad);
    CHECK(to_host(dloss.data(), 1)[0] == doctest::Approx(loss_ref).epsilon(1e-6));
    CHECK(rel_err(g.data(), grad_ref.data(), rows * vocab) < 1e-6);
  }
}

namespace {

template <class P, tk::Space S, class E>
std::vector<float> mlp_grads(const E& ex) {
  using T = amp::activation_t<P>;
  const std::int64_t n = 64, in = 96, classes = 16;
  nn::ParamArena<S> arena;
  nn::Sequential net{nn::Linear(arena, "0", {.in_features = in, .out_features = 128}), nn::GELU{},
                     nn::Linear(arena, "2", {.in_features = 128, .out_features = classes})};
  arena.finalize();
  arena.initialize(5);
  if constexpr (amp::uses_compute_copy_v<P>) arena.template refresh_compute_copy<T>(ex);
  std::vector<T> x;
  for (float v : nntest::random_floats(n * in, 6)) x.push_back(T(v));
  std::vector<std::int32_t> t(static_cast<std::size_t>(n));
  for (std::int64_t i = 0; i < n; ++i) t[std::size_t(i)] = static_cast<std::int32_t>(i % classes);
  tk::Tensor<T, S> xs(tk::Shape{n, in}), logits(tk::Shape{n, classes}),
      dlogits(tk::Shape{n, classes});
  tk::Tensor<std::int32_t, S> ts(tk::Shape{n});
  tk::Tensor<float, S> loss(tk::Shape{1});
  tk::copy(xs.template view<2>(), tk::HostView<const T, 2>(x.data(), tk::Extents<2>{{n, in}}));
  tk::copy(ts.template view<1>(),
           tk::HostView<const std::int32_t, 1>(t.data(), tk::Extents<1>{{n}}));
  nn::SoftmaxCrossEntropy<S> ce;
  typename decltype(net)::Context ctx;
  typename nn::SoftmaxCrossEntropy<S>::Context ce_ctx;
  net.template forward<P>(ex, ctx, xs.template view<2>(), logits.template view<2>());
  ce.template forward<P>(ex, ce_ctx, logits.template view<2>(), ts.template view<1>(),
                         loss.template view<1>());
  ce.template backward<P>(ex, ce_ctx, logits.template view<2>(), ts.template view<1>(),
                          dlogits.template view<2>());
  net.template backward<P>(ex, ctx, xs.template view<2>(), dlogits.template view<2>(),
                           tk::TensorView<T, 2, S>());
  if constexpr (S == tk::Space::kDevice) {
    TRAINKIT_CUDA_CHECK(cudaDeviceSynchronize());
    return to_host(arena.grads_data(), arena.buffer_numel());
  } else {
    return std::vector<float>(arena.grads_data(), arena.grads_data() + arena.buffer_numel());
  }
}

}  // namespace

TEST_CASE("policies on the GPU: tf32, bf16 and f16 steps against the f32 step") {
  const auto ref = mlp_grads<amp::Fp32, tk::Space::kHost>(host());
  const auto f32 = mlp_grads<amp::Fp32, tk::Space::kDevice>(gpu);
  const auto tf32 = mlp_grads<amp::Tf32, tk::Space::kDevice>(gpu);
  const auto b16 = mlp_grads<amp::Bf16, tk::Space::kDevice>(gpu);
  const auto h16 = mlp_grads<amp::Fp16, tk::Space::kDevice>(gpu);
  const auto b16_host = mlp_grads<amp::Bf16, tk::Space::kHost>(host());
  CHECK(err(f32, ref) < 1e-5);
  CHECK(err(tf32, ref) < amp::Tf32::tolerance);
  CHECK(err(tf32, ref) > 1e-7);  // tensor cores really ran in TF32
  CHECK(err(b16, ref) < amp::Bf16::tolerance);
  CHECK(err(h16, ref) < amp::Fp16::tolerance);
  CHECK(err(b16, b16_host) < amp::Bf16::tolerance);
}

TEST_CASE("device kernels at GPT-2 sizes: bias gradient blocks, LayerNorm rows, embedding runs") {
  // 1000 rows: four 256-row blocks of the bias gradient, the last one partial.
  compare(
      "Linear, 1000 rows",
      [](auto& arena) { return nn::Linear(arena, "fc", {.in_features = 64, .out_features = 200}); },
      [](auto& m, const auto& ex, auto& x, auto& y, auto& dy, auto& dx) {
        m.forward(ex, x.template view<2>(), y.template view<2>());
        m.backward(ex, x.template view<2>(), dy.template view<2>(), dx.template view<2>());
      },
      tk::Shape{1000, 64}, tk::Shape{1000, 200}, 1e-5);
  // Widths of the register-held rows (<= 256, 512, 1024 columns) and one past them; backward
  // written, then added (the residual stream's kAccumulate).
  for (const std::int64_t c : {std::int64_t{200}, std::int64_t{768}, std::int64_t{1100}}) {
    CAPTURE(c);
    compare(
        "LayerNorm, overwrite then accumulate",
        [c](auto& arena) { return nn::LayerNorm(arena, "ln", {.features = c}); },
        [](auto& m, const auto& ex, auto& x, auto& y, auto& dy, auto& dx) {
          typename std::remove_reference_t<decltype(m)>::Context ctx;
          m.forward(ex, ctx, x.template view<2>(), y.template view<2>());
          m.backward(ex, ctx, x.template view<2>(), dy.template view<2>(), dx.template view<2>());
          m.backward(ex, ctx, x.template view<2>(), dy.template view<2>(), dx.template view<2>(),
                     nn::Write::kAccumulate);
        },
        tk::Shape{333, c}, tk::Shape{333, c}, 1e-5);
  }
  // dx written over x (a block's backward may be given dx = x): the weight and bias sums read x
  // and dy, so on the device they must run before the dx kernel overwrites x.
  for (const std::int64_t c : {std::int64_t{72}, std::int64_t{1100}}) {
    CAPTURE(c);
    compare(
        "LayerNorm, dx over x",
        [c](auto& arena) { return nn::LayerNorm(arena, "ln", {.features = c}); },
        [](auto& m, const auto& ex, auto& x, auto& y, auto& dy, auto& dx) {
          typename std::remove_reference_t<decltype(m)>::Context ctx;
          m.forward(ex, ctx, x.template view<2>(), y.template view<2>());
          tk::copy(dx, x);
          m.backward(ex, ctx, dx.template view<2>(), dy.template view<2>(), dx.template view<2>());
        },
        tk::Shape{333, c}, tk::Shape{333, c}, 1e-5);
  }

  // GPT-2's vocabulary, int64 ids with long runs of a few frequent ids, 1030 columns (two column
  // tiles of the sorted backward): the device's bits are the host's.
  const std::int64_t V = 50257, n = 3000, cols = 1030;
  nn::ParamArena<> ha;
  nn::ParamArena<tk::Space::kDevice> da;
  nn::Embedding he(ha, "wte", {.num_embeddings = V, .embedding_dim = cols});
  nn::Embedding de(da, "wte", {.num_embeddings = V, .embedding_dim = cols});
  ha.finalize();
  da.finalize();
  ha.initialize(2);
  da.initialize(2);
  std::vector<std::int64_t> ids(static_cast<std::size_t>(n));
  for (std::int64_t i = 0; i < n; ++i)
    ids[std::size_t(i)] = i % 3 == 0 ? 50256 : i % 5 == 0 ? 0 : (i * i * 7919) % V;
  auto did = to_device(ids, tk::Shape{n});
  const auto g = nntest::random_floats(n * cols, 6);
  auto dg = to_device(g, tk::Shape{n, cols});
  const tk::HostView<const std::int64_t, 1> hid(ids.data(), tk::Extents<1>{{n}});
  for (int pass = 0; pass < 2; ++pass) {  // the second pass adds to the first's gradients
    he.backward(host(), hid, tk::HostView<const float, 2>(g.data(), tk::Extents<2>{{n, cols}}));
    de.backward(gpu, did.view<1>(), dg.view<2>());
  }
  TRAINKIT_CUDA_CHECK(cudaDeviceSynchronize());
  CHECK(grads_of(da) == grads_of(ha));

  // Cross-entropy over logits rows padded to a 64-multiple stride (as CausalLmTask lays them
  // out), against the host's dense rows; the padding is never written.
  const std::int64_t rows = 37, vocab = 1000, ld = 1024;
  const auto logits = nntest::random_floats(rows * vocab, 9, 4.0f);
  std::vector<float> padded(static_cast<std::size_t>(rows * ld), 123.0f);
  for (std::int64_t r = 0; r < rows; ++r)
    std::copy(logits.begin() + r * vocab, logits.begin() + (r + 1) * vocab,
              padded.begin() + r * ld);
  std::vector<std::int32_t> t(static_cast<std::size_t>(rows));
  for (std::int64_t i = 0; i < rows; ++i) t[std::size_t(i)] = std::int32_t((i * 37) % vocab);
  auto dl = to_device(padded, tk::Shape{rows, ld});
  auto dgrad = to_device(padded, tk::Shape{rows, ld});
  auto dt = to_device(t, tk::Shape{rows});
  const tk::Extents<2> shape{{rows, vocab}}, strides{{ld, 1}};
  tk::Tensor<float, tk::Space::kDevice> dloss(tk::Shape{1});
  nn::SoftmaxCrossEntropy<tk::Space::kDevice> dce;
  decltype(dce)::Context dctx;
  dce.forward(gpu, dctx, tk::DeviceView<const float, 2>(dl.data(), shape, strides), dt.view<1>(),
              dloss.view<1>());
  dce.backward(gpu, dctx, tk::DeviceView<const float, 2>(dl.data(), shape, strides), dt.view<1>(),
               tk::DeviceView<float, 2>(dgrad.data(), shape, strides));
  float hloss = 0.0f;
  std::vector<float> hgrad(static_cast<std::size_t>(rows * vocab));
  nn::SoftmaxCrossEntropy hce;
  decltype(hce)::Context hctx;
  const tk::HostView<const float, 2> hl(logits.data(), shape);
  const tk::HostView<const std::int32_t, 1> ht(t.data(), tk::Extents<1>{{rows}});
  hce.forward(host(), hctx, hl, ht, tk::make_view(&hloss, {1}));
  hce.backward(host(), hctx, hl, ht, tk::HostView<float, 2>(hgrad.data(), shape));
  CHECK(to_host(dloss.data(), 1)[0] == doctest::Approx(hloss).epsilon(1e-5));
  const std::vector<float> back = to_host(dgrad.data(), rows * ld);
  std::vector<float> dense;
  bool padding_kept = true;
  for (std::int64_t r = 0; r < rows; ++r) {
    dense.insert(dense.end(), back.begin() + r * ld, back.begin() + r * ld + vocab);
    for (std::int64_t j = vocab; j < ld; ++j)
      padding_kept = padding_kept && back[std::size_t(r * ld + j)] == 123.0f;
  }
  CHECK(err(dense, hgrad) < 1e-5);
  CHECK(padding_kept);
}

namespace {

/// The fused core on the device for shape s and type T against float64 (the same check as the
/// host emulation's test, on the real kernels).
template <class T>
void check_fused_on_device(const nntest::AttentionShape& s, std::uint64_t seed, double tol) {
  CAPTURE(s.B);
  CAPTURE(s.H);
  CAPTURE(s.T);
  CAPTURE(s.hs);
  CAPTURE(sizeof(T));
  const std::int64_t C = s.H * s.hs, N = s.B * s.T, rows = s.B * s.H * s.T;
  std::vector<T> qkv(std::size_t(N * 3 * C)), dout(std::size_t(N * C));
  const auto rq = nntest::random_floats(N * 3 * C, seed);
  const auto rd = nntest::random_floats(N * C, seed + 1);
  for (std::size_t i = 0; i < qkv.size(); ++i) qkv[i] = T(rq[i]);
  for (std::size_t i = 0; i < dout.size(); ++i) dout[i] = T(rd[i]);
  auto d_qkv = to_device(qkv, tk::Shape{N * 3 * C});
  auto d_dout = to_device(dout, tk::Shape{N * C});
  auto d_out = to_device(std::vector<T>(std::size_t(N * C), T(NAN)), tk::Shape{N * C});
  auto d_dqkv = to_device(std::vector<T>(std::size_t(N * 3 * C), T(NAN)), tk::Shape{N * 3 * C});
  auto d_lse = to_device(std::vector<float>(std::size_t(rows), NAN), tk::Shape{rows});
  auto d_delta = to_device(std::vector<float>(std::size_t(rows), NAN), tk::Shape{rows});
  const auto a = nntest::fused_args(s, d_qkv.data(), d_out.data(), d_lse.data(), d_delta.data(),
                                    d_dout.data(), d_dqkv.data());
  nn::detail::fused_attention_forward(gpu, a);
  nn::detail::fused_attention_backward(gpu, a);
  TRAINKIT_CUDA_CHECK(cudaDeviceSynchronize());
  const auto want = nntest::attention_reference(s, nntest::widen(qkv), nntest::widen(dout));
  const auto out = nntest::widen(to_host(d_out.data(), N * C));
  const auto dqkv = nntest::widen(to_host(d_dqkv.data(), N * 3 * C));
  const auto lse = to_host(d_lse.data(), rows);
  for (double v : out) REQUIRE(std::isfinite(v));
  for (double v : dqkv) REQUIRE(std::isfinite(v));
  CHECK(rel_err(out, want.out) < tol);
  CHECK(rel_err(dqkv, want.dqkv) < tol);
  double lse_err = 0.0;
  for (std::size_t i = 0; i < lse.size(); ++i)
    lse_err = std::max(lse_err, std::abs(double(lse[i]) - want.lse2[i]));
  CHECK(lse_err < (sizeof(T) == 4 ? 1e-4 : 1e-2));
}

}  // namespace

TEST_CASE("device fused attention core: f32 and tensor-core bf16 / f16 kernels against float64") {
  // Ragged tiles, T = 1, a head size that fills no tile depth, and each depth (32, 64, 128).
  const nntest::AttentionShape shapes[] = {{1, 1, 1, 16},   {2, 3, 7, 5},   {1, 2, 64, 32},
                                           {2, 2, 150, 64}, {1, 1, 70, 40}, {1, 1, 130, 128},
                                           {1, 2, 257, 96}};
  std::uint64_t seed = 300;
  for (const auto& s : shapes) {
    check_fused_on_device<float>(s, seed++, 2e-5);
    check_fused_on_device<tk::bf16>(s, seed++, 2e-2);
    check_fused_on_device<tk::f16>(s, seed++, 4e-3);
  }
  // GPT-2 small's attention heads (12 of 64), T = 512.
  check_fused_on_device<tk::bf16>({1, 12, 512, 64}, 999, 2e-2);
}
