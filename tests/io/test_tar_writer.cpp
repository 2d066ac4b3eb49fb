// SPDX-License-Identifier: MIT
// TarWriter against what Python's tarfile (format=PAX_FORMAT) writes and reads: pax records for
// names that are long or not ASCII, for sizes of 8 GiB and more and for mtimes past 8^11 - 1
// (both would overflow ustar's 11 octal digits). The 8 GiB path is checked on the header blocks
// alone (io::detail::tar_member_header), without writing 8 GiB.
#include <doctest/doctest.h>

#include <cstddef>
#include <cstdint>
#include <random>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "io/io_test_util.hpp"
#include "trainkit/io/tar.hpp"

namespace io = trainkit::io;
using io_test::TempDir;

namespace {

constexpr std::uint64_t k8GiB = std::uint64_t{1} << 33;  // 8^11: the first value ustar cannot hold

std::span<const std::byte> as_bytes(const std::string& s) {
  return std::as_bytes(std::span<const char>(s.data(), s.size()));
}

struct Read {
  std::string name;
  std::uint64_t size = 0;
  std::uint64_t mtime = 0;
  std::string data;
};

std::vector<Read> read_all(const std::string& bytes, bool read_data = true) {
  std::vector<Read> out;
  io::TarReader r = io::TarReader::from_memory(as_bytes(bytes), "test.tar");
  while (r.next()) {
    Read m{r.entry().name, r.entry().size, r.entry().mtime, {}};
    if (read_data) {
      m.data.resize(std::size_t(r.entry().size));
      r.read(std::as_writable_bytes(std::span<char>(m.data.data(), m.data.size())));
    }
    out.push_back(std::move(m));
    if (!read_data) break;
  }
  return out;
}

// The ustar fields of the header block at `at`.
std::string field(const std::string& b, std::size_t at, std::size_t off, std::size_t len) {
  return b.substr(at + off, len);
}

}  // namespace

TEST_CASE("tar writer: mtimes past 8^11 - 1 s are kept in a pax record, not truncated") {
  TempDir dir;
  const std::uint64_t mtimes[] = {0, 1700000000, k8GiB - 1, k8GiB, k8GiB + 5, (k8GiB << 10) + 77};
  {
    io::TarWriter w(dir / "m.tar", {.durable = false});
    for (std::uint64_t m : mtimes) w.add("m" + std::to_string(m), std::string_view("x"), m);
    w.close();
  }
  const std::vector<Read> got = read_all(io_test::read_file(dir / "m.tar"));
  REQUIRE(got.size() == std::size(mtimes));
  for (std::size_t i = 0; i < got.size(); ++i) {
    CAPTURE(mtimes[i]);
    CHECK(got[i].name == "m" + std::to_string(mtimes[i]));
    CHECK(got[i].mtime == mtimes[i]);
    CHECK(got[i].data == "x");
  }
}

TEST_CASE("tar writer: the header blocks of an 8 GiB member carry a pax size, like tarfile") {
  // tarfile's bytes for TarInfo("big", size=2**33, mtime=2**34).tobuf(PAX_FORMAT): a pax header
  // (mode 0, mtime 0) with "size" then "mtime" records, then a ustar header with both fields 0.
  const std::string h = io::detail::tar_member_header("big", k8GiB, k8GiB << 1);
  REQUIRE(h.size() == 3 * 512);
  CHECK(field(h, 0, 0, 15) == std::string("././@PaxHeader\0", 15));
  CHECK(field(h, 0, 100, 8) == std::string("0000000\0", 8));        // mode
  CHECK(field(h, 0, 136, 12) == std::string("00000000000\0", 12));  // mtime
  CHECK(h[156] == 'x');
  CHECK(h.substr(512, 40) == std::string("19 size=8589934592\n21 mtime=17179869184\n"));
  CHECK(h.substr(552, 512 - 40) == std::string(512 - 40, '\0'));
  CHECK(field(h, 1024, 0, 4) == std::string("big\0", 4));
  CHECK(field(h, 1024, 124, 12) == std::string("00000000000\0", 12));  // size
  CHECK(field(h, 1024, 136, 12) == std::string("00000000000\0", 12));  // mtime
  CHECK(h[1024 + 156] == '0');

  // Random sizes on both sides of the limit: the reader sees the full value.
  std::mt19937_64 rng(20261207);
  for (int i = 0; i < 200; ++i) {
    const int bits = 1 + int(rng() % 50);
    const std::uint64_t size = rng() >> (64 - bits);
    const std::uint64_t mtime = rng() >> (64 - 1 - int(rng() % 40));
    CAPTURE(size);
    CAPTURE(mtime);
    const std::string head = io::detail::tar_member_header("f.bin", size, mtime);
    CHECK(head.size() == (size >= k8GiB || mtime >= k8GiB ? 3u : 1u) * 512);
    const std::vector<Read> got = read_all(head, false);
    REQUIRE(got.size() == 1);
    CHECK(got[0].name == "f.bin");
    CHECK(got[0].size == size);
    CHECK(got[0].mtime == mtime);
  }
}

TEST_CASE("tar writer: names that are not ASCII get a pax path; the ustar field gets '?'") {
  TempDir dir;
  const std::string names[] = {"ünïcødé/名前.txt",
                               std::string(98, 'x') + "ü",
                               std::string(60, 'a') + "ü" + std::string(60, 'z'),
                               "plain.txt",
                               std::string(100, 'p'),
                               std::string(101, 'q')};
  {
    io::TarWriter w(dir / "u.tar", {.durable = false});
    for (const std::string& n : names) w.add(n, std::string_view(n));
    w.close();
  }
  const std::string bytes = io_test::read_file(dir / "u.tar");
  // First member: pax header, one record block, then the ustar header with '?' per character.
  CHECK(bytes[156] == 'x');
  CHECK(bytes.substr(512, 31) == "31 path=ünïcødé/名前.txt\n");
  CHECK(field(bytes, 1024, 0, 16) == std::string("?n?c?d?/??.txt\0\0", 16));
  const std::vector<Read> got = read_all(bytes);
  REQUIRE(got.size() == std::size(names));
  for (std::size_t i = 0; i < got.size(); ++i) {
    CHECK(got[i].name == names[i]);
    CHECK(got[i].data == names[i]);
  }
}
