// Tests of nn::Gpt: logits, loss and every parameter gradient against nanoGPT's GPT in PyTorch
// (float64, tests/fixtures/nn/make_reference.py), untied and tied heads; parameter names and
// initialisation; contexts that stay valid across other forwards; dropout's mask replayed by
// backward; bad shapes and options.
#include <doctest/doctest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <string>
#include <utility>
#include <vector>

#include <trainkit/core/half.hpp>
#include <trainkit/core/tensor.hpp>
#include <trainkit/exec/host.hpp>
#include <trainkit/nn/cross_entropy.hpp>
#include <trainkit/nn/gpt.hpp>
#include <trainkit/nn/param_arena.hpp>

#include "nn_test_util.hpp"

namespace {

namespace tk = trainkit;
namespace nn = trainkit::nn;
using nntest::rel_err;

tk::exec::Host& pool() {
  static tk::exec::Host h(2);
  return h;
}

nn::GptOptions small(bool tie) {
  return {.vocab_size = 23,
          .block_size = 10,
          .n_layer = 2,
          .n_head = 2,
          .n_embd = 8,
          .tie_weights = tie};
}

tk::Tensor<std::int32_t> ids_of(const nntest::RefTensor& t) {
  tk::Tensor<std::int32_t> out(tk::Shape{t.shape[0], t.shape[1]});
  for (std::int64_t i = 0; i < t.numel(); ++i)
    out.data()[i] = static_cast<std::int32_t>(t.values[std::size_t(i)]);
  return out;
}

/// Mean cross entropy of the model on (ids, targets); with `backward`, its gradients are added to
/// the arena. Returns the loss; `logits` keeps the forward's output.
float step(nn::Gpt<>& model, nn::Gpt<>::Context& ctx, const tk::Tensor<std::int32_t>& ids,
           const tk::Tensor<std::int32_t>& targets, tk::Tensor<float>& logits, bool backward) {
  const std::int64_t N = ids.numel(), V = model.options().vocab_size;
  logits = tk::Tensor<float>(tk::Shape{N, V});
  model.forward(pool(), ctx, ids.view<2>(), logits.view<2>());
  nn::SoftmaxCrossEntropy<> ce;
  nn::SoftmaxCrossEntropy<>::Context ce_ctx;
  float loss = 0.0f;
  const auto t = targets.view<2>().reshape<1>(tk::Extents<1>{{N}});
  ce.forward(pool(), ce_ctx, logits.view<2>(), t, tk::make_view(&loss, {1}));
  if (backward) {
    tk::Tensor<float> dlogits(logits.shape());
    ce.backward(pool(), ce_ctx, logits.view<2>(), t, dlogits.view<2>());
    model.backward(pool(), ctx, ids.view<2>(), dlogits.view<2>());
  }
  return loss;
}

std::vector<float> grads_of(const nn::ParamArena<>& arena) {
  return std::vector<float>(arena.grads_data(), arena.grads_data() + arena.buffer_numel());
}

}  // namespace

TEST_CASE("Gpt: logits, loss and gradients equal nanoGPT's GPT in PyTorch (untied and tied)") {
  const auto& ref = nntest::Reference::get();
  for (const bool tie : {false, true}) {
    const std::string c = tie ? "gpt_tied" : "gpt";
    CAPTURE(c);
    nn::ParamArena<> arena;
    nn::Gpt model(arena, small(tie));
    arena.finalize();
    nntest::load_params(arena, c);
    const auto ids = ids_of(ref[c + "/ids"]);
    const auto targets = ids_of(ref[c + "/targets"]);
    nn::Gpt<>::Context ctx;
    tk::Tensor<float> logits;
    arena.zero_grad();
    const float loss = step(model, ctx, ids, targets, logits, true);
    CHECK(rel_err(logits.data(), ref[c + "/logits"].values.data(), logits.numel()) < 1e-5);
    CHECK(std::abs(loss - ref[c + "/loss"].values[0]) < 1e-5 * ref[c + "/loss"].values[0]);
    nntest::check_grads(arena, c, 1e-5);
  }
}

