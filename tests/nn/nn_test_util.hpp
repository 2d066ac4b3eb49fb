// Helpers of the nn/ tests: the PyTorch reference values (tests/fixtures/nn/reference.{txt,bin},
// written by make_reference.py), float64 tensors, relative errors and central finite differences.
#pragma once

#include <doctest/doctest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <fstream>
#include <functional>
#include <map>
#include <sstream>
#include <stdexcept>
#include <string>
#include <vector>

#include <trainkit/core/rng.hpp>
#include <trainkit/core/tensor.hpp>
#include <trainkit/core/tensor_view.hpp>
#include <trainkit/nn/param_arena.hpp>

#include "support/reference_bundle.hpp"

namespace nntest {

namespace tk = trainkit;

using tktest::RefTensor;

/// The nn reference bundle (loaded once).
class Reference : public tktest::ReferenceBundle {
 public:
  using tktest::ReferenceBundle::ReferenceBundle;
  static const Reference& get() {
    static const Reference instance(std::string(TRAINKIT_TEST_DATA_DIR) + "/nn/reference");
    return instance;
  }
};

/// ||got - want|| / max(||want||, tiny) over all elements.
template <class G, class W>
double rel_err(const G& got, const W& want, std::int64_t n) {
  double num = 0.0, den = 0.0;
  for (std::int64_t i = 0; i < n; ++i) {
    const double d = static_cast<double>(got[i]) - static_cast<double>(want[i]);
    num += d * d;
    den += static_cast<double>(want[i]) * static_cast<double>(want[i]);
  }
  return std::sqrt(num) / std::max(std::sqrt(den), 1e-30);
}

inline double rel_err(const std::vector<double>& got, const std::vector<double>& want) {
  REQUIRE(got.size() == want.size());
  return rel_err(got.data(), want.data(), static_cast<std::int64_t>(got.size()));
}

/// Deterministic pseudo-random values in [-scale, scale) (Philox, so any platform agrees).
inline std::vector<float> random_floats(std::int64_t n, std::uint64_t seed, float scale = 1.0f) {
  tk::PhiloxStream rng(seed, 7);
  std::vector<float> v(static_cast<std::size_t>(n));
  for (auto& x : v) x = scale * (2.0f * rng.next_uniform() - 1.0f);
  return v;
}

inline std::vector<double> to_double(const float* p, std::int64_t n) {
  return std::vector<double>(p, p + n);
}

/// Central finite differences of a scalar function f at x, in double: g_i = (f(x + h e_i) -
/// f(x - h e_i)) / 2h.
inline std::vector<double> finite_diff(const std::function<double(const std::vector<double>&)>& f,
                                       std::vector<double> x, double h = 1e-6) {
  std::vector<double> g(x.size());
  for (std::size_t i = 0; i < x.size(); ++i) {
    const double x0 = x[i];
    x[i] = x0 + h;
    const double fp = f(x);
    x[i] = x0 - h;
    const double fm = f(x);
    x[i] = x0;
    g[i] = (fp - fm) / (2.0 * h);
  }
  return g;
}

/// sum_i a_i b_i.
inline double dot(const std::vector<double>& a, const std::vector<double>& b) {
  double s = 0.0;
  for (std::size_t i = 0; i < a.size(); ++i) s += a[i] * b[i];
  return s;
}

/// Copies reference values (f32 exactly representable) into float memory.
inline void fill(float* dst, const RefTensor& t) {
  for (std::int64_t i = 0; i < t.numel(); ++i)
    dst[i] = static_cast<float>(t.values[std::size_t(i)]);
}

/// A host f32 tensor holding a reference tensor.
inline tk::Tensor<float> tensor_of(const RefTensor& t) {
  tk::Tensor<float> out(tk::Shape(std::span<const std::int64_t>(t.shape.data(), t.shape.size())));
  fill(out.data(), t);
  return out;
}

/// Loads "<case>/param/<name>" into every parameter of the arena.
inline void load_params(tk::nn::ParamArena<>& arena, const std::string& case_name) {
  const Reference& ref = Reference::get();
  for (const auto& info : arena.infos()) {
    const RefTensor& t = ref[case_name + "/param/" + info.name];
    REQUIRE(t.numel() == info.numel);
    fill(arena.params_data() + info.offset, t);
  }
}

/// Checks every gradient of the arena against "<case>/grad/<name>".
inline void check_grads(const tk::nn::ParamArena<>& arena, const std::string& case_name,
                        double tol) {
  const Reference& ref = Reference::get();
  for (const auto& info : arena.infos()) {
    const RefTensor& t = ref[case_name + "/grad/" + info.name];
    REQUIRE(t.numel() == info.numel);
    const double err = rel_err(arena.grads_data() + info.offset, t.values.data(), info.numel);
    INFO(case_name, " grad ", info.name, ": rel err ", err);
    CHECK(err < tol);
  }
}

}  // namespace nntest
