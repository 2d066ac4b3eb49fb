// SPDX-License-Identifier: MIT
// trainkit/ckpt/checkpointer.hpp: `Checkpointer`, crash-safe checkpoints of a TrainState in
// `<root>/step_000000123/` directories: model.safetensors (PyTorch names), train_state.safetensors
// (every other tensor; scalars in __metadata__) and checkpoint.json (the manifest, written last),
// each file checksummed, the manifest too (format version 2: its first member is its own XXH64).
// resume() logs every damaged checkpoint it skips and moves it aside as `.<name>.corrupt`; when
// none is usable but damaged ones exist it throws rather than start fresh. A save writes a hidden
// temp directory, fsyncs it and renames it into place, so a crash at any instant leaves only
// complete checkpoints under step_* names. Saves every N steps or T seconds, keeps the last K and
// the best K by a metric, can write on a background thread (training waits only for the host
// snapshot), shards across ranks with a model.safetensors.index.json, and resume() restores
// everything from the newest intact one. A save of step N moves checkpoints of later steps aside
// as `.<name>.superseded` (a run sent back to an older checkpoint, or started over): they are not
// its past, and resume() must not take them.
#pragma once

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <condition_variable>
#include <cstdint>
#include <cstdio>
#include <ctime>
#include <exception>
#include <filesystem>
#include <functional>
#include <iostream>
#include <limits>
#include <map>
#include <mutex>
#include <new>
#include <optional>
#include <string>
#include <string_view>
#include <thread>
#include <utility>
#include <vector>

#include <stdio.h>  // renameat2 (glibc >= 2.28)

#include "trainkit/ckpt/checksum.hpp"
#include "trainkit/ckpt/model.hpp"
#include "trainkit/core/state_dict.hpp"
#include "trainkit/ckpt/train_state.hpp"
#include "trainkit/config.hpp"
#include "trainkit/core/any_tensor.hpp"
#include "trainkit/dist/comm.hpp"
#include "trainkit/error.hpp"
#include "trainkit/io/atomic_file.hpp"
#include "trainkit/io/json.hpp"
#include "trainkit/io/mmap.hpp"
#include "trainkit/io/safetensors.hpp"
#include "trainkit/version.hpp"

