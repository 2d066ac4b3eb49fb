// Tests of nn::ParamArena (layout, names, views, gradients, optimizer state, compute copies) and
// the nn::Init initialisers (torch.nn.init's distributions, deterministic Philox keying).
#include <doctest/doctest.h>

#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

#include <trainkit/core/half.hpp>
#include <trainkit/exec/host.hpp>
#include <trainkit/nn/init.hpp>
#include <trainkit/nn/param_arena.hpp>

namespace {

namespace tk = trainkit;
namespace nn = trainkit::nn;

struct Moments {
  double mean = 0.0, std = 0.0, min = 1e300, max = -1e300;
};

Moments moments(const float* p, std::int64_t n) {
  Moments m;
  for (std::int64_t i = 0; i < n; ++i) {
    m.mean += p[i];
    m.min = std::min(m.min, double(p[i]));
    m.max = std::max(m.max, double(p[i]));
  }
  m.mean /= double(n);
  for (std::int64_t i = 0; i < n; ++i) m.std += (p[i] - m.mean) * (p[i] - m.mean);
  m.std = std::sqrt(m.std / double(n));
  return m;
}

}  // namespace

TEST_CASE("ParamArena: registration, aligned layout with zero padding, named views") {
  nn::ParamArena<> arena;
  const nn::ParamId a = arena.add("blocks.0.attn.c_attn.weight", tk::Shape{3, 5});
  const nn::ParamId b = arena.add("blocks.0.attn.c_attn.bias", tk::Shape{3});
  const nn::ParamId c = arena.add("wte.weight", tk::Shape{4, 2, 2});
  CHECK_THROWS_AS(arena.add("wte.weight", tk::Shape{1}), tk::Error);
  CHECK_THROWS_AS(arena.add("", tk::Shape{1}), tk::Error);
  CHECK_THROWS_AS(arena.param<2>(a), tk::Error);  // before finalize
  arena.finalize();
  CHECK_THROWS_AS(arena.add("late", tk::Shape{1}), tk::Error);
  CHECK_THROWS_AS(arena.finalize(), tk::Error);

  REQUIRE(arena.size() == 3);
  CHECK(arena.infos()[0].name == "blocks.0.attn.c_attn.weight");
  CHECK(arena.infos()[2].name == "wte.weight");
  CHECK(arena.info(a).offset == 0);
  CHECK(arena.info(b).offset == 16);
  CHECK(arena.info(c).offset == 32);
  for (const auto& info : arena.infos()) CHECK(info.offset % nn::ParamArena<>::kAlignment == 0);
  CHECK(reinterpret_cast<std::uintptr_t>(arena.params_data() + arena.info(c).offset) % 64 == 0);
  CHECK(arena.num_parameters() == 15 + 3 + 16);
  CHECK(arena.buffer_numel() == 48);
  CHECK(arena.find("wte.weight") == c);
  CHECK(!arena.find("nope").has_value());
  CHECK_THROWS_WITH_AS(arena.at("nope"), doctest::Contains("no parameter named 'nope'"), tk::Error);

  // Zero-filled, views index into the one buffer.
  for (std::int64_t i = 0; i < arena.buffer_numel(); ++i) {
    CHECK(arena.params_data()[i] == 0.0f);
    CHECK(arena.grads_data()[i] == 0.0f);
  }
  auto w = arena.param<2>(a);
  CHECK(w.size(0) == 3);
  CHECK(w.size(1) == 5);
  w(2, 4) = 7.0f;
  CHECK(arena.params_data()[14] == 7.0f);
  auto e = arena.param<3>(c);
  e(1, 0, 1) = 3.0f;
  CHECK(arena.params()[32 + 5] == 3.0f);
  CHECK_THROWS_AS(arena.param<1>(a), tk::Error);  // wrong rank
  CHECK_THROWS_AS(arena.param<1>(nn::ParamId{7}), tk::Error);
  CHECK(arena.param_flat(b).size(0) == 3);

  arena.grad<1>(b)[1] = 2.0f;
  arena.grad_flat(c)[0] = 1.0f;
  arena.zero_grad();
  CHECK(arena.grad<1>(b)[1] == 0.0f);
  CHECK(arena.grads()[32] == 0.0f);

  // Initialising leaves the padding at zero.
  arena.initialize(a, nn::Init::normal(), 1);
  CHECK(arena.params_data()[15] == 0.0f);
}

