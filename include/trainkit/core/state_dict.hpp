// SPDX-License-Identifier: MIT
// trainkit/core/state_dict.hpp: the state protocol of every stateful training object. `StateDict`
// is what an object hands to a checkpoint and takes back: named host tensors (AnyTensor) plus
// named scalars kept as strings (safetensors' `__metadata__` is a string map; numbers are written
// in the shortest form that reads back to the same bits). A type is `Stateful` when
// `StateAdapter<T>` can save and load it; types with PyTorch-style `state_dict()` /
// `load_state_dict()` members (optimizers, scalers, schedules, the Prefetcher, samplers,
// Dropout, ParamArena) are Stateful as they are; `StateAdapter` is specialized for types that
// cannot have the members (PhiloxStream, below) and can be by users for theirs.
#pragma once

#include <charconv>
#include <concepts>
#include <cstdint>
#include <map>
#include <string>
#include <string_view>
#include <system_error>
#include <type_traits>
#include <utility>

#include "trainkit/config.hpp"
#include "trainkit/core/any_tensor.hpp"
#include "trainkit/core/rng.hpp"
#include "trainkit/error.hpp"

TRAINKIT_NAMESPACE_BEGIN

/// Named tensors and named scalars of one object (or of several, under key prefixes).
/// Tensors are host copies (a state_dict of device state downloads it: a host sync). Copying a
/// StateDict copies the tensors' bytes.
struct StateDict {
  std::map<std::string, AnyTensor> tensors;
  std::map<std::string, std::string> values;

  StateDict() = default;
  StateDict(StateDict&&) noexcept = default;
  StateDict& operator=(StateDict&&) noexcept = default;
  StateDict(const StateDict& other) : values(other.values) {
    for (const auto& [k, t] : other.tensors) tensors.emplace(k, AnyTensor::copy_of(t.view()));
  }
  StateDict& operator=(const StateDict& other) {
    if (this != &other) *this = StateDict(other);
    return *this;
  }

  bool empty() const noexcept { return tensors.empty() && values.empty(); }
  bool contains(std::string_view key) const {
    return values.count(std::string(key)) != 0 || tensors.count(std::string(key)) != 0;
  }

  /// Stores a number; doubles round-trip exactly (shortest representation, std::to_chars).
  void set(std::string key, double value) { values[std::move(key)] = number_to_string(value); }
  void set(std::string key, std::int64_t value) { values[std::move(key)] = std::to_string(value); }
  void set(std::string key, int value) { set(std::move(key), std::int64_t{value}); }
  void set(std::string key, bool value) { set(std::move(key), std::int64_t{value ? 1 : 0}); }
  void set(std::string key, std::string value) { values[std::move(key)] = std::move(value); }
  void set(std::string key, const char* value) { values[std::move(key)] = value; }

  /// Unsigned 64-bit values (counters, seeds) do not fit set(int64): stored as decimal text.
  void set_u64(std::string key, std::uint64_t value) {
    values[std::move(key)] = std::to_string(value);
  }

