// Tests of the example layer of docs/layers.md (example_rms_norm.hpp): forward against float64,
// backward against float64 finite differences, stacked in an nn::Sequential between two Linear
// layers with an evaluation forward before the backward, and the document's code block being
// the header's code verbatim.
#include <doctest/doctest.h>

#include <cmath>
#include <cstdint>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

#include <trainkit/exec/host.hpp>
#include <trainkit/nn/linear.hpp>
#include <trainkit/nn/param_arena.hpp>
#include <trainkit/nn/sequential.hpp>

#include "example_rms_norm.hpp"
#include "nn_test_util.hpp"

namespace {

namespace tk = trainkit;
namespace nn = trainkit::nn;
using nntest::rel_err;

tk::exec::Host& pool() {
  static tk::exec::Host host(2);
  return host;
}

tk::HostView<float, 2> mat(std::vector<float>& v, std::int64_t r, std::int64_t c) {
  return tk::HostView<float, 2>(v.data(), tk::Extents<2>{{r, c}});
}

/// float64 RMSNorm of x [n, c] with gain g.
std::vector<double> rms_norm_ref(const std::vector<double>& x, const std::vector<double>& g,
                                 std::int64_t n, std::int64_t c, double eps) {
  std::vector<double> y(x.size());
  for (std::int64_t i = 0; i < n; ++i) {
    double s = 0.0;
    for (std::int64_t j = 0; j < c; ++j) s += x[std::size_t(i * c + j)] * x[std::size_t(i * c + j)];
    const double r = 1.0 / std::sqrt(s / double(c) + eps);
    for (std::int64_t j = 0; j < c; ++j)
      y[std::size_t(i * c + j)] = x[std::size_t(i * c + j)] * r * g[std::size_t(j)];
  }
  return y;
}

std::string read_text(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  REQUIRE(in.good());
  return std::string(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
}

}  // namespace

TEST_CASE("Writing a layer: RmsNorm forward vs f64, backward vs finite differences") {
  const std::int64_t n = 5, c = 7;
  nn::ParamArena<> arena;
  example::RmsNorm norm(arena, "norm", c, 1e-6f);
  arena.finalize();
  arena.initialize(1);
  const auto gv = nntest::random_floats(c, 401, 0.5f);
  for (std::int64_t j = 0; j < c; ++j) arena.param<1>(norm.weight())[j] += gv[std::size_t(j)];
  auto x = nntest::random_floats(n * c, 402, 2.0f);
  auto dy = nntest::random_floats(n * c, 403);
  std::vector<float> y(x.size()), dx(x.size());
  example::RmsNorm::Context ctx;
  norm.forward(pool(), ctx, mat(x, n, c), mat(y, n, c));
  norm.backward(pool(), ctx, mat(x, n, c), mat(dy, n, c), mat(dx, n, c));

  const auto xd = nntest::to_double(x.data(), n * c);
  const auto gd = nntest::to_double(arena.param<1>(norm.weight()).data(), c);
  const auto dyd = nntest::to_double(dy.data(), n * c);
  CHECK(rel_err(y.data(), rms_norm_ref(xd, gd, n, c, 1e-6).data(), n * c) < 1e-6);
  const auto gx = nntest::finite_diff(
      [&](const std::vector<double>& v) {
        return nntest::dot(rms_norm_ref(v, gd, n, c, 1e-6), dyd);
      },
      xd);
  const auto gg = nntest::finite_diff(
      [&](const std::vector<double>& v) {
        return nntest::dot(rms_norm_ref(xd, v, n, c, 1e-6), dyd);
      },
      gd);
  CHECK(rel_err(dx.data(), gx.data(), n * c) < 1e-5);
  CHECK(rel_err(arena.grad<1>(norm.weight()).data(), gg.data(), c) < 1e-5);
}

TEST_CASE("Writing a layer: RmsNorm in a Sequential, an evaluation forward before backward") {
  const std::int64_t n = 6, in = 4, width = 9, out = 3;
  nn::ParamArena<> arena;
  nn::Sequential net{nn::Linear(arena, "0", {.in_features = in, .out_features = width}),
                     example::RmsNorm(arena, "1", width),
                     nn::Linear(arena, "2", {.in_features = width, .out_features = out})};
  arena.finalize();
  arena.initialize(7);
  CHECK(arena.infos()[2].name == "1.weight");
  auto x = nntest::random_floats(n * in, 411);
  auto x_eval = nntest::random_floats(n * in, 412);
  auto dy = nntest::random_floats(n * out, 413);
  std::vector<float> y(std::size_t(n * out)), dx(std::size_t(n * in));
  decltype(net)::Context ctx, eval_ctx;
  net.forward(pool(), ctx, mat(x, n, in), mat(y, n, out));
  net.backward(pool(), ctx, mat(x, n, in), mat(dy, n, out), mat(dx, n, in));
  const std::vector<float> grads(arena.grads_data(), arena.grads_data() + arena.buffer_numel());
  const std::vector<float> dx_alone = dx;

  arena.zero_grad();
  net.forward(pool(), ctx, mat(x, n, in), mat(y, n, out));
  std::vector<float> y_eval(y.size());
  net.forward(pool(), eval_ctx, mat(x_eval, n, in), mat(y_eval, n, out));
  net.backward(pool(), ctx, mat(x, n, in), mat(dy, n, out), mat(dx, n, in));
  CHECK(dx == dx_alone);
  CHECK(std::vector<float>(arena.grads_data(), arena.grads_data() + arena.buffer_numel()) == grads);
}

TEST_CASE("Writing a layer: docs/layers.md shows example_rms_norm.hpp's code verbatim") {
  const std::string root = std::string(TRAINKIT_SOURCE_DIR) + "/";
  const std::string doc = read_text(root + "docs/layers.md");
  const std::string header = read_text(root + "tests/nn/example_rms_norm.hpp");
  const std::string open = "```cpp\nnamespace example {";
  const auto begin = doc.find(open);
  REQUIRE(begin != std::string::npos);
  const auto end = doc.find("```\n", begin + open.size());
  REQUIRE(end != std::string::npos);
  const std::string block = doc.substr(begin + 7, end - (begin + 7));
  const auto at = header.find("namespace example {");
  REQUIRE(at != std::string::npos);
  CHECK(block == header.substr(at));
}
