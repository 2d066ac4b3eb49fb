// SPDX-License-Identifier: MIT
// trainkit/ckpt/state_dict.hpp: the StateDict protocol of checkpoints. A component is
// `Stateful` when `StateAdapter<T>` can turn it into a StateDict (named host tensors + string
// scalars, core/state_dict.hpp) and back: automatically for types with state_dict() /
// load_state_dict() members (optimizers, scalers, LR schedules, EMA), and through the
// specializations here for the components that have none (Prefetcher, samplers, Philox
// streams, Dropout, a ParamArena as plain tensors). Specialize StateAdapter for your own types.
#pragma once

#include <charconv>
#include <concepts>
#include <cstdint>
#include <cstring>
#include <string>
#include <string_view>
#include <system_error>
#include <type_traits>
#include <utility>
#include <vector>

#include "trainkit/config.hpp"
#include "trainkit/core/any_tensor.hpp"
#include "trainkit/core/dtype.hpp"
#include "trainkit/core/rng.hpp"
#include "trainkit/core/shape.hpp"
#include "trainkit/data/prefetcher.hpp"
#include "trainkit/data/sampler.hpp"
#include "trainkit/error.hpp"
#include "trainkit/nn/dropout.hpp"
#include "trainkit/nn/param_arena.hpp"
#include "trainkit/core/state_dict.hpp"

#if TRAINKIT_WITH_CUDA
#include <cuda_runtime_api.h>
#endif

TRAINKIT_NAMESPACE_BEGIN
namespace ckpt {

/// Types with PyTorch-style members: `state_dict() const -> StateDict` and
/// `load_state_dict(const StateDict&)`.
template <class T>
concept HasStateDict = requires(const T& c, T& m, const StateDict& sd) {
  { c.state_dict() } -> std::convertible_to<StateDict>;
  m.load_state_dict(sd);
};

/// How a component of type T is saved (`static StateDict save(const T&)`) and restored
/// (`static void load(T&, const StateDict&)`, which throws trainkit::Error naming the component
/// and the key on a mismatch). The primary template is empty; specialize it for your types.
template <class T>
struct StateAdapter {};

/// Components with state_dict() / load_state_dict() members.
template <HasStateDict T>
struct StateAdapter<T> {
  static StateDict save(const T& c) { return c.state_dict(); }
  static void load(T& c, const StateDict& sd) { c.load_state_dict(sd); }
};

/// Anything a checkpoint can hold: StateAdapter<T> has save and load.
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
/// Restores `c` from `sd` (see StateAdapter).
template <Stateful T>
void load_state_dict_into(T& c, const StateDict& sd) {
  StateAdapter<T>::load(c, sd);
}

namespace detail {

/// Unsigned 64-bit values do not fit StateDict::set(int64): stored as decimal text.
inline void set_u64(StateDict& sd, std::string key, std::uint64_t v) {
  sd.values[std::move(key)] = std::to_string(v);
}
inline std::uint64_t get_u64(const StateDict& sd, std::string_view key) {
  const std::string& text = sd.get_string(key);
  std::uint64_t v = 0;
  const auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), v);
  TRAINKIT_CHECK(ec == std::errc() && end == text.data() + text.size(), "state dict: '", key,
                 "' is '", text, "', not an unsigned integer");
  return v;
}

/// Checks that a configuration value saved with a component equals the one of the component
/// being restored (a different value would change the trajectory silently).
template <class V>
void require_same(std::string_view who, std::string_view key, const V& saved, const V& here) {
  TRAINKIT_CHECK(saved == here, who, ": the checkpoint was saved with ", key, " = ", saved,
                 " but this one has ", key, " = ", here,
                 "; resuming would not continue the same run (construct it as the saved run did)");
}

/// Copies `bytes` between host and device memory (either direction; host-host is memcpy).
inline void copy_between(void* dst, Space dst_space, const void* src, Space src_space,
                         std::size_t bytes) {
  if (bytes == 0) return;
  if (dst_space == Space::kHost && src_space == Space::kHost) {
    std::memcpy(dst, src, bytes);
    return;
  }
#if TRAINKIT_WITH_CUDA
  TRAINKIT_CUDA_CHECK(cudaMemcpy(dst, src, bytes, cudaMemcpyDefault));
#else
  TRAINKIT_FAIL("ckpt: copying device memory, but trainkit was built without CUDA");
#endif
}

}  // namespace detail

// ---- data ----------------------------------------------------------------------------------

