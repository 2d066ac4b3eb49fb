// SPDX-License-Identifier: MIT
// trainkit/io/mmap.hpp: `MappedFile`, a move-only read-only memory map of a whole file. Datasets
// map their files instead of reading them, so N worker threads share one copy in the page cache
// (no per-worker duplication, the "copy-on-read" growth PyTorch users hit) and only touched pages
// are ever loaded. Files another process may truncate while they are read (checkpoints) are read
// with pread instead: `MappedFile::copied` and `detail::PreadFile`. POSIX (Linux, macOS); errors
// name the file and the failing call.
#pragma once

#include <cerrno>
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <span>
#include <string>
#include <utility>

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "trainkit/config.hpp"
#include "trainkit/error.hpp"

TRAINKIT_NAMESPACE_BEGIN
namespace io {

/// How a mapping will be read, passed to madvise(): a hint, never a requirement.
enum class MapAccess : unsigned char {
  kNormal,      ///< no hint
  kSequential,  ///< read front to back once (token shards, tar shards): aggressive read-ahead
  kRandom,      ///< random rows (shuffled .npy rows): no read-ahead beyond the touched pages
};

namespace detail {

/// A regular file opened for pread, closed on destruction. size() is its size when opened; a
/// file that another process truncates meanwhile gives trainkit::Error naming it, never a
/// signal (as touching a mapping past the new end would).
class PreadFile {
 public:
  /// Opens `path` read-only. Throws trainkit::Error naming the file when it cannot be opened or
  /// stat'ed, or is not a regular file.
  TRAINKIT_INLINE explicit PreadFile(const std::filesystem::path& path);
  PreadFile(const PreadFile&) = delete;
  PreadFile& operator=(const PreadFile&) = delete;
  ~PreadFile() {
    if (fd_ >= 0) ::close(fd_);
  }

  std::uint64_t size() const noexcept { return size_; }
  const std::string& path() const noexcept { return path_; }

  /// Asks the kernel for aggressive read-ahead (a hint: failures are ignored).
  void advise_sequential() const noexcept {
#if defined(POSIX_FADV_SEQUENTIAL)
    (void)::posix_fadvise(fd_, 0, 0, POSIX_FADV_SEQUENTIAL);
#endif
  }

  /// Reads exactly `n` bytes at `offset` into `dst`. Throws trainkit::Error naming the file when
  /// the read fails or the file ends first (it shrank since it was opened).
  TRAINKIT_INLINE void read_at(void* dst, std::size_t n, std::uint64_t offset) const;

  /// Throws trainkit::Error naming the file when its size is no longer size(): it was truncated
  /// or rewritten in place while it was read, so what was read may mix two versions.
  TRAINKIT_INLINE void check_unchanged() const;

 private:
  [[noreturn]] void fail(const char* what) const {
    const int err = errno;
    TRAINKIT_FAIL_OS(err, what, " '", path_, "': ", std::strerror(err), " (errno ", err, ")");
  }

  std::string path_;
  int fd_ = -1;
  std::uint64_t size_ = 0;
};

}  // namespace detail

/// A read-only memory map of a whole file. Move-only; unmaps on destruction. An empty file maps
/// nothing: data() is null and size() 0. The mapping stays valid if the file is unlinked, but
/// truncating a mapped file makes later reads fault (SIGBUS): do not rewrite files in place
/// while a dataset reads them, or read them with copied().
class MappedFile {
 public:
  MappedFile() noexcept = default;

  /// Maps `path` read-only. Throws trainkit::Error naming the file when it cannot be opened,
  /// stat'ed or mapped, or is not a regular file.
  TRAINKIT_INLINE explicit MappedFile(const std::filesystem::path& path,
                                      MapAccess access = MapAccess::kNormal);

  /// Reads `path` with pread into private memory (page-aligned, read-only, as a mapping is)
  /// instead of mapping it: the bytes are the file's as read, and a file that another process
  /// truncates or rewrites afterwards cannot make them fault. Throws trainkit::Error naming the
  /// file as the constructor does, and also when the file shrinks or changes size while it is
  /// read.
  TRAINKIT_INLINE static MappedFile copied(const std::filesystem::path& path);

  MappedFile(const MappedFile&) = delete;
  MappedFile& operator=(const MappedFile&) = delete;
  MappedFile(MappedFile&& other) noexcept
      : path_(std::move(other.path_)),
        data_(std::exchange(other.data_, nullptr)),
        size_(std::exchange(other.size_, 0)) {}
  MappedFile& operator=(MappedFile&& other) noexcept {
    if (this != &other) {
      reset();
      path_ = std::move(other.path_);
      data_ = std::exchange(other.data_, nullptr);
      size_ = std::exchange(other.size_, 0);
    }
    return *this;
  }
  ~MappedFile() { reset(); }

  /// Unmaps now; the object becomes empty. Never throws.
  void reset() noexcept {
    if (data_ != nullptr) ::munmap(const_cast<std::byte*>(data_), size_);
    data_ = nullptr;
    size_ = 0;
  }

  /// First byte of the file (page-aligned), or null for an empty file / empty object.
  const std::byte* data() const noexcept { return data_; }
  /// File size in bytes at the time it was mapped.
  std::size_t size() const noexcept { return size_; }
  std::span<const std::byte> bytes() const noexcept { return {data_, size_}; }
  /// The path as given, for error messages.
  const std::string& path() const noexcept { return path_; }
  bool empty() const noexcept { return size_ == 0; }

