// SPDX-License-Identifier: MIT
// trainkit/nn/param_arena.hpp: `ParamArena`, the flat storage of a model's parameters. All f32
// parameters live in ONE buffer, all gradients in ONE buffer with the same layout, and every
// optimizer state (Adam's m, v, ...) and low-precision compute copy (bf16/f16) in one more each.
// Named views index into them. One buffer makes the optimizer a single multi-tensor launch, a DDP
// bucket a slice of the gradient buffer and a checkpoint a list of named views (docs/design.md).
#pragma once

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <type_traits>
#include <unordered_map>
#include <utility>
#include <vector>

#include "trainkit/config.hpp"
#include "trainkit/core/bytes.hpp"
#include "trainkit/core/state_dict.hpp"
#include "trainkit/core/half.hpp"
#include "trainkit/core/shape.hpp"
#include "trainkit/core/tensor.hpp"
#include "trainkit/core/tensor_view.hpp"
#include "trainkit/error.hpp"
#include "trainkit/exec/executor.hpp"
#include "trainkit/exec/launch.hpp"
#include "trainkit/io/utf8.hpp"
#include "trainkit/nn/init.hpp"

#if TRAINKIT_WITH_CUDA
#include <cuda_runtime_api.h>

#include "trainkit/exec/cuda.hpp"
#endif

TRAINKIT_NAMESPACE_BEGIN
namespace nn {

/// A handle to one registered parameter: its registration index. Default-constructed it is
/// invalid (index -1).
struct ParamId {
  std::int32_t index = -1;
  constexpr bool valid() const noexcept { return index >= 0; }
  friend constexpr bool operator==(ParamId, ParamId) noexcept = default;
};

/// What the arena knows about one parameter. `offset` is in elements into every buffer of the
/// arena (params, grads, states, compute copies); it is a multiple of ParamArena's alignment.
struct ParamInfo {
  std::string name;  ///< PyTorch state-dict name, e.g. "blocks.0.attn.c_attn.weight"
  Shape shape;
  std::int64_t offset = 0;
  std::int64_t numel = 0;
  Init init;  ///< what initialize(seed) applies
};

/// Tells the parameter elements of an arena's buffers from the alignment padding after each
/// parameter, on the host and on the device: `real(i)` is false exactly for padding. A table of
/// one byte per 16-element block (how many of its leading elements belong to a parameter; the
/// padding is always a block's tail), so a flat kernel can leave the padding at zero.
/// Default-constructed (null table) every element counts as real.
struct PaddingMask {
  const std::uint8_t* valid = nullptr;  ///< buffer_numel() / 16 entries in the arena's space
  TRAINKIT_HOST_DEVICE bool real(std::int64_t i) const {
    return valid == nullptr || (i & 15) < static_cast<std::int64_t>(valid[i >> 4]);
  }
};

namespace detail {

/// dst[i] = T(src[i]): the fused cast that refreshes a compute copy (one launch for the arena).
template <class T>
struct CastFunctor {
  const float* src;
  T* dst;
  TRAINKIT_HOST_DEVICE void operator()(std::int64_t i) const { dst[i] = T(src[i]); }
};

template <class T, Space S>
void zero_fill(Tensor<T, S>& t) {
  zero_bytes(t.data(), S, t.bytes(), "ParamArena");
}

}  // namespace detail

/// Parameters, gradients, optimizer states and compute copies of a model, each in one contiguous
/// buffer in memory space S (host or device).
///
/// Life cycle: (1) registration — layers call `add(name, shape, init)`; names are unique and
/// registration order is kept (`infos()`; DDP walks it in reverse). (2) `finalize()` allocates one
/// zero-filled f32 buffer for the parameters and one for the gradients; each parameter starts at
/// a multiple of kAlignment elements (64 bytes) and the padding stays zero: no operation of the
/// library (layers, clipping, loss scaling, optimizer steps, EMA) writes anything else into it,
/// whatever the gradients hold (padding_mask() tells it apart). (3) use: named views
/// (`param<R>(id)`, `grad<R>(id)`), `initialize(seed)`, `zero_grad()`, `add_state(name)`,
/// `compute_copy<T>()`. Move-only; views stay valid while the arena lives (and after moves).
template <Space S = Space::kHost>
class ParamArena {
 public:
  static constexpr Space space = S;
  /// Every parameter's offset is a multiple of this many elements (64 bytes of f32).
  static constexpr std::int64_t kAlignment = 16;

