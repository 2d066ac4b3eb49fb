// SPDX-License-Identifier: MIT
// trainkit/data/tar_shards.hpp: TarShardDataset, a streaming dataset over WebDataset tar shards.
// Members sharing a key (the path up to the first dot of the basename) form one sample; declared
// extensions fill fields: `.npy` (checked against the field's dtype and element count: a (784,)
// array fills a (28, 28) field), `.cls` (a decimal
// integer), `.json` (a number or nested arrays of numbers, or raw bytes), anything else raw bytes.
// Each epoch reads this rank's shards in a shuffled order through a sample shuffle buffer, both
// pure functions of (seed, epoch, rank, world_size), so start(epoch, skip) reproduces any position.
#pragma once

#include <algorithm>
#include <atomic>
#include <cctype>
#include <charconv>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <limits>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <system_error>
#include <type_traits>
#include <utility>
#include <vector>

#include "trainkit/config.hpp"
#include "trainkit/core/checked.hpp"
#include "trainkit/core/dtype.hpp"
#include "trainkit/core/half.hpp"
#include "trainkit/core/rng.hpp"
#include "trainkit/data/dataset.hpp"
#include "trainkit/data/sampler.hpp"
#include "trainkit/data/shard_pattern.hpp"
#include "trainkit/error.hpp"
#include "trainkit/io/npy.hpp"
#include "trainkit/io/tar.hpp"

