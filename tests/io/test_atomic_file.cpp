// SPDX-License-Identifier: MIT
// Tests of trainkit/io/atomic_file.hpp: complete replacement, no partial file under the final
// name, buffering, temp-file cleanup, and a simulated disk-full (EFBIG via RLIMIT_FSIZE in a
// forked child) that must leave the previous file intact with a clear error.
#include <doctest/doctest.h>

#include <cstddef>
#include <cstring>
#include <filesystem>
#include <functional>
#include <random>
#include <string>
#include <vector>

#include "io/io_test_util.hpp"
#include "trainkit/io/atomic_file.hpp"
#include "trainkit/io/utf8.hpp"

namespace io = trainkit::io;
using io_test::run_with_file_size_limit;
using io_test::TempDir;

TEST_CASE("atomic_file: creates and replaces a file, leaving no temp file") {
  TempDir dir;
  const auto target = dir / "out.bin";
  io::write_file_atomic(target, std::string_view("first version"));
  CHECK(io_test::read_file(target) == "first version");
  io::write_file_atomic(target, std::string_view("second"));
  CHECK(io_test::read_file(target) == "second");
  CHECK(dir.entries() == std::vector<std::string>{"out.bin"});

  // Pieces are concatenated.
  const std::string a = "abc", b = "defg";
  const std::span<const std::byte> pieces[] = {std::as_bytes(std::span(a)),
                                               std::as_bytes(std::span(b))};
  io::write_file_atomic(target, pieces);
  CHECK(io_test::read_file(target) == "abcdefg");

  // A replaced file keeps its permission bits (a private file stays private).
  namespace fs = std::filesystem;
  fs::permissions(target, fs::perms::owner_read | fs::perms::owner_write);
  io::write_file_atomic(target, std::string_view("third"));
  CHECK(io_test::read_file(target) == "third");
  CHECK((fs::status(target).permissions() & fs::perms::all) ==
        (fs::perms::owner_read | fs::perms::owner_write));
}

TEST_CASE("atomic_file: the final name shows the old file until commit") {
  TempDir dir;
  const auto target = dir / "model.safetensors";
  io_test::write_file(target, "old content");
  {
    io::AtomicFile f(target);
    CHECK(f.path() == target);
    CHECK(f.temp_path().parent_path() == target.parent_path());
    CHECK(io::is_atomic_temp_name(f.temp_path().filename().string()));
    f.write(std::string_view("new content, not committed"));
    CHECK(io_test::read_file(target) == "old content");
    CHECK(dir.entries().size() == 2);  // target + temp
  }                                    // destroyed without commit
  CHECK(io_test::read_file(target) == "old content");
  CHECK(dir.entries() == std::vector<std::string>{"model.safetensors"});

  io::AtomicFile f(target);
  f.write(std::string_view("new"));
  f.discard();
  CHECK_THROWS_WITH(f.write(std::string_view("x")), doctest::Contains("discarded"));
  CHECK(io_test::read_file(target) == "old content");

  io::AtomicFile g(target, {.durable = false});
  g.write(std::string_view("committed"));
  g.commit();
  CHECK(g.committed());
  CHECK(io_test::read_file(target) == "committed");
  CHECK_THROWS_WITH(g.commit(), doctest::Contains("already committed"));
  CHECK(dir.entries() == std::vector<std::string>{"model.safetensors"});
}

TEST_CASE("atomic_file: buffered small writes and direct large writes keep their order") {
  TempDir dir;
  const auto target = dir / "mixed.bin";
  std::string expected;
  io::AtomicFile f(target);
  std::uint32_t state = 12345;
  const auto next = [&] { return state = state * 1664525u + 1013904223u; };
  for (int i = 0; i < 300; ++i) {
    // Sizes from a few bytes to a few MiB, so every branch of write() is taken.
    std::size_t n = next() % 64;
    if (i % 50 == 7) n = (std::size_t(1) << 20) - 3;
    if (i % 97 == 5) n = (std::size_t(3) << 20) + 11;
    std::string piece(n, '\0');
    for (char& c : piece) c = char(next() >> 24);
    f.write(piece.data(), piece.size());
    expected += piece;
  }
  CHECK(f.size() == expected.size());
  f.commit();
  CHECK(io_test::read_file(target) == expected);
}