  ParamArena() = default;
  ParamArena(ParamArena&&) noexcept = default;
  ParamArena& operator=(ParamArena&&) noexcept = default;
  ParamArena(const ParamArena&) = delete;
  ParamArena& operator=(const ParamArena&) = delete;

  // ---- registration ---------------------------------------------------------------------------

  /// Registers a parameter of `shape` named `name` (its PyTorch state-dict name) and returns its
  /// id. `init` is what `initialize(seed)` will apply. Throws for a duplicate or empty name, a
  /// name with control characters, one that is not UTF-8 or is "__metadata__" (which a
  /// checkpoint cannot store), or after finalize().
  TRAINKIT_INLINE ParamId add(std::string name, Shape shape, Init init = Init::zeros());

  /// Allocates the parameter and gradient buffers (zero-filled) and the padding mask. Throws
  /// when called twice.
  TRAINKIT_INLINE void finalize();

  bool finalized() const noexcept { return finalized_; }

  // ---- what is registered ---------------------------------------------------------------------

  /// All parameters in registration order.
  const std::vector<ParamInfo>& infos() const noexcept { return infos_; }
  /// Number of registered parameter tensors.
  std::size_t size() const noexcept { return infos_.size(); }
  const ParamInfo& info(ParamId id) const { return infos_[check_id(id, "info")]; }
  /// The id of parameter `name`, or nullopt.
  std::optional<ParamId> find(std::string_view name) const {
    const auto it = by_name_.find(std::string(name));
    if (it == by_name_.end()) return std::nullopt;
    return ParamId{it->second};
  }
  /// The id of parameter `name`; throws trainkit::Error naming it when absent.
  TRAINKIT_INLINE ParamId at(std::string_view name) const;
  /// Total number of parameter elements (without padding), as PyTorch's
  /// `sum(p.numel() for p in model.parameters())`.
  std::int64_t num_parameters() const noexcept {
    std::int64_t n = 0;
    for (const ParamInfo& p : infos_) n += p.numel;
    return n;
  }
  /// Elements of each buffer (parameters plus alignment padding).
  std::int64_t buffer_numel() const noexcept { return end_; }
  /// Which elements of the buffers are padding (in this arena's memory space; after finalize()).
  PaddingMask padding_mask() const noexcept { return PaddingMask{block_valid_.data()}; }

  /// The parameters as a component: one F32 tensor per parameter under its name (host copies),
  /// for a second arena in a checkpoint (an EMA copy, a frozen teacher); the model itself goes
  /// to model.safetensors through ckpt::TrainState::model().
  TRAINKIT_INLINE StateDict state_dict() const;
  /// Requires exactly this arena's names, shapes and F32; checks all before changing anything, and
  /// names the first parameter the state lacks, else the first tensor the arena lacks.
  TRAINKIT_INLINE void load_state_dict(const StateDict& sd);

  // ---- buffers and views ----------------------------------------------------------------------

  float* params_data() { return params_.data(); }
  const float* params_data() const { return params_.data(); }
  float* grads_data() { return grads_.data(); }
  const float* grads_data() const { return grads_.data(); }

  /// The whole parameter / gradient buffer, padding included (buffer_numel() elements).
  TensorView<float, 1, S> params() { return params_.flat(); }
  TensorView<const float, 1, S> params() const { return params_.flat(); }
  TensorView<float, 1, S> grads() { return grads_.flat(); }
  TensorView<const float, 1, S> grads() const { return grads_.flat(); }

