// SPDX-License-Identifier: MIT
// trainkit/io/tar.hpp: a streaming tar reader (POSIX ustar, pax `x`/`g` extended headers, GNU
// `L`/`K` long names, GNU base-256 sizes, old v7 headers) and a small ustar/pax writer. Built for
// WebDataset shards: members are visited front to back and their data read or skipped without
// seeking back. The reader treats its input as hostile (it is fuzzed): every length is checked,
// and a truncated or corrupt archive gets a trainkit::Error naming the archive and the offset.
// Memory is bounded by the input: a member's data is never allocated beyond the bytes the source
// still holds (files and memory know their size; other sources are read in growing chunks), nor
// beyond TarReaderOptions::max_member_bytes, and an allocation failure is a trainkit::Error.
#pragma once

#include <algorithm>
#include <array>
#include <cerrno>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <exception>
#include <filesystem>
#include <limits>
#include <memory>
#include <new>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include <sys/stat.h>
#include <sys/types.h>

#include "trainkit/config.hpp"
#include "trainkit/core/checked.hpp"
#include "trainkit/error.hpp"
#include "trainkit/io/atomic_file.hpp"

TRAINKIT_NAMESPACE_BEGIN
namespace io {

/// Where a TarReader gets its bytes. read() returns fewer than `n` bytes only at the end of the
/// input; skip() returns how many bytes it actually skipped (fewer only at the end); available()
/// says how many bytes are left when the source knows (a file, memory), std::nullopt when it
/// cannot (a pipe, a decompressor): readers use it to refuse declared sizes that cannot be there
/// before allocating for them.
class ByteSource {
 public:
  virtual ~ByteSource() = default;
  virtual std::size_t read(void* dst, std::size_t n) = 0;
  virtual std::optional<std::uint64_t> available() const { return std::nullopt; }
  TRAINKIT_INLINE virtual std::uint64_t skip(std::uint64_t n);
};

/// A ByteSource over memory the caller keeps alive (tests, fuzzing, archives already in RAM).
class MemorySource final : public ByteSource {
 public:
  explicit MemorySource(std::span<const std::byte> bytes) noexcept : bytes_(bytes) {}
  TRAINKIT_INLINE std::size_t read(void* dst, std::size_t n) override;
  TRAINKIT_INLINE std::uint64_t skip(std::uint64_t n) override;
  std::optional<std::uint64_t> available() const override { return bytes_.size() - pos_; }

 private:
  std::span<const std::byte> bytes_;
  std::size_t pos_ = 0;
};

/// A buffered ByteSource over a file; skip() seeks instead of reading. A regular file knows its
/// size (available()); its buffer is no larger than the file.
class FileSource final : public ByteSource {
 public:
  /// Opens `path` for reading. Throws trainkit::Error naming the file when it cannot.
  TRAINKIT_INLINE explicit FileSource(const std::filesystem::path& path,
                                      std::size_t buffer_bytes = 1 << 20);
  FileSource(const FileSource&) = delete;
  FileSource& operator=(const FileSource&) = delete;
  ~FileSource() override {
    if (file_ != nullptr) std::fclose(file_);
  }

  TRAINKIT_INLINE std::size_t read(void* dst, std::size_t n) override;
  TRAINKIT_INLINE std::uint64_t skip(std::uint64_t n) override;
  std::optional<std::uint64_t> available() const override {
    if (!regular_) return std::nullopt;
    return size_ > pos_ ? size_ - pos_ : 0;
  }

 private:
  std::string path_;
  std::vector<char> buffer_;
  std::FILE* file_ = nullptr;
  std::uint64_t size_ = 0;
  std::uint64_t pos_ = 0;
  bool regular_ = false;
};

/// One archive member as a reader sees it, after pax and GNU headers were applied.
struct TarEntry {
  std::string name;        ///< full path: pax `path`, else GNU `L`, else ustar prefix + "/" + name
  std::string linkname;    ///< for links: pax `linkpath`, else GNU `K`, else the header field
  char type = '0';         ///< ustar typeflag ('0' file, '5' directory, '2' symlink, ...)
  std::uint64_t size = 0;  ///< data bytes (pax `size` overrides the header)
  std::uint64_t mode = 0;
  std::uint64_t mtime = 0;   ///< whole seconds (pax fractions are dropped; before 1970 reads as 0)
  std::uint64_t offset = 0;  ///< byte offset of this member's ustar header in the archive

