// SPDX-License-Identifier: MIT
// trainkit/ckpt/train_state.hpp: `TrainState`, everything a run needs to continue on the exact
// trajectory, registered once: the model (a ParamArena, saved under PyTorch names), named
// Stateful components (optimizer, scaler, LR schedule, Prefetcher, samplers, RNG streams, ...),
// the step and epoch counters and user metadata (string -> string). A Checkpointer snapshots it
// and restores it in one call. Components are held by reference and must outlive it.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "trainkit/ckpt/model.hpp"
#include "trainkit/core/state_dict.hpp"
#include "trainkit/config.hpp"
#include "trainkit/core/any_tensor.hpp"
#include "trainkit/error.hpp"
#include "trainkit/io/safetensors.hpp"
#include "trainkit/nn/param_arena.hpp"

TRAINKIT_NAMESPACE_BEGIN
namespace ckpt {

/// Options of TrainState::load_state_dict.
struct RestoreOptions {
  /// Every registered component must have state in the checkpoint, and the checkpoint may hold
  /// no state of components that are not registered. false: such components are skipped.
  bool strict = true;
};

namespace detail {

/// The model behind TrainState, type-erased over the arena's memory space.
class ModelEntry {
 public:
  virtual ~ModelEntry() = default;
  virtual const std::vector<nn::ParamInfo>& infos() const = 0;
  /// Named F32 views of the parameters selected by `keep` (all when empty); into the arena, or
  /// into `buffer` when `copy` (always for a device arena).
  virtual std::vector<io::NamedTensor> views(bool copy, const std::vector<bool>& keep,
                                             AnyTensor& buffer) const = 0;
  virtual ModelLoadReport load(const TensorSource& src, const ModelLoadOptions& options) = 0;
};

template <Space S>
class ModelEntryOf final : public ModelEntry {
 public:
  explicit ModelEntryOf(nn::ParamArena<S>& arena) : arena_(&arena) {}
  const std::vector<nn::ParamInfo>& infos() const override { return arena_->infos(); }
  std::vector<io::NamedTensor> views(bool copy, const std::vector<bool>& keep,
                                     AnyTensor& buffer) const override {
    return model_views(*arena_, copy, keep, buffer);
  }
  ModelLoadReport load(const TensorSource& src, const ModelLoadOptions& options) override {
    return load_model(*arena_, src, options);
  }

 private:
  nn::ParamArena<S>* arena_;
};

/// Moves the entries under "<prefix>." out of `sd` (prefix removed): no tensor copies.
TRAINKIT_INLINE StateDict take_prefix(StateDict& sd, std::string_view prefix);

#if TRAINKIT_IMPL

TRAINKIT_INLINE StateDict take_prefix(StateDict& sd, std::string_view prefix) {
  const std::string p = std::string(prefix) + ".";
  StateDict out;
  for (auto it = sd.values.lower_bound(p); it != sd.values.end() && it->first.starts_with(p);) {
    out.values.emplace(it->first.substr(p.size()), std::move(it->second));
    it = sd.values.erase(it);
  }
  for (auto it = sd.tensors.lower_bound(p); it != sd.tensors.end() && it->first.starts_with(p);) {
    out.tensors.emplace(it->first.substr(p.size()), std::move(it->second));
    it = sd.tensors.erase(it);
  }
  return out;
}

#endif  // TRAINKIT_IMPL

}  // namespace detail

/// The full state of a training run. Register the parts once, then hand it to a Checkpointer:
///
///   ckpt::TrainState state;
///   state.model(arena).add("optimizer", opt).add("schedule", *sched).add("loader", loader);
///   state.metadata["run"] = "mlp-7";
///   if (auto info = checkpointer.resume(state)) { /* continues at state.step */ }
///   for (; state.step < total; ++state.step) { ...; checkpointer.maybe_save(state); }
///
/// Component state is stored as "<name>.<key>"; the counters as "trainer.step" and
/// "trainer.epoch"; metadata as "user.<key>". Not copyable (it refers to the components).
class TrainState {
 public:
  /// Completed optimizer steps (the Checkpointer names directories after it).
  std::int64_t step = 0;
  /// Epoch counter for your own use (the Prefetcher keeps its own position).
  std::int64_t epoch = 0;
  /// Free-form strings saved with every checkpoint and restored by resume.
  std::map<std::string, std::string> metadata;

  TrainState() = default;
  TrainState(const TrainState&) = delete;
  TrainState& operator=(const TrainState&) = delete;
  TrainState(TrainState&&) noexcept = default;
  TrainState& operator=(TrainState&&) noexcept = default;