/// Prefetcher: the position of the next batch ("epoch", "batch") plus "batch_size" and
/// "batches_per_epoch", which must match on load (another batching changes what batch k is).
/// load() calls restore(): the next next() returns exactly the batch an uninterrupted run
/// would have returned.
template <>
struct StateAdapter<data::Prefetcher> {
  static StateDict save(const data::Prefetcher& p) {
    StateDict sd;
    const data::PrefetchState s = p.state();
    detail::set_u64(sd, "epoch", s.epoch);
    detail::set_u64(sd, "batch", s.batch);
    detail::set_u64(sd, "batch_size", p.options().batch_size);
    detail::set_u64(sd, "batches_per_epoch", p.batches_per_epoch());
    return sd;
  }
  static void load(data::Prefetcher& p, const StateDict& sd) {
    const std::string who = "ckpt: restoring Prefetcher '" + p.options().name + "'";
    detail::require_same<std::uint64_t>(who, "batch_size", detail::get_u64(sd, "batch_size"),
                                        p.options().batch_size);
    detail::require_same<std::uint64_t>(
        who, "batches_per_epoch", detail::get_u64(sd, "batches_per_epoch"), p.batches_per_epoch());
    p.restore({detail::get_u64(sd, "epoch"), detail::get_u64(sd, "batch")});
  }
};

/// Samplers are pure functions of (seed, epoch, rank, world): nothing to restore, but their
/// configuration is saved and checked on load, so a resumed run with another seed or world
/// size fails loudly instead of visiting other samples.
template <>
struct StateAdapter<data::SequentialSampler> {
  static StateDict save(const data::SequentialSampler& s) {
    StateDict sd;
    sd.set("kind", "SequentialSampler");
    detail::set_u64(sd, "size", s.size());
    return sd;
  }
  static void load(data::SequentialSampler& s, const StateDict& sd) {
    const char* who = "ckpt: restoring a SequentialSampler";
    detail::require_same<std::string>(who, "kind", sd.get_string("kind"), "SequentialSampler");
    detail::require_same<std::uint64_t>(who, "size", detail::get_u64(sd, "size"), s.size());
  }
};

template <>
struct StateAdapter<data::RandomSampler> {
  static StateDict save(const data::RandomSampler& s) {
    StateDict sd;
    sd.set("kind", "RandomSampler");
    detail::set_u64(sd, "size", s.size());
    detail::set_u64(sd, "seed", s.seed());
    return sd;
  }
  static void load(data::RandomSampler& s, const StateDict& sd) {
    const char* who = "ckpt: restoring a RandomSampler";
    detail::require_same<std::string>(who, "kind", sd.get_string("kind"), "RandomSampler");
    detail::require_same<std::uint64_t>(who, "size", detail::get_u64(sd, "size"), s.size());
    detail::require_same<std::uint64_t>(who, "seed", detail::get_u64(sd, "seed"), s.seed());
  }
};

template <>
struct StateAdapter<data::DistributedSampler> {
  static StateDict save(const data::DistributedSampler& s) {
    const data::DistributedOptions& o = s.options();
    StateDict sd;
    sd.set("kind", "DistributedSampler");
    detail::set_u64(sd, "num_samples", s.size());
    detail::set_u64(sd, "total_size", s.total_size());
    detail::set_u64(sd, "world", o.world);
    detail::set_u64(sd, "rank", o.rank);
    detail::set_u64(sd, "seed", o.seed);
    sd.set("shuffle", o.shuffle);
    sd.set("drop_last", o.drop_last);
    return sd;
  }
  static void load(data::DistributedSampler& s, const StateDict& sd) {
    const data::DistributedOptions& o = s.options();
    const char* who = "ckpt: restoring a DistributedSampler";
    detail::require_same<std::string>(who, "kind", sd.get_string("kind"), "DistributedSampler");
    detail::require_same<std::uint64_t>(who, "world size", detail::get_u64(sd, "world"), o.world);
    detail::require_same<std::uint64_t>(who, "rank", detail::get_u64(sd, "rank"), o.rank);
    detail::require_same<std::uint64_t>(who, "seed", detail::get_u64(sd, "seed"), o.seed);
    detail::require_same<std::uint64_t>(who, "total_size", detail::get_u64(sd, "total_size"),
                                        s.total_size());
    detail::require_same<bool>(who, "shuffle", sd.get_int("shuffle") != 0, o.shuffle);
    detail::require_same<bool>(who, "drop_last", sd.get_int("drop_last") != 0, o.drop_last);
  }
};