TRAINKIT_NAMESPACE_BEGIN
namespace ckpt {

/// Metric values saved with a checkpoint (e.g. {"val_loss", 0.31}); the best-K rule reads one.
using Metrics = std::map<std::string, double, std::less<>>;

/// Whether smaller or larger values of the best metric are better.
enum class MetricMode : std::uint8_t { kMin, kMax };

/// How the model's parameters are spread over the ranks' files.
enum class ModelSharding : std::uint8_t {
  /// Every rank holds the whole model (data parallel): rank r writes a contiguous, byte-balanced
  /// r-th part of it, so the ranks share the write work.
  kReplicated,
  /// Every rank holds different parameters (model parallel): each writes all of its own; names
  /// must be unique across ranks. On load each rank takes its own names from the index.
  kLocal,
};

/// How much of a checkpoint is checked before it is trusted.
enum class Verify : std::uint8_t {
  kStructure,  ///< the manifest parses and every file it lists exists with its recorded size
  kFull,       ///< also every file's content checksum (reads every byte)
};

struct CheckpointerOptions {
  /// maybe_save() saves when step % every_steps == 0 (0: never by steps).
  std::int64_t every_steps = 0;
  /// maybe_save() also saves when this many seconds passed since the last save (0: never by
  /// time). Single-rank only: ranks would disagree on the time.
  double every_seconds = 0.0;
  /// Keep the newest K complete checkpoints (<= 0: keep all). The newest is always kept.
  int keep_last = 3;
  /// Name of the metric (in save()'s Metrics) that picks the best checkpoints; empty: none.
  std::string best_metric = {};
  MetricMode best_mode = MetricMode::kMin;
  /// Also keep the best K by best_metric (checkpoints without the metric never count as best).
  int keep_best = 1;
  /// Write on a background thread: save() returns after the host snapshot. Errors surface from
  /// the next save(), wait() or resume(). At most one write is in flight (save() waits for it).
  /// The snapshot's memory (a host copy of the model and of the other state) is kept from one
  /// save to the next, so a snapshot is one parallel copy into pages already mapped.
  bool async = false;
  /// With async: save() returns before copying the parameters and the optimizer (and Ema) state
  /// held in host memory; the writer thread copies them first, while training runs its next
  /// forward and backward, then writes. Until those copies are made, optimizer steps, Ema
  /// updates and loads of parameters or optimizer state wait for them, so the checkpoint holds
  /// the state as it was at save(). Anything else that writes the parameters or that state in
  /// the meantime must call wait_snapshot() first. Device memory and the small state (counters,
  /// schedules, scalers) are copied in save() as without it.
  bool overlap_snapshot = false;
  /// fsync files and directories (the power-loss guarantee; off only for tests and scratch).
  bool durable = true;
  /// This process's rank and the number of ranks writing one checkpoint together. Every rank
  /// must call save() for the same steps, with its own TrainState.
  int rank = 0;
  int world_size = 1;
  /// Required when world_size > 1: blocks until every rank called it (e.g. comm_barrier(comm)). In
  /// async mode it runs on the writer thread: give the checkpointer a communicator of its own
  /// (collectives issued from two threads on one communicator would interleave).
  std::function<void()> barrier = {};
  ModelSharding sharding = ModelSharding::kReplicated;
  /// Data alignment of the safetensors files (64: F32 tensors stay cache-line aligned).
  std::size_t alignment = 64;
  /// Directory names are `<prefix><step, 9+ digits>`.
  std::string prefix = "step_";
  /// Rank 0 deletes what interrupted saves and rotations left (hidden temp directories) at
  /// construction and moves damaged checkpoints aside in resume(). false for a Checkpointer
  /// that only watches another process's root.
  bool remove_stale = true;
  /// Warnings, one line each: every checkpoint latest() / resume() skip with the reason, each one
  /// moved aside, a failed deletion; default: stderr ("trainkit ckpt (rank r): ...").
  std::function<void(const std::string&)> log = {};
};

/// A checkpoint on disk, as its manifest describes it.
struct CheckpointInfo {
  struct File {
    std::string name;
    std::uint64_t bytes = 0;
    std::uint64_t xxh64 = 0;
  };
  std::filesystem::path path;  ///< the step directory
  std::int64_t step = 0;
  std::int64_t epoch = 0;
  int world_size = 1;
  std::int64_t created_unix = 0;  ///< seconds since the epoch (wall clock of rank 0)
  Metrics metrics;
  std::map<std::string, std::string> metadata;  ///< TrainState::metadata at the save
  std::string model_file;                       ///< model.safetensors, the index, or empty
  std::vector<File> files;
};

/// Options of load() and resume().
struct LoadOptions {
  ModelLoadOptions model = {};
  RestoreOptions restore = {};
  /// kFull: verify the checksums of the files read (of all ranks' files when world_size > 1, so
  /// every rank reaches the same verdict) before anything is restored.
  Verify verify = Verify::kFull;
  /// resume() / newest_usable() throw when no checkpoint is usable but damaged ones exist (met
  /// now, or quarantined by an earlier resume): a run asked to continue must not silently start
  /// from scratch. true: they return nullopt then (logging what was quarantined).
  bool allow_fresh_start = false;
  /// How that error names the setting that allows a fresh start: a program that exposes it as a
  /// flag names the flag (e.g. "--allow-fresh-start").
  std::string fresh_start_setting = "LoadOptions::allow_fresh_start";
};

/// Timings of the last save, for benchmarks and logs.
struct SaveStats {
  double snapshot_seconds = 0;  ///< save() blocked training this long (async: the copy only)
  double write_seconds = 0;     ///< hashing + writing + committing (async: on the thread)
  std::uint64_t bytes = 0;      ///< bytes this rank wrote
  double copy_seconds = 0;      ///< overlap_snapshot: the deferred copies, on the writer thread
};

/// A barrier over a communicator, for CheckpointerOptions::barrier.
template <dist::Communicator C>
std::function<void()> comm_barrier(C& comm) {
  return [&comm] { comm.barrier().wait(); };
}

namespace detail {

inline constexpr std::string_view kManifestName = "checkpoint.json";
/// Version 2 manifests carry their own XXH64 (version 1 had none: one edited digit changed what
/// a resume restored). Version 1 manifests are refused, not trusted: the settings they record
/// cannot be verified. See parse_manifest.
inline constexpr int kManifestVersion = 2;
/// Larger "version" numbers are not versions at all (damaged or foreign manifests).
inline constexpr std::uint64_t kMaxManifestVersionNumber = 1'000'000;
/// The manifest's checksum member: always the first one, so the file starts with
/// kManifestPrefix followed by 16 hex digits: XXH64 of the whole file with those digits as '0'
/// (the convention of the checksummed safetensors files).
inline constexpr std::string_view kManifestChecksumKey = "manifest_xxh64";
inline constexpr std::string_view kManifestPrefix = "{\n  \"manifest_xxh64\": \"";
/// Larger manifests are refused before they are read (one lists a few files per rank).
inline constexpr std::uint64_t kMaxManifestBytes = std::uint64_t(64) << 20;

TRAINKIT_INLINE std::string state_file_name(int rank, int world_size);
inline std::string model_file_name(int rank, int world_size) {
  return world_size == 1 ? std::string("model.safetensors")
                         : io::safetensors_shard_name(std::size_t(rank), std::size_t(world_size));
}

/// The step of a directory name `<prefix><digits>`, or nullopt.
TRAINKIT_INLINE std::optional<std::int64_t> parse_step_dir(std::string_view name,
                                                           std::string_view prefix);
/// The largest step a checkpoint directory's name records (parse_step_dir reads 18 digits).
inline constexpr std::int64_t kMaxCheckpointStep = 999'999'999'999'999'999;

/// Owner rank of each parameter for ModelSharding::kReplicated: contiguous runs balanced by
/// bytes (a parameter goes to the rank its midpoint falls in). The same on every rank.
TRAINKIT_INLINE std::vector<int> partition_params(const std::vector<nn::ParamInfo>& infos,
                                                  int world_size);

/// A JSON value for a metric: a number, or "nan" / "inf" / "-inf" as strings.
inline io::Json metric_json(double v) {
  if (std::isfinite(v)) return io::Json::number(StateDict::number_to_string(v));
  return io::Json(StateDict::number_to_string(v));
}
TRAINKIT_INLINE double metric_value(const io::Json& j);

/// XXH64 of a manifest text with the 16 digits after kManifestPrefix read as '0'.
TRAINKIT_INLINE std::uint64_t manifest_checksum(std::string_view text);

/// Parses the text of a checkpoint.json (`where` names it in errors; `dir` becomes info.path).
/// Verifies the manifest checksum first, then the content: every file a resume reads (each
/// rank's train_state, the model file and, for world_size > 1, every model shard) must be listed
/// with its size and checksum. Throws trainkit::Error on any problem, never anything else.
TRAINKIT_INLINE CheckpointInfo parse_manifest(std::string_view text,
                                              const std::filesystem::path& dir,
                                              const std::string& where);

/// Parses checkpoint.json of `dir` (see parse_manifest). Throws trainkit::Error naming the file
/// on any problem (missing, empty, too large, unparsable, failing its checksum, inconsistent).
TRAINKIT_INLINE CheckpointInfo read_manifest(const std::filesystem::path& dir);

/// True when `e` says the operating system could not do what checking a checkpoint needs now
/// (no memory, too many open files, no permission, an I/O error): nothing about the checkpoint
/// itself, so it must not be quarantined or passed over for an older one.
inline bool system_refused(const std::exception& e) noexcept {
  const auto* error = dynamic_cast<const Error*>(&e);
  if (error == nullptr) return dynamic_cast<const std::bad_alloc*>(&e) != nullptr;
  if (error->library() != "os") return false;
  switch (error->code()) {
    case ENOMEM:
    case EMFILE:
    case ENFILE:
    case EACCES:
    case EPERM:
    case EAGAIN:
    case EINTR:
    case ENOBUFS:
    case EIO:
    case EBUSY:
    case ETIMEDOUT:
    case ESTALE: return true;
    default: return false;
  }
}

/// The message of `e` without the "trainkit: " every trainkit::Error starts with (for reasons
/// quoted inside another message).
inline std::string reason_of(const std::exception& e) {
  std::string_view what = e.what();
  if (what.starts_with("trainkit: ")) what.remove_prefix(10);
  return std::string(what);
}

/// True when the checkpoint.json of `dir` is an intact trainkit manifest of another format
/// version (version 1: no checksum, so "intact" means it parses): not damaged, but not for this
/// trainkit. Never throws.
TRAINKIT_INLINE bool other_manifest_version(const std::filesystem::path& dir) noexcept;

/// The text of checkpoint.json for `info`, its checksum included (kManifestChecksumKey first).
TRAINKIT_INLINE std::string manifest_text(const CheckpointInfo& info);

/// Throws unless every file of `info` exists with its recorded size (and, for kFull, content).
/// `only` (when non-empty) limits the content check to those names.
TRAINKIT_INLINE void verify_checkpoint(const CheckpointInfo& info, Verify level,
                                       const std::vector<std::string>& only = {});

/// The checksum and size a checksummed safetensors file claims (reads the header only).
TRAINKIT_INLINE CheckpointInfo::File describe_file(const std::filesystem::path& dir,
                                                   const std::string& name);

/// True when every entry of `dir` is a file a checkpoint consists of (or an AtomicFile temp).
TRAINKIT_INLINE bool only_checkpoint_files(const std::filesystem::path& dir);

/// Renames `from` over the directory `to`: atomically exchanged when `to` exists (Linux
/// renameat2), then the old content (now at `from`) is removed.
TRAINKIT_INLINE void replace_directory(const std::filesystem::path& from,
                                       const std::filesystem::path& to);

#if TRAINKIT_IMPL

TRAINKIT_INLINE std::string state_file_name(int rank, int world_size) {
  if (world_size == 1) return "train_state.safetensors";
  char buf[64];
  std::snprintf(buf, sizeof buf, "train_state-rank%05d.safetensors", rank);
  return buf;
}

TRAINKIT_INLINE std::optional<std::int64_t> parse_step_dir(std::string_view name,
                                                           std::string_view prefix) {
  if (!name.starts_with(prefix) || name.size() == prefix.size() || name.size() > prefix.size() + 18)
    return std::nullopt;
  std::int64_t step = 0;
  for (char c : name.substr(prefix.size())) {
    if (c < '0' || c > '9') return std::nullopt;
    step = step * 10 + (c - '0');
  }
  return step;
}

TRAINKIT_INLINE std::vector<int> partition_params(const std::vector<nn::ParamInfo>& infos,
                                                  int world_size) {
  std::int64_t total = 0;
  for (const nn::ParamInfo& p : infos) total += p.numel;
  std::vector<int> owner(infos.size(), 0);
  std::int64_t start = 0;
  for (std::size_t i = 0; i < infos.size(); ++i) {
    if (total > 0) {
      const long double mid = static_cast<long double>(start) + infos[i].numel / 2.0L;
      owner[i] = std::min(world_size - 1,
                          static_cast<int>(mid * world_size / static_cast<long double>(total)));
    }
    start += infos[i].numel;
  }
  return owner;
}

TRAINKIT_INLINE double metric_value(const io::Json& j) {
  if (j.is_number()) return j.as_double();
  const std::string& s = j.as_string();
  if (s == "inf") return HUGE_VAL;
  if (s == "-inf") return -HUGE_VAL;
  return std::nan("");
}

TRAINKIT_INLINE std::uint64_t manifest_checksum(std::string_view text) {
  static constexpr char kZeros[16] = {'0', '0', '0', '0', '0', '0', '0', '0',
                                      '0', '0', '0', '0', '0', '0', '0', '0'};
  const std::size_t at = kManifestPrefix.size();
  Xxh64 h;
  h.update(text.substr(0, at));
  h.update(kZeros, 16);
  h.update(text.substr(at + 16));
  return h.digest();
}

TRAINKIT_INLINE CheckpointInfo parse_manifest(std::string_view text,
                                              const std::filesystem::path& dir,
                                              const std::string& where) {
  TRAINKIT_CHECK(!text.empty(), "checkpoint manifest '", where, "' is empty");
  TRAINKIT_CHECK(text.size() <= kMaxManifestBytes, "checkpoint manifest '", where, "' has ",
                 text.size(), " bytes, more than a manifest can hold (", kMaxManifestBytes, ")");
  const bool summed =
      text.starts_with(kManifestPrefix) && text.size() >= kManifestPrefix.size() + 16;
  if (summed) {
    const auto stored = parse_hex64(text.substr(kManifestPrefix.size(), 16));
    TRAINKIT_CHECK(stored.has_value(), "checkpoint manifest '", where, "': its ",
                   kManifestChecksumKey, " is not 16 hex digits (damaged or edited)");
    const std::uint64_t actual = manifest_checksum(text);
    // The digits as written (lower case): a byte of them edited is an edit too.
    TRAINKIT_CHECK(text.substr(kManifestPrefix.size(), 16) == hex64(actual),
                   "checkpoint manifest '", where, "' fails its checksum: its content hashes to ",
                   hex64(actual), " but it was written with ", kManifestChecksumKey, " = ",
                   hex64(*stored), " (", text.size(),
                   " bytes; bit rot, a torn write or an edited file)");
  }
  const io::Json root = io::Json::parse(text, where);
  TRAINKIT_CHECK(root.is_object(), "checkpoint manifest '", where, "' is not a JSON object");
  const io::Json* format = root.find("format");
  TRAINKIT_CHECK(
      format != nullptr && format->is_string() && format->as_string() == "trainkit.checkpoint", "'",
      where, "' is not a trainkit checkpoint manifest");
  const io::Json* version = root.find("version");
  TRAINKIT_CHECK(version != nullptr && version->is_number(), "checkpoint manifest '", where,
                 "' has no version");
  // A version that is not a small integer (2.5, 1e30, 2^70) is named with the file, not left to
  // the JSON reader's message.
  TRAINKIT_CHECK(version->is_unsigned() && version->as_uint() <= kMaxManifestVersionNumber,
                 "checkpoint manifest '", where, "' has version ", version->dump(),
                 ", which is not a manifest version (an integer; this trainkit reads version ",
                 kManifestVersion, ")");
  const std::int64_t v = version->as_int();
  TRAINKIT_CHECK(v != 1 || summed, "checkpoint manifest '", where,
                 "' has version 1, which carries no checksum of its own: the settings it records "
                 "cannot be verified, so this trainkit (manifest version ",
                 kManifestVersion, ") does not resume from it; use the trainkit that wrote it");
  TRAINKIT_CHECK(v == kManifestVersion, "checkpoint manifest '", where, "' has version ", v,
                 "; this trainkit reads version ", kManifestVersion);
  TRAINKIT_CHECK(summed, "checkpoint manifest '", where, "' does not start with its ",
                 kManifestChecksumKey, " checksum (damaged or edited)");
  CheckpointInfo info;
  try {  // a field missing or of another type: the JSON reader's message, with the file
    info.path = dir;
    info.step = root.at("step").as_int();
    info.epoch = root.at("epoch").as_int();
    info.world_size = static_cast<int>(std::clamp<std::int64_t>(root.at("world_size").as_int(), 0,
                                                                std::numeric_limits<int>::max()));
    TRAINKIT_CHECK(info.world_size >= 1, "checkpoint manifest '", where, "': world_size < 1");
    info.created_unix = root.at("created_unix").as_int();
    for (const io::JsonMember& m : root.at("metrics").as_object())
      info.metrics.emplace(m.key, metric_value(m.value));
    for (const io::JsonMember& m : root.at("metadata").as_object())
      info.metadata.emplace(m.key, m.value.as_string());
    const io::Json& model = root.at("model");
    if (!model.is_null()) info.model_file = model.as_string();
    for (const io::JsonMember& m : root.at("files").as_object()) {
      CheckpointInfo::File f;
      f.name = m.key;
      // No separators, and no control characters: a NUL would cut the path short (the check
      // would read another file), and names from a file reach messages (escaped) only.
      const bool plain = std::none_of(f.name.begin(), f.name.end(), [](char c) {
        const auto u = static_cast<unsigned char>(c);
        return c == '/' || u < 0x20 || u == 0x7f;
      });
      TRAINKIT_CHECK(!f.name.empty() && plain && f.name != ".." && f.name != ".",
                     "checkpoint manifest '", where, "' lists the file '",
                     io::detail::printable(f.name), "', which is not a plain file name");
      for (const CheckpointInfo::File& g : info.files)
        TRAINKIT_CHECK(g.name != f.name, "checkpoint manifest '", where, "' lists '",
                       io::detail::printable(f.name), "' twice");
      f.bytes = m.value.at("bytes").as_uint();
      const auto h = parse_hex64(m.value.at("xxh64").as_string());
      TRAINKIT_CHECK(h.has_value(), "checkpoint manifest '", where, "': file '", f.name,
                     "' has a malformed xxh64");
      f.xxh64 = *h;
      info.files.push_back(std::move(f));
    }
  } catch (const Error& e) {
    const std::string why = reason_of(e);
    if (why.find(where) != std::string::npos) throw;
    TRAINKIT_FAIL("checkpoint manifest '", where, "' is malformed (", why, ")");
  }
  // Every file a resume reads is listed, so that it is verified before it is read.
  const auto listed = [&](const std::string& name) {
    for (const CheckpointInfo::File& f : info.files)
      if (f.name == name) return true;
    return false;
  };
  const auto require = [&](const std::string& name) {
    TRAINKIT_CHECK(listed(name), "checkpoint manifest '", where, "' does not list '", name,
                   "', which a resume reads (its size and checksum must be recorded)");
  };
  TRAINKIT_CHECK(std::size_t(info.world_size) <= info.files.size(), "checkpoint manifest '", where,
                 "': world_size ", info.world_size, " but only ", info.files.size(),
                 " file(s) listed");
  for (int r = 0; r < info.world_size; ++r) require(state_file_name(r, info.world_size));
  if (!info.model_file.empty()) {
    require(info.model_file);
    if (info.world_size > 1)
      for (int r = 0; r < info.world_size; ++r) require(model_file_name(r, info.world_size));
  }
  return info;
}

TRAINKIT_INLINE CheckpointInfo read_manifest(const std::filesystem::path& dir) {
  const std::filesystem::path file = dir / kManifestName;
  std::error_code ec;
  const std::uintmax_t size = std::filesystem::file_size(file, ec);
  if (ec && ec != std::errc::no_such_file_or_directory && ec != std::errc::not_a_directory &&
      ec.category() == std::generic_category())
    TRAINKIT_FAIL_OS(ec.value(), "cannot read checkpoint manifest '", file.string(),
                     "': ", ec.message());
  TRAINKIT_CHECK(!ec, "checkpoint '", dir.string(), "' has no readable ", kManifestName, " (",
                 ec.message(), ")");
  TRAINKIT_CHECK(size <= kMaxManifestBytes, "checkpoint manifest '", file.string(), "' has ", size,
                 " bytes, more than a manifest can hold (", kMaxManifestBytes, ")");
  // Read, not mapped: a manifest truncated in place meanwhile must give an error, not a signal.
  const io::MappedFile map = io::MappedFile::copied(file);
  return parse_manifest(std::string_view(reinterpret_cast<const char*>(map.data()), map.size()),
                        dir, file.string());
}

TRAINKIT_INLINE bool other_manifest_version(const std::filesystem::path& dir) noexcept {
  try {
    const std::filesystem::path file = dir / kManifestName;
    if (std::filesystem::file_size(file) > kMaxManifestBytes) return false;
    const io::MappedFile map = io::MappedFile::copied(file);
    const std::string_view text(reinterpret_cast<const char*>(map.data()), map.size());
    const bool summed =
        text.starts_with(kManifestPrefix) && text.size() >= kManifestPrefix.size() + 16;
    if (summed && parse_hex64(text.substr(kManifestPrefix.size(), 16)) != manifest_checksum(text))
      return false;
    const io::Json root = io::Json::parse(text, file.string());
    const io::Json* format = root.is_object() ? root.find("format") : nullptr;
    const io::Json* version = root.is_object() ? root.find("version") : nullptr;
    return format != nullptr && format->is_string() &&
           format->as_string() == "trainkit.checkpoint" && version != nullptr &&
           version->is_number() && version->as_int() != kManifestVersion &&
           (summed || version->as_int() == 1);
  } catch (...) {
    return false;
  }
}

TRAINKIT_INLINE std::string manifest_text(const CheckpointInfo& info) {
  io::Json root = io::Json::object();
  root.set(std::string(kManifestChecksumKey), std::string(16, '0'));
  root.set("format", "trainkit.checkpoint");
  root.set("version", kManifestVersion);
  root.set("trainkit", TRAINKIT_VERSION_STRING);
  root.set("step", info.step);
  root.set("epoch", info.epoch);
  root.set("world_size", info.world_size);
  root.set("created_unix", info.created_unix);
  io::Json metrics = io::Json::object();
  for (const auto& [k, v] : info.metrics) metrics.set(k, metric_json(v));
  root.set("metrics", std::move(metrics));
  io::Json meta = io::Json::object();
  for (const auto& [k, v] : info.metadata) meta.set(k, io::Json(v));
  root.set("metadata", std::move(meta));
  root.set("model", info.model_file.empty() ? io::Json() : io::Json(info.model_file));
  io::Json files = io::Json::object();
  for (const CheckpointInfo::File& f : info.files) {
    io::Json e = io::Json::object();
    e.set("bytes", f.bytes);
    e.set("xxh64", hex64(f.xxh64));
    files.set(f.name, std::move(e));
  }
  root.set("files", std::move(files));
  std::string text = root.dump(2) + "\n";
  TRAINKIT_CHECK(text.starts_with(kManifestPrefix), "ckpt: the manifest of '", info.path.string(),
                 "' does not start with its checksum member");
  text.replace(kManifestPrefix.size(), 16, hex64(manifest_checksum(text)));
  return text;
}

TRAINKIT_INLINE void verify_checkpoint(const CheckpointInfo& info, Verify level,
                                       const std::vector<std::string>& only) {
  namespace fs = std::filesystem;
  for (const CheckpointInfo::File& f : info.files) {
    const fs::path p = info.path / f.name;
    std::error_code ec;
    const std::uintmax_t size = fs::file_size(p, ec);
    TRAINKIT_CHECK(!ec, "checkpoint '", info.path.string(), "' is incomplete: '", f.name,
                   "' is missing (", ec.message(), ")");
    TRAINKIT_CHECK(size == f.bytes, "checkpoint '", info.path.string(), "' is damaged: '", f.name,
                   "' has ", size, " bytes, the manifest says ", f.bytes);
  }
  if (level != Verify::kFull) return;
  for (const CheckpointInfo::File& f : info.files) {
    if (!only.empty() && std::find(only.begin(), only.end(), f.name) == only.end()) continue;
    const fs::path p = info.path / f.name;
    // Read with pread, not mapped: a file another process truncates meanwhile is then a damaged
    // checkpoint (an error naming it), where touching a mapping past its new end kills the run.
    const std::uint64_t actual =
        p.extension() == ".safetensors" ? verify_checksum_file(p).xxh64 : detail::hash_file(p);
    TRAINKIT_CHECK(actual == f.xxh64, "checkpoint file '", p.string(),
                   "' is corrupt: it hashes to ", hex64(actual), ", the manifest says ",
                   hex64(f.xxh64));
  }
}

TRAINKIT_INLINE CheckpointInfo::File describe_file(const std::filesystem::path& dir,
                                                   const std::string& name) {
  const std::filesystem::path p = dir / name;
  const io::detail::PreadFile file(p);
  const std::optional<std::uint64_t> sum =
      embedded_checksum(read_safetensors_prefix(file), p.string());
  TRAINKIT_CHECK(sum.has_value(), "checkpoint file '", p.string(), "' carries no checksum");
  return {name, file.size(), *sum};
}

TRAINKIT_INLINE bool only_checkpoint_files(const std::filesystem::path& dir) {
  std::error_code ec;
  for (std::filesystem::directory_iterator it(dir, ec), end; !ec && it != end; it.increment(ec)) {
    const std::string n = it->path().filename().string();
    const bool ours =
        n == kManifestName || n == io::kSafetensorsIndexName ||
        ((n.starts_with("model") || n.starts_with("train_state")) && n.ends_with(".safetensors")) ||
        io::is_atomic_temp_name(n);
    if (!ours || !it->is_regular_file(ec)) return false;
  }
  return !ec;
}

TRAINKIT_INLINE void replace_directory(const std::filesystem::path& from,
                                       const std::filesystem::path& to) {
  namespace fs = std::filesystem;
  std::error_code ec;
  if (!fs::exists(to, ec)) {
    fs::rename(from, to, ec);
    TRAINKIT_CHECK(!ec, "cannot rename '", from.string(), "' to '", to.string(),
                   "': ", ec.message());
    return;
  }
#if defined(__linux__) && defined(RENAME_EXCHANGE)
  if (::renameat2(AT_FDCWD, from.c_str(), AT_FDCWD, to.c_str(), RENAME_EXCHANGE) == 0) {
    fs::remove_all(from, ec);
    return;
  }
#endif
  // No atomic exchange: move the old one aside first (a crash in between leaves the step
  // without a checkpoint, and resume falls back to the previous one).
  const fs::path aside = to.parent_path() / ("." + to.filename().string() + ".deleting");
  fs::remove_all(aside, ec);
  fs::rename(to, aside, ec);
  TRAINKIT_CHECK(!ec, "cannot move '", to.string(), "' aside: ", ec.message());
  fs::rename(from, to, ec);
  if (ec) {  // put the old one back: a failed save leaves the previous checkpoint in place
    const std::string why = ec.message();
    fs::rename(aside, to, ec);
    TRAINKIT_FAIL("cannot rename '", from.string(), "' to '", to.string(), "': ", why);
  }
  fs::remove_all(aside, ec);
}

#endif  // TRAINKIT_IMPL

}  // namespace detail

/// Saves and restores TrainStates under a root directory. One Checkpointer per run and rank.
/// Thread-compatible: call it from the training thread only.
///
///   ckpt::Checkpointer ck("runs/mlp/ckpt", {.every_steps = 500, .keep_last = 3, .async = true});
///   ck.resume(state);                      // nothing to do on a fresh start
///   for (; state.step < total; ) { train_step(); ++state.step; ck.maybe_save(state); }
///   ck.wait();                             // the last write is durable after this
class Checkpointer {
 public:
  /// Creates `root` if needed and (rank 0, remove_stale) removes temp directories a crashed
  /// save left: open a Checkpointer that only reads a root another process is saving to (an
  /// evaluation job) with remove_stale = false. Throws
  /// trainkit::Error for inconsistent options (world_size > 1 without a barrier, rank out of range,
  /// every_seconds with world_size > 1) or when the root cannot be created.
  TRAINKIT_INLINE explicit Checkpointer(std::filesystem::path root,
                                        CheckpointerOptions options = {});