  /// Re-advises the kernel on the access pattern (madvise; failures are ignored: it is a hint).
  void advise(MapAccess access) const noexcept {
    if (data_ == nullptr) return;
    int advice = MADV_NORMAL;
    if (access == MapAccess::kSequential) advice = MADV_SEQUENTIAL;
    if (access == MapAccess::kRandom) advice = MADV_RANDOM;
    (void)::madvise(const_cast<std::byte*>(data_), size_, advice);
  }

 private:
  [[noreturn]] void fail(const char* what) const {
    const int err = errno;
    TRAINKIT_FAIL_OS(err, what, " '", path_, "': ", std::strerror(err), " (errno ", err, ")");
  }

  std::string path_;
  const std::byte* data_ = nullptr;
  std::size_t size_ = 0;
};

#if TRAINKIT_IMPL

namespace detail {

TRAINKIT_INLINE PreadFile::PreadFile(const std::filesystem::path& path) : path_(path.string()) {
  fd_ = ::open(path_.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd_ < 0) fail("cannot open");
  struct stat st {};
  const bool stated = ::fstat(fd_, &st) == 0;
  if (!stated || !S_ISREG(st.st_mode)) {  // no destructor runs for a throwing constructor
    const int err = errno;
    ::close(fd_);
    fd_ = -1;
    errno = err;
    if (!stated) fail("cannot stat");
    TRAINKIT_FAIL("cannot read '", path_, "': not a regular file");
  }
  size_ = static_cast<std::uint64_t>(st.st_size);
}

TRAINKIT_INLINE void PreadFile::read_at(void* dst, std::size_t n, std::uint64_t offset) const {
  auto* p = static_cast<char*>(dst);
  while (n > 0) {
    // At most 1 GiB per call: some systems refuse larger reads.
    const std::size_t chunk = std::min<std::size_t>(n, std::size_t{1} << 30);
    const ssize_t r = ::pread(fd_, p, chunk, static_cast<off_t>(offset));
    if (r < 0 && errno == EINTR) continue;
    if (r < 0) fail("cannot read");
    if (r == 0)
      TRAINKIT_FAIL("cannot read '", path_, "': it ends at byte ", offset, " but had ", size_,
                    " bytes when it was opened (truncated in place while it was being read)");
    p += r;
    n -= static_cast<std::size_t>(r);
    offset += static_cast<std::uint64_t>(r);
  }
}

TRAINKIT_INLINE void PreadFile::check_unchanged() const {
  struct stat st {};
  if (::fstat(fd_, &st) != 0) fail("cannot stat");
  const auto now = static_cast<std::uint64_t>(st.st_size);
  if (now != size_)
    TRAINKIT_FAIL("cannot read '", path_, "': it had ", size_, " bytes when it was opened and ",
                  now, " bytes after it was read (truncated or rewritten in place meanwhile)");
}

}  // namespace detail

TRAINKIT_INLINE MappedFile MappedFile::copied(const std::filesystem::path& path) {
  const detail::PreadFile file(path);
  MappedFile out;
  out.path_ = file.path();
  if (file.size() == 0) {
    file.check_unchanged();
    return out;
  }
  const auto size = static_cast<std::size_t>(file.size());
  void* p = ::mmap(nullptr, size, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (p == MAP_FAILED) out.fail("cannot allocate memory to read");
  out.data_ = static_cast<const std::byte*>(p);  // from here `out` frees it, also on a throw
  out.size_ = size;
#if defined(MADV_HUGEPAGE)
  // Faulting in the fresh memory 4 KiB at a time costs more than the copy itself; huge pages
  // make that ~512 times fewer faults (a hint: failures are ignored).
  if (size >= (std::size_t{2} << 20)) (void)::madvise(p, size, MADV_HUGEPAGE);
#endif
  file.advise_sequential();
  file.read_at(p, size, 0);
  file.check_unchanged();
  (void)::mprotect(p, size, PROT_READ);  // read-only like a mapping; the bytes are right anyway
  return out;
}

TRAINKIT_INLINE MappedFile::MappedFile(const std::filesystem::path& path, MapAccess access)
    : path_(path.string()) {
  const int fd = ::open(path_.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) fail("cannot open");
  struct stat st {};
  if (::fstat(fd, &st) != 0) {
    const int err = errno;
    ::close(fd);
    errno = err;
    fail("cannot stat");
  }
  if (!S_ISREG(st.st_mode)) {
    ::close(fd);
    TRAINKIT_FAIL("cannot map '", path_, "': not a regular file");
  }
  size_ = static_cast<std::size_t>(st.st_size);
  if (size_ > 0) {
    void* p = ::mmap(nullptr, size_, PROT_READ, MAP_PRIVATE, fd, 0);
    if (p == MAP_FAILED) {
      const int err = errno;
      ::close(fd);
      errno = err;
      size_ = 0;
      fail("cannot mmap");
    }
    data_ = static_cast<const std::byte*>(p);
    advise(access);
  }
  ::close(fd);  // the mapping keeps its own reference to the file
}

#endif  // TRAINKIT_IMPL

}  // namespace io
TRAINKIT_NAMESPACE_END
