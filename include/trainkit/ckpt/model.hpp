// SPDX-License-Identifier: MIT
// trainkit/ckpt/model.hpp: model weights <-> safetensors under their PyTorch state-dict names.
// save_model() writes a file that `safetensors.torch.load_file` + `model.load_state_dict` read
// for the same architecture; load_model() reads a file, a sharded set (index.json) or a model
// directory - ours or one exported from PyTorch / Hugging Face - into a ParamArena, with
// PyTorch's strict/non-strict semantics, skip patterns for a new head and errors that list every
// missing, unexpected, mis-shaped or mis-typed name before anything is changed.
#pragma once

#include <algorithm>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <deque>
#include <filesystem>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <thread>
#include <utility>
#include <vector>

#include "trainkit/ckpt/checksum.hpp"
#include "trainkit/config.hpp"
#include "trainkit/core/bytes.hpp"
#include "trainkit/core/any_tensor.hpp"
#include "trainkit/core/dtype.hpp"
#include "trainkit/core/host_copy.hpp"
#include "trainkit/core/half.hpp"
#include "trainkit/error.hpp"
#include "trainkit/io/safetensors.hpp"
#include "trainkit/nn/param_arena.hpp"
#include "trainkit/optim/param_groups.hpp"

TRAINKIT_NAMESPACE_BEGIN
namespace ckpt {

/// How load_model matches a file's tensors to the arena's parameters.
struct ModelLoadOptions {
  /// PyTorch's `strict`: every parameter must be in the file and every tensor of the file must
  /// be a parameter. false: missing and unexpected names are only reported (ModelLoadReport).
  /// Shape and dtype mismatches are errors either way (as in PyTorch).
  bool strict = true;
  /// Names in the file that the arena lacks are fine even when strict (a rank-local shard, or a
  /// pretrained file with heads you do not use); missing parameters still fail when strict.
  bool allow_unexpected = false;
  /// Glob patterns (optim::glob_match: `*`, `?`) of arena names to leave untouched, e.g.
  /// {"fc.*"} for a new classifier head: never loaded, never missing, never unexpected.
  std::vector<std::string> skip = {};
  /// The file's names are `prefix + arena name` (e.g. "model." for a wrapped module).
  std::string prefix = {};
  /// Tied parameters, as {other name, arena name} pairs, e.g. {"lm_head.weight",
  /// "transformer.wte.weight"} for a GPT whose head shares the token embedding. PyTorch's
  /// state_dict() lists a tied tensor under each of its names; `safetensors.torch.save_model`
  /// keeps one of them (the first in sort order: "lm_head.weight" for nanoGPT). So the file may
  /// hold the parameter under either name: when its own name is absent the other is read; when
  /// both are present they must hold equal values (two different tensors are an untied model's,
  /// an error); the other name is never unexpected. The other name must not be a parameter.
  std::vector<std::pair<std::string, std::string>> tied = {};
  /// Accept F16/BF16/F64 tensors and round them to the arena's F32 (PyTorch's copy_ does this
  /// silently; here it must be asked for).
  bool convert_dtype = false;
  /// Verify the trainkit checksum of each file that has one (files without are accepted).
  bool verify_checksum = true;
  /// The last line of the error for a file that does not fit (empty: which of these options
  /// would accept it). A program whose users cannot set them says what they can do instead.
  std::string remedy = {};
};

/// What load_model did, by arena name (unexpected: file names, prefix removed when present;
/// converted: the loaded ones rounded from F16, BF16 or F64).
struct ModelLoadReport {
  std::vector<std::string> loaded, missing, unexpected, skipped, converted;
  bool complete() const noexcept { return missing.empty() && unexpected.empty(); }
};

/// The tensors of one safetensors file or of a sharded set, opened and validated.
class TensorSource {
 public:
  /// Opens `path`: a .safetensors file, a `*.index.json` of a sharded set, or a directory
  /// holding model.safetensors.index.json or model.safetensors. The files are read into memory
  /// (io::SafetensorsBacking::kCopy), not mapped: a file that another process truncates or
  /// rewrites while it is read gives an error naming it, and one changed later cannot affect
  /// the source. Throws trainkit::Error naming the path when there is nothing to open or a file
  /// breaks a safetensors rule. With `verify_checksum`, files that carry a trainkit checksum are
  /// verified first (a single file: the very bytes that load).
  TRAINKIT_INLINE static TensorSource open(const std::filesystem::path& path,
                                           bool verify_checksum = true);