  /// True for regular files (typeflag '0', '\0' or the contiguous-file '7'). A '\0' member whose
  /// name ends in '/' is an old-style directory and reads as type '5', as in Python's tarfile.
  /// Sparse files (GNU tar --sparse, old GNU or pax form) read as type 'S', under their real
  /// name; their data is stored as a map and pieces, which this reader does not expand.
  bool is_file() const noexcept { return type == '0' || type == '\0' || type == '7'; }
};

/// Extended headers and GNU long names larger than this are refused (they are metadata: a huge
/// one means a corrupt archive, and refusing avoids an attacker-chosen allocation).
inline constexpr std::uint64_t kTarMaxMetaBytes = 1 << 20;

struct TarReaderOptions {
  /// read_data() refuses members larger than this (bytes): a sane cap on what one member may
  /// make the reader allocate. read() into the caller's buffer and skipping are not limited.
  std::uint64_t max_member_bytes = std::uint64_t{1} << 30;
};

/// Streams the members of a tar archive in order. Usage:
/// ```
/// io::TarReader tar = io::TarReader::open("shard-000000.tar");
/// while (tar.next()) if (tar.entry().is_file()) { auto bytes = tar.read_data(); ... }
/// ```
/// Data that is not read is skipped by the next next(). Not thread-safe (one reader per thread).
class TarReader {
 public:
  /// Reads from `source`; `name` identifies the archive in error messages.
  TarReader(std::unique_ptr<ByteSource> source, std::string name, TarReaderOptions options = {})
      : source_(std::move(source)), name_(std::move(name)), options_(options) {}

  /// Opens an archive file (buffered, seeking over skipped data).
  static TarReader open(const std::filesystem::path& path, TarReaderOptions options = {}) {
    return TarReader(std::make_unique<FileSource>(path), path.string(), options);
  }
  /// Reads an archive held in memory that outlives the reader.
  static TarReader from_memory(std::span<const std::byte> bytes, std::string name,
                               TarReaderOptions options = {}) {
    return TarReader(std::make_unique<MemorySource>(bytes), std::move(name), options);
  }

  const TarReaderOptions& options() const noexcept { return options_; }

  /// Advances to the next member, skipping whatever data of the current one was not read.
  /// Returns false at the end of the archive (a zero block, or the input ending cleanly on a
  /// header boundary). Throws trainkit::Error for a truncated or corrupt archive.
  TRAINKIT_INLINE bool next();

  /// The current member (valid after next() returned true).
  const TarEntry& entry() const noexcept { return entry_; }
  /// The archive's name, as given.
  const std::string& name() const noexcept { return name_; }
  /// Bytes of the current member's data not read yet.
  std::uint64_t remaining() const noexcept { return remaining_; }

  /// Reads the next `out.size()` bytes of the current member's data. Throws when the member has
  /// fewer bytes left, or the archive ends inside them (truncated).
  TRAINKIT_INLINE void read(std::span<std::byte> out);

  /// Reads all remaining data of the current member. Throws trainkit::Error, before allocating,
  /// when the source knows it holds fewer bytes (truncated) or the member is larger than
  /// options().max_member_bytes; sources of unknown size are read in growing chunks, so memory
  /// never runs far ahead of the bytes actually there. Allocation failure is an Error too.
  TRAINKIT_INLINE std::vector<std::byte> read_data();

 private:
  struct Pax {
    bool has_path = false, has_linkpath = false, has_size = false, has_mtime = false;
    bool sparse = false, has_sparse_name = false;  // GNU.sparse.* records (GNU tar --sparse)
    std::string path, linkpath, sparse_name;
    std::uint64_t size = 0, mtime = 0;
  };
  struct PendingMeta {
    bool any = false;
    Pax pax;
    bool has_long_name = false, has_long_link = false;
    std::string long_name, long_link;
  };

  [[noreturn]] void fail(std::uint64_t offset, const std::string& what) const {
    TRAINKIT_FAIL("tar archive '", name_, "': ", what, " (header at byte offset ", offset, ")");
  }

  [[noreturn]] void truncated_member() const {
    fail(entry_.offset, ::trainkit::detail::concat(
                            "truncated: member '", entry_.name, "' declares ", entry_.size,
                            " bytes but the archive ends after ", entry_.size - remaining_));
  }

  static std::uint64_t pad(std::uint64_t size) noexcept { return (512 - size % 512) % 512; }

  TRAINKIT_INLINE void finish_member();

  TRAINKIT_INLINE std::string read_meta(std::size_t size, std::uint64_t header_offset);

