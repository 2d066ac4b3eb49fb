// SPDX-License-Identifier: MIT
// trainkit/optim/detail/state_fields.hpp (internal): the StateDict plumbing of optim's stateful
// objects written once: fields (a key and a member pointer) saved and restored as a list, several
// key/value pairs set in one call, and per-group lists stored as "<prefix>.<g>".
#pragma once

#include <concepts>
#include <cstddef>
#include <cstdint>
#include <string>
#include <tuple>
#include <vector>

#include "trainkit/config.hpp"
#include "trainkit/core/state_dict.hpp"

TRAINKIT_NAMESPACE_BEGIN
namespace optim {
namespace detail {

/// One saved member: the state-dict key and the member of O (double, bool or an integer).
template <class O, class M>
struct StateField {
  using Member = M O::*;
  const char* key;
  Member member;
};
template <class O, class M>
constexpr StateField<O, M> state_field(const char* key, M O::*member) {
  return {key, member};
}

/// sd.set(field.key, obj.*field.member) for every field of `fields` (a tuple of StateField).
template <class O, class Fields>
void save_fields(StateDict& sd, const O& obj, const Fields& fields) {
  std::apply([&](const auto&... f) { (sd.set(f.key, obj.*f.member), ...); }, fields);
}

template <class M>
void load_value(const StateDict& sd, const char* key, M& value) {
  if constexpr (std::same_as<M, bool>) {
    value = sd.get_int(key) != 0;
  } else if constexpr (std::integral<M>) {
    value = static_cast<M>(sd.get_int(key));
  } else {
    value = sd.get_double(key);
  }
}

/// The inverse of save_fields: obj.*field.member = the value under field.key (throws for a
/// missing key, naming it).
template <class O, class Fields>
void load_fields(const StateDict& sd, O& obj, const Fields& fields) {
  std::apply([&](const auto&... f) { (load_value(sd, f.key, obj.*f.member), ...); }, fields);
}

/// sd.set(key, value) for each (key, value) pair of the arguments.
template <class V, class... Rest>
void set_values(StateDict& sd, const char* key, const V& value, const Rest&... rest) {
  sd.set(key, value);
  if constexpr (sizeof...(Rest) > 0) set_values(sd, rest...);
}

/// values[g] as "<prefix>.<g>".
inline void save_list(StateDict& sd, const std::string& prefix, const std::vector<double>& values) {
  for (std::size_t g = 0; g < values.size(); ++g)
    sd.set(prefix + "." + std::to_string(g), values[g]);
}
/// values[g] from "<prefix>.<g>" for every g of values (its size stays).
inline void load_list(const StateDict& sd, const std::string& prefix, std::vector<double>& values) {
  for (std::size_t g = 0; g < values.size(); ++g)
    values[g] = sd.get_double(prefix + "." + std::to_string(g));
}

}  // namespace detail
}  // namespace optim
TRAINKIT_NAMESPACE_END