  Checkpointer(const Checkpointer&) = delete;
  Checkpointer& operator=(const Checkpointer&) = delete;

  /// Finishes the write in flight. Never throws: an error of that write is logged.
  TRAINKIT_INLINE ~Checkpointer();

  const std::filesystem::path& root() const noexcept { return root_; }
  const CheckpointerOptions& options() const noexcept { return options_; }
  /// The directory of the checkpoint of `step`.
  std::filesystem::path path_for(std::int64_t step) const {
    char digits[32];
    std::snprintf(digits, sizeof digits, "%09lld", static_cast<long long>(step));
    return root_ / (options_.prefix + digits);
  }

  /// True when maybe_save() would save at `step` (every_steps / every_seconds, and not saved
  /// for this step already).
  TRAINKIT_INLINE bool due(std::int64_t step) const;

  /// Saves when due(state.step); returns whether it saved.
  bool maybe_save(const TrainState& state, const Metrics& metrics = {}) {
    if (!due(state.step)) return false;
    save(state, metrics);
    return true;
  }

  /// Saves `state` as the checkpoint of state.step (replacing one of that step) and applies the
  /// keep-last / keep-best rules. Sync: returns once the checkpoint is durable. Async: returns
  /// after the snapshot (waiting first for the previous write; its error is thrown here).
  /// Throws trainkit::Error naming the file on any failure; the previous checkpoints are intact.
  /// Never replaces what holds the step's name but is not a checkpoint (a file, a FIFO, a broken
  /// link, a directory of other files): that throws before anything is written.
  TRAINKIT_INLINE std::filesystem::path save(const TrainState& state, const Metrics& metrics = {});

