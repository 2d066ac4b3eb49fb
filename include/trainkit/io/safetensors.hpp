// SPDX-License-Identifier: MIT
// trainkit/io/safetensors.hpp: safetensors files, the format `safetensors.torch.load_file` reads.
// The writer emits the reference layout byte for byte (dtype-then-name order, compact header
// padded to 8 bytes, `__metadata__` string->string) through a crash-safe AtomicFile; the reader
// maps the file and hands out zero-copy AnyTensorViews after enforcing every rule the reference
// reader does, plus a duplicate-name check. Also model.safetensors.index.json for sharded sets.
#pragma once

#include <algorithm>
#include <atomic>
#include <bit>
#include <cerrno>
#include <charconv>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <exception>
#include <filesystem>
#include <functional>
#include <initializer_list>
#include <limits>
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

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "trainkit/config.hpp"
#include "trainkit/core/any_tensor.hpp"
#include "trainkit/core/checked.hpp"
#include "trainkit/core/dtype.hpp"
#include "trainkit/core/shape.hpp"
#include "trainkit/error.hpp"
#include "trainkit/io/atomic_file.hpp"
#include "trainkit/io/json.hpp"
#include "trainkit/io/mmap.hpp"

TRAINKIT_NAMESPACE_BEGIN
namespace io {

/// `__metadata__`: free-form string -> string annotations (HF files carry {"format": "pt"}).
using SafetensorsMetadata = std::map<std::string, std::string, std::less<>>;

/// The reference reader refuses headers above this size (bytes); so do we, and so does the writer.
inline constexpr std::uint64_t kSafetensorsMaxHeaderBytes = 100'000'000;

/// The rule a file broke. Error::code() of a safetensors error holds this value (library "io"),
/// and the message names it, the file and (where relevant) the tensor. The first ten are the
/// reference implementation's error variants; the rest are trainkit's additions.
enum class SafetensorsRule : std::uint8_t {
  kHeaderTooSmall = 1,            ///< the file is shorter than the 8-byte header length
  kHeaderTooLarge,                ///< header length > 100,000,000
  kInvalidHeaderLength,           ///< 8 + header length is past the end of the file
  kInvalidHeader,                 ///< the header is not UTF-8
  kInvalidHeaderDeserialization,  ///< not JSON, wrong types, unknown dtype, bad __metadata__
  kInvalidOffset,                 ///< offsets not contiguous from 0 (a hole or an overlap)
  kValidationOverflow,            ///< numel * bits overflows 64 bits
  kMisalignedSlice,               ///< a sub-byte tensor does not end on a byte boundary
  kTensorInvalidInfo,             ///< end - begin != numel * dtype size
  kMetadataIncompleteBuffer,      ///< data section size != last end (trailing bytes, truncation)
  kDuplicateName,                 ///< a key appears twice (the reference keeps one silently)
  kUnsupported,                   ///< valid safetensors trainkit cannot represent (C64, rank > 8)
  kTensorNotFound,                ///< asked for a name the file does not hold
  kInvalidArgument,               ///< writer input that cannot be written (reserved name, ...)
};

inline constexpr const char* safetensors_rule_name(SafetensorsRule r) noexcept {
  switch (r) {
    case SafetensorsRule::kHeaderTooSmall: return "HeaderTooSmall";
    case SafetensorsRule::kHeaderTooLarge: return "HeaderTooLarge";
    case SafetensorsRule::kInvalidHeaderLength: return "InvalidHeaderLength";
    case SafetensorsRule::kInvalidHeader: return "InvalidHeader";
    case SafetensorsRule::kInvalidHeaderDeserialization: return "InvalidHeaderDeserialization";
    case SafetensorsRule::kInvalidOffset: return "InvalidOffset";
    case SafetensorsRule::kValidationOverflow: return "ValidationOverflow";
    case SafetensorsRule::kMisalignedSlice: return "MisalignedSlice";
    case SafetensorsRule::kTensorInvalidInfo: return "TensorInvalidInfo";
    case SafetensorsRule::kMetadataIncompleteBuffer: return "MetadataIncompleteBuffer";
    case SafetensorsRule::kDuplicateName: return "DuplicateName";
    case SafetensorsRule::kUnsupported: return "Unsupported";
    case SafetensorsRule::kTensorNotFound: return "TensorNotFound";
    case SafetensorsRule::kInvalidArgument: return "InvalidArgument";
  }
  return "?";
}

/// One tensor to write: its name in the file and a contiguous host view of its bytes.
struct NamedTensor {
  std::string name;
  AnyTensorView tensor;
};

struct SafetensorsWriteOptions {
  /// The data section starts at a multiple of this (a power of two >= 8) from the file start;
  /// the header is padded with spaces to get there. 8 reproduces the reference writer exactly;
  /// 64 or 4096 give GPU-friendly alignment of the first tensor to mmap readers.
  std::size_t alignment = 8;
  /// fsync the file and its directory (AtomicFileOptions::durable). Only for save_safetensors.
  bool durable = true;
};

/// What the writer will emit: the bytes before the data (8-byte length + JSON header + padding),
/// the data order and each tensor's offset. Use it to stream a file through your own sink.
struct SafetensorsLayout {
  std::string prefix;                  ///< length field, header JSON and padding
  std::vector<std::size_t> order;      ///< indices of the input tensors in data order
  std::vector<std::uint64_t> offsets;  ///< per input tensor: begin, relative to the data start
  std::uint64_t data_bytes = 0;
  std::uint64_t file_bytes() const noexcept { return prefix.size() + data_bytes; }
};

/// What the header says about one tensor. `dtype` is empty for safetensors types trainkit has no
/// DType for (C64, F8_E8M0, F8_*FNUZ, F4, F6_*): such tensors are validated and listed, but
/// tensor() refuses them.
struct SafetensorsTensorInfo {
  std::string name;
  std::string dtype_name;  ///< as spelled in the file ("F32", "BF16", "F8_E4M3", ...)
  std::optional<DType> dtype;
  Shape shape;
  std::uint64_t begin = 0;  ///< data_offsets[0], relative to the start of the data section
  std::uint64_t end = 0;    ///< data_offsets[1] (one past the last byte)
  std::uint64_t bytes() const noexcept { return end - begin; }
};

/// The validated content of a header.
struct SafetensorsHeader {
  std::vector<SafetensorsTensorInfo> tensors;  ///< in data (offset) order
  SafetensorsMetadata metadata;
  std::uint64_t header_bytes = 0;  ///< N, the JSON length including padding
  std::uint64_t data_offset() const noexcept { return 8 + header_bytes; }
};

namespace detail {

[[noreturn]] TRAINKIT_INLINE void safetensors_fail(SafetensorsRule rule, std::string_view source,
                                                   const std::string& what);

inline void require_little_endian(std::string_view source) {
  if constexpr (std::endian::native != std::endian::little)
    safetensors_fail(SafetensorsRule::kUnsupported, source,
                     "safetensors is little-endian and this host is not");
}

/// A safetensors dtype: its spelling, its rank in the reference's enum (the writer sorts by it,
/// descending, so larger alignments come first), its bit size and trainkit's DType if any.
struct SafetensorsDType {
  std::string_view name;
  int order;
  int bits;
  bool supported;
  DType dtype;
};

inline constexpr SafetensorsDType kSafetensorsDTypes[] = {
    {"BOOL", 0, 8, true, DType::kBool},
    {"F4", 1, 4, false, DType::kU8},
    {"F6_E2M3", 2, 6, false, DType::kU8},
    {"F6_E3M2", 3, 6, false, DType::kU8},
    {"U8", 4, 8, true, DType::kU8},
    {"I8", 5, 8, true, DType::kI8},
    {"F8_E5M2", 6, 8, true, DType::kF8E5M2},
    {"F8_E4M3", 7, 8, true, DType::kF8E4M3},
    {"F8_E8M0", 8, 8, false, DType::kU8},
    {"F8_E4M3FNUZ", 9, 8, false, DType::kU8},
    {"F8_E5M2FNUZ", 10, 8, false, DType::kU8},
    {"I16", 11, 16, true, DType::kI16},
    {"U16", 12, 16, true, DType::kU16},
    {"F16", 13, 16, true, DType::kF16},
    {"BF16", 14, 16, true, DType::kBF16},
    {"I32", 15, 32, true, DType::kI32},
    {"U32", 16, 32, true, DType::kU32},
    {"F32", 17, 32, true, DType::kF32},
    {"C64", 18, 64, false, DType::kU8},
    {"F64", 19, 64, true, DType::kF64},
    {"I64", 20, 64, true, DType::kI64},
    {"U64", 21, 64, true, DType::kU64},
};

inline const SafetensorsDType* find_safetensors_dtype(std::string_view name) noexcept {
  for (const auto& d : kSafetensorsDTypes)
    if (d.name == name) return &d;
  return nullptr;
}

inline const SafetensorsDType& safetensors_dtype(DType t) noexcept {
  for (const auto& d : kSafetensorsDTypes)
    if (d.supported && d.dtype == t) return d;
  return kSafetensorsDTypes[0];  // unreachable: every DType has a safetensors spelling
}

inline std::uint64_t read_u64_le(const std::byte* p) noexcept {
  std::uint64_t v = 0;
  for (int i = 7; i >= 0; --i) v = (v << 8) | std::uint64_t(p[i]);
  return v;
}

inline void append_u64_le(std::string& out, std::uint64_t v) {
  for (int i = 0; i < 8; ++i) out += static_cast<char>((v >> (8 * i)) & 0xff);
}

inline void append_uint(std::string& out, std::uint64_t v) {
  char buf[24];
  const auto r = std::to_chars(buf, buf + sizeof buf, v);
  out.append(buf, r.ptr);
}

/// Faults in fresh memory about to be overwritten with one call instead of one page fault per
/// 4 KiB page (Linux >= 5.14; a hint, errors ignored). In a VM a load from the page cache is
/// dominated by these faults, not by the copy.
TRAINKIT_INLINE void prefault(std::byte* p, std::uint64_t bytes) noexcept;

/// A printable, bounded rendering of an untrusted name for messages.
TRAINKIT_INLINE std::string printable(std::string_view s);

/// Refuses a BOOL tensor whose bytes are not all 0 or 1 (torch saves such bytes when a uint8
/// tensor is viewed as bool, and reads any nonzero byte as True; as a C++ bool it is undefined).
/// `data` holds the tensor's bytes. Does nothing for other dtypes. Throws trainkit::Error naming
/// `source`, the tensor, the first bad element and its byte.
TRAINKIT_INLINE void check_safetensors_bools(const SafetensorsTensorInfo& t,
                                             std::span<const std::byte> data,
                                             std::string_view source);

#if TRAINKIT_IMPL

TRAINKIT_INLINE void safetensors_fail(SafetensorsRule rule, std::string_view source,
                                      const std::string& what) {
  ::trainkit::detail::throw_error(
      ::trainkit::detail::concat("safetensors file '", source, "': ", safetensors_rule_name(rule),
                                 ": ", what),
      "", __FILE__, __LINE__, "io", static_cast<long long>(rule));
}

TRAINKIT_INLINE void prefault(std::byte* p, std::uint64_t bytes) noexcept {
#if defined(__linux__) && defined(MADV_POPULATE_WRITE)
  const auto page = std::uintptr_t(4096);
  const auto lo = (reinterpret_cast<std::uintptr_t>(p) + page - 1) / page * page;
  const auto hi = (reinterpret_cast<std::uintptr_t>(p) + bytes) / page * page;
  if (hi > lo) (void)::madvise(reinterpret_cast<void*>(lo), hi - lo, MADV_POPULATE_WRITE);
#else
  (void)p;
  (void)bytes;
#endif
}

TRAINKIT_INLINE void check_safetensors_bools(const SafetensorsTensorInfo& t,
                                             std::span<const std::byte> data,
                                             std::string_view source) {
  if (t.dtype != DType::kBool) return;
  const std::size_t i = ::trainkit::detail::first_non_bool_byte(data);
  if (i == data.size()) return;
  safetensors_fail(
      SafetensorsRule::kUnsupported, source,
      ::trainkit::detail::concat(
          "BOOL tensor '", printable(t.name), "' element ", i, " holds the byte ",
          std::to_integer<unsigned>(data[i]),
          "; a BOOL tensor must hold only 0 and 1 (torch reads any nonzero byte as True): "
          "save it with (t != 0) instead of t.view(torch.bool)"));
}

TRAINKIT_INLINE std::string printable(std::string_view s) {
  std::string out;
  for (char c : s.substr(0, 200)) {
    const auto u = static_cast<unsigned char>(c);
    out += (u < 0x20 || u == 0x7f) ? '?' : c;
  }
  if (s.size() > 200) out += "...";
  return out;
}

#endif  // TRAINKIT_IMPL

}  // namespace detail

/// Validates the JSON header of a safetensors file: `json` is the N header bytes and
/// `file_bytes` the size of the whole file (for the no-trailing-bytes rule). Applies every rule of
/// the reference reader after the length checks (UTF-8, JSON, dtype, shape, contiguous offsets,
/// sizes, data size) and rejects duplicate keys. Throws trainkit::Error naming `source`, the
/// SafetensorsRule and the tensor; Error::code() is the rule.
TRAINKIT_INLINE SafetensorsHeader parse_safetensors_header(std::string_view json,
                                                           std::uint64_t file_bytes,
                                                           std::string_view source);

/// Reads the 8-byte length and checks it against the buffer (rules HeaderTooSmall,
/// HeaderTooLarge, InvalidHeaderLength); returns N.
TRAINKIT_INLINE std::uint64_t safetensors_header_length(std::span<const std::byte> prefix,
                                                        std::uint64_t file_bytes,
                                                        std::string_view source);

/// How SafetensorsFile and SafetensorsShards reach the bytes of a file.
enum class SafetensorsBacking : unsigned char {
  /// Map the file: zero-copy, and only the pages touched are ever loaded. The file must not
  /// shrink while it is open: touching a mapped page past its new end faults (SIGBUS).
  kMap,
  /// Read the whole file into memory at open (MappedFile::copied): one copy of it in memory, and
  /// a file that another process truncates or rewrites afterwards cannot affect it. A file that
  /// shrinks while it is being read gives trainkit::Error naming it.
  kCopy,
};

/// A validated safetensors file (mapped, read into memory, or a caller's buffer) handing out
/// zero-copy views. Tensors whose bytes are not aligned for their dtype (files from writers that
/// skip the header padding) are copied once, at open, into aligned memory; zero_copy() then says
/// false. A BOOL tensor whose bytes are not all 0 or 1 (a uint8 tensor saved through
/// `.view(torch.bool)`) is refused at open (rule Unsupported), as C++ cannot read such bytes as
/// bool; BOOL tensors are read whole at open for this. Read-only and safe to share between
/// threads. Do not truncate or rewrite a file while it is open with SafetensorsBacking::kMap (a
/// mapped file that shrinks makes reads fault); trainkit's writer replaces files by rename, which
/// is safe.
class SafetensorsFile {
 public:
  SafetensorsFile() = default;