  /// The scalar `key`; throws trainkit::Error naming the key when absent or not a number.
  double get_double(std::string_view key) const { return get_number<double>(key, "a number"); }
  std::int64_t get_int(std::string_view key) const {
    return get_number<std::int64_t>(key, "an integer");
  }
  std::uint64_t get_u64(std::string_view key) const {
    return get_number<std::uint64_t>(key, "an unsigned integer");
  }
  const std::string& get_string(std::string_view key) const {
    const auto it = values.find(std::string(key));
    TRAINKIT_CHECK(it != values.end(), "state dict: missing value '", shown(key), "'");
    return it->second;
  }
  /// The scalar `key` parsed as a T (from_chars, the whole text); throws trainkit::Error naming
  /// the key and its text otherwise ("..., not <what>"; the text, which comes from a file, is
  /// shown escaped and cut to its first 200 bytes).
  template <class T>
  T get_number(std::string_view key, const char* what) const {
    const std::string& text = get_string(key);
    T value{};
    const auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), value);
    TRAINKIT_CHECK(ec == std::errc() && end == text.data() + text.size(), "state dict: '",
                   shown(key), "' is '", shown(text), "', not ", what);
    return value;
  }

  /// The tensor `key`; throws naming the key when absent.
  const AnyTensor& tensor(std::string_view key) const {
    const auto it = tensors.find(std::string(key));
    TRAINKIT_CHECK(it != tensors.end(), "state dict: missing tensor '", shown(key), "'");
    return it->second;
  }

  /// Text of a key or value (which may come from a file) as an error message shows it: its first
  /// 200 bytes through detail::printable_bytes, then "..." if there was more (printable_prefix).
  static std::string shown(std::string_view text) { return detail::printable_prefix(text); }

  /// Moves every entry of `other` in under "<prefix>.<key>" (composition of state dicts).
  void merge(std::string_view prefix, StateDict other) {
    const std::string p = std::string(prefix) + ".";
    for (auto& [k, v] : other.values) values[p + k] = std::move(v);
    for (auto& [k, t] : other.tensors) tensors[p + k] = std::move(t);
  }
  /// The entries under "<prefix>." with the prefix removed (tensors are deep-copied).
  StateDict sub(std::string_view prefix) const {
    const std::string p = std::string(prefix) + ".";
    StateDict out;
    for (auto it = values.lower_bound(p); it != values.end() && it->first.starts_with(p); ++it)
      out.values[it->first.substr(p.size())] = it->second;
    for (auto it = tensors.lower_bound(p); it != tensors.end() && it->first.starts_with(p); ++it)
      out.tensors[it->first.substr(p.size())] = AnyTensor::copy_of(it->second.view());
    return out;
  }

  /// Shortest decimal form that parses back to the same double ("inf", "-inf", "nan" included;
  /// a NaN reads back as the quiet NaN of its sign, without its payload).
  static std::string number_to_string(double value) {
    char buffer[64];
    const auto [end, ec] = std::to_chars(buffer, buffer + sizeof(buffer), value);
    return ec == std::errc() ? std::string(buffer, end) : std::string("nan");
  }
};

/// Writes a StateDict again over what it held, reusing the memory of its tensors: for state
/// saved again and again into one StateDict kept for the purpose (an async checkpoint's staging
/// copy), so a save is one copy into memory that is already mapped (no allocation, no page
/// faults). The constructor sets the tensors aside and clears the scalars; tensor() hands back the
/// set-aside tensor of a key when its dtype and shape match, a new one otherwise; set-aside tensors
/// not asked for again are freed with the StateDictRefill.
///
///   void state_dict_into(StateDict& sd) const {
///     StateDictRefill refill(sd);
///     AnyTensor& t = refill.tensor("exp_avg", DType::kF32, shape);   // then fill t's bytes
///     sd.set("step", step_);
///   }
class StateDictRefill {
 public:
  explicit StateDictRefill(StateDict& sd) : sd_(sd), spare_(std::move(sd.tensors)) {
    sd.tensors.clear();
    sd.values.clear();
  }
  StateDictRefill(const StateDictRefill&) = delete;
  StateDictRefill& operator=(const StateDictRefill&) = delete;

  /// The tensor `key` of the StateDict, of `dtype` and `shape`: the set-aside tensor of that key
  /// when it matches (its old bytes still in it: overwrite them all), else a new one.
  AnyTensor& tensor(const std::string& key, DType dtype, const Shape& shape) {
    AnyTensor& slot = sd_.tensors[key];
    auto node = spare_.extract(key);
    if (!node.empty() && node.mapped().dtype() == dtype && node.mapped().shape() == shape) {
      slot = std::move(node.mapped());
    } else {
      slot = AnyTensor(dtype, shape);
    }
    return slot;
  }

 private:
  StateDict& sd_;
  std::map<std::string, AnyTensor> spare_;
};