// ---- random numbers ------------------------------------------------------------------------

/// A Philox stream is counter-based: its whole state is (seed, stream, position). load()
/// replaces the stream (seed included), so the next draw is the one the saved run made next.
template <>
struct StateAdapter<PhiloxStream> {
  static StateDict save(const PhiloxStream& s) {
    StateDict sd;
    detail::set_u64(sd, "seed", s.seed());
    detail::set_u64(sd, "stream", s.stream());
    detail::set_u64(sd, "position", s.position());
    return sd;
  }
  static void load(PhiloxStream& s, const StateDict& sd) {
    s = PhiloxStream(detail::get_u64(sd, "seed"), detail::get_u64(sd, "stream"),
                     detail::get_u64(sd, "position"));
  }
};

/// Dropout's mask is keyed by (seed, step, site): the step and training flag are restored; p,
/// seed and site come from the model's construction and are checked.
template <>
struct StateAdapter<nn::Dropout> {
  static StateDict save(const nn::Dropout& d) {
    StateDict sd;
    sd.set("p", static_cast<double>(d.options().p));
    detail::set_u64(sd, "seed", d.options().seed);
    detail::set_u64(sd, "site", d.options().site);
    detail::set_u64(sd, "step", d.step());
    sd.set("training", d.training());
    return sd;
  }
  static void load(nn::Dropout& d, const StateDict& sd) {
    const char* who = "ckpt: restoring nn::Dropout";
    detail::require_same<double>(who, "p", sd.get_double("p"), double(d.options().p));
    detail::require_same<std::uint64_t>(who, "seed", detail::get_u64(sd, "seed"), d.options().seed);
    detail::require_same<std::uint64_t>(who, "site", detail::get_u64(sd, "site"), d.options().site);
    const std::uint64_t step = detail::get_u64(sd, "step");
    TRAINKIT_CHECK(step <= 0xffffffffu, who, ": step ", step, " does not fit 32 bits");
    d.set_step(static_cast<std::uint32_t>(step));
    d.train(sd.get_int("training") != 0);
  }
};

// ---- parameters as plain tensors -----------------------------------------------------------

/// A ParamArena as a component: one F32 tensor per parameter under its name. For a second
/// arena (an EMA copy, a frozen teacher); the model itself is saved by TrainState::model() into
/// model.safetensors. load() requires exactly the arena's names and shapes.
template <Space S>
struct StateAdapter<nn::ParamArena<S>> {
  static StateDict save(const nn::ParamArena<S>& arena) {
    TRAINKIT_CHECK(arena.finalized(), "ckpt: saving a ParamArena before finalize()");
    StateDict sd;
    for (const nn::ParamInfo& p : arena.infos()) {
      AnyTensor t(DType::kF32, p.shape);
      detail::copy_between(t.data(), Space::kHost, arena.params_data() + p.offset, S, t.bytes());
      sd.tensors.emplace(p.name, std::move(t));
    }
    return sd;
  }
  static void load(nn::ParamArena<S>& arena, const StateDict& sd) {
    TRAINKIT_CHECK(arena.finalized(), "ckpt: loading a ParamArena before finalize()");
    TRAINKIT_CHECK(sd.tensors.size() == arena.size(), "ckpt: restoring a ParamArena of ",
                   arena.size(), " parameters from a state of ", sd.tensors.size(), " tensors");
    for (const nn::ParamInfo& p : arena.infos()) {
      const AnyTensor& t = sd.tensor(p.name);
      TRAINKIT_CHECK(t.dtype() == DType::kF32 && t.shape() == p.shape, "ckpt: parameter '", p.name,
                     "' is ", dtype_name(t.dtype()), " ", t.shape().to_string(),
                     " in the checkpoint but F32 ", p.shape.to_string(), " in the arena");
    }
    for (const nn::ParamInfo& p : arena.infos()) {
      const AnyTensor& t = sd.tensor(p.name);
      detail::copy_between(arena.params_data() + p.offset, S, t.data(), Space::kHost, t.bytes());
    }
  }
};

static_assert(Stateful<data::Prefetcher> && Stateful<data::RandomSampler> &&
              Stateful<data::DistributedSampler> && Stateful<data::SequentialSampler> &&
              Stateful<PhiloxStream> && Stateful<nn::Dropout> && Stateful<nn::ParamArena<>>);

}  // namespace ckpt
TRAINKIT_NAMESPACE_END