  /// Maps (or reads, see SafetensorsBacking) and validates `path`. Throws trainkit::Error naming
  /// the file (and the SafetensorsRule and tensor) when it cannot be read or breaks a rule.
  explicit SafetensorsFile(const std::filesystem::path& path,
                           SafetensorsBacking backing = SafetensorsBacking::kMap)
      : source_(path.string()),
        map_(backing == SafetensorsBacking::kCopy ? MappedFile::copied(path) : MappedFile(path)) {
    init(map_.bytes());
  }

  /// Validates the bytes of `file` (mapped, or read with MappedFile::copied) and keeps them; the
  /// errors name file.path().
  explicit SafetensorsFile(MappedFile file) : source_(file.path()), map_(std::move(file)) {
    init(map_.bytes());
  }

  /// Validates a safetensors image in memory without copying it; `bytes` must outlive the
  /// object. `source` names it in errors.
  TRAINKIT_INLINE static SafetensorsFile from_buffer(std::span<const std::byte> bytes,
                                                     std::string source = "<memory>");

  /// The path (or buffer name) given at open.
  const std::string& source() const noexcept { return source_; }
  /// Tensor descriptions in data (offset) order.
  const std::vector<SafetensorsTensorInfo>& tensors() const noexcept { return header_.tensors; }
  const SafetensorsMetadata& metadata() const noexcept { return header_.metadata; }
  const SafetensorsHeader& header() const noexcept { return header_; }
  std::size_t size() const noexcept { return header_.tensors.size(); }
  /// Names in data order.
  TRAINKIT_INLINE std::vector<std::string> names() const;
  bool contains(std::string_view name) const noexcept { return index_of(name) >= 0; }
  /// The description of `name`, or null.
  const SafetensorsTensorInfo* find(std::string_view name) const noexcept {
    const long i = index_of(name);
    return i < 0 ? nullptr : &header_.tensors[std::size_t(i)];
  }
  /// The description of `name`; throws (rule TensorNotFound) when absent.
  const SafetensorsTensorInfo& info(std::string_view name) const {
    return header_.tensors[checked_index(name)];
  }