TEST_CASE(
    "ParamArena: sizes past 2^60 elements are refused when registered, before any allocation") {
  nn::ParamArena<> arena;
  CHECK_THROWS_WITH_AS(arena.add("huge", tk::Shape{std::int64_t{1} << 31, std::int64_t{1} << 31}),
                       doctest::Contains("'huge'"), tk::Error);
  arena.add("a", tk::Shape{std::int64_t{1} << 30, std::int64_t{1} << 29});  // 2^59: registers
  arena.add("b", tk::Shape{std::int64_t{1} << 59});
  CHECK_THROWS_WITH_AS(arena.add("c", tk::Shape{64}), doctest::Contains("past 2^60"), tk::Error);
  CHECK(arena.num_parameters() == std::int64_t{1} << 60);
}

TEST_CASE("ParamArena: names are checked (empty, repeated, control characters)") {
  nn::ParamArena<> arena;
  arena.add("layer.weight", tk::Shape{2});
  CHECK_THROWS_WITH_AS(arena.add("", tk::Shape{2}), doctest::Contains("empty parameter name"),
                       tk::Error);
  CHECK_THROWS_WITH_AS(arena.add("layer.weight", tk::Shape{2}), doctest::Contains("duplicate"),
                       tk::Error);
  CHECK_THROWS_WITH_AS(arena.add("a\nb", tk::Shape{2}),
                       doctest::Contains("'a...' holds control character 10 at byte 1"), tk::Error);
  CHECK_THROWS_AS(arena.add(std::string("x\0y", 3), tk::Shape{2}), tk::Error);
  arena.add("caf\xc3\xa9.w", tk::Shape{2});  // other bytes are fine
  CHECK(arena.size() == 2);
}

TEST_CASE("ParamArena: names a checkpoint cannot store are refused (bad UTF-8, __metadata__)") {
  nn::ParamArena<> arena;
  CHECK_THROWS_WITH_AS(arena.add("\xff.weight", tk::Shape{2}),
                       doctest::Contains("the parameter name '\\xff.weight' is not valid UTF-8"),
                       tk::Error);
  CHECK_THROWS_AS(arena.add("a\xc0\xaf", tk::Shape{2}), tk::Error);  // overlong '/'
  CHECK_THROWS_WITH_AS(arena.add("__metadata__", tk::Shape{2}),
                       doctest::Contains("'__metadata__' is reserved by safetensors"), tk::Error);
  CHECK(arena.size() == 0);
  arena.add("__metadata__.weight", tk::Shape{2});
  CHECK(arena.size() == 1);
}

TEST_CASE("ParamArena: optimizer state buffers share the layout") {
  nn::ParamArena<> arena;
  const nn::ParamId a = arena.add("a", tk::Shape{5});
  const nn::ParamId b = arena.add("b", tk::Shape{2, 3});
  CHECK_THROWS_AS(arena.add_state("exp_avg"), tk::Error);  // before finalize
  arena.finalize();
  auto m = arena.add_state("exp_avg");
  arena.add_state("exp_avg_sq");
  CHECK_THROWS_AS(arena.add_state("exp_avg"), tk::Error);
  CHECK(m.size(0) == arena.buffer_numel());
  CHECK(arena.has_state("exp_avg_sq"));
  CHECK(arena.state_names() == std::vector<std::string>{"exp_avg", "exp_avg_sq"});
  auto sb = arena.state<2>("exp_avg", b);
  sb(1, 2) = 4.0f;
  CHECK(m[arena.info(b).offset + 5] == 4.0f);
  CHECK(arena.state("exp_avg_sq")[arena.info(a).offset] == 0.0f);
  CHECK_THROWS_AS(arena.state("nope"), tk::Error);
}

