// Helpers of the optim/ tests: the PyTorch reference values
// (tests/fixtures/optim/reference.{txt,bin}, written by make_reference.py), the 4-parameter test
// model they describe, and error measures.
#pragma once

#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <fstream>
#include <iterator>
#include <map>
#include <sstream>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include <trainkit/core/shape.hpp>
#include <trainkit/nn/param_arena.hpp>

#include "support/reference_bundle.hpp"

namespace optest {

namespace tk = trainkit;

using tktest::RefTensor;

/// The optim reference bundle (loaded once).
class Reference : public tktest::ReferenceBundle {
 public:
  using tktest::ReferenceBundle::ReferenceBundle;
  static const Reference& get() {
    static const Reference instance(std::string(TRAINKIT_TEST_DATA_DIR) + "/optim/reference");
    return instance;
  }
};

/// The parameters of make_reference.py's model, in its order.
inline const std::vector<std::pair<std::string, tk::Shape>>& model_shapes() {
  static const std::vector<std::pair<std::string, tk::Shape>> shapes = {
      {"layer.weight", tk::Shape{7, 5}},
      {"layer.bias", tk::Shape{5}},
      {"ln.weight", tk::Shape{6}},
      {"head.weight", tk::Shape{3, 4}}};
  return shapes;
}

inline constexpr int kSteps = 200;

/// Registers the model in `arena`, finalizes it and loads the reference's initial parameters.
template <tk::Space S>
void build_model(tk::nn::ParamArena<S>& arena) {
  for (const auto& [name, shape] : model_shapes()) arena.add(name, shape);
  arena.finalize();
}

inline void load_init(tk::nn::ParamArena<tk::Space::kHost>& arena) {
  const Reference& ref = Reference::get();
  for (const auto& [name, shape] : model_shapes()) {
    const RefTensor& t = ref["init/" + name];
    float* p = arena.params_data() + arena.info(arena.at(name)).offset;
    for (std::int64_t i = 0; i < t.numel(); ++i) p[i] = static_cast<float>(t.values[i]);
  }
}

/// The reference gradient of step t (1-based), times `scale` in f32 (as torch multiplies).
inline void load_grads(tk::nn::ParamArena<tk::Space::kHost>& arena, int t, float scale = 1.0f) {
  const Reference& ref = Reference::get();
  for (const auto& [name, shape] : model_shapes()) {
    const RefTensor& g = ref["grads/" + name];
    const std::int64_t n = shape.numel();
    float* d = arena.grads_data() + arena.info(arena.at(name)).offset;
    for (std::int64_t i = 0; i < n; ++i)
      d[i] = static_cast<float>(g.values[static_cast<std::size_t>((t - 1) * n + i)]) * scale;
  }
}

/// max |a - r| / max |r| over one snapshot of one parameter (a relative error of the tensor).
inline double rel_error(const float* a, const double* r, std::int64_t n) {
  double num = 0.0, den = 0.0;
  for (std::int64_t i = 0; i < n; ++i) {
    num = std::max(num, std::abs(static_cast<double>(a[i]) - r[i]));
    den = std::max(den, std::abs(r[i]));
  }
  return den == 0.0 ? num : num / den;
}

/// True when step t is stored in the trajectories; its row index via snapshot_row.
inline int snapshot_row(int t) {
  const RefTensor& s = Reference::get()["snapshots"];
  for (std::size_t i = 0; i < s.values.size(); ++i)
    if (static_cast<int>(s.values[i]) == t) return static_cast<int>(i);
  return -1;
}

/// The largest relative error of the arena's parameters against case `c` at step t.
inline double param_error(const tk::nn::ParamArena<tk::Space::kHost>& arena, const std::string& c,
                          int t) {
  const int row = snapshot_row(t);
  double worst = 0.0;
  for (const auto& [name, shape] : model_shapes()) {
    const RefTensor& r = Reference::get()[c + "/param/" + name];
    const std::int64_t n = shape.numel();
    const float* p = arena.params_data() + arena.info(arena.at(name)).offset;
    worst = std::max(worst, rel_error(p, r.values.data() + static_cast<std::size_t>(row) * n, n));
  }
  return worst;
}

}  // namespace optest