TEST_CASE("Gpt: parameter names, order, tying and GPT-2 initialisation") {
  nn::ParamArena<> untied_arena, tied_arena;
  nn::Gpt untied(untied_arena, small(false));
  nn::Gpt tied(tied_arena, small(true));
  untied_arena.finalize();
  tied_arena.finalize();
  const auto& infos = untied_arena.infos();
  REQUIRE(infos.size() == 2 + 2 * 12 + 2 + 1);
  CHECK(infos.front().name == "transformer.wte.weight");
  CHECK(infos[1].name == "transformer.wpe.weight");
  CHECK(infos[2].name == "transformer.h.0.ln_1.weight");
  CHECK(infos[infos.size() - 2].name == "transformer.ln_f.bias");
  CHECK(infos.back().name == "lm_head.weight");
  CHECK(infos.back().shape == tk::Shape{23, 8});
  CHECK(tied_arena.size() == untied_arena.size() - 1);
  CHECK_FALSE(tied_arena.find("lm_head.weight").has_value());
  CHECK(tied_arena.num_parameters() == untied_arena.num_parameters() - 23 * 8);
  CHECK(untied.matmul_parameters() == 2 * 12 * 64 + 23 * 8);

  // GPT-2 init: N(0, 0.02), residual projections N(0, 0.02 / sqrt(2 L)), zero biases, unit
  // LayerNorm weights. Measured on a larger model, where the sample std is close.
  nn::ParamArena<> arena;
  nn::Gpt big(arena,
              {.vocab_size = 300, .block_size = 64, .n_layer = 4, .n_head = 4, .n_embd = 64});
  arena.finalize();
  arena.initialize(7);
  const auto std_of = [&](const char* name) {
    const auto& info = arena.info(arena.at(name));
    double ss = 0.0;
    for (std::int64_t i = 0; i < info.numel; ++i)
      ss += double(arena.params_data()[info.offset + i]) * arena.params_data()[info.offset + i];
    return std::sqrt(ss / double(info.numel));
  };
  CHECK(std_of("transformer.wte.weight") == doctest::Approx(0.02).epsilon(0.05));
  CHECK(std_of("lm_head.weight") == doctest::Approx(0.02).epsilon(0.05));
  CHECK(std_of("transformer.h.3.mlp.c_proj.weight") ==
        doctest::Approx(0.02 / std::sqrt(8.0)).epsilon(0.05));
  CHECK(std_of("transformer.h.0.attn.c_attn.bias") == 0.0);
  CHECK(arena.param<1>(arena.at("transformer.ln_f.weight"))[5] == 1.0f);
}

TEST_CASE("Gpt: a context stays valid across forwards of other shapes (bitwise)") {
  nn::ParamArena<> arena;
  nn::Gpt model(arena, small(false));
  arena.finalize();
  arena.initialize(3);
  tk::Tensor<std::int32_t> a(tk::Shape{3, 7}), targets(tk::Shape{3, 7}), b(tk::Shape{1, 10});
  for (std::int64_t i = 0; i < a.numel(); ++i) {
    a.data()[i] = std::int32_t((i * 5 + 1) % 23);
    targets.data()[i] = std::int32_t((i * 7 + 2) % 23);
  }
  for (std::int64_t i = 0; i < b.numel(); ++i) b.data()[i] = std::int32_t((i * 3) % 23);
  nn::Gpt<>::Context clean_ctx, ctx_a, ctx_b;
  tk::Tensor<float> logits;
  arena.zero_grad();
  const float clean_loss = step(model, clean_ctx, a, targets, logits, true);
  const std::vector<float> clean = grads_of(arena);

  // forward(a), then forward(b) (other B and T, another context), then a's loss and backward.
  arena.zero_grad();
  tk::Tensor<float> logits_a(tk::Shape{21, 23}), logits_b(tk::Shape{10, 23});
  model.forward(pool(), ctx_a, a.view<2>(), logits_a.view<2>());
  model.forward(pool(), ctx_b, b.view<2>(), logits_b.view<2>());
  CHECK(std::memcmp(logits_a.data(), logits.data(), logits.bytes()) == 0);
  nn::SoftmaxCrossEntropy<> ce;
  nn::SoftmaxCrossEntropy<>::Context ce_ctx;
  float loss = 0.0f;
  const auto t = targets.view<2>().reshape<1>(tk::Extents<1>{{21}});
  ce.forward(pool(), ce_ctx, logits_a.view<2>(), t, tk::make_view(&loss, {1}));
  CHECK(loss == clean_loss);
  tk::Tensor<float> dlogits(logits_a.shape());
  ce.backward(pool(), ce_ctx, logits_a.view<2>(), t, dlogits.view<2>());
  model.backward(pool(), ctx_a, a.view<2>(), dlogits.view<2>());
  CHECK(grads_of(arena) == clean);
}