TEST_CASE("ParamArena: bf16/f16 compute copies refreshed by one fused cast") {
  nn::ParamArena<> arena;
  const nn::ParamId a = arena.add("a", tk::Shape{40, 3}, nn::Init::normal(0.0f, 3.0f));
  const nn::ParamId b = arena.add("b", tk::Shape{7}, nn::Init::uniform(-1e5f, 1e5f));
  arena.finalize();
  arena.initialize(3);
  CHECK(!arena.has_compute_copy<tk::bf16>());
  CHECK_THROWS_WITH_AS((arena.compute_param<tk::bf16, 2>(a)),
                       doctest::Contains("refresh_compute_copy"), tk::Error);
  tk::exec::Host host(2);
  arena.refresh_compute_copy<tk::bf16>(host);
  arena.refresh_compute_copy<tk::f16>(host);
  CHECK(arena.has_compute_copy<tk::bf16>());
  const auto wb = arena.compute_param<tk::bf16, 2>(a);
  const auto wf = arena.compute_param<tk::f16, 1>(b);
  const auto pa = arena.param<2>(a);
  for (int i = 0; i < 40; ++i)
    for (int j = 0; j < 3; ++j) CHECK(wb(i, j).bits() == tk::bf16(pa(i, j)).bits());
  for (int i = 0; i < 7; ++i) {
    const float v = arena.param<1>(b)[i];
    CHECK(wf[i].bits() == tk::f16(v).bits());  // |v| > 65504 becomes inf, as a cast would
  }
  // A parameter update is visible after the next refresh only.
  arena.param<2>(a)(0, 0) = 1.5f;
  CHECK(float(arena.compute_param<tk::bf16, 2>(a)(0, 0)) != 1.5f);
  arena.refresh_compute_copy<tk::bf16>(host);
  CHECK(float(arena.compute_param<tk::bf16, 2>(a)(0, 0)) == 1.5f);
}

TEST_CASE("Init: torch.nn.init distributions and fans") {
  CHECK(nn::compute_fans(tk::Shape{4, 3}).fan_in == 3);
  CHECK(nn::compute_fans(tk::Shape{4, 3}).fan_out == 4);
  CHECK(nn::compute_fans(tk::Shape{8, 2, 3, 3}).fan_in == 18);
  CHECK(nn::compute_fans(tk::Shape{8, 2, 3, 3}).fan_out == 72);
  CHECK_THROWS_AS(nn::compute_fans(tk::Shape{5}), tk::Error);

  const std::int64_t out = 200, in = 300, n = out * in;
  std::vector<float> v(static_cast<std::size_t>(n));
  const tk::Shape shape{out, in};
  SUBCASE("normal") {
    nn::fill_init(v.data(), shape, nn::Init::normal(1.0f, 0.5f), 7, 0);
    const Moments m = moments(v.data(), n);
    CHECK(m.mean == doctest::Approx(1.0).epsilon(0.01));
    CHECK(m.std == doctest::Approx(0.5).epsilon(0.01));
  }
  SUBCASE("uniform") {
    nn::fill_init(v.data(), shape, nn::Init::uniform(-2.0f, 3.0f), 7, 0);
    const Moments m = moments(v.data(), n);
    CHECK(m.min >= -2.0);
    CHECK(m.max < 3.0);
    CHECK(m.mean == doctest::Approx(0.5).epsilon(0.02));
    CHECK(m.std == doctest::Approx(5.0 / std::sqrt(12.0)).epsilon(0.01));
  }
  SUBCASE("xavier_uniform / xavier_normal") {
    const double bound = std::sqrt(6.0 / double(in + out));
    nn::fill_init(v.data(), shape, nn::Init::xavier_uniform(), 7, 0);
    Moments m = moments(v.data(), n);
    CHECK(m.max <= bound);
    CHECK(m.max > 0.99 * bound);
    CHECK(m.min >= -bound);
    nn::fill_init(v.data(), shape, nn::Init::xavier_normal(2.0f), 7, 0);
    m = moments(v.data(), n);
    CHECK(m.std == doctest::Approx(2.0 * std::sqrt(2.0 / double(in + out))).epsilon(0.01));
  }
  SUBCASE("kaiming_uniform (PyTorch Linear default) / kaiming_normal fan_out") {
    nn::fill_init(v.data(), shape, nn::Init::kaiming_uniform(std::sqrt(5.0f)), 7, 0);
    const double bound = 1.0 / std::sqrt(double(in));
    Moments m = moments(v.data(), n);
    CHECK(m.max <= bound * (1 + 1e-6));
    CHECK(m.max > 0.99 * bound);
    nn::fill_init(v.data(), shape, nn::Init::kaiming_normal(0.0f, nn::FanMode::kFanOut), 7, 0);
    m = moments(v.data(), n);
    CHECK(m.std == doctest::Approx(std::sqrt(2.0 / double(out))).epsilon(0.01));
  }
  SUBCASE("constant, zeros, ones") {
    nn::fill_init(v.data(), shape, nn::Init::constant(0.25f), 7, 0);
    CHECK(v[12345] == 0.25f);
    nn::fill_init(v.data(), shape, nn::Init::ones(), 7, 0);
    CHECK(v[0] == 1.0f);
    nn::fill_init(v.data(), shape, nn::Init::zeros(), 7, 0);
    CHECK(v[n - 1] == 0.0f);
  }
  SUBCASE("fan-based initialisers reject rank 1") {
    CHECK_THROWS_AS(nn::fill_init(v.data(), tk::Shape{5}, nn::Init::xavier_uniform(), 1, 0),
                    tk::Error);
  }
}

