// SPDX-License-Identifier: MIT
// trainkit/train/search_space.hpp: the space a hyper-parameter search samples from. Dimensions
// are uniform or log-uniform floats, integer ranges (optionally log-spaced) and categorical
// choices, built in code or parsed from text such as `lr=loguniform(1e-4,1e-1)`,
// `hidden=choice(64,128,256)`, `epochs=int(2,8)`. Trial k's values are a pure function of
// (seed, k) through Philox (core/rng.hpp), so the same seed gives the same trials in any order.
#pragma once

#include <algorithm>
#include <cctype>
#include <charconv>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <concepts>
#include <limits>
#include <set>
#include <string>
#include <string_view>
#include <system_error>
#include <utility>
#include <variant>
#include <vector>

#include "trainkit/config.hpp"
#include "trainkit/core/rng.hpp"
#include "trainkit/core/state_dict.hpp"
#include "trainkit/error.hpp"

TRAINKIT_NAMESPACE_BEGIN
namespace train {

/// One hyper-parameter value: a float (double), an integer or a string.
class ParamValue {
 public:
  ParamValue() = default;
  ParamValue(double v) : value_(v) {}  // NOLINT: implicit, like a literal
  template <std::integral I>
  requires(!std::same_as<I, bool>) ParamValue(I v)  // NOLINT
      : value_(static_cast<std::int64_t>(v)) {}
  ParamValue(std::string v) : value_(std::move(v)) {}         // NOLINT
  ParamValue(const char* v) : value_(std::string(v)) {}       // NOLINT
  ParamValue(std::string_view v) : value_(std::string(v)) {}  // NOLINT

  bool is_float() const noexcept { return std::holds_alternative<double>(value_); }
  bool is_int() const noexcept { return std::holds_alternative<std::int64_t>(value_); }
  bool is_string() const noexcept { return std::holds_alternative<std::string>(value_); }

  /// The value as a double (an integer converts); throws trainkit::Error for a string.
  double as_double() const {
    if (const auto* i = std::get_if<std::int64_t>(&value_)) return static_cast<double>(*i);
    TRAINKIT_CHECK(is_float(), "hyper-parameter value '", text(), "' is a string, not a number");
    return std::get<double>(value_);
  }
  /// The integer; throws trainkit::Error unless the value is an integer.
  std::int64_t as_int() const {
    TRAINKIT_CHECK(is_int(), "hyper-parameter value '", text(), "' is not an integer");
    return std::get<std::int64_t>(value_);
  }
  /// The string; throws trainkit::Error unless the value is a string.
  const std::string& as_string() const {
    TRAINKIT_CHECK(is_string(), "hyper-parameter value '", text(), "' is not a string");
    return std::get<std::string>(value_);
  }
  /// The canonical text: the shortest decimal that reads back to the same double, the integer
  /// in decimal, or the string itself. This is what a command line template receives.
  std::string text() const {
    if (const auto* d = std::get_if<double>(&value_)) return StateDict::number_to_string(*d);
    if (const auto* i = std::get_if<std::int64_t>(&value_)) return std::to_string(*i);
    return std::get<std::string>(value_);
  }
  /// Parses a choice's text: an integer, else a finite number, else the text as a string.
  static ParamValue from_text(std::string_view text) {
    std::int64_t i = 0;
    const char* end = text.data() + text.size();
    if (auto [p, ec] = std::from_chars(text.data(), end, i); ec == std::errc() && p == end)
      return ParamValue(i);
    double d = 0.0;
    if (auto [p, ec] = std::from_chars(text.data(), end, d);
        ec == std::errc() && p == end && std::isfinite(d))
      return ParamValue(d);
    return ParamValue(text);
  }

  friend bool operator==(const ParamValue& a, const ParamValue& b) = default;

 private:
  std::variant<double, std::int64_t, std::string> value_ = 0.0;
};

/// One trial's hyper-parameters: name -> value, in the order of the space's dimensions.
class Params {
 public:
  /// Sets (replaces or appends) `name`.
  void set(std::string name, ParamValue value) {
    for (auto& [n, v] : items_)
      if (n == name) {
        v = std::move(value);
        return;
      }
    items_.emplace_back(std::move(name), std::move(value));
  }
  bool contains(std::string_view name) const noexcept { return find(name) != nullptr; }
  /// The value of `name`; throws trainkit::Error naming it and the known names when absent.
  const ParamValue& at(std::string_view name) const {
    const ParamValue* v = find(name);
    if (v == nullptr) {
      std::string known;
      for (const auto& [n, value] : items_) known += (known.empty() ? "" : ", ") + n;
      TRAINKIT_FAIL("hyper-parameter '", name, "' is not in this trial's parameters (",
                    known.empty() ? std::string("none") : known, ")");
    }
    return *v;
  }
  /// Shorthands for at(name).as_double() / as_int() / as_string().
  double get_double(std::string_view name) const { return at(name).as_double(); }
  std::int64_t get_int(std::string_view name) const { return at(name).as_int(); }
  const std::string& get_string(std::string_view name) const { return at(name).as_string(); }