TEST_CASE("Gpt and SoftmaxCrossEntropy: logits rows padded to any stride give the same bits") {
  // CausalLmTask pads the rows of logits and dlogits (aligned products on the GPU); the model and
  // the loss must compute exactly what they compute on dense rows, whatever the padding holds.
  for (const bool tie : {false, true}) {
    for (const std::int64_t pad : {1, 9, 41}) {
      CAPTURE(tie);
      CAPTURE(pad);
      nn::ParamArena<> arena;
      nn::Gpt model(arena, small(tie));
      arena.finalize();
      arena.initialize(11);
      tk::Tensor<std::int32_t> ids(tk::Shape{2, 9}), targets(tk::Shape{2, 9});
      for (std::int64_t i = 0; i < ids.numel(); ++i) {
        ids.data()[i] = std::int32_t((i * 5 + 3) % 23);
        targets.data()[i] = i == 4 ? -100 : std::int32_t((i * 11 + 1) % 23);
      }
      nn::Gpt<>::Context ctx;
      tk::Tensor<float> dense;
      arena.zero_grad();
      const float dense_loss = step(model, ctx, ids, targets, dense, true);
      const std::vector<float> dense_grads = grads_of(arena);

      const std::int64_t N = 18, V = 23, ld = V + pad;
      std::vector<float> lbuf(std::size_t(N * ld), std::nanf("")), dbuf(lbuf);  // NaN padding
      const tk::HostView<float, 2> logits(lbuf.data(), tk::Extents<2>{{N, V}},
                                          tk::Extents<2>{{ld, 1}});
      const tk::HostView<float, 2> dlogits(dbuf.data(), tk::Extents<2>{{N, V}},
                                           tk::Extents<2>{{ld, 1}});
      arena.zero_grad();
      model.forward(pool(), ctx, ids.view<2>(), logits);
      nn::SoftmaxCrossEntropy<> ce;
      nn::SoftmaxCrossEntropy<>::Context ce_ctx;
      float loss = 0.0f;
      const auto t = targets.view<2>().reshape<1>(tk::Extents<1>{{N}});
      ce.forward(pool(), ce_ctx, logits, t, tk::make_view(&loss, {1}));
      ce.backward(pool(), ce_ctx, logits, t, dlogits);
      model.backward(pool(), ctx, ids.view<2>(), dlogits);
      CHECK(loss == dense_loss);
      bool same = true;
      for (std::int64_t r = 0; r < N; ++r)
        for (std::int64_t j = 0; j < V; ++j)
          same = same && std::memcmp(&lbuf[std::size_t(r * ld + j)], &dense.data()[r * V + j],
                                     sizeof(float)) == 0;
      CHECK(same);
      CHECK(grads_of(arena) == dense_grads);
      for (std::int64_t r = 0; r < N; ++r)  // the padding is never written
        for (std::int64_t j = V; j < ld; ++j) {
          REQUIRE(std::isnan(lbuf[std::size_t(r * ld + j)]));
          REQUIRE(std::isnan(dbuf[std::size_t(r * ld + j)]));
        }
    }
  }
  // Overlapping rows (a row stride below the width) are refused, naming the view.
  nn::ParamArena<> arena;
  nn::Gpt model(arena, small(false));
  arena.finalize();
  tk::Tensor<std::int32_t> ids(tk::Shape{1, 4});
  std::vector<float> buf(4 * 23);
  nn::Gpt<>::Context ctx;
  CHECK_THROWS_WITH_AS(
      model.forward(
          pool(), ctx, ids.view<2>(),
          tk::HostView<float, 2>(buf.data(), tk::Extents<2>{{4, 23}}, tk::Extents<2>{{20, 1}})),
      doctest::Contains("logits with shape [4, 23] must have dense rows"), tk::Error);
}