  /// A zero-copy view of tensor `name` (valid while this object lives). Throws trainkit::Error
  /// naming the file and tensor when it is absent or its dtype has no trainkit DType.
  AnyTensorView tensor(std::string_view name) const { return view_at(checked_index(name)); }
  AnyTensorView operator[](std::string_view name) const { return tensor(name); }
  /// The view of the i-th tensor in data order.
  AnyTensorView tensor_at(std::size_t i) const {
    TRAINKIT_CHECK(i < size(), "tensor index ", i, " out of range for ", size(), " tensors");
    return view_at(i);
  }
  /// An owning copy of tensor `name`.
  AnyTensor copy(std::string_view name) const { return AnyTensor::copy_of(tensor(name)); }

  /// The raw bytes of tensor `name` (any dtype, including ones tensor() refuses).
  std::span<const std::byte> raw_bytes(std::string_view name) const {
    const std::size_t i = checked_index(name);
    return {data_[i], std::size_t(header_.tensors[i].bytes())};
  }

  /// False when some tensors had to be copied for alignment.
  bool zero_copy() const noexcept { return copies_.empty(); }

 private:
  TRAINKIT_INLINE void init(std::span<const std::byte> bytes);

  TRAINKIT_INLINE long index_of(std::string_view name) const noexcept;

  TRAINKIT_INLINE std::size_t checked_index(std::string_view name) const;

  TRAINKIT_INLINE AnyTensorView view_at(std::size_t i) const;

