// Helpers of the nn/ tests: the PyTorch reference values (tests/data/nn/reference.{txt,bin},
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

namespace nntest {

namespace tk = trainkit;

/// One stored reference tensor, widened to double.
struct RefTensor {
  std::vector<std::int64_t> shape;
  std::vector<double> values;
  std::int64_t numel() const { return static_cast<std::int64_t>(values.size()); }
};

/// The reference bundle (loaded once).
class Reference {
 public:
  static const Reference& get() {
    static const Reference instance(std::string(TRAINKIT_TEST_DATA_DIR) + "/nn/reference");
    return instance;
  }

  bool has(const std::string& key) const { return tensors_.count(key) != 0; }

  const RefTensor& operator[](const std::string& key) const {
    const auto it = tensors_.find(key);
    if (it == tensors_.end()) throw std::runtime_error("no reference tensor '" + key + "'");
    return it->second;
  }

 private:
  explicit Reference(const std::string& stem) {
    std::ifstream blob(stem + ".bin", std::ios::binary);
    std::ifstream index(stem + ".txt");
    if (!blob || !index) throw std::runtime_error("cannot open " + stem + ".{txt,bin}");
    std::vector<char> bytes((std::istreambuf_iterator<char>(blob)),
                            std::istreambuf_iterator<char>());
    std::string line;
    while (std::getline(index, line)) {
      if (line.empty() || line[0] == '#') continue;
      std::istringstream in(line);
      std::string key, dtype;
      std::size_t offset = 0;
      int rank = 0;
      in >> key >> dtype >> offset >> rank;
      RefTensor t;
      std::int64_t n = 1;
      for (int d = 0; d < rank; ++d) {
        std::int64_t e = 0;
        in >> e;
        t.shape.push_back(e);
        n *= e;
      }
      const std::size_t width = dtype == "f4" ? 4 : 8;
      if (offset + width * std::size_t(n) > bytes.size())
        throw std::runtime_error("reference.bin too short for " + key);
      for (std::int64_t i = 0; i < n; ++i) {
        const char* p = bytes.data() + offset + width * std::size_t(i);
        if (dtype == "f4") {
          float v;
          std::memcpy(&v, p, 4);
          t.values.push_back(v);
        } else if (dtype == "f8") {
          double v;
          std::memcpy(&v, p, 8);
          t.values.push_back(v);
        } else {
          std::int64_t v;
          std::memcpy(&v, p, 8);
          t.values.push_back(static_cast<double>(v));
        }
      }
      tensors_.emplace(key, std::move(t));
    }
  }

  std::map<std::string, RefTensor> tensors_;
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