TEST_CASE("atomic_file: reserve() sets the size up front; commit() trims what was not written") {
  TempDir dir;
  const auto target = dir / "r.bin";
  io::AtomicFile f(target);
  f.reserve(1000);
  CHECK(std::filesystem::file_size(f.temp_path()) == 1000);
  f.reserve(10);  // never shrinks
  f.write(std::string_view("0123456789abc"));
  f.commit();
  CHECK(io_test::read_file(target) == "0123456789abc");

  io::AtomicFile g(target);
  g.reserve(4);
  g.write(std::string_view("abcd"));
  g.commit();
  CHECK(io_test::read_file(target) == "abcd");
}

TEST_CASE("atomic_file: errors name the file") {
  TempDir dir;
  const auto missing = dir / "no_such_dir" / "x.bin";
  CHECK_THROWS_WITH(io::write_file_atomic(missing, std::string_view("x")),
                    doctest::Contains(missing.string().c_str()));
  CHECK_THROWS_WITH(io::AtomicFile(dir.path() / ""), doctest::Contains("does not name a file"));
  // Renaming over a directory fails; the temp file is cleaned up.
  std::filesystem::create_directory(dir / "adir");
  std::filesystem::create_directory(dir / "adir" / "sub");
  io::AtomicFile f(dir / "adir");
  f.write(std::string_view("x"));
  CHECK_THROWS_WITH(f.commit(), doctest::Contains("cannot rename"));
  CHECK(dir.entries() == std::vector<std::string>{"adir"});
}

TEST_CASE("atomic_file: a full disk (EFBIG) fails clearly and keeps the previous file") {
  TempDir dir;
  const auto target = dir / "ckpt.bin";
  const std::string old(1000, 'o');
  io::write_file_atomic(target, std::string_view(old));

  // 2 MiB of data against a 64 KiB limit: the direct write fails part way.
  const std::string message = run_with_file_size_limit(64 << 10, [&] {
    std::vector<char> big(2 << 20, 'n');
    io::AtomicFile f(target);
    f.write(big.data(), big.size());
    f.commit();
  });
  CAPTURE(message);
  CHECK(message.find("File too large") != std::string::npos);
  CHECK(message.find("EFBIG") != std::string::npos);
  CHECK(message.find(target.string()) != std::string::npos);
  CHECK(message.find("previous file is intact") != std::string::npos);
  CHECK(io_test::read_file(target) == old);
  CHECK(dir.entries() == std::vector<std::string>{"ckpt.bin"});

  // Small writes fail at the buffer flush inside commit(): same guarantees.
  const std::string message2 = run_with_file_size_limit(100, [&] {
    io::AtomicFile f(target);
    for (int i = 0; i < 100; ++i) f.write(std::string_view("0123456789"));
    f.commit();
  });
  CAPTURE(message2);
  CHECK(message2.find("EFBIG") != std::string::npos);
  CHECK(message2.find(target.string()) != std::string::npos);
  CHECK(io_test::read_file(target) == old);
  CHECK(dir.entries() == std::vector<std::string>{"ckpt.bin"});

  // reserve() past the limit fails at once, before any data is written.
  const std::string message_r = run_with_file_size_limit(64 << 10, [&] {
    io::AtomicFile f(target);
    f.reserve(1 << 20);
  });
  CAPTURE(message_r);
  CHECK(message_r.find("reserving space for") != std::string::npos);
  CHECK(message_r.find("EFBIG") != std::string::npos);
  CHECK(io_test::read_file(target) == old);
  CHECK(dir.entries() == std::vector<std::string>{"ckpt.bin"});

  // Under the limit everything works in the same child setup (the harness itself is sound).
  const std::string message3 = run_with_file_size_limit(
      64 << 10, [&] { io::write_file_atomic(target, std::string_view("fits")); });
  CHECK(message3 == "<no error>");
  CHECK(io_test::read_file(target) == "fits");
}