  /// Blocks until no write is in flight; rethrows (once) the error of a failed background
  /// write. A no-op for a synchronous Checkpointer.
  TRAINKIT_INLINE void wait();

  /// overlap_snapshot: blocks until the last save()'s deferred copies are made (the state may
  /// change after it). Optimizer steps, Ema updates and loads do this themselves. Returns at once
  /// otherwise.
  TRAINKIT_INLINE void wait_snapshot();

  /// Timings of the last save (write_seconds is final after wait() in async mode).
  SaveStats last_stats() const {
    std::lock_guard<std::mutex> lock(mutex_);
    return stats_;
  }

  /// Complete checkpoints (manifest present and passing its checksum, files with their recorded
  /// sizes), oldest first. Anything else is skipped silently here (latest() and resume() log
  /// it); never throws for it.
  TRAINKIT_INLINE std::vector<CheckpointInfo> list() const;

  /// The newest checkpoint that passes `verify` (kFull reads and hashes every file of it; the
  /// manifest's own checksum is always verified); every newer one skipped is logged with the
  /// reason. Moves nothing (see resume()). nullopt when there is none.
  TRAINKIT_INLINE std::optional<CheckpointInfo> latest(Verify verify = Verify::kFull) const;

  /// The complete checkpoint with the best value of options().best_metric (nullopt when none
  /// has it). Structure-checked only.
  TRAINKIT_INLINE std::optional<CheckpointInfo> best() const;

  /// Restores `state` from `info` (model, components, counters, metadata). Everything is read
  /// and verified before anything changes; a corrupt file throws trainkit::Error naming it.
  TRAINKIT_INLINE void load(const CheckpointInfo& info, TrainState& state,
                            const LoadOptions& options = {});

  /// One call to continue a run: waits for writes in flight, then restores `state` from the
  /// newest checkpoint that is complete and intact (manifest checksum, every listed file's size
  /// and, with Verify::kFull, content). Every damaged checkpoint met on the way (a missing,
  /// empty, unparsable or edited manifest, a missing, truncated or corrupt file) is logged with
  /// the reason and, by rank 0 (remove_stale), moved aside as `.<name>.corrupt[.N]`: kept for
  /// inspection, never listed, never overwritten by a later save, not counted for keep-last.
  /// Step directories holding files a checkpoint does not consist of are logged and left alone.
  /// Returns the checkpoint, or nullopt on a fresh start (state untouched). Throws
  /// trainkit::Error, changing nothing in `state`:
  /// - when no checkpoint is usable but damaged ones exist (met now, or quarantined by an
  ///   earlier resume), listing them, unless options.allow_fresh_start;
  /// - for a manifest of another format version (version 1 has no checksum);
  /// - for an error of this run's configuration (another world_size, a model registered but not
  ///   saved, another optimizer, a changed model): an older checkpoint would fail the same way.
  TRAINKIT_INLINE std::optional<CheckpointInfo> resume(TrainState& state,
                                                       const LoadOptions& options = {});

  /// The checkpoint resume() would restore, without restoring it (e.g. to read the settings in
  /// its metadata before the TrainState exists): the same verification of every file it lists
  /// (options.verify), the same logging, quarantine and errors. A resume() after it verifies
  /// again; compare the steps.
  TRAINKIT_INLINE std::optional<CheckpointInfo> newest_usable(const LoadOptions& options = {});

  /// The checkpoints moved aside as damaged (`.<prefix><step>.corrupt[.N]`), by name.
  TRAINKIT_INLINE std::vector<std::filesystem::path> quarantined() const;

 private:
  struct Job {
    std::int64_t step = 0;
    std::int64_t epoch = 0;
    Metrics metrics;
    std::map<std::string, std::string> metadata;
    bool has_model = false;
    std::vector<io::NamedTensor> model;  // views: into the arena (sync) or model_buffer_
    StateDict state;
    std::vector<trainkit::detail::CopyPiece> copies;  // overlap_snapshot: made by the writer
  };