TEST_CASE("Init: parameters torch.nn.init refuses are errors naming the initialiser") {
  float v[4] = {};
  const tk::Shape shape{4};
  const float nan = std::nanf(""), inf = INFINITY;
  CHECK_THROWS_WITH_AS(nn::fill_init(v, shape, nn::Init::normal(0.0f, -1.0f), 1, 0, "w"),
                       doctest::Contains("normal initialiser of 'w': mean 0 and std -1"),
                       tk::Error);
  CHECK_THROWS_AS(nn::fill_init(v, shape, nn::Init::normal(0.0f, nan), 1, 0, "w"), tk::Error);
  CHECK_THROWS_AS(nn::fill_init(v, shape, nn::Init::normal(inf, 1.0f), 1, 0, "w"), tk::Error);
  CHECK_THROWS_AS(nn::fill_init(v, shape, nn::Init::normal(nan, 1.0f), 1, 0, "w"), tk::Error);
  CHECK_THROWS_WITH_AS(nn::fill_init(v, shape, nn::Init::uniform(-3e38f, 3e38f), 1, 0, "u"),
                       doctest::Contains("uniform initialiser of 'u': high - low"), tk::Error);
  CHECK_THROWS_WITH_AS(nn::fill_init(v, shape, nn::Init::uniform(0.0f, inf), 1, 0, "u"),
                       doctest::Contains("must be finite"), tk::Error);
  CHECK_THROWS_AS(nn::fill_init(v, shape, nn::Init::uniform(nan, 1.0f), 1, 0, "u"), tk::Error);
  CHECK_THROWS_WITH_AS(nn::fill_init(v, shape, nn::Init::uniform(2.0f, 1.0f), 1, 0, "u"),
                       doctest::Contains("low 2 > high 1"), tk::Error);
  // The edges torch accepts: std 0, a range of exactly FLT_MAX, low == high.
  nn::fill_init(v, shape, nn::Init::normal(1.5f, 0.0f), 1, 0, "w");
  CHECK(v[3] == 1.5f);
  nn::fill_init(v, shape, nn::Init::uniform(0.0f, 3.4028235e38f), 1, 0, "u");
  for (const float x : v) CHECK(std::isfinite(x));
  nn::fill_init(v, shape, nn::Init::uniform(-1.0f, -1.0f), 1, 0, "u");
  CHECK(v[0] == -1.0f);
}

TEST_CASE("Init: deterministic per (seed, parameter index, element)") {
  auto build = [](std::uint64_t seed, std::int64_t first_size) {
    nn::ParamArena<> arena;
    arena.add("first", tk::Shape{first_size}, nn::Init::normal());
    arena.add("second", tk::Shape{64, 8}, nn::Init::xavier_uniform());
    arena.finalize();
    arena.initialize(seed);
    const auto& info = arena.infos()[1];
    return std::vector<float>(arena.params_data() + info.offset,
                              arena.params_data() + info.offset + info.numel);
  };
  const auto a = build(5, 10);
  CHECK(build(5, 10) == a);
  CHECK(build(6, 10) != a);
  // Keyed by the parameter's index, not its offset: another size before it changes nothing.
  CHECK(build(5, 1000) == a);
  // Known answer: the first element is the first uniform of stream init_stream_id(1).
  const double bound = std::sqrt(6.0 / (64.0 + 8.0));
  const float u = tk::philox_uniform(5, nn::init_stream_id(1), 0);
  CHECK(a[0] == doctest::Approx(-bound + 2.0 * bound * u).epsilon(1e-6));
}