TEST_CASE("Gpt: backward tells each parameter's gradient once, when it is final") {
  for (const bool tie : {false, true}) {
    CAPTURE(tie);
    nn::ParamArena<> arena;
    const nn::ParamId before = arena.add("other.w", tk::Shape{5});  // not the model's
    nn::Gpt model(arena, small(tie));
    arena.finalize();
    arena.initialize(9);
    tk::Tensor<std::int32_t> ids(tk::Shape{2, 9}), targets(tk::Shape{2, 9});
    for (std::int64_t i = 0; i < ids.numel(); ++i) {
      ids.data()[i] = std::int32_t((i * 11 + 3) % 23);
      targets.data()[i] = std::int32_t((i * 5 + 1) % 23);
    }
    nn::Gpt<>::Context ctx;
    tk::Tensor<float> logits;
    arena.zero_grad();
    step(model, ctx, ids, targets, logits, true);
    const std::vector<float> plain = grads_of(arena);

    // The same backward, noting each parameter and a copy of its gradient when it is told.
    tk::Tensor<float> dlogits(logits.shape());
    nn::SoftmaxCrossEntropy<> ce;
    nn::SoftmaxCrossEntropy<>::Context ce_ctx;
    float loss = 0.0f;
    const auto t = targets.view<2>().reshape<1>(tk::Extents<1>{{ids.numel()}});
    ce.forward(pool(), ce_ctx, logits.view<2>(), t, tk::make_view(&loss, {1}));
    ce.backward(pool(), ce_ctx, logits.view<2>(), t, dlogits.view<2>());
    arena.zero_grad();
    std::vector<std::pair<nn::ParamId, std::vector<float>>> told;
    model.backward(pool(), ctx, ids.view<2>(), dlogits.view<2>(), [&](nn::ParamId id) {
      const auto g = arena.grad_flat(id);
      told.emplace_back(id, std::vector<float>(g.data(), g.data() + g.size(0)));
    });
    CHECK(grads_of(arena) == plain);
    REQUIRE(told.size() == arena.size() - 1);
    std::vector<int> seen(arena.size(), 0);
    for (const auto& [id, grad] : told) {
      CAPTURE(arena.info(id).name);
      ++seen[std::size_t(id.index)];
      const auto g = arena.grad_flat(id);
      CHECK(grad == std::vector<float>(g.data(), g.data() + g.size(0)));  // final when told
    }
    CHECK(seen[std::size_t(before.index)] == 0);
    for (std::size_t i = 1; i < seen.size(); ++i) CHECK(seen[i] == 1);
    CHECK(arena.info(told.front().first).name ==
          (tie ? "transformer.ln_f.weight" : "lm_head.weight"));
    CHECK(arena.info(told.back().first).name == "transformer.wte.weight");
  }
}