  struct Opened {
    std::optional<TensorSource> model;
    StateDict state;
    std::filesystem::path state_file;  ///< where `state` was read (for errors)
  };

  static double seconds_since(std::chrono::steady_clock::time_point t0) {
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  }

  TRAINKIT_INLINE void log(const std::string& message) const;

  /// A directory named like a checkpoint (`<prefix><digits>`).
  struct Candidate {
    std::filesystem::path path;
    std::int64_t step = 0;
  };

  /// The step directories under the root, newest first.
  TRAINKIT_INLINE std::vector<Candidate> candidates() const;

  /// The checkpoint in `c`, checked at `level` (its manifest always in full). Throws.
  TRAINKIT_INLINE static CheckpointInfo inspect(const Candidate& c, Verify level);

  /// True for a step directory without a manifest that holds files a checkpoint does not
  /// consist of: someone else's, never moved or deleted.
  static bool foreign(const Candidate& c) {
    std::error_code ec;
    return !std::filesystem::exists(c.path / detail::kManifestName, ec) &&
           !detail::only_checkpoint_files(c.path);
  }

  /// The search of resume() and newest_usable(): newest first, `check` (errors of this run,
  /// thrown) then `verify` (damage, skipped) on each checkpoint; see resume().
  TRAINKIT_INLINE std::optional<CheckpointInfo> select(
      const LoadOptions& options, const std::function<void(const CheckpointInfo&)>& check,
      const std::function<void(const CheckpointInfo&)>& verify);

  void barrier() const {
    if (options_.world_size > 1) options_.barrier();
  }

  bool has_metric(const CheckpointInfo& info) const {
    if (options_.best_metric.empty()) return false;
    const auto it = info.metrics.find(options_.best_metric);
    return it != info.metrics.end() && !std::isnan(it->second);
  }
  TRAINKIT_INLINE bool better(const CheckpointInfo& a, const CheckpointInfo& b) const;

  TRAINKIT_INLINE Job snapshot(const TrainState& state, const Metrics& metrics, bool copy);
  /// snapshot(copy = true) with the host copies recorded in Job::copies, not made.
  TRAINKIT_INLINE Job snapshot_overlapped(const TrainState& state, const Metrics& metrics);

  /// Writes this rank's files of `job` into the temp directory and (rank 0) commits it. Every
  /// rank passes the three barriers even after a local failure, so none is left waiting; rank 0
  /// commits only when every file it expects is present.
  TRAINKIT_INLINE SaveStats write(const Job& job);

  /// Rank 0: index (world_size > 1), manifest, rename into place, directory fsync, rotation.
  TRAINKIT_INLINE void commit(const Job& job, const std::filesystem::path& tmp,
                              const std::filesystem::path& final_dir);

  /// Rank 0, before the checkpoint of `step` appears: checkpoints of later steps are not this
  /// run's past (it went back to an older checkpoint, or started over in a used root), and left
  /// in place resume() would take them for its newest and keep-last would count them. Each is
  /// renamed to `.<name>.superseded[.N]`: kept, never deleted, invisible to the search. Step
  /// directories of someone else's files are left alone. Throws when one cannot be moved.
  TRAINKIT_INLINE void set_aside_later(std::int64_t step);

  /// Deletes complete checkpoints that neither the keep-last nor the keep-best rule keeps. Each
  /// is renamed to `.<name>.deleting` first (removed at the next construction if a crash cuts
  /// the deletion short), so a step directory never loses its manifest to a rotation: one
  /// without a manifest is damaged, not half-deleted.
  TRAINKIT_INLINE void rotate(std::int64_t newest);

  /// A damaged checkpoint met by resume() and why it is damaged.
  struct Damaged {
    std::filesystem::path path;
    std::string reason;
  };

  /// Rank 0 (remove_stale): renames damaged checkpoints to `.<name>.corrupt[.N]`, logging each.
  /// Returns one line per checkpoint: where it went (or that it was left in place) and why.
  TRAINKIT_INLINE std::vector<std::string> quarantine(const std::vector<Damaged>& dirs) const;

  /// Removes temp directories of interrupted saves and rotations (`.<prefix>*.tmp`,
  /// `.<prefix>*.deleting`). Step directories are never deleted here: a damaged one is
  /// quarantined (and logged) by resume().
  TRAINKIT_INLINE void remove_stale();

  /// Errors of this run's configuration against a checkpoint (thrown, never skipped).
  TRAINKIT_INLINE void check_compatible(const CheckpointInfo& info, const TrainState& state) const;
  /// The part of check_compatible that needs no TrainState: the checkpoint's world size.
  TRAINKIT_INLINE void check_world_size(const CheckpointInfo& info) const;

  /// Phase 1 of a load: verifies and reads everything; changes nothing. Throws for a damaged
  /// checkpoint.
  TRAINKIT_INLINE Opened read_verified(const CheckpointInfo& info, const TrainState& state,
                                       const LoadOptions& options) const;

  /// Phase 2: model, then components and counters.
  TRAINKIT_INLINE void apply(Opened& opened, TrainState& state, const LoadOptions& options);

  TRAINKIT_INLINE void writer_loop();

  std::filesystem::path root_;
  CheckpointerOptions options_;
  std::optional<std::int64_t> last_saved_step_;
  std::chrono::steady_clock::time_point last_save_time_;
  AnyTensor model_buffer_;  // async snapshots of the model (reused: no page faults per save)
  StateDict staging_;       // async snapshots of the other state (reused the same way)
  SaveStats stats_;

  mutable std::mutex mutex_;
  std::condition_variable job_cv_, idle_cv_;
  std::optional<Job> job_;
  bool copying_ = false;  // the job's deferred copies are not made yet
  bool stop_ = false;
  std::exception_ptr error_;
  std::thread writer_;
};

#if TRAINKIT_IMPL

TRAINKIT_INLINE Checkpointer::Checkpointer(std::filesystem::path root, CheckpointerOptions options)
    : root_(std::move(root)), options_(std::move(options)) {
  TRAINKIT_CHECK(
      options_.world_size >= 1 && options_.rank >= 0 && options_.rank < options_.world_size,
      "ckpt::Checkpointer: rank ", options_.rank,
      " is not in [0, world_size = ", options_.world_size, ")");
  TRAINKIT_CHECK(options_.world_size == 1 || options_.barrier,
                 "ckpt::Checkpointer: world_size = ", options_.world_size,
                 " needs a barrier (CheckpointerOptions::barrier, e.g. "
                 "ckpt::comm_barrier(comm))");
  TRAINKIT_CHECK(options_.world_size == 1 || options_.every_seconds <= 0.0,
                 "ckpt::Checkpointer: every_seconds with world_size > 1 would let ranks disagree "
                 "on when to save; use every_steps");
  TRAINKIT_CHECK(!options_.overlap_snapshot || options_.async,
                 "ckpt::Checkpointer: overlap_snapshot needs async = true (the copies are made "
                 "by the writer thread)");
  // A NUL cuts a path short in every system call: a root "<dir>\0x" would be <dir>, whose
  // temp directory removal would delete <dir> itself.
  TRAINKIT_CHECK(root_.native().find('\0') == std::string::npos, "ckpt::Checkpointer: the root '",
                 io::detail::printable(root_.native()),
                 "' contains a NUL character (the system would cut the path there)");
  TRAINKIT_CHECK(!options_.prefix.empty() && options_.prefix.find('/') == std::string::npos &&
                     options_.prefix.find('\0') == std::string::npos,
                 "ckpt::Checkpointer: bad directory prefix '",
                 io::detail::printable(options_.prefix),
                 "' (it must be non-empty, without '/' or NUL)");
  std::error_code ec;
  std::filesystem::create_directories(root_, ec);
  TRAINKIT_CHECK(!ec, "ckpt::Checkpointer: cannot create '", root_.string(), "': ", ec.message());
  if (options_.rank == 0 && options_.remove_stale) remove_stale();
  last_save_time_ = std::chrono::steady_clock::now();
  if (options_.async) writer_ = std::thread([this] { writer_loop(); });
}

TRAINKIT_INLINE Checkpointer::~Checkpointer() {
  if (writer_.joinable()) {
    {
      std::unique_lock<std::mutex> lock(mutex_);
      idle_cv_.wait(lock, [&] { return !job_; });
      stop_ = true;
    }
    job_cv_.notify_all();
    writer_.join();
  }
  if (error_) {
    try {
      try {
        std::rethrow_exception(error_);
      } catch (const std::exception& e) {
        log(std::string("a background checkpoint write failed: ") + e.what());
      }
    } catch (...) {  // a throwing log callback, or a non-std exception
    }
  }
}

TRAINKIT_INLINE bool Checkpointer::due(std::int64_t step) const {
  if (last_saved_step_ && *last_saved_step_ == step) return false;
  if (options_.every_steps > 0 && step % options_.every_steps == 0) return true;
  if (options_.every_seconds > 0.0) {
    const double elapsed =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - last_save_time_).count();
    if (elapsed >= options_.every_seconds) return true;
  }
  return false;
}