namespace detail {
/// A setting as check_saved_setting shows it: a floating-point value in its shortest round-trip
/// form (so two different values never print alike, as 0.1 and 0.10000000000000002 did), text
/// escaped and bounded (the saved one comes from a file), an integer as a number (8-bit too).
template <class V>
std::string setting_text(const V& value) {
  if constexpr (std::is_floating_point_v<V>) {
    char buffer[64];
    const auto [end, ec] = std::to_chars(buffer, buffer + sizeof(buffer), value);
    return ec == std::errc() ? std::string(buffer, end) : concat(value);
  } else if constexpr (std::is_convertible_v<const V&, std::string_view>) {
    return StateDict::shown(std::string_view(value));
  } else if constexpr (std::is_integral_v<V>) {
    return concat(+value);
  } else {
    return concat(value);
  }
}
}  // namespace detail

/// Checks that a setting saved with a component equals the one of the component being restored
/// (a different value would change the trajectory silently). `who` names the component; the
/// message shows both values exactly (see detail::setting_text).
template <class V>
void check_saved_setting(std::string_view who, std::string_view key, const V& saved,
                         const V& here) {
  TRAINKIT_CHECK(saved == here, who, ": the checkpoint was saved with ", key, " = ",
                 detail::setting_text(saved), " but this one has ", key, " = ",
                 detail::setting_text(here),
                 "; resuming would not continue the same run (construct it as the saved run did)");
}

/// Types with PyTorch-style members: `state_dict() const -> StateDict` and
/// `load_state_dict(const StateDict&)`.
template <class T>
concept HasStateDict = requires(const T& c, T& m, const StateDict& sd) {
  { c.state_dict() } -> std::convertible_to<StateDict>;
  m.load_state_dict(sd);
};

/// How a component of type T is saved (`static StateDict save(const T&)`) and restored
/// (`static void load(T&, const StateDict&)`, which throws trainkit::Error naming the component
/// and the key on a mismatch). The primary template is empty; specialize it for types that
/// cannot have the members themselves.
template <class T>
struct StateAdapter {};

/// Components with state_dict() / load_state_dict() members.
template <HasStateDict T>
struct StateAdapter<T> {
  static StateDict save(const T& c) { return c.state_dict(); }
  static void load(T& c, const StateDict& sd) { c.load_state_dict(sd); }
};

/// Anything a checkpoint can hold: StateAdapter<T> has save and load. A component that is saved
/// often and holds much state may also have `state_dict_into(StateDict&) const`: the same
/// entries written into a StateDict that holds what an earlier call wrote, reusing its tensors
/// (StateDictRefill); the Checkpointer's async snapshot uses it when present.
template <class T>
concept Stateful = requires(const T& c, T& m, const StateDict& sd) {
  { StateAdapter<T>::save(c) } -> std::convertible_to<StateDict>;
  StateAdapter<T>::load(m, sd);
};

/// The state of `c` (see StateAdapter).
template <Stateful T>
StateDict state_dict_of(const T& c) {
  return StateAdapter<T>::save(c);
}
/// Writes the state of `c` into `sd`, which is empty or holds what an earlier call for `c` wrote:
/// through `c.state_dict_into(sd)` when T has it (reusing sd's tensors), else as a fresh state.
template <Stateful T>
void state_dict_into_of(const T& c, StateDict& sd) {
  if constexpr (requires { c.state_dict_into(sd); }) {
    c.state_dict_into(sd);
  } else {
    sd = StateAdapter<T>::save(c);
  }
}
/// Restores `c` from `sd` (see StateAdapter).
template <Stateful T>
void load_state_dict_into(T& c, const StateDict& sd) {
  StateAdapter<T>::load(c, sd);
}

/// A Philox stream is counter-based: its whole state is (seed, stream, position). load()
/// replaces the stream (seed included), so the next draw is the one the saved run made next.
/// (An adapter rather than members: core/rng.hpp is included by device code and stays light.)
template <>
struct StateAdapter<PhiloxStream> {
  static StateDict save(const PhiloxStream& s) {
    StateDict sd;
    sd.set_u64("seed", s.seed());
    sd.set_u64("stream", s.stream());
    sd.set_u64("position", s.position());
    return sd;
  }
  static void load(PhiloxStream& s, const StateDict& sd) {
    s = PhiloxStream(sd.get_u64("seed"), sd.get_u64("stream"), sd.get_u64("position"));
  }
};

TRAINKIT_NAMESPACE_END
