// The example rule of docs/optimizers.md ("Writing an optimizer"), torch.optim.Adagrad as a
// rule: the block between the BEGIN/END lines below is the doc's code block, character for
// character (checked here), it compiles, and 20 steps over tensors spanning the vector body and
// the scalar tails match a float64 Adagrad written out below; its state_dict round-trips.
#include <doctest/doctest.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <fstream>
#include <sstream>
#include <string>
#include <tuple>
#include <vector>

#include <trainkit/exec/host.hpp>
#include <trainkit/optim/optimizer.hpp>
#include <trainkit/optim/rule.hpp>

namespace example {
namespace optim = trainkit::optim;

// BEGIN docs/optimizers.md example
/// torch.optim.Adagrad's arguments (initial_accumulator_value is 0: states start at zero).
struct AdagradOptions {
  double lr = 1e-2;
  double lr_decay = 0.0;
  double weight_decay = 0.0;
  double eps = 1e-10;
};

struct AdagradRule {
  using Options = AdagradOptions;
  static constexpr const char* kName = "Adagrad";
  static constexpr std::array kStates{"sum"};
  static constexpr std::tuple kSavedOptions{optim::saved_option("lr_decay", &Options::lr_decay),
                                            optim::saved_option("eps", &Options::eps)};

  struct Scalars {
    float neg_clr;  ///< -lr / (1 + (step - 1) * lr_decay)
    float weight_decay;
    float eps;
  };
  TRAINKIT_HOST_DEVICE static void derive(const Options& o, const optim::StepHeader& head,
                                          Scalars& s) {
    s.neg_clr = static_cast<float>(-(o.lr / (1.0 + (head.step - 1.0) * o.lr_decay)));
    s.weight_decay = static_cast<float>(o.weight_decay);
    s.eps = static_cast<float>(o.eps);
  }
  template <unsigned V, class T>
  TRAINKIT_HOST_DEVICE static void update(const Scalars& s, T& p, T g, T& sum) {
    g = g + s.weight_decay * p;
    sum = sum + g * g;
    p = p + (s.neg_clr * g) / (optim::vsqrt(sum) + s.eps);
  }
};

template <trainkit::Space S = trainkit::Space::kHost>
using Adagrad = optim::FusedOptimizer<AdagradRule, S>;
// END docs/optimizers.md example

}  // namespace example

namespace {

namespace tk = trainkit;
using Arena = tk::nn::ParamArena<tk::Space::kHost>;

std::string between(const std::string& text, const std::string& begin, const std::string& end) {
  const std::size_t b = text.find(begin);
  REQUIRE(b != std::string::npos);
  const std::size_t from = text.find('\n', b) + 1;
  const std::size_t e = text.find(end, from);
  REQUIRE(e != std::string::npos);
  return text.substr(from, e - from);
}

std::string read_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  REQUIRE(in.good());
  std::ostringstream s;
  s << in.rdbuf();
  return s.str();
}

}  // namespace

TEST_CASE("docs/optimizers.md: the example rule is this file's, and it steps like Adagrad") {
  const std::string root = std::string(TRAINKIT_SOURCE_DIR) + "/";
  const std::string doc = read_file(root + "docs/optimizers.md");
  const std::string self = read_file(root + "tests/optim/test_rule_example.cpp");
  CHECK(between(doc, "<!-- BEGIN example -->", "<!-- END example -->") ==
        "```cpp\n" +
            between(self, "// BEGIN docs/optimizers.md example",
                    "// END docs/optimizers.md example") +
            "```\n");

  const tk::exec::Host host(2);
  Arena arena;
  arena.add("w", tk::Shape{301, 3});
  arena.add("b.bias", tk::Shape{5});
  arena.add("v", tk::Shape{40000});
  arena.finalize();
  const std::int64_t n = arena.buffer_numel();
  for (std::int64_t i = 0; i < n; ++i)
    arena.params_data()[i] = std::sin(0.01f * static_cast<float>(i));
  const example::AdagradOptions options{.lr = 0.05, .lr_decay = 0.01, .weight_decay = 0.1};
  example::Adagrad<> opt(arena, options, {trainkit::optim::no_weight_decay({"*.bias"})});
  CHECK(opt.num_groups() == 2);

  // float64 Adagrad (torch/optim/adagrad.py) over the parameters' elements.
  std::vector<double> p(arena.params_data(), arena.params_data() + n), sum(n, 0.0);
  auto grad = [](int t, std::int64_t i) {
    return std::cos(0.003f * static_cast<float>(i) + 0.5f * static_cast<float>(t));
  };
  // Gradients on the parameters' elements only (the padding stays zero).
  auto set_grads = [&](Arena& a, int t) {
    for (const auto& info : a.infos())
      for (std::int64_t i = info.offset; i < info.offset + info.numel; ++i)
        a.grads_data()[i] = grad(t, i);
  };
  double worst = 0.0, scale = 0.0;
  for (int t = 1; t <= 20; ++t) {
    set_grads(arena, t);
    opt.step(host);
    for (const auto& info : arena.infos()) {
      const double wd = info.name == "b.bias" ? 0.0 : options.weight_decay;
      const double clr = options.lr / (1.0 + static_cast<double>(t - 1) * options.lr_decay);
      for (std::int64_t i = info.offset; i < info.offset + info.numel; ++i) {
        const double g = static_cast<double>(grad(t, i)) + wd * p[i];
        sum[i] += g * g;
        p[i] -= clr * g / (std::sqrt(sum[i]) + options.eps);
        worst = std::max(worst, std::abs(p[i] - arena.params_data()[i]));
        scale = std::max(scale, std::abs(p[i]));
      }
    }
  }
  MESSAGE("Adagrad rule vs float64 after 20 steps: " << worst / scale);
  CHECK(worst / scale <= 1e-5);
  CHECK(opt.step_count() == 20);

  // The state is the arena's "sum" buffer, saved under PyTorch's name; a restored optimizer
  // continues the trajectory bit for bit.
  const tk::StateDict sd = opt.state_dict();
  CHECK(sd.get_string("optimizer") == "Adagrad");
  CHECK(sd.get_double("lr_decay") == 0.01);
  CHECK(sd.tensor("w.sum").shape() == tk::Shape{301, 3});
  Arena copy;
  copy.add("w", tk::Shape{301, 3});
  copy.add("b.bias", tk::Shape{5});
  copy.add("v", tk::Shape{40000});
  copy.finalize();
  std::memcpy(copy.params_data(), arena.params_data(), static_cast<std::size_t>(n) * 4);
  example::Adagrad<> resumed(copy, {.lr = 1.0}, {trainkit::optim::no_weight_decay({"*.bias"})});
  resumed.load_state_dict(sd);
  set_grads(arena, 21);
  set_grads(copy, 21);
  opt.step(host);
  resumed.step(host);
  CHECK(std::memcmp(copy.params_data(), arena.params_data(), static_cast<std::size_t>(n) * 4) == 0);
}