TRAINKIT_INLINE std::filesystem::path Checkpointer::save(const TrainState& state,
                                                         const Metrics& metrics) {
  TRAINKIT_CHECK(state.step >= 0, "ckpt::Checkpointer::save: negative step ", state.step);
  // Step directories are listed by up to 18 digits: a larger step could be saved but never found.
  TRAINKIT_CHECK(state.step <= detail::kMaxCheckpointStep, "ckpt::Checkpointer::save: step ",
                 state.step, " is above the largest a checkpoint can record (",
                 detail::kMaxCheckpointStep, ")");
  // The manifest is JSON: every name and text it records must be UTF-8.
  const auto utf8 = [&](std::string_view what, std::string_view text) {
    TRAINKIT_CHECK(io::is_valid_utf8(text), "ckpt::Checkpointer::save: step ", state.step, ": ",
                   what, " '", io::detail::printable(text), "' is not UTF-8");
  };
  for (const auto& [key, value] : metrics) utf8("metric name", key);
  for (const auto& [key, value] : state.metadata) {
    utf8("metadata key", key);
    utf8("the value of metadata key '" + key + "',", value);
  }
  // After the write in flight: its rotation may be renaming or removing the step's directory.
  if (options_.async) wait();
  {  // a step directory of someone else's files is never replaced (that would delete them)
    const Candidate existing{path_for(state.step), state.step};
    std::error_code ec;
    // Nor is anything else under the step's name: a file, a FIFO, a dangling link (the commit
    // would exchange it for the checkpoint and delete it).
    const std::filesystem::file_status link = std::filesystem::symlink_status(existing.path, ec);
    TRAINKIT_CHECK(!std::filesystem::exists(link) ||
                       std::filesystem::is_directory(std::filesystem::status(existing.path, ec)),
                   "ckpt::Checkpointer::save: '", existing.path.string(),
                   "' exists and is not a directory; step ", state.step,
                   " is not saved over it: move it out of the way");
    TRAINKIT_CHECK(!std::filesystem::is_directory(existing.path, ec) || !foreign(existing),
                   "ckpt::Checkpointer::save: '", existing.path.string(),
                   "' exists, has no checkpoint manifest and holds files a checkpoint does not "
                   "consist of; step ",
                   state.step, " is not saved over them: move them out of the way");
  }
  const auto t0 = std::chrono::steady_clock::now();
  Job job = options_.overlap_snapshot ? snapshot_overlapped(state, metrics)
                                      : snapshot(state, metrics, options_.async);
  const double snap = seconds_since(t0);
  const std::filesystem::path dir = path_for(state.step);
  if (!options_.async) {
    stats_ = write(job);  // a save that throws is not recorded: maybe_save tries the step again
    stats_.snapshot_seconds = snap;
    last_saved_step_ = state.step;
    last_save_time_ = std::chrono::steady_clock::now();
    return dir;
  }
  last_saved_step_ = state.step;
  last_save_time_ = std::chrono::steady_clock::now();
  {
    std::lock_guard<std::mutex> lock(mutex_);
    copying_ = !job.copies.empty();
    // Counted before the writer can see the job; the writer uncounts it after the copies.
    if (copying_) trainkit::detail::pending_snapshot_copies().fetch_add(1);
    job_.emplace(std::move(job));
    stats_ = SaveStats{};
    stats_.snapshot_seconds = snap;
  }
  job_cv_.notify_all();
  return dir;
}

TRAINKIT_INLINE void Checkpointer::wait_snapshot() {
  if (!writer_.joinable()) return;
  std::unique_lock<std::mutex> lock(mutex_);
  idle_cv_.wait(lock, [&] { return !copying_; });
}

TRAINKIT_INLINE void Checkpointer::wait() {
  if (!writer_.joinable()) return;
  std::unique_lock<std::mutex> lock(mutex_);
  idle_cv_.wait(lock, [&] { return !job_; });
  if (error_) std::rethrow_exception(std::exchange(error_, nullptr));
}

TRAINKIT_INLINE std::vector<CheckpointInfo> Checkpointer::list() const {
  std::vector<CheckpointInfo> out;
  for (const Candidate& c : candidates()) {
    try {
      out.push_back(inspect(c, Verify::kStructure));
    } catch (const std::exception&) {
    }
  }
  std::reverse(out.begin(), out.end());
  return out;
}

TRAINKIT_INLINE std::optional<CheckpointInfo> Checkpointer::latest(Verify verify) const {
  for (const Candidate& c : candidates()) {
    try {
      return inspect(c, verify);
    } catch (const std::exception& e) {
      if (foreign(c)) {
        log("ignoring '" + c.path.string() + "': not a checkpoint (" + detail::reason_of(e) + ")");
      } else {
        log("skipping checkpoint '" + c.path.string() + "': " + detail::reason_of(e));
      }
    }
  }
  return std::nullopt;
}

TRAINKIT_INLINE std::optional<CheckpointInfo> Checkpointer::best() const {
  std::optional<CheckpointInfo> out;
  for (CheckpointInfo& info : list()) {
    if (!has_metric(info)) continue;
    if (!out || better(info, *out)) out = std::move(info);
  }
  return out;
}

TRAINKIT_INLINE void Checkpointer::load(const CheckpointInfo& info, TrainState& state,
                                        const LoadOptions& options) {
  // Re-read the manifest: `info` may be stale (rotated, or replaced since it was listed).
  const CheckpointInfo fresh = detail::read_manifest(info.path);
  check_compatible(fresh, state);
  Opened opened = read_verified(fresh, state, options);
  apply(opened, state, options);
}

TRAINKIT_INLINE std::optional<CheckpointInfo> Checkpointer::resume(TrainState& state,
                                                                   const LoadOptions& options) {
  wait();
  std::optional<Opened> opened;
  std::optional<CheckpointInfo> info = select(
      options, [&](const CheckpointInfo& i) { check_compatible(i, state); },
      [&](const CheckpointInfo& i) { opened.emplace(read_verified(i, state, options)); });
  if (!info) return std::nullopt;
  apply(*opened, state, options);
  last_saved_step_ = info->step;
  return info;
}

TRAINKIT_INLINE std::optional<CheckpointInfo> Checkpointer::newest_usable(
    const LoadOptions& options) {
  wait();
  return select(
      options, [&](const CheckpointInfo& i) { check_world_size(i); },
      [&](const CheckpointInfo& i) { detail::verify_checkpoint(i, options.verify); });
}

TRAINKIT_INLINE std::vector<std::filesystem::path> Checkpointer::quarantined() const {
  std::vector<std::filesystem::path> out;
  std::error_code ec;
  for (std::filesystem::directory_iterator it(root_, ec), end; !ec && it != end; it.increment(ec)) {
    const std::string name = it->path().filename().string();
    if (name.starts_with("." + options_.prefix) && name.find(".corrupt") != std::string::npos)
      out.push_back(it->path());
  }
  std::sort(out.begin(), out.end());
  return out;
}

TRAINKIT_INLINE void Checkpointer::log(const std::string& message) const {
  if (options_.log) {
    options_.log(message);
  } else {
    std::cerr << "trainkit ckpt (rank " << options_.rank << "): " << message << "\n";
  }
}

TRAINKIT_INLINE std::vector<Checkpointer::Candidate> Checkpointer::candidates() const {
  std::vector<Candidate> out;
  std::error_code ec;
  std::filesystem::directory_iterator it(root_, ec), end;
  if (ec == std::errc::no_such_file_or_directory) return out;
  for (; !ec && it != end; it.increment(ec)) {
    const auto step = detail::parse_step_dir(it->path().filename().string(), options_.prefix);
    std::error_code dec;
    if (step && it->is_directory(dec)) out.push_back({it->path(), *step});
  }
  // A root that cannot be read now is not an empty one (a resume would start afresh).
  if (ec)
    TRAINKIT_FAIL_OS(ec.value(), "ckpt: cannot list the checkpoints in '", root_.string(),
                     "': ", ec.message());
  std::sort(out.begin(), out.end(), [](const Candidate& a, const Candidate& b) {
    return a.step != b.step ? a.step > b.step : a.path > b.path;
  });
  return out;
}

TRAINKIT_INLINE CheckpointInfo Checkpointer::inspect(const Candidate& c, Verify level) {
  CheckpointInfo info = detail::read_manifest(c.path);
  TRAINKIT_CHECK(info.step == c.step, "checkpoint '", c.path.string(),
                 "' is damaged: its manifest says step ", info.step);
  detail::verify_checkpoint(info, level);
  return info;
}