TEST_CASE("Init: fans of a shape with a zero dimension are refused, naming the parameter") {
  // A zero dimension gave fan 0 (or fan_in + fan_out 0), which kaiming / xavier divide by.
  for (const tk::Shape& shape : {tk::Shape{0, 3}, tk::Shape{4, 0}, tk::Shape{0, 0},
                                 tk::Shape{8, 2, 0, 3}, tk::Shape{8, 2, 3, 0}}) {
    CAPTURE(shape.to_string());
    CHECK_THROWS_WITH_AS(nn::compute_fans(shape, "blocks.0.w"),
                         doctest::Contains("parameter 'blocks.0.w' with shape"), tk::Error);
    CHECK_THROWS_WITH_AS(nn::compute_fans(shape, "blocks.0.w"),
                         doctest::Contains("need every dimension > 0"), tk::Error);
  }
  // Every dimension positive: the fans as before, down to 1 x 1.
  CHECK(nn::compute_fans(tk::Shape{1, 1}).fan_in == 1);
  CHECK(nn::compute_fans(tk::Shape{1, 1}).fan_out == 1);
  CHECK(nn::compute_fans(tk::Shape{3, 5, 1, 2}).fan_in == 10);
  // Initialising an empty tensor stays a no-op (torch.nn.init's), fans never computed.
  float none = 7.0f;
  nn::fill_init(&none, tk::Shape{0, 3}, nn::Init::kaiming_uniform(), 1, 0, "empty");
  nn::fill_init(&none, tk::Shape{4, 0}, nn::Init::xavier_normal(), 1, 0, "empty");
  CHECK(none == 7.0f);
}

TEST_CASE("ParamArena::load_state_dict names the missing and the unexpected tensor") {
  nn::ParamArena<> arena;
  arena.add("fc.weight", tk::Shape{3, 2}, nn::Init::normal());
  arena.add("fc.bias", tk::Shape{3}, nn::Init::zeros());
  arena.finalize();
  arena.initialize(1);
  const std::vector<float> before(arena.params_data(), arena.params_data() + arena.buffer_numel());
  const tk::StateDict good = arena.state_dict();
  const auto refused = [&](const tk::StateDict& sd, const std::string& text) {
    CHECK_THROWS_WITH_AS(arena.load_state_dict(sd), doctest::Contains(text.c_str()), tk::Error);
    CHECK(std::vector<float>(arena.params_data(), arena.params_data() + arena.buffer_numel()) ==
          before);
  };
  tk::StateDict missing = good;  // one tensor fewer
  missing.tensors.erase("fc.bias");
  refused(missing, "2 parameters from a state of 1 tensors: the state has no tensor 'fc.bias'");
  tk::StateDict extra = good;  // one tensor more, its key from a file: shown escaped
  extra.tensors.emplace("fc.\x01scale", tk::AnyTensor(tk::DType::kF32, tk::Shape{1}));
  refused(extra, "2 parameters from a state of 3 tensors: the state's 'fc.");
  refused(extra, "' is not a parameter of the arena");
  try {
    arena.load_state_dict(extra);
    FAIL("an unexpected tensor was accepted");
  } catch (const tk::Error& e) {
    CHECK(std::string(e.what()).find('\x01') == std::string::npos);
  }
  tk::StateDict renamed = missing;  // as many tensors, one of another name
  renamed.tensors.emplace("fc.b", tk::AnyTensor(tk::DType::kF32, tk::Shape{3}));
  refused(renamed, "the state has no tensor 'fc.bias'");
  tk::StateDict wrong = good;  // the dtype and shape are named with the key
  wrong.tensors.erase("fc.bias");
  wrong.tensors.emplace("fc.bias", tk::AnyTensor(tk::DType::kF16, tk::Shape{3}));
  refused(wrong, "parameter 'fc.bias' is F16 [3] in the state but F32 [3] in the arena");
  arena.load_state_dict(good);
}
