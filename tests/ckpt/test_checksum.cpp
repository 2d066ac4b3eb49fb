// Tests of ckpt/checksum.hpp: XXH64 against the reference vectors (and, for longer inputs, its
// low 32 bits against zstd's frame checksums of the same bytes, from `zstd -C`), streaming in
// pieces, and checksummed safetensors files: a flipped bit in the data or the header, a
// truncation (also one made while the file is being verified) or a missing checksum is
// detected, and the error names the file.
#include <doctest/doctest.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <string>
#include <thread>
#include <vector>

#include <trainkit/ckpt/checksum.hpp>
#include <trainkit/core/any_tensor.hpp>
#include <trainkit/core/rng.hpp>
#include <trainkit/error.hpp>
#include <trainkit/io/safetensors.hpp>

#include "ckpt/ckpt_test_util.hpp"

namespace {
namespace tk = trainkit;
namespace ckpt = trainkit::ckpt;
namespace io = trainkit::io;
using ckpt_test::TempDir;

std::vector<unsigned char> philox_bytes(std::size_t n) {
  std::vector<unsigned char> b(n);
  for (std::size_t i = 0; i < n; ++i) b[i] = static_cast<unsigned char>(tk::philox_u32(1, 2, i));
  return b;
}

/// Two tensors with Philox content; returns the written file's digest.
ckpt::FileDigest write_sample(const std::filesystem::path& path) {
  tk::AnyTensor a(tk::DType::kF32, tk::Shape{3, 5});
  tk::AnyTensor b(tk::DType::kI64, tk::Shape{4});
  for (std::size_t i = 0; i < a.bytes(); ++i) a.data()[i] = std::byte(tk::philox_u32(3, 0, i));
  for (std::size_t i = 0; i < b.bytes(); ++i) b.data()[i] = std::byte(tk::philox_u32(3, 1, i));
  const io::NamedTensor t[] = {{"a", a.view()}, {"b", b.view()}};
  return ckpt::save_checksummed_safetensors(path, t, {{"note", "x"}}, {.durable = false});
}

}  // namespace

TEST_CASE("Xxh64: reference vectors, zstd cross-check and streaming") {
  CHECK(ckpt::Xxh64::hash("", 0) == 0xEF46DB3751D8E999ULL);
  CHECK(ckpt::Xxh64::hash("a", 1) == 0xD24EC4F1A98C6E5BULL);
  CHECK(ckpt::Xxh64::hash("abc", 3) == 0x44BC2CF5AD770999ULL);
  const struct {
    std::size_t n;
    std::uint32_t low;
  } kZstd[] = {{1, 0xee12f050u},   {31, 0x79bae17bu},   {32, 0x32e371bfu},  {33, 0xcf1dc473u},
               {100, 0x43316777u}, {1000, 0x9576e917u}, {4099, 0x8b9675b9u}};
  const std::vector<unsigned char> b = philox_bytes(4099);
  for (const auto& v : kZstd) {
    CAPTURE(v.n);
    const std::uint64_t whole = ckpt::Xxh64::hash(b.data(), v.n);
    CHECK(static_cast<std::uint32_t>(whole) == v.low);
    // The same bytes fed in pieces of 1..37 bytes.
    ckpt::Xxh64 h;
    std::size_t i = 0, k = 1;
    while (i < v.n) {
      const std::size_t m = std::min(k, v.n - i);
      h.update(b.data() + i, m);
      i += m;
      k = k * 3 % 37 + 1;
    }
    CHECK(h.digest() == whole);
  }
  CHECK(ckpt::Xxh64::hash(b.data(), 4099, 1) != ckpt::Xxh64::hash(b.data(), 4099, 0));
  CHECK(ckpt::hex64(0xab) == "00000000000000ab");
  CHECK(ckpt::parse_hex64("00000000000000AB") == 0xabu);
  CHECK_FALSE(ckpt::parse_hex64("0000000000000g00").has_value());
  CHECK_FALSE(ckpt::parse_hex64("123").has_value());
}

TEST_CASE("checksummed safetensors: valid file, embedded digest, reference reader accepts it") {
  TempDir dir;
  const auto path = dir / "t.safetensors";
  const ckpt::FileDigest d = write_sample(path);
  const std::string bytes = ckpt_test::read_file(path);
  CHECK(d.bytes == bytes.size());
  // The stored digest is the hash of the file with its 16 digits read as '0'.
  std::string zeroed = bytes;
  const std::size_t at = zeroed.find("\"trainkit.xxh64\":\"") + 18;
  CHECK(zeroed.substr(at, 16) == ckpt::hex64(d.xxh64));
  zeroed.replace(at, 16, std::string(16, '0'));
  CHECK(ckpt::Xxh64::hash(zeroed.data(), zeroed.size()) == d.xxh64);
  CHECK(ckpt::verify_checksum_file(path).xxh64 == d.xxh64);
  const io::SafetensorsFile f(path);
  CHECK(f.metadata().at("note") == "x");
  CHECK(f.tensor("a").shape() == tk::Shape{3, 5});
}