  /// Parameter `id` as a rank-R view of its registered shape (throws when R differs). The const
  /// and mutable overloads below repeat each other: C++20 cannot deduce `this` into one template.
  template <int R>
  TensorView<float, R, S> param(ParamId id) {
    return view_in<float, R>(params_.data(), id, "param");
  }
  template <int R>
  TensorView<const float, R, S> param(ParamId id) const {
    return view_in<const float, R>(params_.data(), id, "param");
  }
  template <int R>
  TensorView<float, R, S> grad(ParamId id) {
    return view_in<float, R>(grads_.data(), id, "grad");
  }
  template <int R>
  TensorView<const float, R, S> grad(ParamId id) const {
    return view_in<const float, R>(grads_.data(), id, "grad");
  }
  /// Parameter / gradient `id` as a flat view of its numel elements.
  TensorView<float, 1, S> param_flat(ParamId id) { return flat_in(params_.data(), id, "param"); }
  TensorView<float, 1, S> grad_flat(ParamId id) { return flat_in(grads_.data(), id, "grad"); }

  // ---- gradients ------------------------------------------------------------------------------

  /// Sets every gradient to zero (synchronous; on a device arena a cudaMemset).
  void zero_grad() {
    check_finalized("zero_grad");
    detail::zero_fill(grads_);
  }

#if TRAINKIT_WITH_CUDA
  /// Device arena: zeroes the gradients asynchronously on the executor's stream.
  void zero_grad(const exec::Cuda& exec) {
    static_assert(S == Space::kDevice,
                  "ParamArena<host>::zero_grad(exec::Cuda): a host arena "
                  "zeroes on the host; call zero_grad()");
    check_finalized("zero_grad");
    if (grads_.bytes() != 0)
      TRAINKIT_CUDA_CHECK(cudaMemsetAsync(grads_.data(), 0, grads_.bytes(), exec.stream().get()));
  }
#endif

  // ---- initialisation -------------------------------------------------------------------------

  /// Initialises every parameter with the Init it was registered with. Element e of parameter
  /// number p gets draw e of Philox stream init_stream_id(p) under `seed`: deterministic, and
  /// identical on host and device arenas (a device arena fills on the host and copies).
  TRAINKIT_INLINE void initialize(std::uint64_t seed);

  /// Initialises parameter `id` with `init` (keyed by the parameter's index, as above).
  TRAINKIT_INLINE void initialize(ParamId id, const Init& init, std::uint64_t seed);

  /// Copies all parameters from another arena with the same registrations (names, shapes and
  /// order), e.g. a host arena into a device arena. Throws when the layouts differ.
  template <Space S2>
  void copy_params_from(const ParamArena<S2>& other) {
    check_finalized("copy_params_from");
    TRAINKIT_CHECK(other.finalized(), "ParamArena::copy_params_from: source is not finalized");
    TRAINKIT_CHECK(other.size() == size(), "ParamArena::copy_params_from: source has ",
                   other.size(), " parameters, this arena ", size());
    for (std::size_t i = 0; i < size(); ++i) {
      const ParamInfo& a = infos_[i];
      const ParamInfo& b = other.infos()[i];
      TRAINKIT_CHECK(a.name == b.name && a.shape == b.shape,
                     "ParamArena::copy_params_from: "
                     "parameter ",
                     i, " is '", a.name, "' ", a.shape.to_string(), " here but '", b.name, "' ",
                     b.shape.to_string(), " in the source");
    }
    copy_buffer(params_.data(), other.params_data(), S2);
  }

  /// Copies all gradients into `dst`'s gradient buffer (same layout), e.g. device -> host.
  template <Space S2>
  void copy_grads_to(ParamArena<S2>& dst) const {
    TRAINKIT_CHECK(dst.buffer_numel() == buffer_numel() && dst.size() == size(),
                   "ParamArena::copy_grads_to: the arenas have different layouts");
    dst.copy_grads_from_raw(grads_.data(), S);
  }