  /// Registers the model: its parameters go to model.safetensors under their names. One model
  /// per TrainState (register other arenas with add()). Throws when one is registered already.
  template <Space S>
  TrainState& model(nn::ParamArena<S>& arena) {
    TRAINKIT_CHECK(model_ == nullptr,
                   "ckpt::TrainState: a model is registered already (add() "
                   "other ParamArenas as components)");
    model_ = std::make_unique<detail::ModelEntryOf<S>>(arena);
    return *this;
  }

  /// Registers a Stateful component under `name` (letters, digits, '_' and '-'; not "trainer",
  /// "user" or "trainkit"; unique). The component must outlive this object.
  template <Stateful T>
  TrainState& add(std::string name, T& component) {
    T* c = &component;
    return add_component(
        std::move(name), [c](StateDict& sd) { state_dict_into_of(*c, sd); },
        [c](const StateDict& sd) { StateAdapter<T>::load(*c, sd); });
  }

  /// Registers a component through two functions (for state that is not an object).
  TRAINKIT_INLINE TrainState& add(std::string name, std::function<StateDict()> save,
                                  std::function<void(const StateDict&)> load);

  bool has_model() const noexcept { return model_ != nullptr; }
  /// Names of the registered components, in registration order.
  std::vector<std::string> component_names() const {
    std::vector<std::string> out;
    for (const Component& c : components_) out.push_back(c.name);
    return out;
  }

  /// Everything but the model: "<name>.<key>" entries of every component, "trainer.step",
  /// "trainer.epoch", "trainer.components" (the names, comma-separated) and "user.<key>".
  /// Copies device state to the host (a sync).
  StateDict state_dict() const {
    StateDict sd;
    state_dict_into(sd);
    return sd;
  }

  /// state_dict() written into `sd` (empty, or what an earlier call wrote), reusing the tensors
  /// of the components that have state_dict_into (the optimizers, Ema): the Checkpointer's async
  /// snapshot, one copy of the state into memory already mapped.
  TRAINKIT_INLINE void state_dict_into(StateDict& sd) const;

  /// Restores what state_dict() produced (consumes `sd`'s entries). Checks that the components
  /// match first (see RestoreOptions), then loads them in registration order; a component that
  /// saved nothing (e.g. a disabled loss scaler) is not asked to load. A component that rejects
  /// its state throws trainkit::Error naming it (earlier components are restored then; the
  /// step, epoch and metadata are not).
  TRAINKIT_INLINE void load_state_dict(StateDict sd, const RestoreOptions& options = {});

  /// Throws what load_state_dict(sd, options) throws for the list of components and for the
  /// step and epoch, changing nothing (the Checkpointer checks this before it loads the model).
  TRAINKIT_INLINE void check_state_dict(const StateDict& sd,
                                        const RestoreOptions& options = {}) const;

  /// The registered model (null when none); for the Checkpointer.
  detail::ModelEntry* model_entry() const noexcept { return model_.get(); }

 private:
  struct Component {
    std::string name;
    std::function<void(StateDict&)> save_into;  ///< see state_dict_into_of
    std::function<void(const StateDict&)> load;
  };

  TRAINKIT_INLINE TrainState& add_component(std::string name,
                                            std::function<void(StateDict&)> save_into,
                                            std::function<void(const StateDict&)> load);

  bool has_component(std::string_view name) const {
    for (const Component& c : components_)
      if (c.name == name) return true;
    return false;
  }

  TRAINKIT_INLINE void check_name(const std::string& name) const;