TEST_CASE("atomic_file: stale temp files are recognised and removed") {
  CHECK(io::is_atomic_temp_name(".model.safetensors.tmp.1234.0123456789abcdef"));
  CHECK(io::is_atomic_temp_name(".a.tmp.1.ffffffffffffffff"));
  CHECK_FALSE(io::is_atomic_temp_name("model.safetensors"));
  CHECK_FALSE(io::is_atomic_temp_name(".model.safetensors.tmp.1234.0123456789ABCDEF"));
  CHECK_FALSE(io::is_atomic_temp_name(".model.tmp.x1.0123456789abcdef"));
  CHECK_FALSE(io::is_atomic_temp_name(".model.tmp..0123456789abcdef"));
  CHECK_FALSE(io::is_atomic_temp_name("a.tmp.1.0123456789abcdef"));
  CHECK_FALSE(io::is_atomic_temp_name(".model.tmp.12.0123456789abcde"));

  TempDir dir;
  io_test::write_file(dir / "keep.safetensors", "k");
  io_test::write_file(dir / ".keep.safetensors.tmp.77.0123456789abcdef", "stale");
  io_test::write_file(dir / ".other.json.tmp.1.fedcba9876543210", "stale");
  io_test::write_file(dir / ".hidden", "h");
  {
    io::AtomicFile live(dir / "x.bin");  // what an interrupted writer leaves behind
    const auto name = live.temp_path().filename().string();
    CHECK(io::is_atomic_temp_name(name));
  }
  CHECK(io::remove_stale_temp_files(dir.path()) == 2);
  CHECK(dir.entries() == std::vector<std::string>{".hidden", "keep.safetensors"});
  CHECK_THROWS_WITH(io::remove_stale_temp_files(dir / "missing"), doctest::Contains("missing"));
}

TEST_CASE("atomic_file: names up to 255 bytes are written; '.', '..' and 'dir/' are refused") {
  TempDir dir;
  // The temp name adds ".", ".tmp.<pid>." and 16 hex digits: long names are cut for it, at a
  // UTF-8 character boundary, and the result is still recognised as a temp name.
  std::mt19937_64 rng(255);
  const std::string pieces[] = {"a", "é", "名", "😀"};
  for (int i = 0; i < 60; ++i) {
    const std::size_t limit = i < 10 ? 255 - std::size_t(i) : 150 + rng() % 106;
    std::string name;
    for (;;) {
      const std::string& p = pieces[rng() % 4];
      if (name.size() + p.size() > limit) break;
      name += p;
    }
    CAPTURE(name.size());
    const auto target = dir / name;
    {
      io::AtomicFile f(target, {.durable = false});
      const std::string temp = f.temp_path().filename().string();
      CHECK(temp.size() <= 255);
      CHECK(io::is_valid_utf8(temp));
      CHECK(io::is_atomic_temp_name(temp));
      CHECK(f.temp_path().parent_path() == target.parent_path());
      f.write(std::string_view(name));
      f.commit();
    }
    CHECK(io_test::read_file(target) == name);
    CHECK(dir.entries() == std::vector<std::string>{name});
    std::filesystem::remove(target);
  }
  for (const char* bad : {".", "..", ""}) {
    CAPTURE(bad);
    CHECK_THROWS_WITH(io::write_file_atomic(dir / bad, std::string_view("x")),
                      doctest::Contains("does not name a file"));
    std::string message;
    try {
      io::write_file_atomic(dir / bad, std::string_view("x"));
    } catch (const trainkit::Error& e) {
      message = e.what();
    }
    CHECK(message.find("path_") == std::string::npos);  // no internal condition text
  }
  CHECK(dir.entries().empty());
}