TRAINKIT_NAMESPACE_BEGIN
namespace data {

/// One field of a tar sample: the member extension that fills it and its dtype/shape.
struct TarField {
  std::string name{};  ///< field name in batches
  std::string ext{};   ///< member extension after the key ("npy", "cls", "seg.npy", "json", "bin")
  DType dtype = DType::kU8;
  std::vector<std::int64_t> shape{};  ///< per-sample shape; empty = scalar
  /// Raw and raw-JSON members (U8 fields) shorter than the field are zero-padded instead of
  /// refused. Members longer than the field are always an error.
  bool pad = false;
};

struct TarShardOptions {
  std::vector<TarField> fields{};
  std::uint64_t seed = 0;
  bool shuffle_shards = true;  ///< permute the shard list each epoch (torch_randperm(seed+epoch))
  std::size_t shuffle_buffer = 0;  ///< samples held for shuffling; 0 = shard order
  std::size_t rank = 0;  ///< this rank reads shards rank, rank+world_size, ... of the order
  std::size_t world_size = 1;
  /// Members larger than this (bytes) are refused before they are read into memory (see
  /// io::TarReaderOptions). Members are also never read past the shard's end, and `.npy`, `.cls`
  /// and `.json` members have tighter limits of their own derived from the field.
  std::uint64_t max_member_bytes = std::uint64_t{1} << 30;
};

namespace detail {

enum class TarDecode : unsigned char { kNpy, kInteger, kJson, kRaw };

TRAINKIT_INLINE TarDecode tar_decode_kind(std::string_view ext);

/// Stores `v` as element `k` of `dst` in dtype `t`; false when it does not fit (or, for integer
/// types, is not an integer).
TRAINKIT_INLINE bool store_number(DType t, std::byte* dst, std::size_t k, double v);

/// Stores the integer `v` in dtype `t` exactly; false when it does not fit.
TRAINKIT_INLINE bool store_integer(DType t, std::byte* dst, long long v);

#if TRAINKIT_IMPL

TRAINKIT_INLINE TarDecode tar_decode_kind(std::string_view ext) {
  const std::size_t dot = ext.rfind('.');
  const std::string_view last = dot == std::string_view::npos ? ext : ext.substr(dot + 1);
  if (last == "npy") return TarDecode::kNpy;
  if (last == "cls" || last == "cls2" || last == "index" || last == "id" || last == "count")
    return TarDecode::kInteger;
  if (last == "json" || last == "jsn") return TarDecode::kJson;
  return TarDecode::kRaw;
}

TRAINKIT_INLINE bool store_number(DType t, std::byte* dst, std::size_t k, double v) {
  auto put = [&](auto x) { std::memcpy(dst + k * sizeof(x), &x, sizeof(x)); };
  auto integral = [&](double lo, double hi) {
    return std::isfinite(v) && v == std::floor(v) && v >= lo && v <= hi;
  };
  // An integer dtype, given by a value of its C++ type: false unless v is an integer in [lo, hi].
  auto put_integer = [&](auto zero, double lo, double hi) {
    if (!integral(lo, hi)) return false;
    put(static_cast<decltype(zero)>(v));
    return true;
  };
  switch (t) {
    case DType::kF64: put(v); return true;
    // A finite number that the type cannot hold (1e39 in F32, 70000 in F16) does not fit.
    case DType::kF32: {
      const float x = static_cast<float>(v);
      if (std::isfinite(v) && !std::isfinite(x)) return false;
      put(x);
      return true;
    }
    case DType::kF16: {
      const f16 x(static_cast<float>(v));
      if (std::isfinite(v) && !std::isfinite(static_cast<float>(x))) return false;
      put(x);
      return true;
    }
    case DType::kBF16: {
      const bf16 x(static_cast<float>(v));
      if (std::isfinite(v) && !std::isfinite(static_cast<float>(x))) return false;
      put(x);
      return true;
    }
    case DType::kI64:
      return put_integer(std::int64_t{}, -9223372036854775808.0, 9223372036854774784.0);
    case DType::kI32: return put_integer(std::int32_t{}, -2147483648.0, 2147483647.0);
    case DType::kI16: return put_integer(std::int16_t{}, -32768.0, 32767.0);
    case DType::kI8: return put_integer(std::int8_t{}, -128.0, 127.0);
    case DType::kU64: return put_integer(std::uint64_t{}, 0.0, 18446744073709549568.0);
    case DType::kU32: return put_integer(std::uint32_t{}, 0.0, 4294967295.0);
    case DType::kU16: return put_integer(std::uint16_t{}, 0.0, 65535.0);
    case DType::kU8: return put_integer(std::uint8_t{}, 0.0, 255.0);
    case DType::kBool: return put_integer(std::uint8_t{}, 0.0, 1.0);  // 0 or 1
    default: return false;
  }
}

TRAINKIT_INLINE bool store_integer(DType t, std::byte* dst, long long v) {
  auto put = [&](auto x) {
    // Round trip plus sign: rejects truncation and negative values in unsigned types.
    if (static_cast<long long>(x) != v || (v < 0 && !std::is_signed_v<decltype(x)>)) return false;
    std::memcpy(dst, &x, sizeof(x));
    return true;
  };
  switch (t) {
    case DType::kI64: return put(static_cast<std::int64_t>(v));
    case DType::kI32: return put(static_cast<std::int32_t>(v));
    case DType::kI16: return put(static_cast<std::int16_t>(v));
    case DType::kI8: return put(static_cast<std::int8_t>(v));
    case DType::kU64: return put(static_cast<std::uint64_t>(v));
    case DType::kU32: return put(static_cast<std::uint32_t>(v));
    case DType::kU16: return put(static_cast<std::uint16_t>(v));
    case DType::kU8: return put(static_cast<std::uint8_t>(v));
    default: return store_number(t, dst, 0, static_cast<double>(v));
  }
}

#endif  // TRAINKIT_IMPL

}  // namespace detail

/// Streams WebDataset shards. Satisfies `StreamingDataset`; give it to a Prefetcher, which reads
/// it from one thread. Memory: one shard reader plus `shuffle_buffer` decoded samples.
class TarShardDataset {
 public:
  /// Shards from a pattern such as "data-{000000..000099}.tar" (see expand_shard_pattern).
  TarShardDataset(std::string_view pattern, TarShardOptions options)
      : TarShardDataset(expand_shard_pattern(pattern), std::move(options)) {}

  /// Throws trainkit::Error for no fields, a bad field, fewer shards than ranks, or a bad rank.
  TRAINKIT_INLINE TarShardDataset(std::vector<std::string> shards, TarShardOptions options);

  const std::vector<FieldSpec>& fields() const noexcept { return fields_; }
  const TarShardOptions& options() const noexcept { return o_; }

  /// This rank's shards for `epoch`, in reading order.
  TRAINKIT_INLINE std::vector<std::string> shards_for_epoch(std::uint64_t epoch) const;

  /// Positions the stream at sample `skip` of epoch `epoch` (reading and discarding `skip`
  /// samples: resuming late in a long epoch costs a re-read of its start).
  void start(std::uint64_t epoch, std::uint64_t skip) { (void)position(epoch, skip, nullptr); }

