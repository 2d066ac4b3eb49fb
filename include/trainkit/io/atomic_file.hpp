// SPDX-License-Identifier: MIT
// trainkit/io/atomic_file.hpp: crash-safe file replacement. `AtomicFile` writes into a temp file
// in the target's directory, then fsyncs it, renames it over the target and fsyncs the directory,
// so a reader (or a restart after a crash or power loss) sees either the old file or the complete
// new one, never a partial file under the final name. Errors (ENOSPC, EFBIG, EIO) name the file.
// POSIX (Linux, macOS).
#pragma once

#include <algorithm>
#include <cerrno>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <memory>
#include <random>
#include <span>
#include <string>
#include <string_view>
#include <utility>

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include "trainkit/config.hpp"
#include "trainkit/error.hpp"

TRAINKIT_NAMESPACE_BEGIN
namespace io {

struct AtomicFileOptions {
  /// fsync the file before the rename and the directory after it. Without it the replacement is
  /// still atomic for other processes and for a crash of this one, but not for a power loss.
  bool durable = true;
  /// Permission bits of a new file (the umask applies); a file that replaces one keeps that
  /// one's bits (a private 0600 file stays private).
  unsigned mode = 0644;
};

namespace detail {

TRAINKIT_INLINE std::string errno_text(int err);

/// fsync, or on macOS F_FULLFSYNC (plain fsync there does not flush the drive's cache).
TRAINKIT_INLINE int full_fsync(int fd) noexcept;

inline int open_directory(const std::filesystem::path& dir) {
  return ::open(dir.empty() ? "." : dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
}

#if TRAINKIT_IMPL

TRAINKIT_INLINE std::string errno_text(int err) {
  std::string s = std::strerror(err);
  switch (err) {
    case ENOSPC: return s + " (ENOSPC: the filesystem is full)";
    case EDQUOT: return s + " (EDQUOT: disk quota exceeded)";
    case EFBIG:
      return s + " (EFBIG: larger than RLIMIT_FSIZE or the filesystem's maximum file size)";
    case EIO: return s + " (EIO: the data may be lost; not retried)";
    default: return s + " (errno " + std::to_string(err) + ")";
  }
}

TRAINKIT_INLINE int full_fsync(int fd) noexcept {
#if defined(__APPLE__)
  if (::fcntl(fd, F_FULLFSYNC) == 0) return 0;
#endif
  return ::fsync(fd);
}

#endif  // TRAINKIT_IMPL

}  // namespace detail

/// Makes a completed rename or create inside `dir` durable (fsync of the directory). Throws
/// trainkit::Error naming the directory on failure.
TRAINKIT_INLINE void fsync_directory(const std::filesystem::path& dir);

/// A file being written to replace `path` atomically. Write with write(), then commit(); if the
/// object is destroyed (or discard() is called) before commit(), the temp file is removed and
/// `path` is untouched. Small writes are buffered (1 MiB); large ones go straight to the kernel.
/// Move-only. Not thread-safe.
///
///   io::AtomicFile f("ckpt/model.safetensors");
///   f.write(header.data(), header.size());
///   f.write(tensor_bytes, n);
///   f.commit();  // fsync, rename, fsync dir
class AtomicFile {
 public:
  static constexpr std::size_t kBufferBytes = std::size_t(1) << 20;

  /// Creates the temp file `<dir>/.<name>.tmp.<pid>.<random>` next to `path` (`<name>` cut short
  /// where the whole would pass the 255-byte limit on a file name, so any name can be written).
  /// Throws trainkit::Error naming `path` when it cannot be created (missing directory,
  /// permissions) or does not name a file ("dir/", ".", "..").
  TRAINKIT_INLINE explicit AtomicFile(std::filesystem::path path, AtomicFileOptions options = {});

