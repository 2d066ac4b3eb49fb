// SPDX-License-Identifier: MIT
// For libFuzzer targets whose reader takes a path: the input as an anonymous in-memory file
// (memfd), opened by /proc/self/fd/N, so every run reads a real file without touching the disk.
#pragma once

#include <sys/mman.h>
#include <unistd.h>

#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string>

namespace fuzz_memfile {

/// Aborts (a libFuzzer crash with the input saved) when a property does not hold.
inline void check(bool ok) {
  if (!ok) std::abort();
}

class MemFile {
 public:
  MemFile(const std::uint8_t* data, std::size_t size) {
    fd_ = ::memfd_create("fuzz_input", MFD_CLOEXEC);
    if (fd_ < 0) std::abort();
    std::size_t done = 0;
    while (done < size) {
      const ssize_t n = ::write(fd_, data + done, size - done);
      if (n <= 0) std::abort();
      done += std::size_t(n);
    }
  }
  MemFile(const MemFile&) = delete;
  MemFile& operator=(const MemFile&) = delete;
  ~MemFile() { ::close(fd_); }
  std::string path() const { return "/proc/self/fd/" + std::to_string(fd_); }

 private:
  int fd_ = -1;
};

}  // namespace fuzz_memfile