  std::unique_ptr<detail::ModelEntry> model_;
  std::vector<Component> components_;
};

#if TRAINKIT_IMPL

TRAINKIT_INLINE TrainState& TrainState::add(std::string name, std::function<StateDict()> save,
                                            std::function<void(const StateDict&)> load) {
  TRAINKIT_CHECK(save && load, "ckpt::TrainState::add('", name, "'): empty function");
  return add_component(
      std::move(name), [save = std::move(save)](StateDict& sd) { sd = save(); }, std::move(load));
}

TRAINKIT_INLINE TrainState& TrainState::add_component(std::string name,
                                                      std::function<void(StateDict&)> save_into,
                                                      std::function<void(const StateDict&)> load) {
  check_name(name);
  components_.push_back({std::move(name), std::move(save_into), std::move(load)});
  return *this;
}

TRAINKIT_INLINE void TrainState::state_dict_into(StateDict& sd) const {
  StateDict previous = std::move(sd);
  sd = StateDict();
  std::string names;
  for (const Component& c : components_) {
    StateDict part = detail::take_prefix(previous, c.name);
    c.save_into(part);
    sd.merge(c.name, std::move(part));
    names += (names.empty() ? "" : ",") + c.name;
  }
  sd.set("trainer.components", names);
  sd.set("trainer.step", step);
  sd.set("trainer.epoch", epoch);
  for (const auto& [k, v] : metadata) sd.values["user." + k] = v;
}

namespace detail {
/// The component names a state_dict() holds state for (its list, and every key's prefix).
inline std::set<std::string> components_in(const StateDict& sd) {
  std::set<std::string> present;
  if (const auto it = sd.values.find("trainer.components"); it != sd.values.end()) {
    std::string_view list = it->second;
    while (!list.empty()) {
      const std::size_t comma = list.find(',');
      present.emplace(list.substr(0, comma));
      list = comma == std::string_view::npos ? std::string_view() : list.substr(comma + 1);
    }
  }
  for (const auto& [k, v] : sd.values) present.insert(k.substr(0, k.find('.')));
  for (const auto& [k, t] : sd.tensors) present.insert(k.substr(0, k.find('.')));
  return present;
}
}  // namespace detail

TRAINKIT_INLINE void TrainState::check_state_dict(const StateDict& sd,
                                                  const RestoreOptions& options) const {
  const std::set<std::string> present = detail::components_in(sd);
  std::vector<std::string> missing, unexpected;
  for (const Component& c : components_)
    if (!present.count(c.name)) missing.push_back(c.name);
  for (const std::string& p : present)
    if (p != "trainer" && p != "user" && p != "trainkit" && !has_component(p))
      unexpected.push_back(p);
  if (options.strict) {
    TRAINKIT_CHECK(missing.empty(), "ckpt: the checkpoint has no state for component(s) ",
                   detail::name_list(missing),
                   " (registered, but not saved; RestoreOptions::"
                   "strict = false skips them)");
    TRAINKIT_CHECK(unexpected.empty(), "ckpt: the checkpoint has state for component(s) ",
                   detail::name_list(unexpected),
                   " that are not registered (RestoreOptions::"
                   "strict = false ignores them)");
  }
  (void)sd.get_int("trainer.step");
  (void)sd.get_int("trainer.epoch");
}

TRAINKIT_INLINE void TrainState::load_state_dict(StateDict sd, const RestoreOptions& options) {
  check_state_dict(sd, options);
  const std::set<std::string> present = detail::components_in(sd);
  const std::int64_t saved_step = sd.get_int("trainer.step");
  const std::int64_t saved_epoch = sd.get_int("trainer.epoch");
  std::map<std::string, std::string> saved_metadata;
  for (auto& [k, v] : detail::take_prefix(sd, "user").values)
    saved_metadata.emplace(k, std::move(v));
  for (const Component& c : components_) {
    if (!present.count(c.name)) continue;
    StateDict part = detail::take_prefix(sd, c.name);
    if (part.empty()) continue;
    try {
      c.load(part);
    } catch (const Error& e) {
      std::string_view why = e.what();  // quoted: without its own "trainkit: "
      if (why.starts_with("trainkit: ")) why.remove_prefix(10);
      TRAINKIT_FAIL("ckpt: restoring component '", c.name, "' failed: ", why);
    }
  }
  // Last: a component that refuses its state leaves the step, epoch and metadata as they were.
  step = saved_step;
  epoch = saved_epoch;
  metadata = std::move(saved_metadata);
}

TRAINKIT_INLINE void TrainState::check_name(const std::string& name) const {
  TRAINKIT_CHECK(!name.empty(), "ckpt::TrainState::add: empty component name");
  for (char ch : name)
    TRAINKIT_CHECK((ch >= 'a' && ch <= 'z') || (ch >= 'A' && ch <= 'Z') ||
                       (ch >= '0' && ch <= '9') || ch == '_' || ch == '-',
                   "ckpt::TrainState::add('", name,
                   "'): names may hold letters, digits, '_' "
                   "and '-' only (keys are '<name>.<key>')");
  TRAINKIT_CHECK(name != "trainer" && name != "user" && name != "trainkit",
                 "ckpt::TrainState::add('", name, "'): the name is reserved");
  TRAINKIT_CHECK(!has_component(name), "ckpt::TrainState::add: component '", name,
                 "' is registered twice");
}

#endif  // TRAINKIT_IMPL

}  // namespace ckpt
TRAINKIT_NAMESPACE_END