TRAINKIT_INLINE std::optional<CheckpointInfo> Checkpointer::select(
    const LoadOptions& options, const std::function<void(const CheckpointInfo&)>& check,
    const std::function<void(const CheckpointInfo&)>& verify) {
  std::vector<Damaged> damaged;
  // The system refused to read a checkpoint: thrown at once, nothing moved or passed over.
  const auto refused_by_system = [&](const Candidate& c, const std::exception& e) {
    if (!detail::system_refused(e)) return;
    const auto* error = dynamic_cast<const Error*>(&e);
    TRAINKIT_FAIL_OS(error != nullptr ? error->code() : ENOMEM, "ckpt: cannot check checkpoint '",
                     c.path.string(), "' now (", detail::reason_of(e),
                     "); nothing was restored, moved or passed over: resume again once the "
                     "system allows it");
  };
  const auto skip = [&](const Candidate& c, const std::string& why) {
    log("resume: skipping checkpoint '" + c.path.string() + "': " + why);
    damaged.push_back({c.path, why});
  };
  for (const Candidate& c : candidates()) {
    CheckpointInfo info;
    try {
      info = detail::read_manifest(c.path);
      TRAINKIT_CHECK(info.step == c.step, "checkpoint '", c.path.string(),
                     "' is damaged: its manifest says step ", info.step);
    } catch (const std::exception& e) {
      refused_by_system(c, e);
      if (foreign(c)) {
        log("resume: ignoring '" + c.path.string() + "': not a checkpoint (" +
            detail::reason_of(e) + ")");
        continue;
      }
      if (detail::other_manifest_version(c.path))
        TRAINKIT_FAIL("ckpt: cannot resume from '", c.path.string(), "': ", detail::reason_of(e));
      skip(c, detail::reason_of(e));
      continue;
    }
    check(info);  // a mismatch of this run is not skipped: it is thrown
    try {
      verify(info);
    } catch (const std::exception& e) {
      refused_by_system(c, e);
      skip(c, detail::reason_of(e));
      continue;
    }
    quarantine(damaged);
    return info;
  }
  std::vector<std::string> now = quarantine(damaged);
  std::string earlier;
  for (const std::filesystem::path& q : quarantined()) {
    bool listed = false;
    for (const std::string& n : now) listed = listed || n.find("'" + q.string() + "'") != n.npos;
    if (!listed) earlier += (earlier.empty() ? "'" : ", '") + q.string() + "'";
  }
  if (now.empty() && earlier.empty()) return std::nullopt;
  std::string what = "no usable checkpoint remains in '" + root_.string() + "'";
  if (!now.empty()) {
    what += "; damaged now: ";
    for (std::size_t i = 0; i < now.size(); ++i) what += (i ? ", " : "") + now[i];
  }
  if (!earlier.empty()) what += "; quarantined by an earlier resume: " + earlier;
  if (options.allow_fresh_start) {
    log("resume: " + what + "; starting fresh (allow_fresh_start)");
    return std::nullopt;
  }
  TRAINKIT_FAIL("ckpt: ", what,
                ". Nothing was restored. Inspect the quarantined directories, move them out of "
                "the root (or delete them) to start from scratch, or allow a fresh start (",
                options.fresh_start_setting, ")");
}

TRAINKIT_INLINE bool Checkpointer::better(const CheckpointInfo& a, const CheckpointInfo& b) const {
  const double x = a.metrics.at(options_.best_metric);
  const double y = b.metrics.at(options_.best_metric);
  if (x != y) return options_.best_mode == MetricMode::kMin ? x < y : x > y;
  return a.step > b.step;  // ties: the newer one
}

TRAINKIT_INLINE Checkpointer::Job Checkpointer::snapshot(const TrainState& state,
                                                         const Metrics& metrics, bool copy) {
  Job job;
  job.step = state.step;
  job.epoch = state.epoch;
  job.metrics = metrics;
  job.metadata = state.metadata;
  if (const detail::ModelEntry* model = state.model_entry()) {
    job.has_model = true;
    std::vector<bool> keep;
    if (options_.world_size > 1 && options_.sharding == ModelSharding::kReplicated) {
      const std::vector<int> owner = detail::partition_params(model->infos(), options_.world_size);
      keep.resize(owner.size());
      for (std::size_t i = 0; i < owner.size(); ++i) keep[i] = owner[i] == options_.rank;
    }
    job.model = model->views(copy, keep, model_buffer_);
  }
  if (copy) {  // async: into the staging copy the previous write handed back
    state.state_dict_into(staging_);
    job.state = std::move(staging_);
  } else {
    job.state = state.state_dict();
  }
  return job;
}

TRAINKIT_INLINE Checkpointer::Job Checkpointer::snapshot_overlapped(const TrainState& state,
                                                                    const Metrics& metrics) {
  // The host copies of snapshot() are only recorded here (the staging memory is the same);
  // writer_loop makes them before it writes.
  std::vector<trainkit::detail::CopyPiece> copies;
  Job job;
  {
    trainkit::detail::DeferCopies defer(copies);
    job = snapshot(state, metrics, true);
  }
  job.copies = std::move(copies);
  return job;
}

TRAINKIT_INLINE SaveStats Checkpointer::write(const Job& job) {
  namespace fs = std::filesystem;
  const auto t0 = std::chrono::steady_clock::now();
  const fs::path final_dir = path_for(job.step);
  const fs::path tmp = root_ / ("." + final_dir.filename().string() + ".tmp");
  const int rank = options_.rank;
  const int world_size = options_.world_size;
  std::exception_ptr error;
  std::uint64_t bytes = 0;
  const auto attempt = [&](auto&& f) {
    if (error) return;
    try {
      f();
    } catch (...) {
      error = std::current_exception();
    }
  };

  attempt([&] {
    if (rank != 0) return;
    std::error_code ec;
    fs::remove_all(tmp, ec);
    fs::create_directory(tmp, ec);
    TRAINKIT_CHECK(!ec, "ckpt: cannot create the temp directory '", tmp.string(),
                   "': ", ec.message());
  });
  barrier();
  attempt([&] {
    const io::SafetensorsWriteOptions wo{.alignment = options_.alignment,
                                         .durable = options_.durable};
    if (job.has_model) {
      io::SafetensorsMetadata meta{{"format", "pt"}};
      bytes += save_checksummed_safetensors(tmp / detail::model_file_name(rank, world_size),
                                            job.model, std::move(meta), wo)
                   .bytes;
    }
    std::vector<io::NamedTensor> tensors;
    tensors.reserve(job.state.tensors.size());
    for (const auto& [name, t] : job.state.tensors) tensors.push_back({name, t.view()});
    io::SafetensorsMetadata meta;
    for (const auto& [k, v] : job.state.values) meta.emplace(k, v);
    bytes += save_checksummed_safetensors(tmp / detail::state_file_name(rank, world_size), tensors,
                                          std::move(meta), wo)
                 .bytes;
  });
  barrier();
  if (rank == 0) {
    attempt([&] { commit(job, tmp, final_dir); });
    if (error) {
      std::error_code ec;
      fs::remove_all(tmp, ec);
    }
  }
  barrier();
  if (rank != 0) {
    attempt([&] {
      std::error_code ec;
      TRAINKIT_CHECK(fs::exists(final_dir / detail::kManifestName, ec),
                     "ckpt: the checkpoint "
                     "of step ",
                     job.step,
                     " was not committed by rank 0 (its error is "
                     "reported there)");
    });
  }
  if (error) std::rethrow_exception(error);
  SaveStats s;
  s.write_seconds = seconds_since(t0);
  s.bytes = bytes;
  return s;
}

TRAINKIT_INLINE void Checkpointer::commit(const Job& job, const std::filesystem::path& tmp,
                                          const std::filesystem::path& final_dir) {
  namespace fs = std::filesystem;
  const int world_size = options_.world_size;
  CheckpointInfo info;
  info.path = final_dir;
  info.step = job.step;
  info.epoch = job.epoch;
  info.world_size = world_size;
  info.created_unix = static_cast<std::int64_t>(std::time(nullptr));
  info.metrics = job.metrics;
  info.metadata = job.metadata;
  for (int r = 0; r < world_size; ++r) {
    if (job.has_model)
      info.files.push_back(detail::describe_file(tmp, detail::model_file_name(r, world_size)));
    info.files.push_back(detail::describe_file(tmp, detail::state_file_name(r, world_size)));
  }
  if (job.has_model && world_size == 1) info.model_file = "model.safetensors";
  if (job.has_model && world_size > 1) {
    io::SafetensorsIndex index;
    std::uint64_t total = 0;
    for (int r = 0; r < world_size; ++r) {
      const std::string file = detail::model_file_name(r, world_size);
      // Only the header is needed: read it, not mapped (another rank's file on a shared disk).
      const io::detail::PreadFile shard(tmp / file);
      const std::vector<std::byte> prefix = detail::read_safetensors_prefix(shard);
      const io::SafetensorsHeader header = io::parse_safetensors_header(
          std::string_view(reinterpret_cast<const char*>(prefix.data()) + 8, prefix.size() - 8),
          shard.size(), shard.path());
      for (const io::SafetensorsTensorInfo& t : header.tensors) {
        const bool fresh = index.weight_map.emplace(t.name, file).second;
        TRAINKIT_CHECK(fresh, "ckpt: parameter '", t.name, "' is written by two ranks ('",
                       index.weight_map.at(t.name), "' and '", file,
                       "'); with ModelSharding::kLocal names must be unique across ranks");
        total += t.bytes();
      }
    }
    index.metadata.set("total_size", total);
    const std::string text = index.to_json();
    io::write_file_atomic(tmp / io::kSafetensorsIndexName, std::string_view(text),
                          io::AtomicFileOptions{.durable = options_.durable});
    info.files.push_back({std::string(io::kSafetensorsIndexName), text.size(),
                          Xxh64::hash(text.data(), text.size())});
    info.model_file = std::string(io::kSafetensorsIndexName);
  }
  // The manifest is written last: a directory without it is not a checkpoint.
  io::write_file_atomic(tmp / detail::kManifestName, std::string_view(detail::manifest_text(info)),
                        io::AtomicFileOptions{.durable = options_.durable});
  set_aside_later(job.step);
  detail::replace_directory(tmp, final_dir);
  if (options_.durable) io::fsync_directory(root_);  // both renames
  rotate(job.step);
}