  /// Implementation detail of copy_grads_to (copies buffer_numel() gradients from `src` in space
  /// `src_space`).
  void copy_grads_from_raw(const float* src, Space src_space) {
    check_finalized("copy_grads_to");
    copy_buffer(grads_.data(), src, src_space);
  }

  // ---- optimizer state ------------------------------------------------------------------------

  /// Adds an optimizer state buffer `name` (e.g. "exp_avg") with the parameters' layout,
  /// zero-filled, and returns it flat; parameter p's state is at info(p).offset. Checkpoints name
  /// the slices "<param>.<state>". Throws when the name exists or before finalize().
  TRAINKIT_INLINE TensorView<float, 1, S> add_state(std::string name);
  bool has_state(std::string_view name) const noexcept { return find_state(name) != nullptr; }
  /// State buffer `name`, flat; throws when absent.
  TRAINKIT_INLINE TensorView<float, 1, S> state(std::string_view name);
  /// Parameter `id`'s slice of state `name` as a rank-R view.
  template <int R>
  TensorView<float, R, S> state(std::string_view name, ParamId id) {
    return view_in<float, R>(state(name).data(), id, "state");
  }
  /// Names of the state buffers, in creation order.
  TRAINKIT_INLINE std::vector<std::string> state_names() const;

  // ---- low-precision compute copies -----------------------------------------------------------

  /// The compute copy of the parameters in T (bf16 or f16), flat with the parameters' layout;
  /// created zero-filled on first use. Fill it with refresh_compute_copy<T>() once per step.
  template <class T>
  TensorView<T, 1, S> compute_copy() {
    check_finalized("compute_copy");
    Tensor<T, S>& t = copy_slot<T>();
    if (t.numel() != end_) {
      t = Tensor<T, S>(Shape{end_});
      detail::zero_fill(t);
    }
    return t.flat();
  }
  /// True when compute_copy<T>() has been created.
  template <class T>
  bool has_compute_copy() const noexcept {
    return const_cast<ParamArena*>(this)->template copy_slot<T>().numel() == end_ && end_ > 0;
  }
  /// Parameter `id` in the compute copy of type T, as a rank-R view. Throws when the copy was
  /// never created (call refresh_compute_copy<T>() first).
  template <class T, int R>
  TensorView<const T, R, S> compute_param(ParamId id) const {
    const Tensor<T, S>& t = const_cast<ParamArena*>(this)->template copy_slot<T>();
    TRAINKIT_CHECK(t.numel() == end_ && end_ > 0, "ParamArena: no ", dtype_name(dtype_of<T>),
                   " compute copy of '", info(id).name, "': call refresh_compute_copy<",
                   dtype_name(dtype_of<T>), ">(exec) after each optimizer step");
    return view_in<const T, R>(t.data(), id, "compute_param");
  }
  /// Rewrites the compute copy of type T from the f32 parameters (one fused cast over the whole
  /// buffer, round-to-nearest-even) on `exec`: on the host now, on a CUDA stream asynchronously.
  template <class T, class E>
  void refresh_compute_copy(const E& exec) {
    static_assert(exec::Executor<E>, "refresh_compute_copy: pass an exec::Host or exec::Cuda");
    static_assert((S == Space::kHost) == exec::is_host_executor_v<E>,
                  "refresh_compute_copy: a host arena needs exec::Host, a device arena exec::Cuda");
    TensorView<T, 1, S> dst = compute_copy<T>();
    exec::launch(exec, end_, detail::CastFunctor<T>{params_.data(), dst.data()});
  }

 private:
  struct NamedBuffer {
    std::string name;
    Tensor<float, S> buffer;
  };

  static std::int64_t round_up(std::int64_t n) noexcept {
    return (n + kAlignment - 1) / kAlignment * kAlignment;
  }

  std::size_t check_id(ParamId id, const char* what) const {
    TRAINKIT_CHECK(id.valid() && std::size_t(id.index) < infos_.size(), "ParamArena::", what,
                   ": invalid parameter id ", id.index, " (", infos_.size(), " registered)");
    return static_cast<std::size_t>(id.index);
  }
  void check_finalized(const char* what) const {
    TRAINKIT_CHECK(finalized_, "ParamArena::", what, " before finalize()");
  }