TEST_CASE("Gpt: dropout's mask is the forward's, whatever the layer's step and mode are later") {
  nn::ParamArena<> arena;
  nn::GptOptions o = small(true);
  o.dropout = 0.3f;
  o.seed = 11;
  nn::Gpt model(arena, o);
  arena.finalize();
  arena.initialize(5);
  tk::Tensor<std::int32_t> ids(tk::Shape{2, 9}), targets(tk::Shape{2, 9});
  for (std::int64_t i = 0; i < ids.numel(); ++i) {
    ids.data()[i] = std::int32_t((i * 11 + 4) % 23);
    targets.data()[i] = std::int32_t((i * 13 + 1) % 23);
  }
  tk::Tensor<float> logits;
  nn::Gpt<>::Context ctx;
  model.set_step(4);
  arena.zero_grad();
  const float dropped = step(model, ctx, ids, targets, logits, true);
  const std::vector<float> reference = grads_of(arena);

  model.set_step(4);
  tk::Tensor<float> first(tk::Shape{18, 23});
  model.forward(pool(), ctx, ids.view<2>(), first.view<2>());
  // Another step's training forward and an eval forward in between, on other contexts.
  nn::Gpt<>::Context other;
  model.set_step(5);
  tk::Tensor<float> scratch(tk::Shape{18, 23});
  model.forward(pool(), other, ids.view<2>(), scratch.view<2>());
  CHECK(std::memcmp(scratch.data(), first.data(), scratch.bytes()) != 0);  // another mask
  model.eval();
  model.forward(pool(), other, ids.view<2>(), scratch.view<2>());
  nn::SoftmaxCrossEntropy<> ce;
  nn::SoftmaxCrossEntropy<>::Context ce_ctx;
  float loss = 0.0f, eval_loss = 0.0f;
  const auto t = targets.view<2>().reshape<1>(tk::Extents<1>{{18}});
  ce.forward(pool(), ce_ctx, scratch.view<2>(), t, tk::make_view(&eval_loss, {1}));
  CHECK(eval_loss != dropped);
  ce.forward(pool(), ce_ctx, first.view<2>(), t, tk::make_view(&loss, {1}));
  CHECK(loss == dropped);
  tk::Tensor<float> dlogits(first.shape());
  ce.backward(pool(), ce_ctx, first.view<2>(), t, dlogits.view<2>());
  arena.zero_grad();
  model.backward(pool(), ctx, ids.view<2>(), dlogits.view<2>());
  CHECK(grads_of(arena) == reference);
}

TEST_CASE("Gpt: a failed generate leaves dropout's mode as it was") {
  nn::ParamArena<> arena;
  nn::GptOptions o = small(false);
  o.dropout = 0.1f;
  nn::Gpt model(arena, o);
  arena.finalize();
  arena.initialize(1);
  nn::Gpt<>::Context ctx;
  tk::PhiloxStream rng(1);
  REQUIRE(model.dropout().training());
  CHECK_THROWS_AS(model.generate(pool(), ctx, {1, 99}, 3, 1.0, rng), tk::Error);  // 99 >= vocab
  CHECK(model.dropout().training());
  model.eval();
  CHECK_THROWS_AS(model.generate(pool(), ctx, {1, 99}, 3, 1.0, rng), tk::Error);
  CHECK_FALSE(model.dropout().training());
  model.train();
  CHECK(model.generate(pool(), ctx, {1, 2}, 2, 0.0, rng).size() == 2);
  CHECK(model.dropout().training());
}