  /// The opened file (or index) path.
  const std::string& source() const noexcept { return source_; }
  /// Every tensor name, sorted.
  TRAINKIT_INLINE std::vector<std::string> names() const;
  /// The header entry of `name`, or null.
  const io::SafetensorsTensorInfo* find(std::string_view name) const {
    if (file_) return file_->find(name);
    if (!shards_->contains(name)) return nullptr;
    return shards_->shard_of(name).find(name);
  }
  /// A zero-copy view of `name`; throws naming the source when absent or of an unsupported dtype.
  AnyTensorView tensor(std::string_view name) const {
    return file_ ? file_->tensor(name) : shards_->tensor(name);
  }
  /// The `__metadata__` of a single file (empty for a sharded set).
  io::SafetensorsMetadata metadata() const {
    return file_ ? file_->metadata() : io::SafetensorsMetadata{};
  }

 private:
  std::string source_;
  std::unique_ptr<io::SafetensorsFile> file_;
  std::unique_ptr<io::SafetensorsShards> shards_;
};

namespace detail {

inline bool matches_any(const std::vector<std::string>& patterns, std::string_view name) {
  for (const std::string& p : patterns)
    if (optim::glob_match(p, name)) return true;
  return false;
}

/// "'a', 'b', 'c' and 4 more".
TRAINKIT_INLINE std::string name_list(const std::vector<std::string>& names, std::size_t max = 8);

/// Element i of `t` (F32, F16, BF16 or F64) as float.
TRAINKIT_INLINE void convert_to_f32(const AnyTensorView& t, float* out);

/// Same dtype, shape and bytes.
TRAINKIT_INLINE bool same_tensor(const AnyTensorView& a, const AnyTensorView& b);

#if TRAINKIT_IMPL

TRAINKIT_INLINE std::string name_list(const std::vector<std::string>& names, std::size_t max) {
  std::string s;
  for (std::size_t i = 0; i < names.size() && i < max; ++i)
    s += (i ? ", '" : "'") + io::detail::printable(names[i]) + "'";
  if (names.size() > max) s += " and " + std::to_string(names.size() - max) + " more";
  return s;
}

TRAINKIT_INLINE bool same_tensor(const AnyTensorView& a, const AnyTensorView& b) {
  return a.dtype() == b.dtype() && a.shape() == b.shape() &&
         (a.bytes() == 0 || std::memcmp(a.data(), b.data(), a.bytes()) == 0);
}

TRAINKIT_INLINE void convert_to_f32(const AnyTensorView& t, float* out) {
  const std::int64_t n = t.numel();
  const std::byte* p = t.data();
  switch (t.dtype()) {
    case DType::kF32: std::memcpy(out, p, std::size_t(n) * 4); return;
    case DType::kF64:
      for (std::int64_t i = 0; i < n; ++i) {
        double v;
        std::memcpy(&v, p + i * 8, 8);
        out[i] = static_cast<float>(v);
      }
      return;
    case DType::kF16:
      for (std::int64_t i = 0; i < n; ++i) {
        f16 v;
        std::memcpy(&v, p + i * 2, 2);
        out[i] = static_cast<float>(v);
      }
      return;
    case DType::kBF16:
      for (std::int64_t i = 0; i < n; ++i) {
        bf16 v;
        std::memcpy(&v, p + i * 2, 2);
        out[i] = static_cast<float>(v);
      }
      return;
    default: TRAINKIT_FAIL("ckpt: cannot convert ", dtype_name(t.dtype()), " to F32");
  }
}

#endif  // TRAINKIT_IMPL

}  // namespace detail

namespace detail {

/// The parameters a load fills, each with the file's name for its tensor.
using ModelLoadPlan = std::vector<std::pair<const nn::ParamInfo*, std::string>>;

/// The checks load_model makes before it changes anything: names (strict / allow_unexpected /
/// skip / tied), shapes and dtypes. `src` offers find(name), names() and source();
/// `same(a, b)` says whether the file's tensors `a` and `b` hold the same dtype, shape and bytes.
/// Fills report.missing, unexpected and skipped; returns the parameters to load, each with the
/// file's name for it. Throws trainkit::Error listing every problem.
template <Space S, class Source, class Same>
ModelLoadPlan plan_model_load(nn::ParamArena<S>& arena, const Source& src,
                              const ModelLoadOptions& options, ModelLoadReport& report,
                              Same&& same) {
  TRAINKIT_CHECK(arena.finalized(), "ckpt::load_model: finalize() the ParamArena first");
  for (const auto& [other, own] : options.tied) {
    TRAINKIT_CHECK(arena.find(own), "ckpt::load_model: tied = {'", other, "', '", own,
                   "'}: the model has no parameter '", own, "'");
    TRAINKIT_CHECK(!arena.find(other), "ckpt::load_model: tied = {'", other, "', '", own, "'}: '",
                   other, "' is a parameter of its own (the model is not tied)");
  }
  std::vector<std::string> problems;
  ModelLoadPlan todo;
  for (const nn::ParamInfo& p : arena.infos()) {
    if (detail::matches_any(options.skip, p.name)) {
      report.skipped.push_back(p.name);
      continue;
    }
    std::string key = options.prefix + p.name;
    const io::SafetensorsTensorInfo* t = src.find(key);
    for (const auto& [other, own] : options.tied) {
      if (own != p.name) continue;
      const std::string other_key = options.prefix + other;
      const io::SafetensorsTensorInfo* u = src.find(other_key);
      if (u == nullptr) continue;
      if (t == nullptr) {
        key = other_key;
        t = u;
      } else if (!same(key, other_key)) {
        problems.push_back("'" + io::detail::printable(other_key) + "' and '" +
                           io::detail::printable(key) +
                           "' differ in the file, but the model ties them (the file holds an "
                           "untied model's weights)");
      }
    }
    if (t == nullptr) {
      report.missing.push_back(p.name);
      continue;
    }
    if (!(t->shape == p.shape)) {
      problems.push_back("'" + key + "' has shape " + t->shape.to_string() + " in the file but " +
                         p.shape.to_string() + " in the model");
      continue;
    }
    const bool convertible = t->dtype && (*t->dtype == DType::kF16 || *t->dtype == DType::kBF16 ||
                                          *t->dtype == DType::kF64);
    if (!(t->dtype && *t->dtype == DType::kF32) && !(options.convert_dtype && convertible)) {
      problems.push_back("'" + key + "' is " + t->dtype_name + " in the file but the model is F32" +
                         (convertible && options.remedy.empty()
                              ? " (pass convert_dtype = true to round it)"
                              : ""));
      continue;
    }
    todo.emplace_back(&p, key);
  }
  for (const std::string& name : src.names()) {
    std::string local = name;
    if (!options.prefix.empty()) {
      if (!name.starts_with(options.prefix)) {
        report.unexpected.push_back(name);
        continue;
      }
      local = name.substr(options.prefix.size());
    }
    const bool tied_name = std::any_of(options.tied.begin(), options.tied.end(),
                                       [&](const auto& pair) { return pair.first == local; });
    if (!arena.find(local) && !tied_name && !detail::matches_any(options.skip, local))
      report.unexpected.push_back(local);
  }
  if (options.strict && !report.missing.empty())
    problems.push_back(std::to_string(report.missing.size()) +
                       " missing: " + detail::name_list(report.missing));
  if (options.strict && !options.allow_unexpected && !report.unexpected.empty())
    problems.push_back(
        std::to_string(report.unexpected.size()) +
        " unexpected (in the file, not in the model): " + detail::name_list(report.unexpected));
  if (!problems.empty()) {
    std::string msg;
    for (const std::string& p : problems) msg += "\n  " + p;
    TRAINKIT_FAIL("ckpt::load_model from '", src.source(), "': ", problems.size(),
                  " problem(s), nothing was loaded:", msg, "\n  (",
                  options.remedy.empty() ? "strict = false loads what matches; skip = "
                                           "{\"head.*\"} leaves new layers as initialized"
                                         : options.remedy,
                  ")");
  }
  return todo;
}

/// The file TensorSource::open opens for `path`: `path` itself, or in a directory its
/// model.safetensors.index.json or model.safetensors. Throws trainkit::Error naming a directory
/// that holds neither.
TRAINKIT_INLINE std::filesystem::path model_target(const std::filesystem::path& path);

/// The safetensors files of a model (one file, or the shards of an index) opened for pread with
/// only their headers read and validated: load_model from a path reads each tensor's bytes
/// straight into the parameters, so memory never holds a copy of the file.
class StreamedModel {
 public:
  /// Opens `target` (a .safetensors file or a `*.index.json`) as TensorSource::open does.
  TRAINKIT_INLINE explicit StreamedModel(const std::filesystem::path& target);