  template <class T>
  Tensor<T, S>& copy_slot() {
    static_assert(std::is_same_v<T, bf16> || std::is_same_v<T, f16>,
                  "ParamArena compute copies are bf16 or f16 (f32 uses the parameters directly)");
    if constexpr (std::is_same_v<T, bf16>) {
      return copy_bf16_;
    } else {
      return copy_f16_;
    }
  }

  template <class T, int R>
  TensorView<T, R, S> view_in(T* base, ParamId id, const char* what) const {
    check_finalized(what);
    const ParamInfo& p = infos_[check_id(id, what)];
    TRAINKIT_CHECK(p.shape.rank() == R, "ParamArena::", what, "<", R, ">('", p.name,
                   "'): the parameter has rank ", p.shape.rank(), " (shape ", p.shape.to_string(),
                   ")");
    Extents<R> e;
    for (int d = 0; d < R; ++d) e[d] = p.shape[d];
    return TensorView<T, R, S>(base + p.offset, e);
  }
  TensorView<float, 1, S> flat_in(float* base, ParamId id, const char* what) const {
    check_finalized(what);
    const ParamInfo& p = infos_[check_id(id, what)];
    return TensorView<float, 1, S>(base + p.offset, Extents<1>{{p.numel}});
  }

  /// Host bytes into a buffer of this arena's space.
  static void upload(void* dst, const void* src, std::size_t bytes) {
    copy_bytes(dst, S, src, Space::kHost, bytes, "ParamArena");
  }

  void copy_buffer(float* dst, const float* src, Space src_space) {
    copy_bytes(dst, S, src, src_space, static_cast<std::size_t>(end_) * sizeof(float),
               "ParamArena");
  }

  NamedBuffer* find_state(std::string_view name) {
    for (auto& s : states_)
      if (s.name == name) return &s;
    return nullptr;
  }
  const NamedBuffer* find_state(std::string_view name) const {
    for (const auto& s : states_)
      if (s.name == name) return &s;
    return nullptr;
  }