  TRAINKIT_INLINE void verify_checksum(const std::array<unsigned char, 512>& b,
                                       std::uint64_t offset) const;

  /// An octal field (spaces/NULs around it allowed) or GNU base-256 (first byte & 0x80).
  TRAINKIT_INLINE std::uint64_t number(const std::array<unsigned char, 512>& b, std::size_t off,
                                       std::size_t len, const char* field,
                                       std::uint64_t offset) const;

  TRAINKIT_INLINE static std::string text(const std::array<unsigned char, 512>& b, std::size_t off,
                                          std::size_t len);

  /// Parses "<len> <key>=<value>\n" records into `pax`.
  TRAINKIT_INLINE void parse_pax(const std::string& data, Pax& pax, std::uint64_t offset) const;

  TRAINKIT_INLINE std::uint64_t pax_number(std::string_view v, const char* key,
                                           std::uint64_t offset) const;

  TRAINKIT_INLINE void build_entry(const std::array<unsigned char, 512>& b, std::uint64_t offset,
                                   std::uint64_t size, const PendingMeta& meta);

  // (A member list: it shares only its shape with other classes' lists.)
  std::unique_ptr<ByteSource> source_;
  std::string name_;
  TarReaderOptions options_;
  TarEntry entry_;
  Pax global_;
  std::uint64_t pos_ = 0;
  std::uint64_t remaining_ = 0;
  std::uint64_t padding_ = 0;
  bool done_ = false;
};

namespace detail {
/// The 512-byte blocks TarWriter writes ahead of a member's data: the pax `x` header and its
/// records when one is needed (see TarWriter), then the ustar header of a regular file.
TRAINKIT_INLINE std::string tar_member_header(std::string_view name, std::uint64_t size,
                                              std::uint64_t mtime);
}  // namespace detail

/// Writes a tar archive the way Python's tarfile does with format=PAX_FORMAT (byte for byte):
/// ustar headers, plus a pax `x` header ahead of a member whose name is longer than 100 bytes or
/// not ASCII (`path`), or whose size or mtime does not fit ustar's 11 octal digits (`size`,
/// `mtime`: 8 GiB and more, after the year 2242); ends with two zero blocks padded to a 10240-byte
/// record. Enough to write WebDataset shards from C++ (tests, converters).
///
/// The archive is written beside `path` (io::AtomicFile) and replaces it only when close()
/// succeeds, so a failed write (disk full, RLIMIT_FSIZE) or an exception between add() calls
/// leaves the file that was at `path` as it was, and a reader never sees half an archive.
class TarWriter {
 public:
  /// Starts an archive that will replace `path`. Throws trainkit::Error naming the file when it
  /// cannot be created (missing directory, permissions).
  explicit TarWriter(const std::filesystem::path& path, AtomicFileOptions options = {})
      : file_(path, options), unwinding_(std::uncaught_exceptions()) {}
  TarWriter(const TarWriter&) = delete;
  TarWriter& operator=(const TarWriter&) = delete;
  /// Closes the archive if close() was not called (errors are swallowed: call close() to see
  /// them), except while an exception unwinds the scope: then the archive is dropped and `path`
  /// keeps what it held.
  TRAINKIT_INLINE ~TarWriter();

  /// Appends a regular file `name` (mode 0444, modified at `mtime` seconds since the epoch) with
  /// `data`. Throws trainkit::Error naming the archive when the write fails; the archive is then
  /// dropped.
  TRAINKIT_INLINE void add(std::string_view name, std::span<const std::byte> data,
                           std::uint64_t mtime = 0);
  void add(std::string_view name, std::string_view data, std::uint64_t mtime = 0) {
    add(name, std::as_bytes(std::span<const char>(data.data(), data.size())), mtime);
  }

  /// Writes the end-of-archive blocks and renames the archive over `path`. Throws on I/O
  /// failure (the file at `path` is then as it was).
  TRAINKIT_INLINE void close();

 private:
  void write(const std::byte* p, std::size_t n) { file_.write(p, n); }
  void write_padded(const std::byte* p, std::size_t n) {
    write(p, n);
    const std::array<std::byte, 512> zeros{};
    write(zeros.data(), (512 - n % 512) % 512);
  }