  const std::string& source() const noexcept { return source_; }
  TRAINKIT_INLINE const io::SafetensorsTensorInfo* find(std::string_view name) const;
  /// Every tensor name, sorted.
  TRAINKIT_INLINE std::vector<std::string> names() const;
  /// Same dtype, shape and bytes (read with pread in pieces).
  TRAINKIT_INLINE bool same(std::string_view a, std::string_view b) const;

  /// Verifies the checksum of every file that carries one, reading it with pread in pieces;
  /// nothing is loaded. Throws trainkit::Error naming a file that fails.
  TRAINKIT_INLINE void verify() const;

  /// Reads the tensors `todo` names into the parameters at `params` (host or device memory, as
  /// S says), file by file in file order. F32 tensors are read straight into a host arena;
  /// others go through a 1 MiB buffer (rounded to F32 when they are F16, BF16 or F64). With
  /// `verify`, a file that carries a checksum is hashed whole as it loads and must still match
  /// it (so the bytes that load are the verified ones). Throws trainkit::Error naming a file that
  /// ends early, changes size or no longer matches its checksum while it loads.
  template <Space S>
  void load(const ModelLoadPlan& todo, float* params, bool verify) const;

 private:
  struct File {
    std::unique_ptr<io::detail::PreadFile> file;
    std::vector<std::byte> prefix;  // the first 8 + N bytes: length and header
    io::SafetensorsHeader header;
    std::vector<std::uint32_t> by_name;  // indices into header.tensors, sorted by name
  };
  using Targets = std::vector<std::vector<const nn::ParamInfo*>>;  // per tensor of a file
  /// Reads the tensors of `f` that `to` gives parameters, in file order, into them; with `h`,
  /// reads and hashes every byte after the header too (the checksum covers the whole file).
  template <Space S>
  void read_file(const File& f, const Targets& to, float* params, Xxh64* h) const;
  TRAINKIT_INLINE void add_file(const std::filesystem::path& path);
  TRAINKIT_INLINE std::pair<std::size_t, long> locate(std::string_view name) const;