  std::vector<ParamInfo> infos_;
  std::unordered_map<std::string, std::int32_t> by_name_;
  std::int64_t end_ = 0;
  bool finalized_ = false;
  Tensor<float, S> params_;
  Tensor<float, S> grads_;
  Tensor<std::uint8_t, S> block_valid_;  // PaddingMask::valid
  std::vector<NamedBuffer> states_;
  Tensor<bf16, S> copy_bf16_;
  Tensor<f16, S> copy_f16_;
};

template <Space S>
TRAINKIT_INLINE ParamId ParamArena<S>::add(std::string name, Shape shape, Init init) {
  TRAINKIT_CHECK(!finalized_, "ParamArena::add('", name,
                 "') after finalize(): register every parameter before finalizing");
  TRAINKIT_CHECK(!name.empty(), "ParamArena::add: empty parameter name");
  // Names travel in checkpoint manifests, TensorBoard tags and the ranks' layout checks, all of
  // which are line- or text-based: no control characters.
  const auto control = std::find_if(name.begin(), name.end(),
                                    [](char c) { return static_cast<unsigned char>(c) < 0x20; });
  TRAINKIT_CHECK(control == name.end(), "ParamArena::add: the parameter name '",
                 name.substr(0, std::size_t(control - name.begin())),
                 "...' holds control character ",
                 int(static_cast<unsigned char>(control == name.end() ? 0 : *control)), " at byte ",
                 control - name.begin());
  // The safetensors writer needs UTF-8 names and keeps "__metadata__" for the header's metadata.
  std::size_t bad_byte = 0;
  TRAINKIT_CHECK(io::is_valid_utf8(name, &bad_byte), "ParamArena::add: the parameter name '",
                 io::printable_bytes(name), "' is not valid UTF-8 (bad sequence at byte ", bad_byte,
                 "); checkpoints store names as UTF-8");
  TRAINKIT_CHECK(name != "__metadata__",
                 "ParamArena::add: the parameter name '__metadata__' is reserved by safetensors "
                 "for the file's metadata; choose another name");
  TRAINKIT_CHECK(by_name_.find(name) == by_name_.end(),
                 "ParamArena::add: duplicate parameter "
                 "name '",
                 name, "'");
  TRAINKIT_CHECK(infos_.size() < std::size_t{0x7fffffff}, "ParamArena: too many parameters");
  ParamInfo info;
  info.shape = shape;
  info.numel = shape.numel();
  // The arena's size in floats stays far from int64 overflow (its byte counts multiply by 4).
  constexpr std::int64_t kMaxFloats = std::int64_t{1} << 60;
  TRAINKIT_CHECK(info.numel <= kMaxFloats && round_up(info.numel) <= kMaxFloats - end_,
                 "ParamArena::add('", name, "'): shape ", shape.to_string(), " (", info.numel,
                 " elements) after ", end_,
                 " registered would take the parameters past 2^60 elements");
  info.offset = end_;
  info.init = init;
  end_ += round_up(info.numel);
  info.name = std::move(name);
  const ParamId id{static_cast<std::int32_t>(infos_.size())};
  by_name_.emplace(info.name, id.index);
  infos_.push_back(std::move(info));
  return id;
}

template <Space S>
TRAINKIT_INLINE void ParamArena<S>::finalize() {
  TRAINKIT_CHECK(!finalized_, "ParamArena::finalize() called twice");
  params_ = Tensor<float, S>(Shape{end_});
  grads_ = Tensor<float, S>(Shape{end_});
  detail::zero_fill(params_);
  detail::zero_fill(grads_);
  static_assert(kAlignment == 16, "PaddingMask assumes 16-element blocks");
  std::vector<std::uint8_t> valid(static_cast<std::size_t>(end_ / kAlignment), 0);
  for (const ParamInfo& p : infos_)
    for (std::int64_t b = 0; b * kAlignment < p.numel; ++b)
      valid[static_cast<std::size_t>(p.offset / kAlignment + b)] =
          static_cast<std::uint8_t>(std::min(kAlignment, p.numel - b * kAlignment));
  block_valid_ = Tensor<std::uint8_t, S>(Shape{static_cast<std::int64_t>(valid.size())});
  upload(block_valid_.data(), valid.data(), valid.size());
  finalized_ = true;
}

template <Space S>
TRAINKIT_INLINE ParamId ParamArena<S>::at(std::string_view name) const {
  const auto id = find(name);
  TRAINKIT_CHECK(id.has_value(), "ParamArena: no parameter named '", name, "'");
  return *id;
}

template <Space S>
TRAINKIT_INLINE StateDict ParamArena<S>::state_dict() const {
  check_finalized("state_dict");
  StateDict sd;
  for (const ParamInfo& p : infos_) {
    AnyTensor t(DType::kF32, p.shape);
    copy_bytes(t.data(), Space::kHost, params_.data() + p.offset, S, t.bytes(), "ParamArena");
    sd.tensors.emplace(p.name, std::move(t));
  }
  return sd;
}

template <Space S>
TRAINKIT_INLINE void ParamArena<S>::load_state_dict(const StateDict& sd) {
  check_finalized("load_state_dict");
  // A missing parameter, then a tensor the arena does not have, each named (keys from a file are
  // shown escaped), before any count: "3 parameters from 4 tensors" alone says not which.
  for (const ParamInfo& p : infos_)
    TRAINKIT_CHECK(sd.tensors.count(p.name) != 0, "ParamArena: restoring ", infos_.size(),
                   " parameters from a state of ", sd.tensors.size(),
                   " tensors: the state has no tensor '", p.name, "'");
  for (const auto& entry : sd.tensors)
    TRAINKIT_CHECK(by_name_.count(entry.first) != 0, "ParamArena: restoring ", infos_.size(),
                   " parameters from a state of ", sd.tensors.size(), " tensors: the state's '",
                   StateDict::shown(entry.first), "' is not a parameter of the arena");
  for (const ParamInfo& p : infos_) {
    const AnyTensor& t = sd.tensor(p.name);
    TRAINKIT_CHECK(t.dtype() == DType::kF32 && t.shape() == p.shape, "ParamArena: parameter '",
                   p.name, "' is ", dtype_name(t.dtype()), " ", t.shape().to_string(),
                   " in the state but F32 ", p.shape.to_string(), " in the arena");
  }
  for (const ParamInfo& p : infos_) {
    const AnyTensor& t = sd.tensor(p.name);
    upload(params_.data() + p.offset, t.data(), t.bytes());
  }
}

template <Space S>
TRAINKIT_INLINE void ParamArena<S>::initialize(std::uint64_t seed) {
  for (std::size_t p = 0; p < infos_.size(); ++p)
    initialize(ParamId{static_cast<std::int32_t>(p)}, infos_[p].init, seed);
}

template <Space S>
TRAINKIT_INLINE void ParamArena<S>::initialize(ParamId id, const Init& init, std::uint64_t seed) {
  check_finalized("initialize");
  const ParamInfo& p = infos_[check_id(id, "initialize")];
  if constexpr (S == Space::kHost) {
    fill_init(params_.data() + p.offset, p.shape, init, seed, static_cast<std::uint64_t>(id.index),
              p.name);
  } else {
    Tensor<float, Space::kHost> staging(Shape{p.numel});
    fill_init(staging.data(), p.shape, init, seed, static_cast<std::uint64_t>(id.index), p.name);
    upload(params_.data() + p.offset, staging.data(), staging.bytes());
  }
}

template <Space S>
TRAINKIT_INLINE TensorView<float, 1, S> ParamArena<S>::add_state(std::string name) {
  check_finalized("add_state");
  TRAINKIT_CHECK(!name.empty(), "ParamArena::add_state: empty state name");
  for (const auto& s : states_)
    TRAINKIT_CHECK(s.name != name, "ParamArena::add_state: duplicate state '", name, "'");
  NamedBuffer b{std::move(name), Tensor<float, S>(Shape{end_})};
  detail::zero_fill(b.buffer);
  states_.push_back(std::move(b));
  return states_.back().buffer.flat();
}

template <Space S>
TRAINKIT_INLINE TensorView<float, 1, S> ParamArena<S>::state(std::string_view name) {
  NamedBuffer* b = find_state(name);
  TRAINKIT_CHECK(b != nullptr, "ParamArena: no optimizer state named '", name, "'");
  return b->buffer.flat();
}

template <Space S>
TRAINKIT_INLINE std::vector<std::string> ParamArena<S>::state_names() const {
  std::vector<std::string> names;
  for (const auto& s : states_) names.push_back(s.name);
  return names;
}

#if TRAINKIT_SEPARATE_COMPILATION
// The host arena's out-of-class members are instantiated once, in the compiled library
// (src/trainkit.cpp); a device arena's are still instantiated where they are used.
extern template ParamId ParamArena<Space::kHost>::add(std::string, Shape, Init);
extern template void ParamArena<Space::kHost>::finalize();
extern template ParamId ParamArena<Space::kHost>::at(std::string_view) const;
extern template StateDict ParamArena<Space::kHost>::state_dict() const;
extern template void ParamArena<Space::kHost>::load_state_dict(const StateDict&);
extern template void ParamArena<Space::kHost>::initialize(std::uint64_t);
extern template void ParamArena<Space::kHost>::initialize(ParamId, const Init&, std::uint64_t);
extern template TensorView<float, 1, Space::kHost> ParamArena<Space::kHost>::add_state(std::string);
extern template TensorView<float, 1, Space::kHost> ParamArena<Space::kHost>::state(
    std::string_view);
extern template std::vector<std::string> ParamArena<Space::kHost>::state_names() const;
#endif

}  // namespace nn
TRAINKIT_NAMESPACE_END