  AtomicFile(const AtomicFile&) = delete;
  AtomicFile& operator=(const AtomicFile&) = delete;
  AtomicFile(AtomicFile&& o) noexcept
      : path_(std::move(o.path_)),
        temp_(std::move(o.temp_)),
        options_(o.options_),
        fd_(std::exchange(o.fd_, -1)),
        committed_(o.committed_),
        written_(o.written_),
        flushed_(o.flushed_),
        writeback_(o.writeback_),
        reserved_(o.reserved_),
        buffer_(std::move(o.buffer_)),
        buffered_(std::exchange(o.buffered_, 0)) {}
  AtomicFile& operator=(AtomicFile&& o) noexcept {
    if (this != &o) {
      discard();
      path_ = std::move(o.path_);
      temp_ = std::move(o.temp_);
      options_ = o.options_;
      fd_ = std::exchange(o.fd_, -1);
      committed_ = o.committed_;
      written_ = o.written_;
      flushed_ = o.flushed_;
      writeback_ = o.writeback_;
      reserved_ = o.reserved_;
      buffer_ = std::move(o.buffer_);
      buffered_ = std::exchange(o.buffered_, 0);
    }
    return *this;
  }
  ~AtomicFile() { discard(); }

  /// Appends `bytes` bytes. Throws trainkit::Error naming the file on failure (ENOSPC, EFBIG,
  /// EIO, ...); the temp file is then already removed and the object is dead (further calls
  /// throw), and `path()` still holds its previous contents.
  void write(const void* data, std::size_t bytes) {
    check_open("write");
    if (bytes == 0) return;
    const auto* p = static_cast<const char*>(data);
    if (bytes <= kBufferBytes - buffered_) {
      append_to_buffer(p, bytes);
      written_ += bytes;
      return;
    }
    flush_buffer();
    if (bytes < kBufferBytes) {
      append_to_buffer(p, bytes);
    } else {
      write_fully(p, bytes);
    }
    written_ += bytes;
  }
  void write(std::span<const std::byte> bytes) { write(bytes.data(), bytes.size()); }
  void write(std::string_view text) { write(text.data(), text.size()); }

  /// Announces the final size. Writing into a file that already has its size skips an inode
  /// update per extending write (on ext4 several times faster for GiB-sized files), and a size
  /// the filesystem or RLIMIT_FSIZE refuses fails here, before any data is written. commit()
  /// trims the file if fewer bytes were written. Throws trainkit::Error like write().
  void reserve(std::uint64_t bytes) {
    check_open("reserve");
    if (bytes <= reserved_) return;
    if (::ftruncate(fd_, off_t(bytes)) != 0) fail_io("reserving space for");
    reserved_ = bytes;
  }

  /// Flushes, fsyncs (when durable), closes, renames over path() and fsyncs the directory.
  /// Throws trainkit::Error naming the file on failure; the previous file is then intact (or,
  /// for a failed directory fsync only, replaced but possibly not durable, as the message says).
  void commit() {
    check_open("commit");
    flush_buffer();
    if (reserved_ > written_ && ::ftruncate(fd_, off_t(written_)) != 0) fail_io("trimming");
    if (options_.durable && detail::full_fsync(fd_) != 0) fail_io("fsync of");
    const int fd = std::exchange(fd_, -1);
    if (::close(fd) != 0) {
      const int err = errno;
      remove_temp();
      TRAINKIT_FAIL("closing the temp file of '", path_.string(),
                    "' failed: ", detail::errno_text(err));
    }
    if (::rename(temp_.c_str(), path_.c_str()) != 0) {
      const int err = errno;
      remove_temp();
      TRAINKIT_FAIL("cannot rename '", temp_.string(), "' to '", path_.string(),
                    "': ", detail::errno_text(err));
    }
    committed_ = true;
    if (options_.durable) {
      try {
        fsync_directory(path_.parent_path());
      } catch (const Error& e) {
        TRAINKIT_FAIL("'", path_.string(),
                      "' was replaced but may not survive a power loss: ", e.what());
      }
    }
  }

  /// Abandons the write: closes and removes the temp file. Never throws; idempotent.
  void discard() noexcept {
    if (fd_ >= 0) {
      ::close(fd_);
      fd_ = -1;
      remove_temp();
    }
    buffered_ = 0;
  }

  /// The final path and the temp path.
  const std::filesystem::path& path() const noexcept { return path_; }
  const std::filesystem::path& temp_path() const noexcept { return temp_; }
  /// Bytes accepted by write() so far.
  std::uint64_t size() const noexcept { return written_; }
  bool committed() const noexcept { return committed_; }

 private:
  void check_open(const char* what) const {
    TRAINKIT_CHECK(fd_ >= 0, "AtomicFile::", what, " on '", path_.string(), "': the file was ",
                   committed_ ? "already committed" : "discarded after an error");
  }