TEST_CASE("Gpt: generate refuses logits it cannot draw from (NaN, +inf, all -inf)") {
  // torch.multinomial refuses such probabilities; greedy or not, token 0 came out silently.
  const float inf = std::numeric_limits<float>::infinity();
  for (const float bad : {std::numeric_limits<float>::quiet_NaN(), inf, -inf}) {
    for (const double temperature : {0.0, 1.0}) {
      CAPTURE(bad);
      CAPTURE(temperature);
      nn::ParamArena<> arena;
      nn::Gpt model(arena, small(false));
      arena.finalize();
      arena.initialize(1);
      auto w = arena.param_flat(*arena.find("lm_head.weight"));  // [V, C]
      const std::int64_t C = small(false).n_embd;
      if (bad == -inf) {  // ln_f's output 1 everywhere, every head row [-inf, 0, ...]: all -inf
        auto g = arena.param_flat(*arena.find("transformer.ln_f.weight"));
        auto b = arena.param_flat(*arena.find("transformer.ln_f.bias"));
        for (std::int64_t j = 0; j < g.numel(); ++j) g.data()[j] = 0.0f;
        for (std::int64_t j = 0; j < b.numel(); ++j) b.data()[j] = 1.0f;
        for (std::int64_t j = 0; j < w.numel(); ++j) w.data()[j] = j % C == 0 ? -inf : 0.0f;
      } else {  // one row of NaN / +inf weights: logit 3 is NaN, or +inf, -inf or NaN
        for (std::int64_t j = 3 * C; j < 4 * C; ++j) w.data()[j] = bad;
      }
      nn::Gpt<>::Context ctx;
      tk::PhiloxStream rng(1);
      std::string what;
      try {
        model.generate(pool(), ctx, {1, 2}, 2, temperature, rng);
      } catch (const tk::Error& e) {
        what = e.what();
      }
      CHECK_MESSAGE(what.find("nn::Gpt::generate: ") != std::string::npos, what);
      CHECK_MESSAGE((what.find("NaN or +inf") != std::string::npos ||
                     what.find("is -inf") != std::string::npos),
                    what);
      if (bad == -inf) CHECK_MESSAGE(what.find("is -inf") != std::string::npos, what);
    }
  }
}

TEST_CASE("Gpt: a refused option leaves the arena as it was") {
  nn::ParamArena<> arena;
  nn::GptOptions o = small(false);
  o.dropout = 1.5f;
  CHECK_THROWS_WITH_AS(nn::Gpt(arena, o),
                       doctest::Contains("dropout 1.5 is not a probability in [0, 1]"), tk::Error);
  o.dropout = -0.1f;
  CHECK_THROWS_AS(nn::Gpt(arena, o), tk::Error);
  o.dropout = std::nanf("");
  CHECK_THROWS_AS(nn::Gpt(arena, o), tk::Error);
  CHECK(arena.size() == 0);
  o.dropout = 0.1f;
  nn::Gpt model(arena, o);  // the same arena still takes the model
  CHECK(arena.size() > 0);
}

TEST_CASE("Gpt: a context of a model of another width or depth is an error") {
  nn::ParamArena<> arenas[3];
  nn::GptOptions o = small(false);
  nn::Gpt model(arenas[0], o);
  o.n_embd = 16;
  nn::Gpt wide(arenas[1], o);
  o.n_embd = 8;
  o.n_layer = 3;
  nn::Gpt deep(arenas[2], o);
  for (auto& arena : arenas) {
    arena.finalize();
    arena.initialize(2);
  }
  tk::Tensor<std::int32_t> ids(tk::Shape{2, 5});
  ids.fill(1);
  tk::Tensor<float> logits(tk::Shape{10, 23}), dlogits(tk::Shape{10, 23});
  dlogits.fill(0.01f);
  nn::Gpt<>::Context ctx;
  model.forward(pool(), ctx, ids.view<2>(), logits.view<2>());
  CHECK_THROWS_WITH_AS(wide.backward(pool(), ctx, ids.view<2>(), dlogits.view<2>()),
                       doctest::Contains("the context holds the forward of a [2, 5, 8] input of "
                                         "F32, but backward got [2, 5, 16]"),
                       tk::Error);
  CHECK_THROWS_WITH_AS(deep.backward(pool(), ctx, ids.view<2>(), dlogits.view<2>()),
                       doctest::Contains("a model with 2 layers, this one has 3"), tk::Error);
  CHECK_NOTHROW(model.backward(pool(), ctx, ids.view<2>(), dlogits.view<2>()));
}