  std::string source_;
  MappedFile map_;
  SafetensorsHeader header_;
  std::vector<const std::byte*> data_;  // per tensor: into the file, or into copies_
  std::vector<std::uint32_t> by_name_;  // tensor indices sorted by name
  std::vector<AnyTensor> copies_;       // aligned copies of misaligned tensors
};

struct SafetensorsLoadOptions {
  /// Threads reading (and first-touching) the tensors' memory; 0 picks min(4, cores), or one for
  /// files under 64 MiB. Page faults on the fresh memory, not the copy, dominate a load from the
  /// page cache, and they proceed in parallel.
  unsigned threads = 0;
};

/// Reads a whole file into owning, 64-byte aligned tensors (name -> tensor) with pread instead
/// of a mapping: the counterpart of `safetensors.torch.load_file(path, backend="pread")`.
/// Validates like SafetensorsFile (BOOL tensors must hold only 0 and 1); tensors with dtypes
/// trainkit has no DType for are refused (rule Unsupported). `metadata`, when not null, receives
/// the file's `__metadata__`. A file that shrinks while it is read (truncated in place by another
/// process) gives an error, never a signal. Throws trainkit::Error naming the file.
TRAINKIT_INLINE std::map<std::string, AnyTensor, std::less<>> load_safetensors(
    const std::filesystem::path& path, const SafetensorsLoadOptions& options = {},
    SafetensorsMetadata* metadata = nullptr);

/// Plans the reference layout for `tensors`: sorted by dtype (descending in the reference's
/// order, so wider types come first and every tensor is naturally aligned), then by name (byte
/// order); compact JSON with `__metadata__` first (omitted when `metadata` is empty); padded with
/// spaces. Throws trainkit::Error (rule InvalidArgument) for a duplicate or reserved name
/// (`__metadata__`), non-UTF-8 text, a null view with data, or a header over 100 MB.
TRAINKIT_INLINE SafetensorsLayout plan_safetensors(std::span<const NamedTensor> tensors,
                                                   const SafetensorsMetadata& metadata = {},
                                                   const SafetensorsWriteOptions& options = {});

/// Streams a planned file through `sink(const std::byte* data, std::size_t bytes)`.
template <class Sink>
void write_safetensors(const SafetensorsLayout& layout, std::span<const NamedTensor> tensors,
                       Sink&& sink) {
  sink(reinterpret_cast<const std::byte*>(layout.prefix.data()), layout.prefix.size());
  for (std::size_t i : layout.order) {
    const AnyTensorView& t = tensors[i].tensor;
    if (t.bytes() != 0) sink(t.data(), t.bytes());
  }
}

/// The file image in memory (same bytes save_safetensors writes).
TRAINKIT_INLINE std::vector<std::byte> safetensors_bytes(
    std::span<const NamedTensor> tensors, const SafetensorsMetadata& metadata = {},
    const SafetensorsWriteOptions& options = {});
inline std::vector<std::byte> safetensors_bytes(std::initializer_list<NamedTensor> tensors,
                                                const SafetensorsMetadata& metadata = {},
                                                const SafetensorsWriteOptions& options = {}) {
  return safetensors_bytes(std::span<const NamedTensor>(tensors.begin(), tensors.size()), metadata,
                           options);
}

/// Writes `tensors` to `path` crash-safely (temp file in the same directory, fsync, rename,
/// directory fsync): `path` holds either its previous content or the complete new file. Throws
/// trainkit::Error naming the file on bad input (see plan_safetensors) or an I/O error
/// (ENOSPC, EFBIG, ...), leaving `path` untouched.
TRAINKIT_INLINE void save_safetensors(const std::filesystem::path& path,
                                      std::span<const NamedTensor> tensors,
                                      const SafetensorsMetadata& metadata = {},
                                      const SafetensorsWriteOptions& options = {});
inline void save_safetensors(const std::filesystem::path& path,
                             std::initializer_list<NamedTensor> tensors,
                             const SafetensorsMetadata& metadata = {},
                             const SafetensorsWriteOptions& options = {}) {
  save_safetensors(path, std::span<const NamedTensor>(tensors.begin(), tensors.size()), metadata,
                   options);
}

// ---- Sharded sets: model-00001-of-00003.safetensors + model.safetensors.index.json -----------

/// The index file name of a sharded set (Hugging Face convention).
inline constexpr std::string_view kSafetensorsIndexName = "model.safetensors.index.json";

/// "model-00001-of-00003.safetensors" for shard `i` (0-based) of `n`, as huggingface_hub names
/// them (`prefix` replaces "model").
TRAINKIT_INLINE std::string safetensors_shard_name(std::size_t i, std::size_t n,
                                                   std::string_view prefix = "model");

/// `model.safetensors.index.json`: {"metadata": {...}, "weight_map": {tensor: shard file}}.
struct SafetensorsIndex {
  /// Free-form; Hugging Face writes {"total_size": <bytes of all tensors>}.
  Json metadata = Json::object();
  /// Tensor name -> shard file name, relative to the index's directory.
  std::map<std::string, std::string, std::less<>> weight_map;

  /// The distinct shard files, sorted.
  TRAINKIT_INLINE std::vector<std::string> files() const;

  /// metadata["total_size"] when it is a non-negative integer.
  std::optional<std::uint64_t> total_size() const {
    const Json* v = metadata.is_object() ? metadata.find("total_size") : nullptr;
    if (v == nullptr || !v->is_unsigned()) return std::nullopt;
    return v->as_uint();
  }

  /// The file text: 2-space indented JSON with sorted keys and a final newline, the layout
  /// `transformers` writes.
  TRAINKIT_INLINE std::string to_json() const;

  /// Parses and checks an index: an object with a "weight_map" object of strings (required) and
  /// an optional "metadata" object; shard names must be relative paths without "..". Throws
  /// trainkit::Error naming `source` and the offending entry.
  TRAINKIT_INLINE static SafetensorsIndex parse(std::string_view text,
                                                std::string_view source = "index");
};

/// Writes an index file crash-safely (see AtomicFile).
inline void save_safetensors_index(const std::filesystem::path& path, const SafetensorsIndex& index,
                                   AtomicFileOptions options = {}) {
  write_file_atomic(path, std::string_view(index.to_json()), options);
}

/// Reads and checks an index file (see SafetensorsIndex::parse).
inline SafetensorsIndex load_safetensors_index(const std::filesystem::path& path) {
  const MappedFile map = MappedFile::copied(path);  // small: read, so a truncation cannot fault
  return SafetensorsIndex::parse(
      std::string_view(reinterpret_cast<const char*>(map.data()), map.size()), path.string());
}

namespace detail {

/// The checks SafetensorsShards makes of an index against the headers of its shards: every
/// tensor of a shard is listed under that shard, and every entry is held by its shard.
/// `shard_tensors` maps each shard file to its header's tensors. Throws trainkit::Error naming
/// `index_path`, the shard and the tensor.
TRAINKIT_INLINE void check_shard_index(
    const SafetensorsIndex& index, std::string_view index_path,
    const std::map<std::string, const std::vector<SafetensorsTensorInfo>*, std::less<>>&
        shard_tensors);

}  // namespace detail

/// A sharded set opened through its index: every shard is mapped and validated, every
/// weight_map entry is checked to exist in its shard, and every tensor of a shard to be listed
/// under that shard. tensor() finds a name across shards.
class SafetensorsShards {
 public:
  /// Opens `index_path` and the shards it names (relative to its directory), each mapped or read
  /// as `backing` says. Throws trainkit::Error naming the index, shard and tensor on any
  /// inconsistency: an entry its shard does not hold, or a tensor a shard holds that the index
  /// does not list for it.
  TRAINKIT_INLINE explicit SafetensorsShards(const std::filesystem::path& index_path,
                                             SafetensorsBacking backing = SafetensorsBacking::kMap);

  const SafetensorsIndex& index() const noexcept { return index_; }
  std::size_t size() const noexcept { return index_.weight_map.size(); }
  bool contains(std::string_view name) const { return index_.weight_map.count(name) != 0; }
  /// The shard holding `name`; throws when the index does not list it.
  TRAINKIT_INLINE const SafetensorsFile& shard_of(std::string_view name) const;
  /// A zero-copy view of `name` from its shard.
  AnyTensorView tensor(std::string_view name) const { return shard_of(name).tensor(name); }
  /// The opened shards by file name.
  const std::map<std::string, std::unique_ptr<SafetensorsFile>, std::less<>>& shards() const {
    return shards_;
  }