TRAINKIT_INLINE void Checkpointer::set_aside_later(std::int64_t step) {
  namespace fs = std::filesystem;
  using ::trainkit::detail::concat;
  for (const Candidate& c : candidates()) {  // newest first
    if (c.step <= step) break;
    if (foreign(c)) continue;
    std::error_code ec;
    const std::string hidden = concat('.', c.path.filename().string(), ".superseded");
    fs::path target = root_ / hidden;
    for (int n = 1; fs::exists(target, ec) && n < 1000; ++n)
      target = root_ / concat(hidden, '.', n);
    fs::rename(c.path, target, ec);
    TRAINKIT_CHECK(!ec, "ckpt: cannot set aside the checkpoint '", c.path.string(),
                   "', newer than step ", step,
                   " being saved (a resume would take it for this run's newest): ", ec.message());
    log(concat("the checkpoint '", c.path.string(), "' is newer than step ", step,
               " being saved, so not this run's past: set aside as '", target.string(), "'"));
  }
}

TRAINKIT_INLINE void Checkpointer::rotate(std::int64_t newest) {
  std::vector<CheckpointInfo> all = list();
  if (options_.keep_last <= 0) return;
  std::vector<bool> keep(all.size(), false);
  for (std::size_t i = 0; i < all.size(); ++i) {
    if (all[i].step == newest) keep[i] = true;
    if (i + std::size_t(options_.keep_last) >= all.size()) keep[i] = true;
  }
  if (!options_.best_metric.empty() && options_.keep_best > 0) {
    std::vector<std::size_t> order;
    for (std::size_t i = 0; i < all.size(); ++i)
      if (has_metric(all[i])) order.push_back(i);
    std::sort(order.begin(), order.end(),
              [&](std::size_t a, std::size_t b) { return better(all[a], all[b]); });
    for (std::size_t k = 0; k < order.size() && k < std::size_t(options_.keep_best); ++k)
      keep[order[k]] = true;
  }
  for (std::size_t i = 0; i < all.size(); ++i) {
    if (keep[i]) continue;
    const std::filesystem::path aside =
        root_ / ("." + all[i].path.filename().string() + ".deleting");
    std::error_code ec;
    std::filesystem::remove_all(aside, ec);
    std::filesystem::rename(all[i].path, aside, ec);
    if (!ec) std::filesystem::remove_all(aside, ec);
    if (ec) log("cannot delete old checkpoint '" + all[i].path.string() + "': " + ec.message());
  }
}

TRAINKIT_INLINE std::vector<std::string> Checkpointer::quarantine(
    const std::vector<Damaged>& dirs) const {
  std::vector<std::string> out;
  const bool move = options_.rank == 0 && options_.remove_stale;
  for (const Damaged& d : dirs) {
    if (!move) {
      out.push_back("'" + d.path.string() + "' (left in place: " + d.reason + ")");
      continue;
    }
    std::error_code ec;
    const std::string hidden =
        trainkit::detail::concat('.', d.path.filename().string(), ".corrupt");
    std::filesystem::path target = root_ / hidden;
    for (int n = 1; std::filesystem::exists(target, ec) && n < 1000; ++n)
      target = root_ / trainkit::detail::concat(hidden, '.', n);
    std::filesystem::rename(d.path, target, ec);
    if (ec) {
      log("cannot move the damaged checkpoint '" + d.path.string() + "' aside: " + ec.message());
      out.push_back("'" + d.path.string() + "' (left in place: cannot move it aside: " +
                    ec.message() + "; " + d.reason + ")");
    } else {
      log("moved the damaged checkpoint '" + d.path.string() + "' to '" + target.string() + "'");
      out.push_back("'" + d.path.string() + "' -> '" + target.string() + "' (" + d.reason + ")");
    }
  }
  return out;
}

TRAINKIT_INLINE void Checkpointer::remove_stale() {
  std::error_code ec;
  std::vector<std::filesystem::path> stale;
  for (std::filesystem::directory_iterator it(root_, ec), end; !ec && it != end; it.increment(ec)) {
    const std::string name = it->path().filename().string();
    if (!name.starts_with("." + options_.prefix)) continue;
    if (name.ends_with(".tmp") || name.ends_with(".deleting")) stale.push_back(it->path());
  }
  for (const auto& p : stale) std::filesystem::remove_all(p, ec);
}

TRAINKIT_INLINE void Checkpointer::check_world_size(const CheckpointInfo& info) const {
  TRAINKIT_CHECK(info.world_size == options_.world_size, "checkpoint '", info.path.string(),
                 "' was written by ", info.world_size, " rank(s); this run has ",
                 options_.world_size, " (the per-rank training state cannot be redistributed)");
}

TRAINKIT_INLINE void Checkpointer::check_compatible(const CheckpointInfo& info,
                                                    const TrainState& state) const {
  check_world_size(info);
  TRAINKIT_CHECK(state.model_entry() == nullptr || !info.model_file.empty(), "checkpoint '",
                 info.path.string(), "' holds no model, but a model is registered");
}

TRAINKIT_INLINE Checkpointer::Opened Checkpointer::read_verified(const CheckpointInfo& info,
                                                                 const TrainState& state,
                                                                 const LoadOptions& options) const {
  const int world_size = options_.world_size;
  const std::string state_file = detail::state_file_name(options_.rank, world_size);
  std::vector<std::string> mine;
  if (world_size == 1 || options.verify != Verify::kFull) {
    mine.push_back(state_file);
    if (!info.model_file.empty()) {
      mine.push_back(info.model_file);
      if (world_size > 1)
        for (int r = 0; r < world_size; ++r) mine.push_back(detail::model_file_name(r, world_size));
    }
  }  // else: verify every file, so that every rank reaches the same verdict
  detail::verify_checkpoint(info, options.verify, mine);
  Opened out;
  out.state_file = info.path / state_file;
  if (state.model_entry() != nullptr) {
    out.model.emplace(TensorSource::open(info.path / info.model_file, /*verify=*/false));
  }
  // Read with pread straight into the tensors, not mapped: a file truncated in place after its
  // verification then gives an error naming it, where touching a mapping past its new end would
  // kill the run.
  io::SafetensorsMetadata metadata;
  for (auto& [name, tensor] : io::load_safetensors(out.state_file, {}, &metadata))
    out.state.tensors.emplace(name, std::move(tensor));
  for (const auto& [k, v] : metadata)
    if (k != kChecksumKey) out.state.values.emplace(k, v);
  return out;
}

TRAINKIT_INLINE void Checkpointer::apply(Opened& opened, TrainState& state,
                                         const LoadOptions& options) {
  // The TrainState's errors (another set of components, a component refusing its state) name
  // no file: say which checkpoint they are about.
  const auto naming_the_file = [&](auto&& f) {
    try {
      f();
    } catch (const Error& e) {
      const std::string file = opened.state_file.string();
      const std::string why = detail::reason_of(e);
      if (why.find(file) != std::string::npos) throw;
      TRAINKIT_FAIL("cannot restore the training state from '", file, "': ", why);
    }
  };
  // Before the model changes.
  naming_the_file([&] { state.check_state_dict(opened.state, options.restore); });
  if (opened.model) {
    ModelLoadOptions mo = options.model;
    mo.verify_checksum = false;
    if (options_.world_size > 1 && options_.sharding == ModelSharding::kLocal)
      mo.allow_unexpected = true;
    state.model_entry()->load(*opened.model, mo);
  }
  naming_the_file([&] { state.load_state_dict(std::move(opened.state), options.restore); });
}

TRAINKIT_INLINE void Checkpointer::writer_loop() {
  for (;;) {
    std::unique_lock<std::mutex> lock(mutex_);
    job_cv_.wait(lock, [&] { return stop_ || job_; });
    if (!job_) return;  // stop_ and nothing left
    lock.unlock();
    std::exception_ptr error;
    SaveStats s;
    double copy_seconds = 0;
    if (!job_->copies.empty()) {
      const auto t0 = std::chrono::steady_clock::now();
      try {
        trainkit::detail::parallel_copy_now(job_->copies);
      } catch (...) {  // no memory to split the pieces: one by one on this thread
        for (const trainkit::detail::CopyPiece& p : job_->copies)
          trainkit::detail::copy_streaming(p.dst, p.src, p.bytes);
      }
      copy_seconds = seconds_since(t0);
      std::atomic<int>& pending = trainkit::detail::pending_snapshot_copies();
      pending.fetch_sub(1, std::memory_order_release);
      pending.notify_all();
      lock.lock();
      copying_ = false;
      lock.unlock();
      idle_cv_.notify_all();
    }
    try {
      s = write(*job_);
    } catch (...) {
      error = std::current_exception();
    }
    lock.lock();
    staging_ = std::move(job_->state);  // the next snapshot's memory
    stats_.write_seconds = s.write_seconds;
    stats_.copy_seconds = copy_seconds;
    stats_.bytes = s.bytes;
    // Moved under the lock: the writer keeps no reference to the exception the caller's
    // wait() rethrows, so its last release never races with the caller reading it.
    if (error) error_ = std::move(error);
    job_.reset();
    lock.unlock();
    idle_cv_.notify_all();
  }
}

#endif  // TRAINKIT_IMPL

}  // namespace ckpt
TRAINKIT_NAMESPACE_END