  void remove_temp() noexcept {
    if (!temp_.empty()) ::unlink(temp_.c_str());
  }

  [[noreturn]] void fail_io(const char* what) {
    const int err = errno;
    discard();
    TRAINKIT_FAIL(what, " '", path_.string(), "' failed after ", written_,
                  " bytes: ", detail::errno_text(err), "; the previous file is intact");
  }

  // The caller ensures buffered_ + n <= kBufferBytes.
  void append_to_buffer(const char* p, std::size_t n) {
    if (buffer_ == nullptr) buffer_.reset(new char[kBufferBytes]);
    std::memcpy(buffer_.get() + buffered_, p, n);
    buffered_ += n;
  }

  void flush_buffer() {
    if (buffered_ == 0) return;
    write_fully(buffer_.get(), buffered_);
    buffered_ = 0;
  }

  void write_fully(const char* p, std::size_t n) {
    while (n > 0) {
      // Linux writes at most ~2 GiB per call; chunk so the loop also works elsewhere.
      const std::size_t chunk = n < (std::size_t(1) << 30) ? n : (std::size_t(1) << 30);
      const ssize_t w = ::write(fd_, p, chunk);
      if (w < 0) {
        if (errno == EINTR) continue;
        fail_io("writing");
      }
      if (w == 0) {
        errno = EIO;
        fail_io("writing");
      }
      p += w;
      n -= std::size_t(w);
      flushed_ += std::uint64_t(w);
    }
    start_writeback();
  }

  // With durable writes, start the disk writing each finished 32 MiB while later data is still
  // being copied, instead of leaving it all to the final fsync (Linux; elsewhere a no-op).
  void start_writeback() noexcept {
#if defined(__linux__)
    constexpr std::uint64_t kWindow = std::uint64_t(32) << 20;
    if (!options_.durable || flushed_ - writeback_ < kWindow) return;
    (void)::sync_file_range(fd_, off_t(writeback_), off_t(flushed_ - writeback_),
                            SYNC_FILE_RANGE_WRITE);
    writeback_ = flushed_;
#endif
  }