  std::string source_;
  std::vector<File> files_;
  std::map<std::string, std::size_t, std::less<>> file_of_;  // tensor -> files_ (sharded sets)
};

/// Hashes pieces of memory on a second thread, in the order they are pushed, so that hashing a
/// file overlaps reading it (each costs about as much as the other).
class HashBehind {
 public:
  explicit HashBehind(Xxh64& h) : h_(h), thread_([this] { run(); }) {}
  HashBehind(const HashBehind&) = delete;
  HashBehind& operator=(const HashBehind&) = delete;
  ~HashBehind() { stop(); }

  /// Queues `n` bytes at `p` (they must stay unchanged until hashed() counts them); returns
  /// the piece's number, from 1.
  std::uint64_t push(const std::byte* p, std::size_t n) {
    {
      const std::lock_guard<std::mutex> lock(mutex_);
      queue_.push_back({p, n});
      ++pushed_;
    }
    cv_.notify_all();
    return pushed_;
  }
  /// Waits until the first `count` pieces are hashed.
  void wait(std::uint64_t count) {
    std::unique_lock<std::mutex> lock(mutex_);
    cv_.wait(lock, [&] { return hashed_ >= count; });
  }
  /// Waits until every piece is hashed; the hash then holds them all.
  void finish() {
    wait(pushed_);
    stop();
  }

 private:
  void run() {
    for (;;) {
      std::pair<const std::byte*, std::size_t> piece;
      {
        std::unique_lock<std::mutex> lock(mutex_);
        cv_.wait(lock, [&] { return stop_ || !queue_.empty(); });
        if (queue_.empty()) return;
        piece = queue_.front();
        queue_.pop_front();
      }
      h_.update(piece.first, piece.second);
      {
        const std::lock_guard<std::mutex> lock(mutex_);
        ++hashed_;
      }
      cv_.notify_all();
    }
  }
  void stop() {
    {
      const std::lock_guard<std::mutex> lock(mutex_);
      stop_ = true;
    }
    cv_.notify_all();
    if (thread_.joinable()) thread_.join();
  }