  /// start() for a loader that may be stopped (destroyed, restored elsewhere) while it skips:
  /// `stop` (set from any thread) is checked before each skipped sample and while the shuffle
  /// buffer fills. Returns true once positioned; false when it gave up, with the shard closed,
  /// the buffer freed and next() throwing until the next start().
  bool start(std::uint64_t epoch, std::uint64_t skip, const std::atomic<bool>& stop) {
    return position(epoch, skip, &stop);
  }

  /// Writes the next sample of the epoch; false at its end. Throws trainkit::Error naming the
  /// shard, the key and the member for a missing member, a bad member or a corrupt shard, and
  /// after a start() that was stopped.
  TRAINKIT_INLINE bool next(const SampleRef& out);

  /// What fixes the order of the stream apart from the epoch: the shard count, the seed, the
  /// shuffles and the number of ranks. A Prefetcher saves it with its position and refuses a
  /// position saved under other settings (the same position would hold other samples).
  std::string stream_settings() const {
    return ::trainkit::detail::concat(shards_.size(), " shards, seed ", o_.seed,
                                      ", shuffle_shards ", o_.shuffle_shards ? "on" : "off",
                                      ", shuffle_buffer ", o_.shuffle_buffer, ", world_size ",
                                      o_.world_size);
  }

  /// "tar shard 'x.tar', sample key '000017'": where the last sample was read (the shard alone
  /// before its first sample; the epoch alone before its first shard).
  std::string describe_current() const {
    if (current_shard_.empty())
      return ::trainkit::detail::concat("epoch ", epoch_, " before its first tar shard");
    std::string s = "tar shard '" + current_shard_ + "'";
    if (!current_key_.empty()) s += ", sample key '" + current_key_ + "'";
    return s;
  }

 private:
  TRAINKIT_INLINE std::vector<std::span<std::byte>> spans_of(std::byte* base) const;

  TRAINKIT_INLINE void emit(const std::vector<std::byte>& sample, const SampleRef& out) const;

  /// start(); `stop` (may be null) ends the skip early (see the public overload).
  TRAINKIT_INLINE bool position(std::uint64_t epoch, std::uint64_t skip,
                                const std::atomic<bool>* stop);

  bool stop_requested() const noexcept {
    return skip_stop_ != nullptr && skip_stop_->load(std::memory_order_relaxed);
  }

  [[noreturn]] void fail_member(const std::string& member, const std::string& what) const {
    TRAINKIT_FAIL("tar shard '", current_shard_, "': member '", member, "': ", what);
  }

  /// Reads one whole sample (all declared members of one key) from the shard stream.
  TRAINKIT_INLINE bool read_sample(std::vector<std::byte>& sample);

  /// WebDataset's base_plus_ext: key = path up to the first dot of the basename; ext lowercased.
  /// False for names to skip (no dot, or __metadata__ names).
  TRAINKIT_INLINE static bool split_name(const std::string& name, std::string& key,
                                         std::string& ext);

  TRAINKIT_INLINE void decode(std::size_t k, const std::string& member, std::byte* dst);

  /// A JSON number, or (nested) arrays of numbers, flattened in order into field k.
  TRAINKIT_INLINE void parse_json_numbers(std::size_t k, const std::string& member,
                                          const std::vector<std::byte>& bytes,
                                          std::byte* dst) const;

  std::vector<std::string> shards_;
  TarShardOptions o_;
  std::vector<FieldSpec> fields_;
  std::vector<std::size_t> offsets_;
  std::size_t sample_bytes_ = 0;