TEST_CASE("checksummed safetensors: corruption is detected and names the file") {
  TempDir dir;
  const auto path = dir / "t.safetensors";
  write_sample(path);
  const std::string good = ckpt_test::read_file(path);
  const std::size_t data_start = good.size() - (15 * 4 + 4 * 8);

  SUBCASE("a flipped bit in the data") {
    std::string bad = good;
    bad[data_start + 17] = static_cast<char>(bad[data_start + 17] ^ 0x04);
    ckpt_test::write_file(path, bad);
    CHECK_THROWS_WITH_AS(ckpt::verify_checksum_file(path),
                         doctest::Contains((path.string() + "' is corrupt").c_str()), tk::Error);
  }
  SUBCASE("an edited metadata value in the header") {
    std::string bad = good;
    const std::size_t at = bad.find("\"note\":\"x\"");
    REQUIRE(at != std::string::npos);
    bad[at + 8] = 'y';
    ckpt_test::write_file(path, bad);
    CHECK_THROWS_WITH_AS(ckpt::verify_checksum_file(path), doctest::Contains("is corrupt"),
                         tk::Error);
  }
  SUBCASE("a truncated file") {
    ckpt_test::write_file(path, good.substr(0, good.size() - 3));
    CHECK_THROWS_AS(ckpt::verify_checksum_file(path), tk::Error);
  }
  SUBCASE("a malformed digest") {
    std::string bad = good;
    bad[bad.find("\"trainkit.xxh64\":\"") + 18] = 'z';
    ckpt_test::write_file(path, bad);
    CHECK_THROWS_WITH_AS(ckpt::verify_checksum_file(path), doctest::Contains("not 16 hex digits"),
                         tk::Error);
  }
  SUBCASE("the header rewritten by another tool: a checksum that cannot be checked is refused") {
    // The same header with a space after the key's colon, or the key spelled with an escape
    // (both the same JSON), re-padded: the compact pattern is gone, the claim is not.
    std::uint64_t n = 0;
    for (int i = 7; i >= 0; --i) n = n << 8 | static_cast<unsigned char>(good[i]);
    std::string json = good.substr(8, n);
    json.erase(json.find_last_not_of(' ') + 1);
    const std::string key = "\"trainkit.xxh64\":\"";
    for (const std::string& spelling :
         {std::string("\"trainkit.xxh64\": \""), std::string("\"trainkit\\u002exxh64\":\"")}) {
      CAPTURE(spelling);
      std::string edited = json;
      edited.replace(edited.find(key), key.size(), spelling);
      edited.append((8 - edited.size() % 8) % 8, ' ');
      std::string bad(8, '\0');
      for (int i = 0; i < 8; ++i) bad[i] = static_cast<char>(edited.size() >> (8 * i));
      bad += edited;
      bad += good.substr(8 + n);
      ckpt_test::write_file(path, bad);
      CHECK(io::SafetensorsFile(path).metadata().count("trainkit.xxh64") == 1);
      for (const bool require : {true, false})
        CHECK_THROWS_WITH_AS(ckpt::verify_checksum_file(path, require),
                             doctest::Contains("cannot be verified"), tk::Error);
    }
  }
  SUBCASE("no checksum at all: required fails, optional passes") {
    io::save_safetensors(path, {{"a", tk::AnyTensor(tk::DType::kF32, tk::Shape{2}).view()}}, {},
                         {.durable = false});
    CHECK_THROWS_WITH_AS(ckpt::verify_checksum_file(path), doctest::Contains("has no"), tk::Error);
    CHECK(ckpt::verify_checksum_file(path, /*require=*/false).xxh64 == 0);
  }
}

TEST_CASE(
    "verify_checksum_file: a file truncated in place while it is verified -> error, no signal") {
  // Another process truncating a checkpoint file while a resume verifies it: the verification
  // must end in an error naming the file (a damaged checkpoint), not kill the trainer. Each
  // verification races a truncation timed at a different point of it, in a child process (a
  // fault would kill it, not the test run).
  TempDir dir;
  const auto path = dir / "big.safetensors";
  tk::AnyTensor t(tk::DType::kU8, tk::Shape{std::int64_t{32} << 20});
  std::memset(t.data(), 0, t.bytes());
  for (std::size_t i = 0; i < t.bytes(); i += 4096) t.data()[i] = std::byte(i >> 12);
  const io::NamedTensor tensors[] = {{"t", t.view()}};
  ckpt::save_checksummed_safetensors(path, tensors, {}, {.durable = false});
  const std::string good = ckpt_test::read_file(path);
  const int rc = ckpt_test::in_child_with_file_limit(RLIM_INFINITY, [&] {
    const auto t0 = std::chrono::steady_clock::now();
    ckpt::verify_checksum_file(path);
    const auto took = std::chrono::steady_clock::now() - t0;
    for (int i = 0; i < 16; ++i) {
      ckpt_test::write_file(path, good);
      std::thread cut([&] {
        std::this_thread::sleep_for(took * (2 * i + 1) / 32);
        std::filesystem::resize_file(path, good.size() / 3);
      });
      try {
        ckpt::verify_checksum_file(path);  // the truncation came after it: fine
      } catch (const tk::Error& e) {
        if (std::string(e.what()).find(path.string()) == std::string::npos) {
          cut.join();
          return 2;
        }
      }
      cut.join();
    }
    return 0;
  });
  CHECK_MESSAGE(rc == 0, "the child exited with ", rc, " (-1: killed by a signal)");
}