  AtomicFile file_;
  int unwinding_;
  bool closed_ = false;
};

#if TRAINKIT_IMPL

TRAINKIT_INLINE std::uint64_t ByteSource::skip(std::uint64_t n) {
  std::array<unsigned char, 4096> sink{};
  std::uint64_t done = 0;
  while (done < n) {
    const std::size_t want =
        static_cast<std::size_t>(std::min<std::uint64_t>(sink.size(), n - done));
    const std::size_t got = read(sink.data(), want);
    done += got;
    if (got < want) break;
  }
  return done;
}

TRAINKIT_INLINE std::size_t MemorySource::read(void* dst, std::size_t n) {
  const std::size_t k = std::min(n, bytes_.size() - pos_);
  if (k > 0) std::memcpy(dst, bytes_.data() + pos_, k);
  pos_ += k;
  return k;
}

TRAINKIT_INLINE std::uint64_t MemorySource::skip(std::uint64_t n) {
  const std::size_t k = static_cast<std::size_t>(std::min<std::uint64_t>(n, bytes_.size() - pos_));
  pos_ += k;
  return k;
}

TRAINKIT_INLINE FileSource::FileSource(const std::filesystem::path& path, std::size_t buffer_bytes)
    : path_(path.string()) {
  file_ = std::fopen(path_.c_str(), "rb");
  TRAINKIT_CHECK(file_ != nullptr, "cannot open '", path_, "': ", std::strerror(errno));
  struct stat st {};
  if (::fstat(::fileno(file_), &st) == 0 && S_ISREG(st.st_mode)) {
    size_ = static_cast<std::uint64_t>(st.st_size);
    regular_ = true;
    // A small file needs no 1 MiB buffer: round its size up to a page.
    buffer_bytes = static_cast<std::size_t>(
        std::min<std::uint64_t>(buffer_bytes, (size_ + 4095) / 4096 * 4096));
  }
  try {
    buffer_.resize(buffer_bytes);
  } catch (const std::bad_alloc&) {
    std::fclose(file_);
    TRAINKIT_FAIL("cannot allocate a ", buffer_bytes, "-byte read buffer for '", path_, "'");
  }
  if (!buffer_.empty()) std::setvbuf(file_, buffer_.data(), _IOFBF, buffer_.size());
}

TRAINKIT_INLINE std::size_t FileSource::read(void* dst, std::size_t n) {
  const std::size_t got = std::fread(dst, 1, n, file_);
  TRAINKIT_CHECK(got == n || !std::ferror(file_), "read error in '", path_,
                 "': ", std::strerror(errno));
  pos_ += got;
  return got;
}

TRAINKIT_INLINE std::uint64_t FileSource::skip(std::uint64_t n) {
  if (!regular_) return ByteSource::skip(n);  // a pipe or device: no size, no seeking
  const std::uint64_t k = std::min<std::uint64_t>(n, size_ > pos_ ? size_ - pos_ : 0);
  if (k > 0 && k <= static_cast<std::uint64_t>(std::numeric_limits<long>::max()) &&
      ::fseeko(file_, static_cast<off_t>(k), SEEK_CUR) == 0) {
    pos_ += k;
    return k;
  }
  return ByteSource::skip(k);
}

TRAINKIT_INLINE bool TarReader::next() {
  if (done_) return false;
  finish_member();
  PendingMeta meta;
  for (;;) {
    const std::uint64_t header_offset = pos_;
    std::array<unsigned char, 512> block{};
    const std::size_t got = source_->read(block.data(), block.size());
    pos_ += got;
    if (got == 0 && !meta.any) {
      done_ = true;  // no end-of-archive blocks: tolerated, as Python's tarfile does
      return false;
    }
    if (got < block.size()) {
      fail(header_offset, ::trainkit::detail::concat(
                              "truncated: the archive ends ", got, " bytes into a 512-byte ",
                              meta.any ? "header after an extended header" : "header"));
    }
    if (header_offset == 0 && block[0] == 0x1f && block[1] == 0x8b) {
      fail(0,
           "gzip-compressed archive: decompress it first (gunzip); .tar.gz is not read directly");
    }
    if (std::all_of(block.begin(), block.end(), [](unsigned char c) { return c == 0; })) {
      if (meta.any) fail(header_offset, "end-of-archive block right after an extended header");
      done_ = true;
      return false;
    }
    verify_checksum(block, header_offset);
    const char type = static_cast<char>(block[156]);
    const std::uint64_t size = number(block, 124, 12, "size", header_offset);
    if (type == 'x' || type == 'g' || type == 'L' || type == 'K') {
      if (size > kTarMaxMetaBytes) {
        fail(header_offset,
             ::trainkit::detail::concat("extended header of ", size, " bytes exceeds the ",
                                        kTarMaxMetaBytes, "-byte limit"));
      }
      std::string data = read_meta(static_cast<std::size_t>(size), header_offset);
      if (type == 'x') {
        parse_pax(data, meta.pax, header_offset);
      } else if (type == 'g') {
        parse_pax(data, global_, header_offset);
      } else {
        // GNU long name/link: NUL-terminated text; the next header's field is truncated.
        const std::size_t end = data.find('\0');
        if (end != std::string::npos) data.resize(end);
        (type == 'L' ? meta.long_name : meta.long_link) = std::move(data);
        (type == 'L' ? meta.has_long_name : meta.has_long_link) = true;
      }
      meta.any = true;
      continue;
    }
    build_entry(block, header_offset, size, meta);
    remaining_ = entry_.size;
    padding_ = pad(entry_.size);
    return true;
  }
}

TRAINKIT_INLINE void TarReader::read(std::span<std::byte> out) {
  if (out.size() > remaining_) {
    fail(entry_.offset, ::trainkit::detail::concat("member '", entry_.name, "' has ", remaining_,
                                                   " bytes left, ", out.size(), " requested"));
  }
  const std::size_t got = source_->read(out.data(), out.size());
  pos_ += got;
  remaining_ -= got;
  if (got < out.size()) truncated_member();
}

TRAINKIT_INLINE std::vector<std::byte> TarReader::read_data() {
  const std::uint64_t want = remaining_;
  const std::optional<std::uint64_t> avail = source_->available();
  if (avail && *avail < want) {
    fail(entry_.offset, ::trainkit::detail::concat(
                            "truncated: member '", entry_.name, "' declares ", entry_.size,
                            " bytes but the archive ends after ", entry_.size - want + *avail));
  }
  if (want > options_.max_member_bytes) {
    fail(entry_.offset,
         ::trainkit::detail::concat("member '", entry_.name, "' has ", want,
                                    " bytes, above max_member_bytes = ", options_.max_member_bytes,
                                    " (raise TarReaderOptions::max_member_bytes, "
                                    "or TarShardOptions::max_member_bytes, to read it)"));
  }
  const std::optional<std::size_t> n = checked_cast<std::size_t>(want);
  if (!n)
    fail(entry_.offset, ::trainkit::detail::concat("member '", entry_.name, "' of ", want,
                                                   " bytes does not fit in memory"));
  std::vector<std::byte> out;
  try {
    if (avail) {
      out.resize(*n);
      read(out);
      return out;
    }
    constexpr std::size_t kFirstChunk = 64 << 10;
    while (remaining_ > 0) {
      const std::size_t have = out.size();
      const std::size_t chunk = static_cast<std::size_t>(
          std::min<std::uint64_t>(remaining_, std::max(kFirstChunk, have)));
      out.resize(have + chunk);
      read(std::span<std::byte>(out.data() + have, chunk));
    }
  } catch (const std::bad_alloc&) {
    fail(entry_.offset,
         ::trainkit::detail::concat("cannot allocate ", want, " bytes to read member '",
                                    entry_.name, "' (out of memory)"));
  }
  return out;
}

TRAINKIT_INLINE void TarReader::finish_member() {
  // remaining_ + padding_ overflows only for a declared size no archive can hold.
  const std::uint64_t want = checked_add(remaining_, padding_).value_or(remaining_);
  if (want == 0) return;
  const std::uint64_t got = source_->skip(want);
  pos_ += got;
  if (got < remaining_) {
    remaining_ -= got;
    truncated_member();
  }
  if (got < want) {
    fail(entry_.offset, ::trainkit::detail::concat("truncated: the archive ends inside the ",
                                                   "padding after member '", entry_.name, "'"));
  }
  remaining_ = 0;
  padding_ = 0;
}

TRAINKIT_INLINE std::string TarReader::read_meta(std::size_t size, std::uint64_t header_offset) {
  const std::optional<std::uint64_t> avail = source_->available();
  if (avail && *avail < size) {
    fail(header_offset, ::trainkit::detail::concat("truncated: an extended header declares ", size,
                                                   " bytes but the archive ends after ", *avail));
  }
  std::string data(size, '\0');
  const std::size_t got = source_->read(data.data(), size);
  pos_ += got;
  const std::uint64_t padding = pad(size);
  const std::uint64_t skipped = got == size ? source_->skip(padding) : 0;
  pos_ += skipped;
  if (got < size || skipped < padding)
    fail(header_offset, "truncated: the archive ends inside an extended header");
  return data;
}

TRAINKIT_INLINE void TarReader::verify_checksum(const std::array<unsigned char, 512>& b,
                                                std::uint64_t offset) const {
  const std::uint64_t stored = number(b, 148, 8, "checksum", offset);
  std::uint64_t unsigned_sum = 0;
  std::int64_t signed_sum = 0;
  for (std::size_t i = 0; i < 512; ++i) {
    const unsigned char c = (i >= 148 && i < 156) ? ' ' : b[i];
    unsigned_sum += c;
    signed_sum += static_cast<signed char>(c);
  }
  // Like Python's tarfile, accept the signed sum some historic tars wrote.
  if (stored != unsigned_sum && static_cast<std::int64_t>(stored) != signed_sum) {
    fail(offset, ::trainkit::detail::concat("bad header checksum (stored ", stored, ", computed ",
                                            unsigned_sum, "): not a tar archive, or corrupt"));
  }
}

TRAINKIT_INLINE std::uint64_t TarReader::number(const std::array<unsigned char, 512>& b,
                                                std::size_t off, std::size_t len, const char* field,
                                                std::uint64_t offset) const {
  if (b[off] & 0x80) {
    if (b[off] == 0xff) fail(offset, ::trainkit::detail::concat("negative base-256 ", field));
    std::uint64_t v = b[off] & 0x7f;
    for (std::size_t i = off + 1; i < off + len; ++i) {
      if (v >> 55) fail(offset, ::trainkit::detail::concat("base-256 ", field, " overflows"));
      v = (v << 8) | b[i];
    }
    return v;
  }
  std::size_t i = off;
  const std::size_t end = off + len;
  while (i < end && (b[i] == ' ' || b[i] == 0)) ++i;
  // An all-blank numeric field reads as 0, as in GNU tar.
  std::uint64_t v = 0;
  for (; i < end && b[i] >= '0' && b[i] <= '7'; ++i) {
    if (v >> 60) fail(offset, ::trainkit::detail::concat("octal ", field, " overflows"));
    v = v * 8 + (b[i] - '0');
  }
  for (; i < end; ++i) {
    if (b[i] != ' ' && b[i] != 0) {
      fail(offset, ::trainkit::detail::concat("bad ", field,
                                              " field: not an octal number (not a tar archive, "
                                              "or corrupt)"));
    }
  }
  return v;
}

TRAINKIT_INLINE std::string TarReader::text(const std::array<unsigned char, 512>& b,
                                            std::size_t off, std::size_t len) {
  const auto* p = reinterpret_cast<const char*>(b.data() + off);
  std::size_t n = 0;
  while (n < len && p[n] != 0) ++n;
  return std::string(p, n);
}

TRAINKIT_INLINE void TarReader::parse_pax(const std::string& data, Pax& pax,
                                          std::uint64_t offset) const {
  std::size_t pos = 0;
  while (pos < data.size()) {
    if (data[pos] == '\0') break;  // some writers pad the record block with NULs
    std::size_t i = pos;
    std::uint64_t len = 0;
    // Digits stop mattering once len exceeds the record block (it is then refused below).
    while (i < data.size() && data[i] >= '0' && data[i] <= '9') {
      if (len <= data.size()) len = len * 10 + static_cast<std::uint64_t>(data[i] - '0');
      ++i;
    }
    if (i == pos || i >= data.size() || data[i] != ' ' || len <= i - pos + 1 ||
        len > data.size() - pos || data[pos + len - 1] != '\n') {
      fail(offset, ::trainkit::detail::concat("corrupt pax record at byte ", pos,
                                              " of the extended header"));
    }
    const std::string_view record(data.data() + i + 1, pos + len - 1 - (i + 1));
    const std::size_t eq = record.find('=');
    if (eq == std::string_view::npos || eq == 0) fail(offset, "corrupt pax record: no 'key=value'");
    const std::string_view key = record.substr(0, eq);
    const std::string_view value = record.substr(eq + 1);
    if (key == "path") {
      pax.path = value;
      pax.has_path = !value.empty();
    } else if (key == "linkpath") {
      pax.linkpath = value;
      pax.has_linkpath = !value.empty();
    } else if (key == "size") {
      pax.size = pax_number(value, "size", offset);
      pax.has_size = !value.empty();
    } else if (key.starts_with("GNU.sparse.")) {
      pax.sparse = true;
      if (key == "GNU.sparse.name") {
        pax.sparse_name = value;
        pax.has_sparse_name = !value.empty();
      }
    } else if (key == "mtime") {
      // tarfile writes a time before 1970 as "-N[.f]"; it reads as 0 (see TarEntry::mtime).
      const bool negative = !value.empty() && value[0] == '-';
      const std::string_view digits = value.substr(negative ? 1 : 0);
      const std::uint64_t seconds = pax_number(digits.substr(0, digits.find('.')), "mtime", offset);
      pax.mtime = negative ? 0 : seconds;
      pax.has_mtime = !value.empty();
    }
    pos += len;
  }
}

TRAINKIT_INLINE std::uint64_t TarReader::pax_number(std::string_view v, const char* key,
                                                    std::uint64_t offset) const {
  std::uint64_t n = 0;
  for (char c : v) {
    std::optional<std::uint64_t> next;
    if (c >= '0' && c <= '9') {
      if (const auto tens = checked_mul(n, std::uint64_t{10}))
        next = checked_add(*tens, static_cast<std::uint64_t>(c - '0'));
    }
    if (!next) {
      fail(offset, ::trainkit::detail::concat("bad pax '", key, "' value '", v.substr(0, 40),
                                              v.size() > 40 ? "...'" : "'",
                                              c >= '0' && c <= '9' ? " (above 2^64 - 1)" : ""));
    }
    n = *next;
  }
  return n;
}

TRAINKIT_INLINE void TarReader::build_entry(const std::array<unsigned char, 512>& b,
                                            std::uint64_t offset, std::uint64_t size,
                                            const PendingMeta& meta) {
  TarEntry e;
  e.offset = offset;
  e.type = static_cast<char>(b[156]);
  e.mode = number(b, 100, 8, "mode", offset);
  // A time before 1970 is a negative base-256 number (GNU tar, tarfile's GNU format); it reads as
  // 0 rather than making the whole archive unreadable over a time stamp.
  e.mtime = b[136] == 0xff ? 0 : number(b, 136, 12, "mtime", offset);
  e.size = size;
  e.name = text(b, 0, 100);
  e.linkname = text(b, 157, 100);
  // POSIX ustar ("ustar\0" + "00") has a prefix field; GNU ("ustar  \0") uses those bytes
  // for other things, and v7 headers have no magic at all.
  if (std::memcmp(b.data() + 257, "ustar\0", 6) == 0) {
    const std::string prefix = text(b, 345, 155);
    if (!prefix.empty()) e.name = prefix + "/" + e.name;
  }
  if (global_.has_path) e.name = global_.path;
  if (global_.has_linkpath) e.linkname = global_.linkpath;
  if (global_.has_size) e.size = global_.size;
  if (global_.has_mtime) e.mtime = global_.mtime;
  if (meta.has_long_name) e.name = meta.long_name;
  if (meta.has_long_link) e.linkname = meta.long_link;
  if (meta.pax.has_path) e.name = meta.pax.path;
  if (meta.pax.has_linkpath) e.linkname = meta.pax.linkpath;
  if (meta.pax.has_size) e.size = meta.pax.size;
  if (meta.pax.has_mtime) e.mtime = meta.pax.mtime;
  // GNU tar's pax form of a sparse file: the member's data is a map and the non-hole pieces, not
  // the file, under a made-up path ("./GNUSparseFile.<pid>/<name>"). List it as the old GNU form
  // lists it (type 'S', not a regular file) under its real name rather than as a file holding
  // those bytes.
  if (meta.pax.sparse) {
    e.type = 'S';
    if (meta.pax.has_sparse_name) e.name = meta.pax.sparse_name;
  }
  // Old (v7) archives mark a directory only by the '/' ending its name; tarfile reads it as one.
  if (e.type == '\0' && !e.name.empty() && e.name.back() == '/') e.type = '5';
  // Links, directories and devices carry no data whatever their size field says (tarfile).
  if (e.type == '1' || e.type == '2' || e.type == '3' || e.type == '4' || e.type == '5' ||
      e.type == '6')
    e.size = 0;
  entry_ = std::move(e);
}

TRAINKIT_INLINE TarWriter::~TarWriter() {
  // AtomicFile's destructor removes the temp file of an archive that was not closed.
  if (closed_ || std::uncaught_exceptions() > unwinding_) return;
  try {
    close();
  } catch (...) {
  }
}

TRAINKIT_INLINE void TarWriter::add(std::string_view name, std::span<const std::byte> data,
                                    std::uint64_t mtime) {
  TRAINKIT_CHECK(!closed_, "TarWriter('", file_.path().string(), "'): add() after close()");
  const std::string header = detail::tar_member_header(name, data.size(), mtime);
  write(reinterpret_cast<const std::byte*>(header.data()), header.size());
  write_padded(data.data(), data.size());
}

TRAINKIT_INLINE void TarWriter::close() {
  if (closed_) return;
  closed_ = true;  // a failed close leaves nothing to retry: AtomicFile dropped the temp file
  const std::array<std::byte, 1024> zeros{};
  write(zeros.data(), zeros.size());
  const std::uint64_t record = 10240;
  const std::array<std::byte, 512> block{};
  while (file_.size() % record != 0) write(block.data(), block.size());
  file_.commit();
}

namespace detail {

/// `len` - 1 octal digits, then NUL (what tarfile writes for mode/uid/size/mtime); the caller
/// checks that `v` fits.
inline void tar_octal(unsigned char* field, std::size_t len, std::uint64_t v) {
  for (std::size_t i = len - 1; i-- > 0;) {
    field[i] = static_cast<unsigned char>('0' + (v & 7));
    v >>= 3;
  }
  field[len - 1] = 0;
}

/// One ustar header block (tarfile's _create_header for USTAR_FORMAT).
inline void append_ustar_header(std::string& out, std::string_view name, unsigned mode, char type,
                                std::uint64_t size, std::uint64_t mtime) {
  std::array<unsigned char, 512> b{};
  std::memcpy(b.data(), name.data(), std::min<std::size_t>(name.size(), 100));
  tar_octal(b.data() + 100, 8, mode);
  tar_octal(b.data() + 108, 8, 0);
  tar_octal(b.data() + 116, 8, 0);
  tar_octal(b.data() + 124, 12, size);
  tar_octal(b.data() + 136, 12, mtime);
  b[156] = static_cast<unsigned char>(type);
  std::memcpy(b.data() + 257,
              "ustar\0"
              "00",
              8);
  std::memset(b.data() + 148, ' ', 8);
  std::uint64_t sum = 0;
  for (unsigned char c : b) sum += c;
  // "%06o\0 " like tarfile.
  for (int i = 5; i >= 0; --i) {
    b[148 + static_cast<std::size_t>(i)] = static_cast<unsigned char>('0' + (sum & 7));
    sum >>= 3;
  }
  b[154] = 0;
  b[155] = ' ';
  out.append(reinterpret_cast<const char*>(b.data()), b.size());
}

/// Appends the pax record "<len> <key>=<value>\n"; len counts the whole record, its own digits
/// included.
inline void append_pax_record(std::string& out, std::string_view key, std::string_view value) {
  const std::size_t body = 1 + key.size() + 1 + value.size() + 1;
  std::size_t len = body + 1;
  while (std::to_string(len).size() + body != len) ++len;
  out += std::to_string(len);
  out += ' ';
  out.append(key).append("=").append(value).append("\n");
}

}  // namespace detail

TRAINKIT_INLINE std::string detail::tar_member_header(std::string_view name, std::uint64_t size,
                                                      std::uint64_t mtime) {
  constexpr std::uint64_t kOctal11 = std::uint64_t{1} << 33;  // 8^11: 11 octal digits + NUL
  const bool ascii = std::all_of(name.begin(), name.end(),
                                 [](char c) { return static_cast<unsigned char>(c) < 0x80; });
  // Like tarfile's create_pax_header: records in the order path, size, mtime; a value that does
  // not fit is 0 in the ustar header; a name that is not ASCII is written there with '?' per
  // character (and cut to 100 bytes).
  std::string records;
  if (!ascii || name.size() > 100) append_pax_record(records, "path", name);
  if (size >= kOctal11) append_pax_record(records, "size", std::to_string(size));
  if (mtime >= kOctal11) append_pax_record(records, "mtime", std::to_string(mtime));
  std::string out;
  if (!records.empty()) {
    append_ustar_header(out, "././@PaxHeader", 0, 'x', records.size(), 0);
    out += records;
    out.append((512 - records.size() % 512) % 512, '\0');
  }
  std::string field;
  if (ascii) {
    field = name.substr(0, 100);
  } else {
    for (char c : name) {
      const auto u = static_cast<unsigned char>(c);
      if (u < 0x80) field += c;
      else if (u >= 0xc0) field += '?';  // a lead byte starts a character; drop the rest
    }
    field.resize(std::min<std::size_t>(field.size(), 100));
  }
  append_ustar_header(out, field, 0444, '0', size >= kOctal11 ? 0 : size,
                      mtime >= kOctal11 ? 0 : mtime);
  return out;
}

#endif  // TRAINKIT_IMPL

}  // namespace io
TRAINKIT_NAMESPACE_END