  /// (name, value) pairs in order.
  const std::vector<std::pair<std::string, ParamValue>>& items() const noexcept { return items_; }
  std::size_t size() const noexcept { return items_.size(); }
  /// "lr=0.001 hidden=64".
  std::string to_string() const {
    std::string out;
    for (const auto& [n, v] : items_) out += (out.empty() ? "" : " ") + n + "=" + v.text();
    return out;
  }
  friend bool operator==(const Params& a, const Params& b) = default;

 private:
  const ParamValue* find(std::string_view name) const noexcept {
    for (const auto& [n, v] : items_)
      if (n == name) return &v;
    return nullptr;
  }
  std::vector<std::pair<std::string, ParamValue>> items_;
};

/// How a dimension is sampled.
enum class DimensionKind : std::uint8_t {
  kUniform,     ///< a double uniform in [low, high)
  kLogUniform,  ///< a double whose log is uniform in [log low, log high); 0 < low < high
  kInt,         ///< an integer uniform in [low, high] (both ends included)
  kLogInt,      ///< an integer in [low, high], log-spaced (floor of log-uniform on [low, high+1))
  kChoice,      ///< one of `choices`, each equally likely
};

/// One named dimension of a SearchSpace.
struct Dimension {
  std::string name;
  DimensionKind kind = DimensionKind::kUniform;
  double low = 0.0, high = 0.0;            ///< kUniform, kLogUniform
  std::int64_t int_low = 0, int_high = 0;  ///< kInt, kLogInt
  std::vector<ParamValue> choices = {};    ///< kChoice

  /// The value for a uniform variate `u` in [0, 1) (always inside the dimension's range).
  ParamValue sample(double u) const {
    switch (kind) {
      case DimensionKind::kUniform: {
        // high - low overflows for ranges wider than the largest double: then the weighted sum.
        const double width = high - low;
        const double v = std::isfinite(width) ? low + u * width : (1.0 - u) * low + u * high;
        return std::clamp(v, low, std::nextafter(high, low));
      }
      case DimensionKind::kLogUniform: {
        const double v = std::exp(std::log(low) + u * (std::log(high) - std::log(low)));
        return std::clamp(v, low, std::nextafter(high, low));
      }
      case DimensionKind::kInt: {
        const double span = static_cast<double>(int_high - int_low) + 1.0;
        const auto k = static_cast<std::int64_t>(std::floor(u * span));
        return std::min(int_low + k, int_high);
      }
      case DimensionKind::kLogInt: {
        const double a = std::log(static_cast<double>(int_low));
        const double b = std::log(static_cast<double>(int_high) + 1.0);
        const auto k = static_cast<std::int64_t>(std::floor(std::exp(a + u * (b - a))));
        return std::clamp(k, int_low, int_high);
      }
      case DimensionKind::kChoice: {
        const auto i = static_cast<std::size_t>(u * static_cast<double>(choices.size()));
        return choices[std::min(i, choices.size() - 1)];
      }
    }
    return ParamValue();
  }

  /// The canonical text, which parse() reads back: `lr=loguniform(0.0001,0.1)`.
  std::string spec() const {
    const auto num = [](double v) { return StateDict::number_to_string(v); };
    switch (kind) {
      case DimensionKind::kUniform: return name + "=uniform(" + num(low) + "," + num(high) + ")";
      case DimensionKind::kLogUniform:
        return name + "=loguniform(" + num(low) + "," + num(high) + ")";
      case DimensionKind::kInt:
        return name + "=int(" + std::to_string(int_low) + "," + std::to_string(int_high) + ")";
      case DimensionKind::kLogInt:
        return name + "=logint(" + std::to_string(int_low) + "," + std::to_string(int_high) + ")";
      case DimensionKind::kChoice: {
        std::string out = name + "=choice(";
        for (std::size_t i = 0; i < choices.size(); ++i)
          out += (i == 0 ? "" : ",") + choices[i].text();
        return out + ")";
      }
    }
    return name;
  }
};

namespace detail {

/// A double in [0, 1) with 53 random bits from two Philox words of (seed, stream).
inline double search_uniform(std::uint64_t seed, std::uint64_t stream, std::uint64_t pair) {
  const std::uint64_t hi = philox_u32(seed, stream, 2 * pair);
  const std::uint64_t lo = philox_u32(seed, stream, 2 * pair + 1);
  return static_cast<double>(((hi << 32) | lo) >> 11) * 0x1p-53;
}

/// The word pair of a trial's stream that gives the trial its own seed (past any dimension's).
inline constexpr std::uint64_t kTrialSeedPair = std::uint64_t{1} << 40;

inline std::string_view trim(std::string_view s) {
  while (!s.empty() && (s.front() == ' ' || s.front() == '\t')) s.remove_prefix(1);
  while (!s.empty() && (s.back() == ' ' || s.back() == '\t')) s.remove_suffix(1);
  return s;
}

}  // namespace detail

/// The dimensions of a search, each with a unique name.
///
///   train::SearchSpace space;
///   space.log_uniform("lr", 1e-4, 1e-1).choice("hidden", {64, 128, 256}).integer("layers", 1, 4);
///   space.add("dropout=uniform(0,0.5)");  // the same from text
class SearchSpace {
 public:
  SearchSpace() = default;
  /// Parses every spec (see add(std::string_view)).
  static SearchSpace parse(const std::vector<std::string>& specs) {
    SearchSpace s;
    for (const std::string& spec : specs) s.add(spec);
    return s;
  }

