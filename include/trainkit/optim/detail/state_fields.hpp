// SPDX-License-Identifier: MIT
// trainkit/optim/detail/state_fields.hpp (internal): the StateDict plumbing of optim's stateful
// objects written once: fields (a key and a member pointer) saved and restored as a list, several
// key/value pairs set in one call, per-group lists stored as "<prefix>.<g>", and buffers with a
// ParamArena's layout stored as one tensor per parameter.
#pragma once

#include <cmath>
#include <concepts>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <limits>
#include <string>
#include <tuple>
#include <vector>

#include "trainkit/config.hpp"
#include "trainkit/core/any_tensor.hpp"
#include "trainkit/core/bytes.hpp"
#include "trainkit/core/dtype.hpp"
#include "trainkit/core/half.hpp"
#include "trainkit/core/host_copy.hpp"
#include "trainkit/core/state_dict.hpp"
#include "trainkit/error.hpp"
#include "trainkit/nn/param_arena.hpp"

TRAINKIT_NAMESPACE_BEGIN
namespace optim {
namespace detail {

/// One saved member: the state-dict key and the member of O (double, bool or an integer;
/// unsigned integers are stored as decimal text, so a std::uint64_t above INT64_MAX round-trips).
/// `optional`: states saved before the field was added lack its key, and a load keeps the
/// member's current value then (instead of refusing the state).
template <class O, class M>
struct StateField {
  using Member = M O::*;
  const char* key;
  Member member;
  bool optional = false;
};
template <class O, class M>
constexpr StateField<O, M> state_field(const char* key, M O::*member) {
  return {key, member, false};
}
/// A field added after states were first saved: a state without `key` loads, keeping the value.
template <class O, class M>
constexpr StateField<O, M> optional_state_field(const char* key, M O::*member) {
  return {key, member, true};
}

template <class M>
void save_value(StateDict& sd, const char* key, const M& value) {
  if constexpr (std::same_as<M, bool>) {
    sd.set(key, value);
  } else if constexpr (std::unsigned_integral<M>) {
    sd.set_u64(key, static_cast<std::uint64_t>(value));
  } else if constexpr (std::integral<M>) {
    sd.set(key, static_cast<std::int64_t>(value));
  } else {
    sd.set(key, static_cast<double>(value));
  }
}

/// sd.set(field.key, obj.*field.member) for every field of `fields` (a tuple of StateField).
template <class O, class Fields>
void save_fields(StateDict& sd, const O& obj, const Fields& fields) {
  std::apply([&](const auto&... f) { (save_value(sd, f.key, obj.*f.member), ...); }, fields);
}

template <class M>
void load_value(const StateDict& sd, const char* key, M& value) {
  if constexpr (std::same_as<M, bool>) {
    value = sd.get_int(key) != 0;
  } else if constexpr (std::unsigned_integral<M>) {
    const std::uint64_t v = sd.get_u64(key);
    constexpr auto kMax = static_cast<std::uint64_t>(std::numeric_limits<M>::max());
    TRAINKIT_CHECK(v <= kMax, "state dict: '", key, "' is ", v,
                   ", above the largest value it can hold (", kMax, ")");
    value = static_cast<M>(v);
  } else if constexpr (std::integral<M>) {
    value = static_cast<M>(sd.get_int(key));
  } else {
    value = sd.get_double(key);
  }
}

/// The inverse of save_fields: obj.*field.member = the value under field.key (throws for a
/// missing key, naming it; an optional field's missing key keeps the member as it is).
template <class O, class Fields>
void load_fields(const StateDict& sd, O& obj, const Fields& fields) {
  const auto load = [&](const auto& f) {
    if (f.optional && sd.values.count(f.key) == 0) return;
    load_value(sd, f.key, obj.*f.member);
  };
  std::apply([&](const auto&... f) { (load(f), ...); }, fields);
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
/// load_list of learning rates: throws naming `who` and the entry unless each is finite, >= 0.
inline void load_rates(const StateDict& sd, const char* who, const std::string& prefix,
                       std::vector<double>& values) {
  load_list(sd, prefix, values);
  for (std::size_t g = 0; g < values.size(); ++g)
    TRAINKIT_CHECK(std::isfinite(values[g]) && values[g] >= 0.0, who, " state: ", prefix, ".", g,
                   " is ", values[g], "; a learning rate is finite and >= 0");
}

/// The buffer `data` (buffer_numel() elements of `dtype` in the arena's space S, the arena's
/// layout) as tensors "<param><suffix>" of each parameter's shape, padding left out, written
/// through `refill` (reusing its tensors). Host memory is copied once, in parallel (deferred in a
/// DeferCopies scope); device memory is downloaded first (sync, never deferred).
template <Space S>
void save_by_param(StateDictRefill& refill, const nn::ParamArena<S>& arena, const void* data,
                   DType dtype, const std::string& suffix) {
  const std::size_t esize = dtype_size(dtype);
  std::vector<unsigned char> download;
  const unsigned char* src = static_cast<const unsigned char*>(data);
  if constexpr (S != Space::kHost) {
    download.resize(static_cast<std::size_t>(arena.buffer_numel()) * esize);
    copy_bytes(download.data(), Space::kHost, data, S, download.size());
    src = download.data();
  }
  std::vector<trainkit::detail::CopyPiece> pieces;
  pieces.reserve(arena.infos().size());
  for (const nn::ParamInfo& p : arena.infos()) {
    AnyTensor& t = refill.tensor(p.name + suffix, dtype, p.shape);
    pieces.push_back({t.data(), src + static_cast<std::size_t>(p.offset) * esize, t.bytes()});
  }
  if constexpr (S == Space::kHost) {
    trainkit::detail::parallel_copy(pieces);
  } else {
    trainkit::detail::parallel_copy_now(pieces);  // from `download`, gone after the return
  }
}

/// What check_by_param asks of the values of each tensor.
enum class StateValues {
  kAny,          ///< no check (parameters, whose NaN the training loop reports)
  kNumbers,      ///< no NaN (a NaN state makes its parameters NaN at the next step)
  kNonNegative,  ///< no NaN and no value below zero (second moments: a sum of squares)
};

/// The index of the first element of the F32 or BF16 `t` that breaks `want` (-1: none).
inline std::int64_t first_bad_value(const AnyTensor& t, StateValues want) {
  if (want == StateValues::kAny) return -1;
  const bool signs = want == StateValues::kNonNegative;
  // On the bits: NaN has a magnitude above infinity's; a negative value has the sign bit set
  // and a non-zero magnitude (-0 is a fine sum of squares).
  const auto scan = [&]<class Bits>(Bits abs_mask, Bits inf_bits) -> std::int64_t {
    const auto* bytes = t.data();
    const std::int64_t n = t.numel();
    for (std::int64_t i = 0; i < n; ++i) {
      Bits v;
      std::memcpy(&v, bytes + static_cast<std::size_t>(i) * sizeof v, sizeof v);
      const Bits magnitude = v & abs_mask;
      if (magnitude > inf_bits || (signs && v != magnitude && magnitude != 0)) return i;
    }
    return -1;
  };
  if (t.dtype() == DType::kF32) return scan(std::uint32_t{0x7fffffff}, std::uint32_t{0x7f800000});
  if (t.dtype() == DType::kBF16) return scan(std::uint16_t{0x7fff}, std::uint16_t{0x7f80});
  return -1;
}

/// The element `i` of the F32 or BF16 `t` as a float.
inline float value_at(const AnyTensor& t, std::int64_t i) {
  if (t.dtype() == DType::kF32) {
    float value = 0.0f;
    std::memcpy(&value, t.data() + static_cast<std::size_t>(i) * sizeof value, sizeof value);
    return value;
  }
  std::uint16_t bits = 0;
  std::memcpy(&bits, t.data() + static_cast<std::size_t>(i) * sizeof bits, sizeof bits);
  return bf16_bits_to_float(bits);
}

/// Throws `what` + "'<param><suffix>' is ..., expected ..." for the first tensor of a
/// save_by_param layout that is missing or has another dtype or shape, or holds a value that
/// `want` refuses (naming the element and the value).
template <Space S>
void check_by_param(const StateDict& sd, const nn::ParamArena<S>& arena, DType dtype,
                    const std::string& suffix, const std::string& what,
                    StateValues want = StateValues::kAny) {
  for (const nn::ParamInfo& p : arena.infos()) {
    const AnyTensor& t = sd.tensor(p.name + suffix);
    TRAINKIT_CHECK(t.dtype() == dtype && t.shape() == p.shape, what, "'", p.name, suffix, "' is ",
                   dtype_name(t.dtype()), " ", t.shape().to_string(), ", expected ",
                   dtype_name(dtype), " ", p.shape.to_string());
    const std::int64_t bad = first_bad_value(t, want);
    if (bad < 0) continue;
    TRAINKIT_FAIL(
        what, "'", p.name, suffix, "' holds ", value_at(t, bad), " at element ", bad, "; expected ",
        want == StateValues::kNonNegative ? "values >= 0 (a second moment)" : "numbers (no NaN)",
        ": the state is damaged or was saved after the training diverged");
  }
}

/// The inverse of save_by_param (after check_by_param): the padding becomes zero.
template <Space S>
void load_by_param(const StateDict& sd, const nn::ParamArena<S>& arena, void* data, DType dtype,
                   const std::string& suffix) {
  const std::size_t esize = dtype_size(dtype);
  std::vector<unsigned char> host(static_cast<std::size_t>(arena.buffer_numel()) * esize, 0);
  for (const nn::ParamInfo& p : arena.infos()) {
    const AnyTensor& t = sd.tensor(p.name + suffix);
    if (t.bytes() != 0)
      std::memcpy(host.data() + static_cast<std::size_t>(p.offset) * esize, t.data(), t.bytes());
  }
  if constexpr (S == Space::kHost) trainkit::detail::wait_for_snapshot_copies();
  copy_bytes(data, S, host.data(), Space::kHost, host.size());
}

}  // namespace detail
}  // namespace optim
TRAINKIT_NAMESPACE_END