  std::uint64_t epoch_ = 0;
  std::vector<std::string> order_;
  std::size_t next_shard_ = 0;
  std::optional<io::TarReader> reader_;
  bool entry_pending_ = false;
  bool exhausted_ = false;
  std::string current_shard_;
  std::string current_key_;
  std::vector<std::vector<std::byte>> buffer_;
  std::vector<std::byte> scratch_;
  PhiloxStream rng_{0};
  const std::atomic<bool>* skip_stop_ = nullptr;  // the stop flag while position() skips
  std::optional<std::uint64_t> stopped_after_;    // samples skipped before a stopped start()
  std::uint64_t skip_ = 0;                        // the skip of the last start()
};

#if TRAINKIT_IMPL

TRAINKIT_INLINE TarShardDataset::TarShardDataset(std::vector<std::string> shards,
                                                 TarShardOptions options)
    : shards_(std::move(shards)), o_(std::move(options)) {
  TRAINKIT_CHECK(!o_.fields.empty(), "TarShardDataset: no fields declared");
  TRAINKIT_CHECK(o_.world_size >= 1 && o_.rank < o_.world_size, "TarShardDataset: rank ", o_.rank,
                 " is not in [0, world_size=", o_.world_size, ")");
  TRAINKIT_CHECK(shards_.size() >= o_.world_size, "TarShardDataset: ", shards_.size(),
                 " shard(s) cannot feed ", o_.world_size, " ranks (each rank reads whole shards)");
  std::size_t offset = 0;
  for (TarField& f : o_.fields) {
    TRAINKIT_CHECK(!f.ext.empty(), "TarShardDataset: field '", f.name, "' has no extension");
    std::transform(f.ext.begin(), f.ext.end(), f.ext.begin(),
                   [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
    if (f.name.empty()) f.name = f.ext;
    for (std::size_t k = 0; k < fields_.size(); ++k) {
      TRAINKIT_CHECK(fields_[k].name != f.name, "TarShardDataset: field '", f.name,
                     "' declared twice");
      TRAINKIT_CHECK(o_.fields[k].ext != f.ext, "TarShardDataset: fields '", fields_[k].name,
                     "' and '", f.name, "' both take the member '.", f.ext,
                     "' (a member fills one field)");
    }
    FieldSpec spec{f.name, f.dtype, f.shape};
    std::size_t bytes = dtype_size(f.dtype);
    for (std::int64_t d : f.shape) {
      TRAINKIT_CHECK(d >= 0, "TarShardDataset: field '", f.name, "' has a negative extent ", d);
      bytes = checked_mul(bytes, static_cast<std::size_t>(d), "TarShardDataset: field '", f.name,
                          "' (", dtype_name(f.dtype), ") bytes per sample");
    }
    // Strides and batch sizes are int64 products of these extents: keep them representable.
    TRAINKIT_CHECK(bytes <= static_cast<std::size_t>(std::numeric_limits<std::int64_t>::max()),
                   "TarShardDataset: field '", f.name, "' of ", bytes,
                   " bytes per sample is too large");
    const auto kind = detail::tar_decode_kind(f.ext);
    TRAINKIT_CHECK(kind != detail::TarDecode::kInteger || spec.numel() == 1,
                   "TarShardDataset: field '", f.name, "' (.", f.ext,
                   ") holds one integer per sample; its shape must be scalar");
    offsets_.push_back(offset);
    offset = checked_add(offset, bytes, "TarShardDataset: bytes per sample of all fields");
    fields_.push_back(std::move(spec));
  }
  sample_bytes_ = offset;
  start(0, 0);
}

TRAINKIT_INLINE std::vector<std::string> TarShardDataset::shards_for_epoch(
    std::uint64_t epoch) const {
  std::vector<std::string> out;
  std::vector<std::int64_t> order;
  if (o_.shuffle_shards) {
    order = torch_randperm(static_cast<std::int64_t>(shards_.size()), o_.seed + epoch);
  } else {
    for (std::size_t k = 0; k < shards_.size(); ++k) order.push_back(static_cast<std::int64_t>(k));
  }
  for (std::size_t k = o_.rank; k < order.size(); k += o_.world_size)
    out.push_back(shards_[static_cast<std::size_t>(order[k])]);
  return out;
}

TRAINKIT_INLINE bool TarShardDataset::position(std::uint64_t epoch, std::uint64_t skip,
                                               const std::atomic<bool>* stop) {
  epoch_ = epoch;
  skip_ = skip;
  stopped_after_.reset();
  // An error before the epoch's first read names the epoch, not the last epoch's sample.
  current_shard_.clear();
  current_key_.clear();
  order_ = shards_for_epoch(epoch);
  next_shard_ = 0;
  reader_.reset();
  entry_pending_ = false;
  buffer_.clear();
  exhausted_ = false;
  rng_ = PhiloxStream(o_.seed, rng_stream_id(static_cast<std::uint32_t>(epoch),
                                             static_cast<std::uint32_t>(o_.rank)));
  std::vector<std::byte> scratch(sample_bytes_);
  std::vector<std::span<std::byte>> spans = spans_of(scratch.data());
  const SampleRef out(spans);
  // next() sees the flag too (a large shuffle buffer fills in one call); cleared on every exit.
  struct Clear {
    const std::atomic<bool>*& flag;
    ~Clear() { flag = nullptr; }
  } clear{skip_stop_};
  skip_stop_ = stop;
  for (std::uint64_t k = 0; k < skip; ++k) {
    const bool more = !stop_requested() && next(out);
    if (stop_requested()) {
      stopped_after_ = k + (more ? 1 : 0);
      reader_.reset();
      entry_pending_ = false;
      buffer_.clear();
      buffer_.shrink_to_fit();
      return false;
    }
    TRAINKIT_CHECK(more, "TarShardDataset: cannot skip to sample ", skip, " of epoch ", epoch,
                   ": the epoch has only ", k, " samples on rank ", o_.rank);
  }
  return true;
}

TRAINKIT_INLINE bool TarShardDataset::next(const SampleRef& out) {
  TRAINKIT_CHECK(!stopped_after_, "TarShardDataset: start(epoch ", epoch_, ", skip ", skip_,
                 ") was stopped after ", stopped_after_.value_or(0),
                 " samples; call start() again before next()");
  if (o_.shuffle_buffer == 0) {
    if (!read_sample(scratch_)) return false;
    emit(scratch_, out);
    return true;
  }
  while (!exhausted_ && buffer_.size() < o_.shuffle_buffer && !stop_requested()) {
    std::vector<std::byte> s;
    if (!read_sample(s)) break;
    buffer_.push_back(std::move(s));
  }
  if (buffer_.empty()) return false;
  const std::size_t k = rng_.next_u32() % buffer_.size();
  emit(buffer_[k], out);
  if (exhausted_ || !read_sample(buffer_[k])) {
    buffer_[k] = std::move(buffer_.back());
    buffer_.pop_back();
  }
  return true;
}

TRAINKIT_INLINE std::vector<std::span<std::byte>> TarShardDataset::spans_of(std::byte* base) const {
  std::vector<std::span<std::byte>> spans;
  for (std::size_t k = 0; k < fields_.size(); ++k)
    spans.emplace_back(base + offsets_[k], fields_[k].bytes());
  return spans;
}

TRAINKIT_INLINE void TarShardDataset::emit(const std::vector<std::byte>& sample,
                                           const SampleRef& out) const {
  TRAINKIT_CHECK(out.size() == fields_.size(), "TarShardDataset: destination has ", out.size(),
                 " fields, expected ", fields_.size());
  for (std::size_t k = 0; k < fields_.size(); ++k) {
    TRAINKIT_CHECK(out[k].size() == fields_[k].bytes(), "TarShardDataset: destination for '",
                   fields_[k].name, "' has ", out[k].size(), " bytes, expected ",
                   fields_[k].bytes());
    if (!out[k].empty()) std::memcpy(out[k].data(), sample.data() + offsets_[k], out[k].size());
  }
}

TRAINKIT_INLINE bool TarShardDataset::read_sample(std::vector<std::byte>& sample) {
  if (exhausted_) return false;
  sample.assign(sample_bytes_, std::byte{0});
  std::vector<char> present(fields_.size(), 0);
  std::vector<std::string> seen_exts;
  std::string key;
  for (;;) {
    if (!reader_) {
      if (!key.empty()) break;  // a sample never spans two shards
      if (next_shard_ == order_.size()) {
        exhausted_ = true;
        return false;
      }
      current_shard_ = order_[next_shard_++];
      current_key_.clear();  // the last key was the previous shard's
      reader_.emplace(io::TarReader::open(
          current_shard_, io::TarReaderOptions{.max_member_bytes = o_.max_member_bytes}));
      entry_pending_ = false;
    }
    if (!entry_pending_) {
      if (!reader_->next()) {
        reader_.reset();
        continue;
      }
      entry_pending_ = true;
    }
    const io::TarEntry& e = reader_->entry();
    std::string member_key, ext;
    if (!e.is_file() || !split_name(e.name, member_key, ext)) {
      entry_pending_ = false;  // directories, links, metadata, names without a dot
      continue;
    }
    if (!key.empty() && member_key != key) break;  // it starts the next sample: keep it pending
    if (key.empty()) {
      key = member_key;
      current_key_ = key;
    }
    entry_pending_ = false;
    if (std::find(seen_exts.begin(), seen_exts.end(), ext) != seen_exts.end())
      fail_member(e.name, "extension '." + ext + "' appears twice in sample '" + key + "'");
    seen_exts.push_back(ext);
    for (std::size_t k = 0; k < fields_.size(); ++k) {
      if (o_.fields[k].ext != ext) continue;
      decode(k, e.name, sample.data() + offsets_[k]);
      present[k] = 1;
    }
  }
  for (std::size_t k = 0; k < fields_.size(); ++k) {
    if (present[k]) continue;
    std::string have;
    for (const std::string& x : seen_exts) have += (have.empty() ? "." : ", .") + x;
    TRAINKIT_FAIL("tar shard '", current_shard_, "': sample '", key, "' has no member '.",
                  o_.fields[k].ext, "' for field '", fields_[k].name,
                  "' (members: ", have.empty() ? "none" : have, ")");
  }
  return true;
}

TRAINKIT_INLINE bool TarShardDataset::split_name(const std::string& name, std::string& key,
                                                 std::string& ext) {
  const std::size_t slash = name.rfind('/');
  const std::size_t base = slash == std::string::npos ? 0 : slash + 1;
  if (name.compare(base, 2, "__") == 0) {
    const std::size_t close = name.find("__", base + 2);
    if (close != std::string::npos && close + 2 == name.size()) return false;
  }
  const std::size_t dot = name.find('.', base);
  if (dot == std::string::npos || dot == base) return false;
  key = name.substr(0, dot);
  ext = name.substr(dot + 1);
  if (ext.empty()) return false;
  std::transform(ext.begin(), ext.end(), ext.begin(),
                 [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
  return true;
}

TRAINKIT_INLINE void TarShardDataset::decode(std::size_t k, const std::string& member,
                                             std::byte* dst) {
  const FieldSpec& f = fields_[k];
  const std::size_t want = f.bytes();
  const std::uint64_t size = reader_->entry().size;
  switch (detail::tar_decode_kind(o_.fields[k].ext)) {
    case detail::TarDecode::kNpy: {
      // A .npy of this field is its header (at most 12 + kNpyMaxHeaderBytes) plus `want`.
      const std::uint64_t most = std::uint64_t{12} + io::kNpyMaxHeaderBytes + want;
      if (size > most)
        fail_member(member,
                    ::trainkit::detail::concat(size, " bytes, more than a .npy of field '", f.name,
                                               "' (", dtype_name(f.dtype), ", ", want,
                                               " data bytes) can hold (at most ", most, ")"));
      const std::vector<std::byte> bytes = reader_->read_data();
      const std::string where = current_shard_ + ":" + member;
      const io::NpyHeader h = io::parse_npy_header(bytes, where);
      io::check_npy_size(h, bytes.size(), where);
      io::check_npy_bools(h, std::span(bytes).subspan(h.data_offset), where);
      std::size_t numel = 1;
      for (std::int64_t d : f.shape) numel *= static_cast<std::size_t>(d);
      if (h.dtype != f.dtype || h.numel != numel) {
        fail_member(member, ::trainkit::detail::concat("holds ", dtype_name(h.dtype), " ",
                                                       io::shape_string(h), " but field '", f.name,
                                                       "' expects ", dtype_name(f.dtype), " with ",
                                                       numel, " elements"));
      }
      if (want > 0) std::memcpy(dst, bytes.data() + h.data_offset, want);
      return;
    }
    case detail::TarDecode::kInteger: {
      if (size > 64) fail_member(member, "a class label longer than 64 bytes");
      const std::vector<std::byte> bytes = reader_->read_data();
      std::string_view text(reinterpret_cast<const char*>(bytes.data()), bytes.size());
      while (!text.empty() && std::isspace(static_cast<unsigned char>(text.back())))
        text.remove_suffix(1);
      while (!text.empty() && std::isspace(static_cast<unsigned char>(text.front())))
        text.remove_prefix(1);
      long long v = 0;
      const auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), v);
      if (ec != std::errc() || end != text.data() + text.size() || text.empty())
        fail_member(member, "'" + std::string(text.substr(0, 32)) + "' is not a decimal integer");
      if (!detail::store_integer(f.dtype, dst, v))
        fail_member(member, ::trainkit::detail::concat("label ", v, " does not fit field '", f.name,
                                                       "' (", dtype_name(f.dtype), ")"));
      return;
    }
    case detail::TarDecode::kJson:
      if (f.dtype != DType::kU8) {
        if (size > (std::uint64_t{1} << 26)) fail_member(member, "JSON member larger than 64 MiB");
        const std::vector<std::byte> bytes = reader_->read_data();
        parse_json_numbers(k, member, bytes, dst);
        return;
      }
      [[fallthrough]];
    case detail::TarDecode::kRaw: {
      if (size > want || (size < want && !o_.fields[k].pad)) {
        fail_member(member,
                    ::trainkit::detail::concat(
                        size, " bytes, but field '", f.name, "' (", dtype_name(f.dtype), ", ", want,
                        " bytes per sample) needs exactly ", want,
                        size < want ? " (set pad = true to zero-pad shorter members)" : ""));
      }
      reader_->read(std::span<std::byte>(dst, static_cast<std::size_t>(size)));
      return;
    }
  }
}

TRAINKIT_INLINE void TarShardDataset::parse_json_numbers(std::size_t k, const std::string& member,
                                                         const std::vector<std::byte>& bytes,
                                                         std::byte* dst) const {
  const FieldSpec& f = fields_[k];
  const std::size_t numel = f.numel();
  const char* p = reinterpret_cast<const char*>(bytes.data());
  const char* end = p + bytes.size();
  std::size_t count = 0;
  int depth = 0;
  // What may come next: a value (at the start, after a comma), a value or ']' (after '['), a
  // comma or ']' (after a value in an array), nothing (after the top-level value). Anything
  // else ("[1,,2]", "[1,2,]", "[1][2]") stops the scan and is reported below.
  enum class Next { kValue, kValueOrClose, kCommaOrClose, kEnd } next = Next::kValue;
  for (; p < end; ++p) {
    const char c = *p;
    if (c == ' ' || c == '\t' || c == '\n' || c == '\r') continue;
    const bool value_ok = next == Next::kValue || next == Next::kValueOrClose;
    if (c == '[') {
      if (!value_ok) break;
      if (++depth > 32) fail_member(member, "JSON nested deeper than 32 arrays");
      next = Next::kValueOrClose;
      continue;
    }
    if (c == ']') {
      if (next != Next::kValueOrClose && next != Next::kCommaOrClose) break;
      next = --depth == 0 ? Next::kEnd : Next::kCommaOrClose;
      continue;
    }
    if (c == ',') {
      if (next != Next::kCommaOrClose) break;
      next = Next::kValue;
      continue;
    }
    if (!value_ok) break;
    double v = 0;
    if (end - p >= 4 && std::memcmp(p, "true", 4) == 0) {
      v = 1;
      p += 3;
    } else if (end - p >= 5 && std::memcmp(p, "false", 5) == 0) {
      p += 4;
    } else {
      const auto [next, ec] = std::from_chars(p, end, v);
      if (ec != std::errc()) break;
      p = next - 1;
    }
    if (count >= numel)
      fail_member(member, ::trainkit::detail::concat("more than the ", numel, " numbers field '",
                                                     f.name, "' holds"));
    if (!detail::store_number(f.dtype, dst, count, v))
      fail_member(member, ::trainkit::detail::concat("value ", v, " does not fit field '", f.name,
                                                     "' (", dtype_name(f.dtype), ")"));
    ++count;
    next = depth == 0 ? Next::kEnd : Next::kCommaOrClose;
  }
  if (p != end || next != Next::kEnd) {
    fail_member(member, ::trainkit::detail::concat("not a number or an array of numbers (byte ",
                                                   p - reinterpret_cast<const char*>(bytes.data()),
                                                   "); to keep raw JSON text declare field '",
                                                   f.name, "' as U8 with pad = true"));
  }
  if (count != numel)
    fail_member(member, ::trainkit::detail::concat(count, " numbers, but field '", f.name,
                                                   "' holds ", numel));
}

#endif  // TRAINKIT_IMPL

}  // namespace data
TRAINKIT_NAMESPACE_END