 private:
  SafetensorsIndex index_;
  std::map<std::string, std::unique_ptr<SafetensorsFile>, std::less<>> shards_;
};

#if TRAINKIT_IMPL

TRAINKIT_INLINE SafetensorsHeader parse_safetensors_header(std::string_view json,
                                                           std::uint64_t file_bytes,
                                                           std::string_view source) {
  using R = SafetensorsRule;
  using detail::safetensors_fail;
  using ::trainkit::detail::concat;
  SafetensorsHeader out;
  out.header_bytes = json.size();

  std::size_t bad = 0;
  if (!is_valid_utf8(json, &bad))
    safetensors_fail(R::kInvalidHeader, source,
                     concat("header is not valid UTF-8 (bad byte at header offset ", bad, ")"));
  JsonParseError error;
  // Depth 4 is enough for the format ({name: {shape: [..]}}), and its arrays hold at most
  // kMaxRank dimensions or two offsets: refuse anything deeper or longer as it is met (a header
  // of millions of zeros in one shape would otherwise take gigabytes to parse).
  std::optional<Json> parsed =
      Json::try_parse(json, &error, JsonLimits{.max_depth = 8, .max_array = 64});
  if (!parsed) {
    if (error.kind == JsonErrorKind::kOutOfMemory)
      safetensors_fail(
          R::kInvalidHeaderDeserialization, source,
          concat("the ", json.size(), "-byte header is too large to parse (", error.message, ")"));
    // Valid JSON (the reference reads a shape of any rank), but longer than any array a tensor
    // trainkit can hold needs: say so rather than call the header malformed.
    if (error.kind == JsonErrorKind::kTooLong)
      safetensors_fail(
          R::kInvalidHeaderDeserialization, source,
          concat("the header holds ", error.message, " at header offset ", error.offset,
                 "; shapes may have at most ", kMaxRank, " dimensions and data_offsets exactly 2"));
    if (error.kind == JsonErrorKind::kDuplicateKey)
      safetensors_fail(R::kDuplicateName, source,
                       concat("the header names '", detail::printable(error.key),
                              "' twice (at header offset ", error.offset, ")"));
    safetensors_fail(
        R::kInvalidHeaderDeserialization, source,
        concat("header is not valid JSON: ", error.message, " at header offset ", error.offset));
  }
  if (!parsed->is_object())
    safetensors_fail(
        R::kInvalidHeaderDeserialization, source,
        concat("header is a JSON ", Json::kind_name(parsed->kind()), ", expected an object"));

  struct Raw {
    const JsonMember* member;
    const detail::SafetensorsDType* dtype;
    std::vector<std::uint64_t> dims;
    std::uint64_t begin, end;
  };
  std::vector<Raw> raw;
  raw.reserve(parsed->size());
  for (const JsonMember& m : parsed->as_object()) {
    const std::string name = detail::printable(m.key);
    const auto bad_entry = [&](const std::string& what) {
      safetensors_fail(R::kInvalidHeaderDeserialization, source,
                       concat("tensor '", name, "': ", what));
    };
    if (m.key == "__metadata__") {
      if (m.value.is_null()) continue;
      if (!m.value.is_object())
        safetensors_fail(R::kInvalidHeaderDeserialization, source,
                         concat("__metadata__ is a JSON ", Json::kind_name(m.value.kind()),
                                ", expected an object of strings"));
      for (const JsonMember& kv : m.value.as_object()) {
        if (!kv.value.is_string())
          safetensors_fail(R::kInvalidHeaderDeserialization, source,
                           concat("__metadata__ value of '", detail::printable(kv.key), "' is a ",
                                  Json::kind_name(kv.value.kind()),
                                  ", expected a string (metadata is string->string only)"));
        out.metadata.emplace(kv.key, kv.value.as_string());
      }
      continue;
    }
    if (!m.value.is_object())
      bad_entry(
          concat("entry is a JSON ", Json::kind_name(m.value.kind()), ", expected an object"));
    const Json* dtype = m.value.find("dtype");
    const Json* shape = m.value.find("shape");
    const Json* offsets = m.value.find("data_offsets");
    if (dtype == nullptr || shape == nullptr || offsets == nullptr)
      bad_entry(concat("missing field '",
                       dtype == nullptr   ? "dtype"
                       : shape == nullptr ? "shape"
                                          : "data_offsets",
                       "'"));
    if (!dtype->is_string()) bad_entry("'dtype' is not a string");
    Raw r{&m, detail::find_safetensors_dtype(dtype->as_string()), {}, 0, 0};
    if (r.dtype == nullptr)
      bad_entry(concat("unknown dtype '", detail::printable(dtype->as_string()), "'"));
    if (!shape->is_array()) bad_entry("'shape' is not an array");
    for (const Json& d : shape->as_array()) {
      if (!d.is_unsigned()) bad_entry("'shape' holds something other than integers >= 0");
      r.dims.push_back(d.as_uint());
    }
    if (!offsets->is_array() || offsets->size() != 2 || !offsets->as_array()[0].is_unsigned() ||
        !offsets->as_array()[1].is_unsigned())
      bad_entry("'data_offsets' is not an array of two integers >= 0");
    r.begin = offsets->as_array()[0].as_uint();
    r.end = offsets->as_array()[1].as_uint();
    raw.push_back(std::move(r));
  }

  // The reference's Metadata::validate(): walk tensors in offset order.
  std::stable_sort(raw.begin(), raw.end(), [](const Raw& a, const Raw& b) {
    return a.begin != b.begin ? a.begin < b.begin : a.end < b.end;
  });
  std::uint64_t cursor = 0;
  for (const Raw& r : raw) {
    const std::string name = detail::printable(r.member->key);
    if (r.begin != cursor || r.end < r.begin)
      safetensors_fail(R::kInvalidOffset, source,
                       concat("tensor '", name, "' has data_offsets [", r.begin, ", ", r.end,
                              "] but must start at ", cursor,
                              " (offsets must be contiguous from 0: no holes, no overlaps)"));
    std::uint64_t numel = 1;
    bool overflow = false;
    for (std::uint64_t d : r.dims) {
      if (d != 0 && numel > std::numeric_limits<std::uint64_t>::max() / d) overflow = true;
      numel *= d;
    }
    const auto bits = std::uint64_t(r.dtype->bits);
    if (overflow || (numel != 0 && numel > std::numeric_limits<std::uint64_t>::max() / bits))
      safetensors_fail(
          R::kValidationOverflow, source,
          concat("tensor '", name, "': the element count times ", bits, " bits overflows 64 bits"));
    if ((numel * bits) % 8 != 0)
      safetensors_fail(R::kMisalignedSlice, source,
                       concat("tensor '", name, "' (", r.dtype->name, ", ", numel,
                              " elements) does not end on a byte boundary"));
    const std::uint64_t nbytes = numel * bits / 8;
    if (r.end - r.begin != nbytes)
      safetensors_fail(R::kTensorInvalidInfo, source,
                       concat("tensor '", name, "' spans ", r.end - r.begin, " bytes but ", numel,
                              " elements of ", r.dtype->name, " need ", nbytes));
    cursor = r.end;
  }
  if (file_bytes < 8 + out.header_bytes || cursor != file_bytes - 8 - out.header_bytes)
    safetensors_fail(R::kMetadataIncompleteBuffer, source,
                     concat("the tensors end at data byte ", cursor, " but the data section has ",
                            file_bytes - std::min(file_bytes, 8 + out.header_bytes),
                            " bytes (truncated file, or trailing bytes after the last tensor)"));

  out.tensors.reserve(raw.size());
  for (Raw& r : raw) {
    const std::string name = detail::printable(r.member->key);
    if (r.dims.size() > std::size_t(kMaxRank))
      safetensors_fail(R::kUnsupported, source,
                       concat("tensor '", name, "' has rank ", r.dims.size(),
                              "; trainkit supports up to ", kMaxRank));
    std::vector<std::int64_t> dims;
    std::int64_t nonzero = 1;  // product of the nonzero extents: strides are int64
    for (std::uint64_t d : r.dims) {
      const std::optional<std::int64_t> e = checked_cast<std::int64_t>(d);
      if (!e)
        safetensors_fail(R::kUnsupported, source,
                         concat("tensor '", name, "' has an extent above 2^63-1"));
      const std::optional<std::int64_t> next = checked_mul(nonzero, *e == 0 ? 1 : *e);
      if (!next)
        safetensors_fail(R::kUnsupported, source,
                         concat("tensor '", name, "' has extents whose product (zeros aside) ",
                                "exceeds 2^63-1: trainkit's int64 strides cannot index it"));
      nonzero = *next;
      dims.push_back(*e);
    }
    SafetensorsTensorInfo info;
    info.name = r.member->key;
    info.dtype_name = std::string(r.dtype->name);
    if (r.dtype->supported) info.dtype = r.dtype->dtype;
    info.shape = Shape(std::span<const std::int64_t>(dims));
    info.begin = r.begin;
    info.end = r.end;
    out.tensors.push_back(std::move(info));
  }
  return out;
}

TRAINKIT_INLINE std::uint64_t safetensors_header_length(std::span<const std::byte> prefix,
                                                        std::uint64_t file_bytes,
                                                        std::string_view source) {
  using R = SafetensorsRule;
  using ::trainkit::detail::concat;
  if (prefix.size() < 8 || file_bytes < 8)
    detail::safetensors_fail(
        R::kHeaderTooSmall, source,
        concat("the file has ", file_bytes, " bytes, fewer than the 8-byte header length"));
  const std::uint64_t n = detail::read_u64_le(prefix.data());
  if (n > kSafetensorsMaxHeaderBytes)
    detail::safetensors_fail(R::kHeaderTooLarge, source,
                             concat("header length ", n, " exceeds the limit of ",
                                    kSafetensorsMaxHeaderBytes, " bytes"));
  if (8 + n > file_bytes)
    detail::safetensors_fail(
        R::kInvalidHeaderLength, source,
        concat("header length ", n, " runs past the end of the file (", file_bytes, " bytes)"));
  return n;
}

TRAINKIT_INLINE SafetensorsFile SafetensorsFile::from_buffer(std::span<const std::byte> bytes,
                                                             std::string source) {
  SafetensorsFile f;
  f.source_ = std::move(source);
  f.init(bytes);
  return f;
}

TRAINKIT_INLINE std::vector<std::string> SafetensorsFile::names() const {
  std::vector<std::string> out;
  out.reserve(size());
  for (const auto& t : header_.tensors) out.push_back(t.name);
  return out;
}

TRAINKIT_INLINE void SafetensorsFile::init(std::span<const std::byte> bytes) {
  detail::require_little_endian(source_);
  const std::uint64_t n = safetensors_header_length(bytes, bytes.size(), source_);
  const std::string_view json(reinterpret_cast<const char*>(bytes.data()) + 8, std::size_t(n));
  header_ = parse_safetensors_header(json, bytes.size(), source_);
  const std::byte* base = bytes.data() + 8 + n;
  data_.resize(header_.tensors.size());
  by_name_.resize(header_.tensors.size());
  for (std::size_t i = 0; i < header_.tensors.size(); ++i) {
    const SafetensorsTensorInfo& t = header_.tensors[i];
    data_[i] = base + t.begin;
    by_name_[i] = std::uint32_t(i);
    detail::check_safetensors_bools(t, {data_[i], std::size_t(t.bytes())}, source_);
    if (!t.dtype || t.bytes() == 0) continue;
    const std::size_t align = dtype_size(*t.dtype);
    if (reinterpret_cast<std::uintptr_t>(data_[i]) % align != 0) {
      copies_.push_back(AnyTensor(*t.dtype, t.shape));
      std::memcpy(copies_.back().data(), data_[i], std::size_t(t.bytes()));
      data_[i] = copies_.back().data();
    }
  }
  std::sort(by_name_.begin(), by_name_.end(), [&](std::uint32_t a, std::uint32_t b) {
    return header_.tensors[a].name < header_.tensors[b].name;
  });
}

TRAINKIT_INLINE long SafetensorsFile::index_of(std::string_view name) const noexcept {
  const auto it = std::lower_bound(
      by_name_.begin(), by_name_.end(), name,
      [&](std::uint32_t i, std::string_view n) { return header_.tensors[i].name < n; });
  if (it == by_name_.end() || header_.tensors[*it].name != name) return -1;
  return long(*it);
}

TRAINKIT_INLINE std::size_t SafetensorsFile::checked_index(std::string_view name) const {
  const long i = index_of(name);
  if (i < 0)
    detail::safetensors_fail(
        SafetensorsRule::kTensorNotFound, source_,
        ::trainkit::detail::concat("no tensor named '", detail::printable(name),
                                   "' (the file holds ", size(), " tensors)"));
  return std::size_t(i);
}

TRAINKIT_INLINE AnyTensorView SafetensorsFile::view_at(std::size_t i) const {
  const SafetensorsTensorInfo& t = header_.tensors[i];
  if (!t.dtype)
    detail::safetensors_fail(SafetensorsRule::kUnsupported, source_,
                             ::trainkit::detail::concat("tensor '", detail::printable(t.name),
                                                        "' has dtype ", t.dtype_name,
                                                        ", which trainkit has no DType for "
                                                        "(raw_bytes() gives its bytes)"));
  return AnyTensorView(*t.dtype, t.shape, data_[i]);
}

TRAINKIT_INLINE std::map<std::string, AnyTensor, std::less<>> load_safetensors(
    const std::filesystem::path& path, const SafetensorsLoadOptions& options,
    SafetensorsMetadata* metadata) {
  const std::string source = path.string();
  detail::require_little_endian(source);
  struct Fd {
    int fd;
    ~Fd() {
      if (fd >= 0) ::close(fd);
    }
  } f{::open(path.c_str(), O_RDONLY | O_CLOEXEC)};
  const auto fail_errno = [&](const char* what) {
    const int err = errno;
    TRAINKIT_FAIL_OS(err, what, " '", source, "': ", detail::errno_text(err));
  };
  if (f.fd < 0) fail_errno("cannot open");
  struct stat st {};
  if (::fstat(f.fd, &st) != 0) fail_errno("cannot stat");
  const auto file_bytes = std::uint64_t(st.st_size);
  const auto read_at = [&](void* dst, std::uint64_t n, std::uint64_t offset) {
    auto* p = static_cast<char*>(dst);
    while (n > 0) {
      const std::size_t chunk = std::size_t(std::min<std::uint64_t>(n, std::uint64_t(1) << 30));
      const ssize_t r = ::pread(f.fd, p, chunk, off_t(offset));
      if (r < 0 && errno == EINTR) continue;
      if (r < 0) fail_errno("cannot read");
      if (r == 0)
        detail::safetensors_fail(SafetensorsRule::kMetadataIncompleteBuffer, source,
                                 "the file shrank while it was being read");
      p += r;
      n -= std::uint64_t(r);
      offset += std::uint64_t(r);
    }
  };
  std::byte prefix[8] = {};
  if (file_bytes >= 8) read_at(prefix, 8, 0);
  const std::uint64_t n = safetensors_header_length(
      std::span<const std::byte>(prefix, file_bytes >= 8 ? 8 : 0), file_bytes, source);
  std::string json(std::size_t(n), '\0');
  read_at(json.data(), n, 8);
  SafetensorsHeader header = parse_safetensors_header(json, file_bytes, source);
  if (metadata != nullptr) *metadata = std::move(header.metadata);

  // Allocate everything first, then read in 8 MiB pieces pulled by a few threads.
  struct Piece {
    std::byte* dst;
    std::uint64_t bytes, offset;
  };
  constexpr std::uint64_t kPiece = std::uint64_t(8) << 20;
  std::map<std::string, AnyTensor, std::less<>> out;
  std::vector<Piece> pieces;
  for (const SafetensorsTensorInfo& t : header.tensors) {
    if (!t.dtype)
      detail::safetensors_fail(
          SafetensorsRule::kUnsupported, source,
          ::trainkit::detail::concat("tensor '", detail::printable(t.name), "' has dtype ",
                                     t.dtype_name, ", which trainkit has no DType for"));
    AnyTensor& tensor = out.emplace(t.name, AnyTensor(*t.dtype, t.shape)).first->second;
    for (std::uint64_t done = 0; done < t.bytes(); done += kPiece)
      pieces.push_back({tensor.data() + done, std::min(kPiece, t.bytes() - done),
                        header.data_offset() + t.begin + done});
  }
  unsigned threads = options.threads;
  if (threads == 0)
    threads = file_bytes < (std::uint64_t(64) << 20)
                  ? 1u
                  : std::clamp(std::thread::hardware_concurrency(), 1u, 4u);
  threads = unsigned(std::min<std::size_t>(threads, std::max<std::size_t>(pieces.size(), 1)));
  std::atomic<std::size_t> next{0};
  std::exception_ptr error;
  std::mutex error_mutex;
  const auto work = [&] {
    for (std::size_t i; (i = next.fetch_add(1)) < pieces.size();) {
      try {
        detail::prefault(pieces[i].dst, pieces[i].bytes);
        read_at(pieces[i].dst, pieces[i].bytes, pieces[i].offset);
      } catch (...) {
        const std::lock_guard<std::mutex> lock(error_mutex);
        if (!error) error = std::current_exception();
        next.store(pieces.size());
      }
    }
  };
  std::vector<std::thread> pool;
  for (unsigned t = 1; t < threads; ++t) pool.emplace_back(work);
  work();
  for (std::thread& t : pool) t.join();
  if (error) std::rethrow_exception(error);
  for (const SafetensorsTensorInfo& t : header.tensors)
    if (t.dtype == DType::kBool) {
      const AnyTensor& tensor = out.find(t.name)->second;
      detail::check_safetensors_bools(t, {tensor.data(), std::size_t(t.bytes())}, source);
    }
  return out;
}

TRAINKIT_INLINE SafetensorsLayout plan_safetensors(std::span<const NamedTensor> tensors,
                                                   const SafetensorsMetadata& metadata,
                                                   const SafetensorsWriteOptions& options) {
  using ::trainkit::detail::concat;
  const auto invalid = [](const std::string& what) {
    ::trainkit::detail::throw_error(
        concat("safetensors writer: ", safetensors_rule_name(SafetensorsRule::kInvalidArgument),
               ": ", what),
        "", __FILE__, __LINE__, "io", static_cast<long long>(SafetensorsRule::kInvalidArgument));
  };
  detail::require_little_endian("safetensors writer");
  const std::size_t align = options.alignment;
  // At most 1 MiB: the header is padded to it (readers accept headers up to 100 MB).
  if (align < 8 || (align & (align - 1)) != 0 || align > (std::size_t{1} << 20))
    invalid(concat("alignment ", align, " is not a power of two in [8, 2^20]"));
  {  // every name once (the layout's order sorts by dtype first: equal names need not meet)
    std::vector<std::string_view> names;
    names.reserve(tensors.size());
    for (const NamedTensor& t : tensors) names.push_back(t.name);
    std::sort(names.begin(), names.end());
    const auto twice = std::adjacent_find(names.begin(), names.end());
    if (twice != names.end())
      invalid(concat("tensor name '", detail::printable(*twice), "' appears twice"));
  }

  SafetensorsLayout layout;
  layout.order.resize(tensors.size());
  for (std::size_t i = 0; i < tensors.size(); ++i) layout.order[i] = i;
  std::sort(layout.order.begin(), layout.order.end(), [&](std::size_t a, std::size_t b) {
    const int oa = detail::safetensors_dtype(tensors[a].tensor.dtype()).order;
    const int ob = detail::safetensors_dtype(tensors[b].tensor.dtype()).order;
    if (oa != ob) return oa > ob;
    return tensors[a].name < tensors[b].name;
  });

  std::string json = "{";
  if (!metadata.empty()) {
    json += "\"__metadata__\":{";
    bool first = true;
    for (const auto& [k, v] : metadata) {
      if (!is_valid_utf8(k) || !is_valid_utf8(v))
        invalid(concat("metadata key '", detail::printable(k), "' or its value is not UTF-8"));
      if (!first) json += ',';
      first = false;
      append_json_string(json, k);
      json += ':';
      append_json_string(json, v);
    }
    json += '}';
  }
  layout.offsets.assign(tensors.size(), 0);
  std::uint64_t cursor = 0;
  for (std::size_t k = 0; k < layout.order.size(); ++k) {
    const NamedTensor& t = tensors[layout.order[k]];
    const std::string name = detail::printable(t.name);
    if (t.name == "__metadata__") invalid("'__metadata__' is reserved and cannot name a tensor");
    if (!is_valid_utf8(t.name)) invalid(concat("tensor name '", name, "' is not UTF-8"));
    const std::uint64_t nbytes = t.tensor.bytes();
    if (nbytes != 0 && t.tensor.data() == nullptr)
      invalid(concat("tensor '", name, "' has ", nbytes, " bytes but a null data pointer"));
    if (json.size() > 1) json += ',';
    append_json_string(json, t.name);
    json += ":{\"dtype\":\"";
    json += dtype_name(t.tensor.dtype());
    json += "\",\"shape\":[";
    for (int d = 0; d < t.tensor.shape().rank(); ++d) {
      if (d) json += ',';
      detail::append_uint(json, std::uint64_t(t.tensor.shape()[d]));
    }
    json += "],\"data_offsets\":[";
    detail::append_uint(json, cursor);
    json += ',';
    detail::append_uint(json, cursor + nbytes);
    json += "]}";
    layout.offsets[layout.order[k]] = cursor;
    cursor += nbytes;
  }
  json += '}';
  // Pad so the data section (at 8 + N) starts on a multiple of `align`.
  const std::size_t padded = (8 + json.size() + align - 1) / align * align - 8;
  json.append(padded - json.size(), ' ');
  if (json.size() > kSafetensorsMaxHeaderBytes)
    invalid(concat("the header would be ", json.size(), " bytes, above the limit of ",
                   kSafetensorsMaxHeaderBytes, " readers accept"));
  layout.prefix.reserve(8 + json.size());
  detail::append_u64_le(layout.prefix, json.size());
  layout.prefix += json;
  layout.data_bytes = cursor;
  return layout;
}

TRAINKIT_INLINE std::vector<std::byte> safetensors_bytes(std::span<const NamedTensor> tensors,
                                                         const SafetensorsMetadata& metadata,
                                                         const SafetensorsWriteOptions& options) {
  const SafetensorsLayout layout = plan_safetensors(tensors, metadata, options);
  std::vector<std::byte> out;
  out.reserve(std::size_t(layout.file_bytes()));
  write_safetensors(layout, tensors,
                    [&](const std::byte* p, std::size_t n) { out.insert(out.end(), p, p + n); });
  return out;
}

TRAINKIT_INLINE void save_safetensors(const std::filesystem::path& path,
                                      std::span<const NamedTensor> tensors,
                                      const SafetensorsMetadata& metadata,
                                      const SafetensorsWriteOptions& options) {
  const SafetensorsLayout layout = plan_safetensors(tensors, metadata, options);
  AtomicFile file(path, AtomicFileOptions{.durable = options.durable});
  file.reserve(layout.file_bytes());
  write_safetensors(layout, tensors, [&](const std::byte* p, std::size_t n) { file.write(p, n); });
  file.commit();
}

TRAINKIT_INLINE std::string safetensors_shard_name(std::size_t i, std::size_t n,
                                                   std::string_view prefix) {
  TRAINKIT_CHECK(n > 0 && i < n, "shard index ", i, " out of range for ", n, " shards");
  char buf[64];
  std::snprintf(buf, sizeof buf, "-%05zu-of-%05zu.safetensors", i + 1, n);
  return std::string(prefix) + buf;
}

TRAINKIT_INLINE std::vector<std::string> SafetensorsIndex::files() const {
  std::vector<std::string> out;
  for (const auto& [name, file] : weight_map) out.push_back(file);
  std::sort(out.begin(), out.end());
  out.erase(std::unique(out.begin(), out.end()), out.end());
  return out;
}

TRAINKIT_INLINE std::string SafetensorsIndex::to_json() const {
  Json root = Json::object();
  Json meta = metadata;
  if (meta.is_object())
    std::sort(meta.as_object().begin(), meta.as_object().end(),
              [](const JsonMember& a, const JsonMember& b) { return a.key < b.key; });
  root.set("metadata", std::move(meta));
  Json map = Json::object();
  map.as_object().reserve(weight_map.size());
  for (const auto& [name, file] : weight_map) map.as_object().push_back({name, Json(file)});
  root.set("weight_map", std::move(map));
  return root.dump(2) + "\n";
}

TRAINKIT_INLINE SafetensorsIndex SafetensorsIndex::parse(std::string_view text,
                                                         std::string_view source) {
  using ::trainkit::detail::concat;
  const Json root = Json::parse(text, source);
  TRAINKIT_CHECK(root.is_object(), "safetensors index '", source,
                 "': expected a JSON object at the top level");
  SafetensorsIndex index;
  if (const Json* m = root.find("metadata"); m != nullptr && !m->is_null()) {
    TRAINKIT_CHECK(m->is_object(), "safetensors index '", source, "': 'metadata' is not an object");
    index.metadata = *m;
  }
  const Json* map = root.find("weight_map");
  TRAINKIT_CHECK(map != nullptr && map->is_object(), "safetensors index '", source,
                 "': missing 'weight_map' object");
  for (const JsonMember& e : map->as_object()) {
    TRAINKIT_CHECK(e.value.is_string(), "safetensors index '", source, "': weight_map['",
                   detail::printable(e.key), "'] is not a string");
    const std::string& file = e.value.as_string();
    const std::filesystem::path p(file);
    bool escapes = file.empty() || p.is_absolute();
    for (const auto& part : p) escapes = escapes || part == "..";
    TRAINKIT_CHECK(!escapes, "safetensors index '", source, "': weight_map['",
                   detail::printable(e.key), "'] = '", detail::printable(file),
                   "' is not a relative path inside the index's directory");
    index.weight_map.emplace(e.key, file);
  }
  return index;
}

TRAINKIT_INLINE SafetensorsShards::SafetensorsShards(const std::filesystem::path& index_path,
                                                     SafetensorsBacking backing)
    : index_(load_safetensors_index(index_path)) {
  const std::filesystem::path dir = index_path.parent_path();
  for (const std::string& file : index_.files())
    shards_.emplace(file, std::make_unique<SafetensorsFile>(dir / file, backing));
  std::map<std::string, const std::vector<SafetensorsTensorInfo>*, std::less<>> shard_tensors;
  for (const auto& [file, shard] : shards_) shard_tensors.emplace(file, &shard->tensors());
  detail::check_shard_index(index_, index_path.string(), shard_tensors);
}

TRAINKIT_INLINE void detail::check_shard_index(
    const SafetensorsIndex& index, std::string_view index_path,
    const std::map<std::string, const std::vector<SafetensorsTensorInfo>*, std::less<>>&
        shard_tensors) {
  // Every tensor of a shard must be listed, under that shard: one the index leaves out (or lists
  // under another shard) means a damaged or edited index or a shard of another set.
  std::map<std::string, std::vector<std::string_view>, std::less<>> held;
  for (const auto& [file, tensors] : shard_tensors) {
    std::vector<std::string_view>& names = held[file];
    for (const SafetensorsTensorInfo& t : *tensors) {
      const auto it = index.weight_map.find(t.name);
      TRAINKIT_CHECK(it != index.weight_map.end(), "safetensors index '", index_path,
                     "' does not list tensor '", printable(t.name), "', which shard '",
                     printable(file), "' holds");
      TRAINKIT_CHECK(it->second == file, "safetensors index '", index_path,
                     "' does not list tensor '", printable(t.name), "' under shard '",
                     printable(file), "', which holds it (the index lists it under '",
                     printable(it->second), "')");
      names.push_back(t.name);
    }
    std::sort(names.begin(), names.end());
  }
  for (const auto& [name, file] : index.weight_map) {
    const std::vector<std::string_view>& names = held.at(file);
    TRAINKIT_CHECK(std::binary_search(names.begin(), names.end(), std::string_view(name)),
                   "safetensors index '", index_path, "' maps tensor '", printable(name), "' to '",
                   printable(file), "', which does not hold it");
  }
}

TRAINKIT_INLINE const SafetensorsFile& SafetensorsShards::shard_of(std::string_view name) const {
  const auto it = index_.weight_map.find(name);
  TRAINKIT_CHECK(it != index_.weight_map.end(), "sharded safetensors set: no tensor named '",
                 detail::printable(name), "' in the index");
  return *shards_.at(it->second);
}

#endif  // TRAINKIT_IMPL

}  // namespace io
TRAINKIT_NAMESPACE_END