TEST_CASE("Gpt: bf16 activations on the host follow the f32 model") {
  nn::ParamArena<> arena;
  nn::Gpt model(arena, small(false));
  arena.finalize();
  nntest::load_params(arena, "gpt");
  arena.refresh_compute_copy<tk::bf16>(pool());
  const auto& ref = nntest::Reference::get();
  const auto ids = ids_of(ref["gpt/ids"]);
  tk::Tensor<tk::bf16> logits(tk::Shape{21, 23});
  nn::Gpt<>::Context ctx;
  model.forward<tk::amp::Bf16>(pool(), ctx, ids.view<2>(), logits.view<2>());
  std::vector<double> got(std::size_t(logits.numel()));
  for (std::size_t i = 0; i < got.size(); ++i) got[i] = static_cast<float>(logits.data()[i]);
  CHECK(rel_err(got.data(), ref["gpt/logits"].values.data(), logits.numel()) < 3e-2);
}

TEST_CASE("Gpt: bad options and shapes are errors naming what was expected") {
  nn::ParamArena<> arena;
  CHECK_THROWS_WITH_AS(
      nn::Gpt(arena, {.vocab_size = 10, .block_size = 4, .n_layer = 1, .n_head = 3, .n_embd = 8}),
      doctest::Contains("n_embd 8 is not a multiple of n_head 3"), tk::Error);
  CHECK_THROWS_WITH_AS(
      nn::Gpt(arena, {.vocab_size = 0, .block_size = 4, .n_layer = 1, .n_head = 2, .n_embd = 8}),
      doctest::Contains("must be > 0"), tk::Error);
  nn::ParamArena<> good;
  nn::Gpt model(good, small(false));
  good.finalize();
  nn::Gpt<>::Context ctx;
  tk::Tensor<std::int32_t> long_ids(tk::Shape{1, 11});
  long_ids.fill(1);
  tk::Tensor<float> logits(tk::Shape{11, 23});
  CHECK_THROWS_WITH_AS(model.forward(pool(), ctx, long_ids.view<2>(), logits.view<2>()),
                       doctest::Contains("10 (block_size)"), tk::Error);
  tk::Tensor<std::int32_t> ids(tk::Shape{2, 5});
  ids.fill(1);
  tk::Tensor<float> wrong(tk::Shape{10, 22});
  CHECK_THROWS_WITH_AS(model.forward(pool(), ctx, ids.view<2>(), wrong.view<2>()),
                       doctest::Contains("must be [10, 23]"), tk::Error);
  ids.data()[3] = 23;  // out of the vocabulary
  CHECK_THROWS_AS(model.forward(pool(), ctx, ids.view<2>(),
                                logits.view<2>().reshape<2>(tk::Extents<2>{{10, 23}})),
                  tk::Error);
  // backward of a forward of another shape.
  tk::Tensor<std::int32_t> ok(tk::Shape{2, 5});
  ok.fill(2);
  tk::Tensor<float> l10(tk::Shape{10, 23}), d(tk::Shape{10, 23});
  model.forward(pool(), ctx, ok.view<2>(), l10.view<2>());
  tk::Tensor<std::int32_t> other(tk::Shape{5, 2});
  other.fill(2);
  CHECK_THROWS_AS(model.backward(pool(), ctx, other.view<2>(), d.view<2>()), tk::Error);

  // A tied Linear needs the tied parameter's shape.
  nn::ParamArena<> a2;
  const auto emb = a2.add("emb.weight", tk::Shape{7, 4});
  CHECK_THROWS_WITH_AS(
      nn::Linear(a2, "head",
                 {.in_features = 4, .out_features = 6, .bias = false, .tied_weight = emb}),
      doctest::Contains("the tied weight 'emb.weight' is [7, 4]"), tk::Error);
}