  /// A double uniform in [low, high); throws unless low < high, both finite.
  SearchSpace& uniform(std::string name, double low, double high) {
    TRAINKIT_CHECK(std::isfinite(low) && std::isfinite(high) && low < high, "search space: ", name,
                   "=uniform(", low, ",", high, ") needs finite low < high");
    return push(
        {.name = std::move(name), .kind = DimensionKind::kUniform, .low = low, .high = high});
  }
  /// A double log-uniform in [low, high); throws unless 0 < low < high, both finite.
  SearchSpace& log_uniform(std::string name, double low, double high) {
    TRAINKIT_CHECK(std::isfinite(low) && std::isfinite(high) && low > 0 && low < high,
                   "search space: ", name, "=loguniform(", low, ",", high,
                   ") needs finite 0 < low < high");
    return push(
        {.name = std::move(name), .kind = DimensionKind::kLogUniform, .low = low, .high = high});
  }
  /// An integer in [low, high], both included; `log`: log-spaced (needs low >= 1). Throws
  /// unless low <= high and the range has fewer than 2^53 values.
  SearchSpace& integer(std::string name, std::int64_t low, std::int64_t high, bool log = false) {
    const char* what = log ? "=logint(" : "=int(";
    TRAINKIT_CHECK(low <= high, "search space: ", name, what, low, ",", high,
                   ") needs low <= high");
    TRAINKIT_CHECK(static_cast<double>(high) - static_cast<double>(low) < 0x1p53,
                   "search space: ", name, what, low, ",", high, ") spans more than 2^53 values");
    TRAINKIT_CHECK(!log || low >= 1, "search space: ", name, what, low, ",", high,
                   ") needs low >= 1 (it is log-spaced)");
    return push({.name = std::move(name),
                 .kind = log ? DimensionKind::kLogInt : DimensionKind::kInt,
                 .int_low = low,
                 .int_high = high});
  }
  /// One of `choices` (at least one, no value twice).
  SearchSpace& choice(std::string name, std::vector<ParamValue> choices) {
    TRAINKIT_CHECK(!choices.empty(), "search space: ", name, "=choice() needs at least one value");
    // Compared by their text, which is what a trial and the spec see (1 and 1.0 are both "1").
    std::set<std::string> texts;
    for (const ParamValue& c : choices)
      TRAINKIT_CHECK(texts.insert(c.text()).second, "search space: ", name, "=choice(...) lists '",
                     c.text(), "' twice");
    return push(
        {.name = std::move(name), .kind = DimensionKind::kChoice, .choices = std::move(choices)});
  }

