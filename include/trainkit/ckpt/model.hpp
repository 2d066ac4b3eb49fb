// SPDX-License-Identifier: MIT
// trainkit/ckpt/model.hpp: model weights <-> safetensors under their PyTorch state-dict names.
// save_model() writes a file that `safetensors.torch.load_file` + `model.load_state_dict` read
// for the same architecture; load_model() reads a file, a sharded set (index.json) or a model
// directory - ours or one exported from PyTorch / Hugging Face - into a ParamArena, with
// PyTorch's strict/non-strict semantics, skip patterns for a new head and errors that list every
// missing, unexpected, mis-shaped or mis-typed name before anything is changed.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <memory>
#include <span>
#include <string>
#include <string_view>
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

/// Loads the parameters of `arena` (finalized) from `src` by name. Every check runs before any
/// parameter changes: names (strict / allow_unexpected / skip), shapes, dtypes (F32, or with
/// convert_dtype F16/BF16/F64). Throws trainkit::Error naming the source and listing every
/// problem, with a hint (strict = false, skip = {...}). A device arena is uploaded with
/// cudaMemcpy (synchronous).
template <Space S>
ModelLoadReport load_model(nn::ParamArena<S>& arena, const TensorSource& src,
                           const ModelLoadOptions& options = {}) {
  TRAINKIT_CHECK(arena.finalized(), "ckpt::load_model: finalize() the ParamArena first");
  for (const auto& [other, own] : options.tied) {
    TRAINKIT_CHECK(arena.find(own), "ckpt::load_model: tied = {'", other, "', '", own,
                   "'}: the model has no parameter '", own, "'");
    TRAINKIT_CHECK(!arena.find(other), "ckpt::load_model: tied = {'", other, "', '", own, "'}: '",
                   other, "' is a parameter of its own (the model is not tied)");
  }
  ModelLoadReport report;
  std::vector<std::string> problems;
  std::vector<std::pair<const nn::ParamInfo*, std::string>> todo;  // parameter, file name
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
      } else if (!detail::same_tensor(src.tensor(key), src.tensor(other_key))) {
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

/// load_model from a path (file, index.json or directory; see TensorSource::open).
template <Space S>
ModelLoadReport load_model(nn::ParamArena<S>& arena, const std::filesystem::path& path,
                           const ModelLoadOptions& options = {}) {
  const TensorSource src = TensorSource::open(path, options.verify_checksum);
  return load_model(arena, src, options);
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

TRAINKIT_INLINE TensorSource TensorSource::open(const std::filesystem::path& path,
                                                bool verify_checksum) {
  namespace fs = std::filesystem;
  fs::path target = path;
  std::error_code ec;
  if (fs::is_directory(path, ec)) {
    if (fs::exists(path / io::kSafetensorsIndexName, ec)) {
      target = path / io::kSafetensorsIndexName;
    } else if (fs::exists(path / "model.safetensors", ec)) {
      target = path / "model.safetensors";
    } else {
      TRAINKIT_FAIL("ckpt: directory '", path.string(), "' holds neither ",
                    io::kSafetensorsIndexName, " nor model.safetensors");
    }
  }
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
