// SPDX-License-Identifier: MIT
// TarWriter against what Python's tarfile (format=PAX_FORMAT) writes and reads: pax records for
// names that are long or not ASCII, for sizes of 8 GiB and more and for mtimes past 8^11 - 1
// (both would overflow ustar's 11 octal digits). The 8 GiB path is checked on the header blocks
// alone (io::detail::tar_member_header), without writing 8 GiB. The reader on what tarfile writes
// for times before 1970 and old-style (v7) directory entries.
#include <doctest/doctest.h>

#include <cstddef>
#include <cstdint>
#include <cstdio>
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

/// One header block as tarfile would write it: `name`, typeflag `type`, an octal `size`, the 12
/// bytes of `mtime` as given (octal or base-256), magic `magic` (8 bytes), and the checksum.
std::string header_block(std::string_view name, char type, std::uint64_t size,
                         const std::string& mtime, const std::string& magic) {
  std::string b(512, '\0');
  b.replace(0, name.size(), name);
  b.replace(100, 8, std::string("0000644\0", 8));
  char octal_size[12];
  std::snprintf(octal_size, sizeof octal_size, "%011llo", static_cast<unsigned long long>(size));
  b.replace(124, 11, octal_size);
  b.replace(136, 12, mtime);
  b[156] = type;
  b.replace(257, 8, magic);
  b.replace(148, 8, std::string(8, ' '));
  unsigned sum = 0;
  for (char c : b) sum += static_cast<unsigned char>(c);
  char chk[8];
  std::snprintf(chk, sizeof chk, "%06o", sum);
  b.replace(148, 6, chk);
  b[154] = '\0';
  return b;
}

std::string padded(std::string data) {
  data.append((512 - data.size() % 512) % 512, '\0');
  return data;
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

TEST_CASE("tar reader: times before 1970 and old-style directories, as tarfile reads them") {
  const std::string ustar(
      "ustar\0"
      "00",
      8),
      gnu("ustar  \0", 8), v7(8, '\0');
  const std::string zero_time("00000000000\0", 12);
  // tarfile's GNU format writes mtime -100 as base-256: 0xff ... 0xff 0x9c.
  const std::string gnu_negative = std::string(11, '\xff') + '\x9c';
  // Its pax format writes "mtime=-100" and "mtime=-1.5" records (the ustar field holds 0).
  const std::string pax_records = "14 mtime=-100\n";
  const std::string pax_fraction = "14 mtime=-1.5\n";
  const std::string archive =
      header_block("gnu.txt", '0', 3, gnu_negative, gnu) + padded("abc") +
      header_block("././@PaxHeader", 'x', pax_records.size(), zero_time, ustar) +
      padded(pax_records) + header_block("pax.txt", '0', 2, zero_time, ustar) + padded("de") +
      header_block("././@PaxHeader", 'x', pax_fraction.size(), zero_time, ustar) +
      padded(pax_fraction) + header_block("frac.txt", '0', 1, zero_time, ustar) + padded("f") +
      header_block("dir/", '\0', 0, zero_time, v7) +
      header_block("dir/a.txt", '\0', 2, zero_time, v7) + padded("hi") + std::string(1024, '\0');
  io::TarReader r = io::TarReader::from_memory(as_bytes(archive), "old.tar");
  struct Want {
    const char* name;
    char type;
    std::uint64_t size;
  };
  const Want want[] = {{"gnu.txt", '0', 3},
                       {"pax.txt", '0', 2},
                       {"frac.txt", '0', 1},
                       {"dir/", '5', 0},
                       {"dir/a.txt", '\0', 2}};
  for (const Want& w : want) {
    CAPTURE(w.name);
    REQUIRE(r.next());
    CHECK(r.entry().name == w.name);
    CHECK(r.entry().type == w.type);
    CHECK(r.entry().is_file() == (w.type != '5'));
    CHECK(r.entry().size == w.size);
    CHECK(r.entry().mtime == 0);
  }
  CHECK(!r.next());
  // A pax mtime that is not a number is still refused, with or without a sign.
  const std::string bad = "12 mtime=-x\n";
  const std::string bad_archive =
      header_block("././@PaxHeader", 'x', bad.size(), zero_time, ustar) + padded(bad) +
      header_block("a", '0', 0, zero_time, ustar);
  io::TarReader b = io::TarReader::from_memory(as_bytes(bad_archive), "bad.tar");
  CHECK_THROWS_WITH_AS(b.next(), doctest::Contains("bad pax 'mtime' value 'x'"), trainkit::Error);
}

TEST_CASE("tar reader: a sparse file of GNU tar's pax form is listed as sparse, not as a file") {
  // What `tar --sparse --format=posix` (GNU tar 1.34) writes for a 1 MiB file holding 10 bytes at
  // 0 and 10 at 2^20: a pax header naming the real file, then a member under a made-up path whose
  // data is the sparse map and the stored pieces. Python's tarfile rebuilds the file; trainkit
  // does not, so it must not hand those bytes out as the content of a regular file.
  const std::string ustar(
      "ustar\0"
      "00",
      8);
  const std::string zero_time("00000000000\0", 12);
  const std::string records =
      "22 GNU.sparse.major=1\n22 GNU.sparse.minor=0\n30 GNU.sparse.name=sparse.bin\n"
      "31 GNU.sparse.realsize=1048586\n";
  const std::string stored =
      padded("3\n0\n4096\n1048576\n10\n1048586\n0\n") + std::string(10, 'A') + std::string(10, 'B');
  const std::string archive =
      header_block("./PaxHeaders/sparse.bin", 'x', records.size(), zero_time, ustar) +
      padded(records) +
      header_block("./GNUSparseFile.25915/sparse.bin", '0', stored.size(), zero_time, ustar) +
      padded(stored) + header_block("a.txt", '0', 3, zero_time, ustar) + padded("hi\n") +
      std::string(1024, '\0');
  io::TarReader r = io::TarReader::from_memory(as_bytes(archive), "sparse.tar");
  REQUIRE(r.next());
  CHECK(r.entry().name == "sparse.bin");
  CHECK(r.entry().type == 'S');
  CHECK(!r.entry().is_file());
  CHECK(r.entry().size == stored.size());  // what the archive holds, so skipping it stays exact
  REQUIRE(r.next());
  CHECK(r.entry().name == "a.txt");
  CHECK(r.entry().is_file());
  const std::vector<std::byte> data = r.read_data();
  CHECK(std::string(reinterpret_cast<const char*>(data.data()), data.size()) == "hi\n");
  CHECK(!r.next());
}