  /// Adds a dimension from text `name=kind(args)`: `uniform(low,high)`, `loguniform(low,high)`,
  /// `int(low,high)`, `logint(low,high)`, `choice(a,b,...)` (each value an integer, a number or a
  /// word). Names are letters, digits, '_' and '-', starting with a letter. Throws
  /// trainkit::Error quoting `spec` and saying what is wrong.
  SearchSpace& add(std::string_view spec) {
    const std::string quoted = "search space '" + std::string(spec) + "': ";
    const std::size_t eq = spec.find('=');
    TRAINKIT_CHECK(eq != std::string_view::npos, quoted,
                   "expected name=kind(args), e.g. lr=loguniform(1e-4,1e-1)");
    const std::string name(detail::trim(spec.substr(0, eq)));
    bool name_ok = !name.empty() && std::isalpha(static_cast<unsigned char>(name[0]));
    for (char c : name)
      name_ok = name_ok && (std::isalnum(static_cast<unsigned char>(c)) || c == '_' || c == '-');
    TRAINKIT_CHECK(name_ok, quoted, "'", name,
                   "' is not a usable name (letters, digits, '_' and '-', starting with a letter)");
    std::string_view rest = detail::trim(spec.substr(eq + 1));
    const std::size_t open = rest.find('(');
    TRAINKIT_CHECK(open != std::string_view::npos && rest.back() == ')', quoted,
                   "expected kind(args) after '=', e.g. uniform(0,1)");
    const std::string kind(detail::trim(rest.substr(0, open)));
    const std::string_view inside = rest.substr(open + 1, rest.size() - open - 2);
    std::vector<std::string_view> args;
    for (std::size_t begin = 0;;) {
      const std::size_t comma = inside.find(',', begin);
      args.push_back(detail::trim(inside.substr(begin, comma - begin)));
      if (comma == std::string_view::npos) break;
      begin = comma + 1;
    }
    for (std::string_view a : args)
      TRAINKIT_CHECK(!a.empty(), quoted, "an empty argument in ", kind, "(...)");
    const auto need_two = [&] {
      TRAINKIT_CHECK(args.size() == 2, quoted, kind, " takes two arguments (low,high), got ",
                     args.size());
    };
    const auto number = [&](std::string_view a) {
      double v = 0.0;
      const auto [p, ec] = std::from_chars(a.data(), a.data() + a.size(), v);
      TRAINKIT_CHECK(ec == std::errc() && p == a.data() + a.size() && std::isfinite(v), quoted, "'",
                     a, "' is not a finite number");
      return v;
    };
    const auto whole = [&](std::string_view a) {
      std::int64_t v = 0;
      const auto [p, ec] = std::from_chars(a.data(), a.data() + a.size(), v);
      TRAINKIT_CHECK(ec == std::errc() && p == a.data() + a.size(), quoted, "'", a,
                     "' is not an integer");
      return v;
    };
    try {
      if (kind == "uniform" || kind == "loguniform") {
        need_two();
        const double low = number(args[0]), high = number(args[1]);
        return kind == "uniform" ? uniform(name, low, high) : log_uniform(name, low, high);
      }
      if (kind == "int" || kind == "logint") {
        need_two();
        return integer(name, whole(args[0]), whole(args[1]), kind == "logint");
      }
      if (kind == "choice") {
        std::vector<ParamValue> values;
        for (std::string_view a : args) values.push_back(ParamValue::from_text(a));
        return choice(name, std::move(values));
      }
    } catch (const Error& e) {
      const std::string message = e.what();
      if (message.starts_with(quoted)) throw;
      TRAINKIT_FAIL(quoted, message.substr(message.find(": ") + 2));
    }
    TRAINKIT_FAIL(quoted, "unknown kind '", kind, "' (uniform, loguniform, int, logint or choice)");
  }

  const std::vector<Dimension>& dimensions() const noexcept { return dims_; }
  std::size_t size() const noexcept { return dims_.size(); }
  bool empty() const noexcept { return dims_.empty(); }
  /// Each dimension's canonical text (Dimension::spec), in order.
  std::vector<std::string> specs() const {
    std::vector<std::string> out;
    for (const Dimension& d : dims_) out.push_back(d.spec());
    return out;
  }

  /// Trial `trial`'s values under `seed`: dimension d uses words 2d and 2d+1 of Philox stream
  /// `trial`, so each trial and each dimension is independent of the others and of the order
  /// in which trials are drawn.
  Params sample(std::uint64_t seed, std::uint64_t trial) const {
    Params p;
    for (std::size_t d = 0; d < dims_.size(); ++d)
      p.set(dims_[d].name, dims_[d].sample(detail::search_uniform(seed, trial, d)));
    return p;
  }
  /// A seed of trial `trial`'s own (for its initialisation and data order), from the same stream.
  static std::uint64_t trial_seed(std::uint64_t seed, std::uint64_t trial) {
    return (std::uint64_t{philox_u32(seed, trial, 2 * detail::kTrialSeedPair)} << 32 |
            philox_u32(seed, trial, 2 * detail::kTrialSeedPair + 1)) >>
           1;  // < 2^63: fits a signed 64-bit flag
  }

 private:
  SearchSpace& push(Dimension d) {
    for (const Dimension& e : dims_)
      TRAINKIT_CHECK(e.name != d.name, "search space: '", d.name, "' is defined twice");
    dims_.push_back(std::move(d));
    return *this;
  }
  std::vector<Dimension> dims_;
};

}  // namespace train
TRAINKIT_NAMESPACE_END
