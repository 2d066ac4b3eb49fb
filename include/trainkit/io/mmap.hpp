// SPDX-License-Identifier: MIT
// trainkit/io/mmap.hpp: `MappedFile`, a move-only read-only memory map of a whole file. Datasets
// map their files instead of reading them, so N worker threads share one copy in the page cache
// (no per-worker duplication, the "copy-on-read" growth PyTorch users hit) and only touched pages
// are ever loaded. POSIX (Linux, macOS); errors name the file and the failing call.
#pragma once

#include <cerrno>
#include <cstddef>
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

/// A read-only memory map of a whole file. Move-only; unmaps on destruction. An empty file maps
/// nothing: data() is null and size() 0. The mapping stays valid if the file is unlinked, but
/// truncating a mapped file makes later reads fault (SIGBUS): do not rewrite files in place
/// while a dataset reads them.
class MappedFile {
 public:
  MappedFile() noexcept = default;

  /// Maps `path` read-only. Throws trainkit::Error naming the file when it cannot be opened,
  /// stat'ed or mapped, or is not a regular file.
  TRAINKIT_INLINE explicit MappedFile(const std::filesystem::path& path,
                                      MapAccess access = MapAccess::kNormal);

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