  Xxh64& h_;
  std::mutex mutex_;
  std::condition_variable cv_;
  std::deque<std::pair<const std::byte*, std::size_t>> queue_;
  std::uint64_t pushed_ = 0, hashed_ = 0;
  bool stop_ = false;
  std::thread thread_;  // last: it starts once the rest is constructed
};

template <Space S>
void StreamedModel::read_file(const File& f, const Targets& to, float* params, Xxh64* h) const {
  constexpr std::size_t kPiece = std::size_t(1) << 20;
  // Pieces read into `staging` wait in its slots until they are hashed: 4 MiB in all.
  constexpr std::size_t kSlots = 4;
  std::vector<std::byte> staging;
  std::uint64_t slot_piece[kSlots] = {};  // the piece number each slot last held
  std::size_t next_slot = 0;
  std::vector<float> converted;
  std::optional<HashBehind> behind;
  if (h != nullptr && std::thread::hardware_concurrency() > 1) behind.emplace(*h);
  const std::uint64_t base = f.header.data_offset();
  for (std::size_t i = 0; i < f.header.tensors.size(); ++i) {
    const io::SafetensorsTensorInfo& t = f.header.tensors[i];
    if (to[i].empty() && h == nullptr) continue;
    const bool direct = S == Space::kHost && !to[i].empty() && *t.dtype == DType::kF32;
    // Straight into the parameter: one read per tensor, or 1 MiB pieces when hashing (each
    // piece is hashed while the next is read).
    const std::uint64_t piece = direct && h == nullptr ? t.bytes() : kPiece;
    for (std::uint64_t done = 0; done < t.bytes(); done += piece) {
      const auto n = std::size_t(std::min(piece, t.bytes() - done));
      std::byte* buf = nullptr;
      std::size_t slot = kSlots;
      if (direct) {
        buf = reinterpret_cast<std::byte*>(params + to[i][0]->offset) + done;
      } else {
        if (staging.empty()) staging.resize(kPiece * (behind ? kSlots : 1));
        slot = behind ? next_slot : 0;
        next_slot = (next_slot + 1) % kSlots;
        if (behind) behind->wait(slot_piece[slot]);  // the slot's last piece is hashed
        buf = staging.data() + slot * kPiece;
      }
      f.file->read_at(buf, n, base + t.begin + done);
      if (behind) {
        const std::uint64_t number = behind->push(buf, n);
        if (slot < kSlots) slot_piece[slot] = number;
      } else if (h != nullptr) {
        h->update(buf, n);
      }
      if (to[i].empty()) continue;
      const std::size_t size = dtype_size(*t.dtype);
      const std::size_t first = std::size_t(done) / size, count = n / size;
      const float* from = reinterpret_cast<const float*>(buf);
      if (*t.dtype != DType::kF32) {
        converted.resize(count);
        convert_to_f32(AnyTensorView(*t.dtype, Shape{std::int64_t(count)}, buf), converted.data());
        from = converted.data();
      }
      for (std::size_t k = direct ? 1 : 0; k < to[i].size(); ++k)
        copy_bytes(params + to[i][k]->offset + first, S, from, Space::kHost, count * sizeof(float),
                   "ckpt::load_model");
    }
  }
  if (behind) behind->finish();
}

template <Space S>
void StreamedModel::load(const ModelLoadPlan& todo, float* params, bool verify) const {
  for (std::size_t fi = 0; fi < files_.size(); ++fi) {
    const File& f = files_[fi];
    // Where each of the file's tensors goes (a tied tensor may fill two parameters).
    Targets to(f.header.tensors.size());
    bool any = false;
    for (const auto& [p, key] : todo) {
      const auto [where, i] = locate(key);
      if (where != fi || i < 0) continue;
      to[std::size_t(i)].push_back(p);
      any = true;
    }
    if (!any) continue;
    bool hashed = false, read_all = false;
    if (verify) {
      try {
        ckpt::detail::verify_checksum_parts(f.prefix, f.file->size(), f.file->path(),
                                            /*require=*/false, [&](Xxh64& h) {
                                              hashed = true;
                                              read_file<S>(f, to, params, &h);
                                              read_all = true;
                                            });
      } catch (const Error&) {
        // It verified before anything loaded (verify()), so a mismatch now means that it was
        // rewritten in place meanwhile.
        if (!read_all) throw;
        TRAINKIT_FAIL("checkpoint file '", f.file->path(),
                      "' changed while it was being loaded: it matched its checksum before the "
                      "load and not during it (rewritten in place meanwhile); the model's "
                      "parameters are partly overwritten");
      }
    }
    if (!hashed) read_file<S>(f, to, params, nullptr);
    f.file->check_unchanged();
  }
}

}  // namespace detail

/// Loads the parameters of `arena` (finalized) from `src` by name. Every check runs before any
/// parameter changes: names (strict / allow_unexpected / skip), shapes, dtypes (F32, or with
/// convert_dtype F16/BF16/F64). Throws trainkit::Error naming the source and listing every
/// problem, with a hint (strict = false, skip = {...}). A device arena is uploaded with
/// cudaMemcpy (synchronous).
template <Space S>
ModelLoadReport load_model(nn::ParamArena<S>& arena, const TensorSource& src,
                           const ModelLoadOptions& options = {}) {
  ModelLoadReport report;
  const detail::ModelLoadPlan todo = detail::plan_model_load(
      arena, src, options, report, [&](std::string_view a, std::string_view b) {
        return detail::same_tensor(src.tensor(a), src.tensor(b));
      });
  std::vector<float> staging;
  if constexpr (S == Space::kHost) trainkit::detail::wait_for_snapshot_copies();
  for (const auto& [p, key] : todo) {
    const AnyTensorView t = src.tensor(key);
    const float* from = nullptr;
    if (t.dtype() == DType::kF32) {
      from = reinterpret_cast<const float*>(t.data());
      // Files written without alignment padding can leave an F32 tensor misaligned; the
      // reader then copies it, so `t.data()` is always usable here.
    } else {
      staging.resize(std::size_t(p->numel));
      detail::convert_to_f32(t, staging.data());
      from = staging.data();
      report.converted.push_back(p->name);
    }
    copy_bytes(arena.params_data() + p->offset, S, from, Space::kHost,
               std::size_t(p->numel) * sizeof(float), "ckpt::load_model");
    report.loaded.push_back(p->name);
  }
  return report;
}

/// load_model from a path (file, index.json or directory, found as TensorSource::open finds
/// them). Unlike a TensorSource, nothing is mapped or copied whole: the headers are read and
/// every check runs first, then each tensor is read with pread straight into its parameter (one
/// converted to F32 through a 1 MiB buffer). With verify_checksum, every file that carries a
/// checksum is verified before anything loads (a corrupt file changes nothing), and hashed again
/// as it loads, so the bytes that load are the ones that match it. A file that ends early,
/// changes size or stops matching its checksum while it loads (truncated or rewritten in place
/// by another process) gives trainkit::Error naming it; the parameters are then partly
/// overwritten.
template <Space S>
ModelLoadReport load_model(nn::ParamArena<S>& arena, const std::filesystem::path& path,
                           const ModelLoadOptions& options = {}) {
  const detail::StreamedModel src(detail::model_target(path));
  if (options.verify_checksum) src.verify();
  ModelLoadReport report;
  const detail::ModelLoadPlan todo = detail::plan_model_load(
      arena, src, options, report,
      [&](std::string_view a, std::string_view b) { return src.same(a, b); });
  if constexpr (S == Space::kHost) trainkit::detail::wait_for_snapshot_copies();
  src.load<S>(todo, arena.params_data(), options.verify_checksum);
  for (const auto& [p, key] : todo) {
    const io::SafetensorsTensorInfo* t = src.find(key);
    if (*t->dtype != DType::kF32) report.converted.push_back(p->name);
    report.loaded.push_back(p->name);
  }
  return report;
}

/// Options of save_model.
struct ModelSaveOptions {
  /// `__metadata__`; Hugging Face loaders expect {"format": "pt"}, which is added when absent.
  io::SafetensorsMetadata metadata = {};
  /// Data alignment (see io::SafetensorsWriteOptions): 64 keeps every F32 tensor of the arena
  /// cache-line aligned for readers that map the file.
  std::size_t alignment = 64;
  bool durable = true;
};

namespace detail {

/// The parameters of `arena` as named F32 views: into the arena (host, `copy` false) or into
/// `buffer` (a copy of the parameters `keep` selects; a device arena is always copied).
/// `keep` (may be empty: all) selects by parameter index.
template <Space S>
std::vector<io::NamedTensor> model_views(const nn::ParamArena<S>& arena, bool copy,
                                         const std::vector<bool>& keep, AnyTensor& buffer) {
  TRAINKIT_CHECK(arena.finalized(), "ckpt: saving a ParamArena before finalize()");
  const auto& infos = arena.infos();
  const bool must_copy = copy || S == Space::kDevice;
  if (must_copy && (buffer.dtype() != DType::kF32 || buffer.numel() != arena.buffer_numel()))
    buffer = AnyTensor(DType::kF32, Shape{arena.buffer_numel()});
  std::vector<io::NamedTensor> out;
  std::vector<trainkit::detail::CopyPiece> copies;
  for (std::size_t i = 0; i < infos.size(); ++i) {
    if (!keep.empty() && !keep[i]) continue;
    const nn::ParamInfo& p = infos[i];
    const float* src = arena.params_data() + p.offset;
    if (must_copy) {
      float* dst = reinterpret_cast<float*>(buffer.data()) + p.offset;
      const std::size_t bytes = std::size_t(p.numel) * sizeof(float);
      if constexpr (S == Space::kHost) {
        copies.push_back({dst, src, bytes});
      } else {
        copy_bytes(dst, Space::kHost, src, S, bytes, "ckpt::save_model");
      }
      src = dst;
    }
    out.push_back({p.name, AnyTensorView(DType::kF32, p.shape, src)});
  }
  trainkit::detail::parallel_copy(copies);
  return out;
}

}  // namespace detail

/// Writes the parameters of `arena` to `path` as safetensors (F32, PyTorch names, checksummed,
/// crash-safe). In Python: `model.load_state_dict(safetensors.torch.load_file(path))`.
/// Returns the file's size and checksum. Throws trainkit::Error naming the file.
template <Space S>
FileDigest save_model(const std::filesystem::path& path, const nn::ParamArena<S>& arena,
                      ModelSaveOptions options = {}) {
  AnyTensor buffer;
  const std::vector<io::NamedTensor> views = detail::model_views(arena, false, {}, buffer);
  if (options.metadata.find("format") == options.metadata.end())
    options.metadata.emplace("format", "pt");
  return save_checksummed_safetensors(
      path, views, std::move(options.metadata),
      io::SafetensorsWriteOptions{.alignment = options.alignment, .durable = options.durable});
}

#if TRAINKIT_IMPL

TRAINKIT_INLINE std::filesystem::path detail::model_target(const std::filesystem::path& path) {
  namespace fs = std::filesystem;
  std::error_code ec;
  if (!fs::is_directory(path, ec)) return path;
  if (fs::exists(path / io::kSafetensorsIndexName, ec)) return path / io::kSafetensorsIndexName;
  if (fs::exists(path / "model.safetensors", ec)) return path / "model.safetensors";
  TRAINKIT_FAIL("ckpt: directory '", path.string(), "' holds neither ", io::kSafetensorsIndexName,
                " nor model.safetensors");
}

TRAINKIT_INLINE TensorSource TensorSource::open(const std::filesystem::path& path,
                                                bool verify_checksum) {
  const std::filesystem::path target = detail::model_target(path);
  TensorSource s;
  s.source_ = target.string();
  if (target.extension() == ".json") {
    if (verify_checksum) {
      const io::SafetensorsIndex index = io::load_safetensors_index(target);
      for (const std::string& f : index.files())
        ckpt::verify_checksum_file(target.parent_path() / f, /*require=*/false);
    }
    s.shards_ = std::make_unique<io::SafetensorsShards>(target, io::SafetensorsBacking::kCopy);
  } else {
    io::MappedFile bytes = io::MappedFile::copied(target);
    if (verify_checksum) ckpt::verify_checksum(bytes.bytes(), bytes.path(), /*require=*/false);
    s.file_ = std::make_unique<io::SafetensorsFile>(std::move(bytes));
  }
  return s;
}

TRAINKIT_INLINE detail::StreamedModel::StreamedModel(const std::filesystem::path& target)
    : source_(target.string()) {
  if (target.extension() != ".json") {
    add_file(target);
    return;
  }
  const io::SafetensorsIndex index = io::load_safetensors_index(target);
  const std::vector<std::string> names = index.files();
  files_.reserve(names.size());
  std::map<std::string, const std::vector<io::SafetensorsTensorInfo>*, std::less<>> tensors;
  for (const std::string& name : names) {
    add_file(target.parent_path() / name);
    tensors.emplace(name, &files_.back().header.tensors);
  }
  io::detail::check_shard_index(index, source_, tensors);
  for (const auto& [tensor, file] : index.weight_map)
    file_of_.emplace(
        tensor, std::size_t(std::lower_bound(names.begin(), names.end(), file) - names.begin()));
}

TRAINKIT_INLINE void detail::StreamedModel::add_file(const std::filesystem::path& path) {
  File f;
  f.file = std::make_unique<io::detail::PreadFile>(path);
  f.file->advise_sequential();
  io::detail::require_little_endian(f.file->path());
  f.prefix = ckpt::detail::read_safetensors_prefix(*f.file);
  f.header = io::parse_safetensors_header(
      std::string_view(reinterpret_cast<const char*>(f.prefix.data()) + 8, f.prefix.size() - 8),
      f.file->size(), f.file->path());
  f.by_name.resize(f.header.tensors.size());
  for (std::size_t i = 0; i < f.by_name.size(); ++i) f.by_name[i] = std::uint32_t(i);
  std::sort(f.by_name.begin(), f.by_name.end(), [&](std::uint32_t a, std::uint32_t b) {
    return f.header.tensors[a].name < f.header.tensors[b].name;
  });
  files_.push_back(std::move(f));
}

TRAINKIT_INLINE std::pair<std::size_t, long> detail::StreamedModel::locate(
    std::string_view name) const {
  std::size_t fi = 0;
  if (!file_of_.empty() || files_.size() != 1) {
    const auto it = file_of_.find(name);
    if (it == file_of_.end()) return {0, -1};
    fi = it->second;
  }
  const File& f = files_[fi];
  const auto it = std::lower_bound(
      f.by_name.begin(), f.by_name.end(), name,
      [&](std::uint32_t i, std::string_view n) { return f.header.tensors[i].name < n; });
  if (it == f.by_name.end() || f.header.tensors[*it].name != name) return {fi, -1};
  return {fi, long(*it)};
}

TRAINKIT_INLINE const io::SafetensorsTensorInfo* detail::StreamedModel::find(
    std::string_view name) const {
  const auto [fi, i] = locate(name);
  return i < 0 ? nullptr : &files_[fi].header.tensors[std::size_t(i)];
}

TRAINKIT_INLINE std::vector<std::string> detail::StreamedModel::names() const {
  std::vector<std::string> out;
  for (const File& f : files_)
    for (const io::SafetensorsTensorInfo& t : f.header.tensors) out.push_back(t.name);
  std::sort(out.begin(), out.end());
  return out;
}

TRAINKIT_INLINE bool detail::StreamedModel::same(std::string_view a, std::string_view b) const {
  const auto [fa, ia] = locate(a);
  const auto [fb, ib] = locate(b);
  const io::SafetensorsTensorInfo& ta = files_[fa].header.tensors[std::size_t(ia)];
  const io::SafetensorsTensorInfo& tb = files_[fb].header.tensors[std::size_t(ib)];
  for (const io::SafetensorsTensorInfo* t : {&ta, &tb})
    if (!t->dtype)
      io::detail::safetensors_fail(
          io::SafetensorsRule::kUnsupported, files_[t == &ta ? fa : fb].file->path(),
          trainkit::detail::concat("tensor '", io::detail::printable(t->name), "' has dtype ",
                                   t->dtype_name, ", which trainkit has no DType for"));
  if (ta.dtype != tb.dtype || !(ta.shape == tb.shape)) return false;
  // Compared in pieces, so a large tied embedding needs no copy of its own.
  constexpr std::uint64_t kPiece = std::uint64_t(1) << 20;
  std::vector<std::byte> x(std::size_t(std::min(kPiece, ta.bytes()))), y(x.size());
  for (std::uint64_t done = 0; done < ta.bytes(); done += kPiece) {
    const auto n = std::size_t(std::min(kPiece, ta.bytes() - done));
    files_[fa].file->read_at(x.data(), n, files_[fa].header.data_offset() + ta.begin + done);
    files_[fb].file->read_at(y.data(), n, files_[fb].header.data_offset() + tb.begin + done);
    if (std::memcmp(x.data(), y.data(), n) != 0) return false;
  }
  return true;
}

TRAINKIT_INLINE void detail::StreamedModel::verify() const {
  for (const File& f : files_) {
    const Targets none(f.header.tensors.size());
    ckpt::detail::verify_checksum_parts(
        f.prefix, f.file->size(), f.file->path(), /*require=*/false,
        [&](Xxh64& h) { read_file<Space::kHost>(f, none, nullptr, &h); });
    f.file->check_unchanged();
  }
}

TRAINKIT_INLINE std::vector<std::string> TensorSource::names() const {
  std::vector<std::string> out;
  if (file_) {
    out = file_->names();
  } else {
    for (const auto& [name, f] : shards_->index().weight_map) out.push_back(name);
  }
  std::sort(out.begin(), out.end());
  return out;
}

#endif  // TRAINKIT_IMPL

}  // namespace ckpt
TRAINKIT_NAMESPACE_END