  std::filesystem::path path_;
  std::filesystem::path temp_;
  AtomicFileOptions options_;
  int fd_ = -1;
  bool committed_ = false;
  std::uint64_t written_ = 0;       // accepted by write()
  std::uint64_t flushed_ = 0;       // handed to the kernel
  std::uint64_t writeback_ = 0;     // writeback started up to here
  std::uint64_t reserved_ = 0;      // size set by reserve()
  std::unique_ptr<char[]> buffer_;  // kBufferBytes, allocated by the first buffered write
  std::size_t buffered_ = 0;        // bytes of buffer_ not yet handed to the kernel
};

/// Replaces `path` atomically with the concatenation of `pieces` (see AtomicFile).
inline void write_file_atomic(const std::filesystem::path& path,
                              std::span<const std::span<const std::byte>> pieces,
                              AtomicFileOptions options = {}) {
  AtomicFile f(path, options);
  for (const auto& piece : pieces) f.write(piece);
  f.commit();
}

/// Replaces `path` atomically with `bytes`.
inline void write_file_atomic(const std::filesystem::path& path, std::span<const std::byte> bytes,
                              AtomicFileOptions options = {}) {
  AtomicFile f(path, options);
  f.write(bytes);
  f.commit();
}

/// Replaces `path` atomically with `text`.
inline void write_file_atomic(const std::filesystem::path& path, std::string_view text,
                              AtomicFileOptions options = {}) {
  AtomicFile f(path, options);
  f.write(text);
  f.commit();
}

/// True for names AtomicFile gives its temp files (".<name>.tmp.<pid>.<16 hex digits>").
TRAINKIT_INLINE bool is_atomic_temp_name(std::string_view name) noexcept;

/// Removes the temp files an interrupted AtomicFile left in `dir` (e.g. after a crash; call at
/// start-up, never while another process may be writing there). Returns how many were removed.
/// Throws trainkit::Error when `dir` cannot be listed.
TRAINKIT_INLINE std::size_t remove_stale_temp_files(const std::filesystem::path& dir);

#if TRAINKIT_IMPL

TRAINKIT_INLINE void fsync_directory(const std::filesystem::path& dir) {
  const int fd = detail::open_directory(dir);
  if (fd < 0) {
    const int err = errno;
    TRAINKIT_FAIL("cannot open directory '", dir.string(),
                  "' to fsync it: ", detail::errno_text(err));
  }
  const int rc = detail::full_fsync(fd);
  const int err = errno;
  ::close(fd);
  // Some filesystems cannot fsync directories (EINVAL); there is nothing more to make durable.
  if (rc != 0 && err != EINVAL)
    TRAINKIT_FAIL("fsync of directory '", dir.string(), "' failed: ", detail::errno_text(err));
}

TRAINKIT_INLINE AtomicFile::AtomicFile(std::filesystem::path path, AtomicFileOptions options)
    : path_(std::move(path)), options_(options) {
  if (path_.empty() || !path_.has_filename() || path_.filename() == "." || path_.filename() == "..")
    TRAINKIT_FAIL("AtomicFile: '", path_.string(), "' does not name a file");
  std::random_device rd;
  std::mt19937_64 rng((std::uint64_t(rd()) << 32) ^ rd() ^ std::uint64_t(::getpid()));
  for (int attempt = 0; attempt < 64; ++attempt) {
    char suffix[40];
    std::snprintf(suffix, sizeof suffix, ".tmp.%ld.%016llx", static_cast<long>(::getpid()),
                  static_cast<unsigned long long>(rng()));
    // A file name has at most 255 bytes (NAME_MAX on Linux and macOS): cut `<name>` to make
    // room for "." and the suffix, at a UTF-8 character boundary (macOS needs UTF-8 names).
    const std::string base = path_.filename().string();
    std::size_t keep = std::min(base.size(), 255 - 1 - std::strlen(suffix));
    while (keep > 0 && keep < base.size() &&
           (static_cast<unsigned char>(base[keep]) & 0xc0) == 0x80)
      --keep;
    std::string name = ".";  // (appends: GCC 12 -Wrestrict misreads "." + std::string)
    name.append(base, 0, keep).append(suffix);
    temp_ = path_.parent_path() / name;
    fd_ = ::open(temp_.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC,
                 static_cast<mode_t>(options_.mode));
    if (fd_ >= 0 || errno != EEXIST) break;
  }
  if (fd_ < 0) {
    const int err = errno;
    TRAINKIT_FAIL("cannot create a temp file to write '", path_.string(), "' (", temp_.string(),
                  "): ", detail::errno_text(err));
  }
  struct stat old {};
  if (::stat(path_.c_str(), &old) == 0 && S_ISREG(old.st_mode))
    (void)::fchmod(fd_, old.st_mode & 07777);
}

TRAINKIT_INLINE bool is_atomic_temp_name(std::string_view name) noexcept {
  if (name.size() < 1 + 5 + 1 + 1 + 16 || name[0] != '.') return false;
  const std::string_view hex = name.substr(name.size() - 16);
  for (char c : hex)
    if (!((c >= '0' && c <= '9') || (c >= 'a' && c <= 'f'))) return false;
  std::string_view rest = name.substr(0, name.size() - 17);  // drop ".<hex>"
  if (name[name.size() - 17] != '.') return false;
  const std::size_t dot = rest.rfind('.');
  if (dot == std::string_view::npos || dot + 1 == rest.size()) return false;
  for (char c : rest.substr(dot + 1))
    if (c < '0' || c > '9') return false;
  return rest.substr(0, dot).ends_with(".tmp") && dot > 5;
}

TRAINKIT_INLINE std::size_t remove_stale_temp_files(const std::filesystem::path& dir) {
  std::error_code ec;
  std::size_t removed = 0;
  std::filesystem::directory_iterator it(dir, ec), end;
  TRAINKIT_CHECK(!ec, "cannot list '", dir.string(), "': ", ec.message());
  for (; it != end; it.increment(ec)) {
    if (ec) break;
    const std::string name = it->path().filename().string();
    if (is_atomic_temp_name(name) && it->is_regular_file(ec)) {
      if (std::filesystem::remove(it->path(), ec)) ++removed;
    }
  }
  TRAINKIT_CHECK(!ec, "error while cleaning temp files in '", dir.string(), "': ", ec.message());
  return removed;
}

#endif  // TRAINKIT_IMPL

}  // namespace io
TRAINKIT_NAMESPACE_END
