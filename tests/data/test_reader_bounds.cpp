// SPDX-License-Identifier: MIT
// Readers never allocate more than their input can hold: crafted tar archives (declared sizes in
// octal, GNU base-256 and pax records, in memory and on disk, through TarReader and
// TarShardDataset), .npy headers with huge shapes and token shards with huge options. An
// allocation probe refuses any single request above a bound, so a reader that trusts a declared
// size fails the test with std::bad_alloc instead of allocating it.
#include <doctest/doctest.h>

#include <algorithm>
#include <csignal>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <limits>
#include <memory>
#include <optional>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include <sys/stat.h>

#include <trainkit/data/npy_dataset.hpp>
#include <trainkit/data/tar_shards.hpp>
#include <trainkit/data/token_shards.hpp>
#include <trainkit/io/npy.hpp>
#include <trainkit/io/tar.hpp>

#include "alloc_probe.hpp"
#include "data_test_util.hpp"

namespace tk = trainkit;
using data_test::check_contains;
using data_test::error_of;
using data_test::TempDir;
using data_test::write_file;

namespace {

constexpr std::size_t kSlack = 64 << 10;  // allocations any reader may make whatever the input

void put(std::vector<std::byte>& b, std::size_t at, std::string_view s) {
  std::memcpy(b.data() + at, s.data(), s.size());
}

using data_test::set_checksum;

/// Appends a ustar header for `name` whose size field says `size`: octal when it fits the 11
/// digits, else GNU base-256 (or always base-256 when `base256`).
void add_header(std::vector<std::byte>& b, std::string_view name, char type, std::uint64_t size,
                bool base256 = false) {
  const std::size_t at = b.size();
  b.resize(at + 512);
  put(b, at, name.substr(0, 100));
  put(b, at + 100, "0000444");
  put(b, at + 108, "0000000");
  put(b, at + 116, "0000000");
  if (!base256 && size < (std::uint64_t{1} << 33)) {
    char text[16];
    std::snprintf(text, sizeof text, "%011llo", static_cast<unsigned long long>(size));
    put(b, at + 124, text);
  } else {
    b[at + 124] = std::byte{0x80};
    for (int i = 0; i < 8; ++i)
      b[at + 135 - static_cast<std::size_t>(i)] = std::byte((size >> (8 * i)) & 0xff);
  }
  put(b, at + 136, "00000000000");
  b[at + 156] = std::byte(type);
  put(b, at + 257,
      std::string_view("ustar\0"
                       "00",
                       8));
  set_checksum(b, at);
}

/// Appends `data` padded to a 512-byte block.
void add_data(std::vector<std::byte>& b, std::string_view data) {
  const std::size_t at = b.size();
  b.resize(at + (data.size() + 511) / 512 * 512);
  put(b, at, data);
}

/// A pax 'x' header carrying `records` ("size=..." and so on; lengths are computed here).
void add_pax(std::vector<std::byte>& b, const std::vector<std::string>& records) {
  std::string body;
  for (const std::string& r : records) {
    std::size_t len = r.size() + 3;
    while (std::to_string(len).size() + 2 + r.size() != len) ++len;
    body += std::to_string(len) + " " + r + "\n";
  }
  add_header(b, "././@PaxHeader", 'x', body.size());
  add_data(b, body);
}

void add_end(std::vector<std::byte>& b) { b.resize(b.size() + 1024); }

/// A ByteSource that does not know its size (a pipe, a socket, a decompressor).
class StreamSource final : public tk::io::ByteSource {
 public:
  explicit StreamSource(std::vector<std::byte> bytes) : bytes_(std::move(bytes)) {}
  std::size_t read(void* dst, std::size_t n) override {
    const std::size_t k = std::min(n, bytes_.size() - pos_);
    if (k > 0) std::memcpy(dst, bytes_.data() + pos_, k);
    pos_ += k;
    return k;
  }

 private:
  std::vector<std::byte> bytes_;
  std::size_t pos_ = 0;
};

tk::data::TarShardOptions one_field(std::string ext, tk::DType dtype,
                                    std::vector<std::int64_t> shape) {
  tk::data::TarShardOptions o;
  o.fields = {{"f", std::move(ext), dtype, std::move(shape)}};
  o.shuffle_shards = false;
  return o;
}

std::vector<std::byte> bytes_of(std::string_view s) {
  std::vector<std::byte> out(s.size());
  std::memcpy(out.data(), s.data(), s.size());
  return out;
}

/// The .npy header np.save's layout gives `shape` (format 1.0, padded to 64 bytes), also for the
/// shapes io::npy_header_bytes refuses to write (a byte size past 2^63 - 1): a reader's input.
std::string raw_npy_header(tk::DType t, const std::vector<std::int64_t>& shape) {
  std::string dict = "{'descr': '" + tk::io::npy_descr(t) + "', 'fortran_order': False, 'shape': (";
  for (std::size_t i = 0; i < shape.size(); ++i) dict += (i ? ", " : "") + std::to_string(shape[i]);
  dict += shape.size() == 1 ? ",), }" : "), }";
  const std::size_t pad = 63 - (10 + dict.size()) % 64;  // the header ends with '\n' at 64k
  const std::size_t hlen = dict.size() + pad + 1;
  REQUIRE(hlen <= 0xffff);
  std::string out = "\x93NUMPY";
  out += '\x01';
  out += '\x00';
  out += static_cast<char>(hlen & 0xff);
  out += static_cast<char>(hlen >> 8);
  return out + dict + std::string(pad, ' ') + '\n';
}

}  // namespace

TEST_CASE("tar bounds: a 1 KiB archive declaring a 2 GiB member allocates nothing like 2 GiB") {
  std::vector<std::byte> tar;
  add_header(tar, "000000.bin", '0', std::uint64_t{2} << 30);
  add_data(tar, "only a few bytes");
  REQUIRE(tar.size() == 1024);
  TempDir dir;
  write_file(dir / "big.tar", tar);
  for (int on_disk = 0; on_disk < 2; ++on_disk) {
    CAPTURE(on_disk);
    const alloc_probe::Limit probe(tar.size() + kSlack);
    const std::string what = error_of([&] {
      tk::io::TarReader r = on_disk ? tk::io::TarReader::open(dir / "big.tar")
                                    : tk::io::TarReader::from_memory(tar, "big.tar");
      REQUIRE(r.next());
      CHECK(r.entry().size == std::uint64_t{2} << 30);
      (void)r.read_data();
    });
    check_contains(what, {"big.tar", "000000.bin", "truncated", "2147483648"});
    CHECK(probe.refused() == 0);
    CHECK(probe.largest() <= tar.size() + kSlack);
  }
}

TEST_CASE("tar bounds: base-256 sizes near 2^55 and pax size=10^12 give trainkit::Error") {
  const std::uint64_t sizes[] = {(std::uint64_t{1} << 55) - 1, std::uint64_t{1} << 55,
                                 (std::uint64_t{1} << 62) + 12345, 1000000000000ull};
  for (std::uint64_t size : sizes) {
    for (int pax = 0; pax < 2; ++pax) {
      CAPTURE(size);
      CAPTURE(pax);
      std::vector<std::byte> tar;
      if (pax) {
        add_pax(tar, {"size=" + std::to_string(size)});
        add_header(tar, "k.npy", '0', 10);
      } else {
        add_header(tar, "k.npy", '0', size, true);
      }
      add_data(tar, "0123456789");
      add_end(tar);
      const alloc_probe::Limit probe(tar.size() + kSlack);
      tk::io::TarReader r = tk::io::TarReader::from_memory(tar, "huge.tar");
      REQUIRE(r.next());
      CHECK(r.entry().size == size);
      check_contains(error_of([&] { (void)r.read_data(); }), {"huge.tar", "k.npy", "truncated"});
      CHECK(probe.refused() == 0);
    }
  }
  // A pax size beyond 64 bits is refused as a number, not wrapped.
  std::vector<std::byte> tar;
  add_pax(tar, {"size=99999999999999999999"});
  add_header(tar, "k.bin", '0', 1);
  add_data(tar, "x");
  add_end(tar);
  tk::io::TarReader r = tk::io::TarReader::from_memory(tar, "wrap.tar");
  check_contains(error_of([&] { (void)r.next(); }), {"wrap.tar", "bad pax 'size'"});
}

TEST_CASE("tar bounds: random declared sizes over many seeds never allocate past the input") {
  std::mt19937_64 rng(20240520);
  std::size_t whole = 0, truncated = 0;
  TempDir dir;
  for (int seed = 0; seed < 300; ++seed) {
    CAPTURE(seed);
    const std::size_t actual = std::size_t(rng() % 3000);
    // Declared sizes: exact, a little off, or log-uniform up to 2^63.
    std::uint64_t declared = actual;
    switch (rng() % 4) {
      case 0: break;
      case 1: declared = actual + rng() % 1024; break;
      case 2: declared = actual > 0 ? rng() % actual : 0; break;
      default: declared = rng() >> (1 + rng() % 63); break;
    }
    const int encoding = int(rng() % 3);  // octal (when it fits), base-256, pax
    std::vector<std::byte> tar;
    if (encoding == 2) {
      add_pax(tar, {"size=" + std::to_string(declared)});
      add_header(tar, "000001.bin", '0', actual);
    } else {
      add_header(tar, "000001.bin", '0', declared, encoding == 1);
    }
    add_data(tar, std::string(actual, 'd'));
    if (rng() % 2) add_end(tar);
    const bool disk = rng() % 2;
    if (disk) write_file(dir / "r.tar", tar);
    const alloc_probe::Limit probe(tar.size() + kSlack);
    try {
      tk::io::TarReader r = disk ? tk::io::TarReader::open(dir / "r.tar")
                                 : tk::io::TarReader::from_memory(tar, "r.tar");
      REQUIRE(r.next());
      CHECK(r.entry().size == declared);
      const std::vector<std::byte> d = r.read_data();
      CHECK(d.size() == declared);
      ++whole;
    } catch (const tk::Error& e) {
      check_contains(e.what(), {"r.tar"});
      ++truncated;
    }
    CHECK(probe.refused() == 0);
    CHECK(probe.largest() <= tar.size() + kSlack);
  }
  CHECK(whole > 30);
  CHECK(truncated > 30);
}

TEST_CASE("tar bounds: an extended header longer than the archive is not allocated") {
  std::vector<std::byte> tar;
  add_header(tar, "././@PaxHeader", 'x', 1 << 20);  // the 1 MiB metadata limit, but 10 bytes
  add_data(tar, "10 path=a\n");
  const alloc_probe::Limit probe(tar.size() + kSlack);
  tk::io::TarReader r = tk::io::TarReader::from_memory(tar, "meta.tar");
  check_contains(error_of([&] { (void)r.next(); }), {"meta.tar", "truncated"});
  CHECK(probe.refused() == 0);
}

TEST_CASE("tar bounds: TarShardDataset on a 1 KiB shard whose members declare gigabytes") {
  TempDir dir;
  struct Case {
    const char* ext;
    tk::DType dtype;
    std::vector<std::int64_t> shape;
    std::uint64_t declared;
  };
  const Case cases[] = {
      {"npy", tk::DType::kF32, {4}, std::uint64_t{2} << 30},
      {"npy", tk::DType::kF32, {4}, std::uint64_t{1} << 55},
      {"json", tk::DType::kI32, {2}, 60 << 20},  // under the 64 MiB JSON limit
      {"cls", tk::DType::kI64, {}, 1 << 30},
      {"bin", tk::DType::kU8, {8}, 1 << 30},
  };
  for (const Case& c : cases) {
    CAPTURE(c.ext);
    CAPTURE(c.declared);
    std::vector<std::byte> tar;
    add_header(tar, std::string("000000.") + c.ext, '0', c.declared);
    add_data(tar, "[1, 2]");
    write_file(dir / "s.tar", tar);
    const alloc_probe::Limit probe(tar.size() + kSlack);
    const std::string what = error_of([&] {
      tk::data::TarShardDataset ds(std::vector<std::string>{(dir / "s.tar").string()},
                                   one_field(c.ext, c.dtype, c.shape));
      std::vector<std::byte> sample(ds.fields()[0].bytes());
      const std::vector<std::span<std::byte>> spans{std::span<std::byte>(sample)};
      while (ds.next(tk::data::SampleRef(spans))) {
      }
    });
    check_contains(what, {"s.tar", std::string("000000.") + c.ext});
    CHECK(probe.refused() == 0);
    CHECK(probe.largest() <= tar.size() + kSlack);
  }
}

TEST_CASE("tar bounds: TarShardDataset refuses field shapes whose size overflows") {
  TempDir dir;
  std::vector<std::byte> tar;
  add_header(tar, "000000.bin", '0', 1);
  add_data(tar, "x");
  add_end(tar);
  write_file(dir / "s.tar", tar);
  const std::vector<std::string> shards{(dir / "s.tar").string()};
  const std::vector<std::vector<std::int64_t>> shapes = {
      {-1}, {4, -3}, {std::int64_t{1} << 40, std::int64_t{1} << 40}, {std::int64_t{1} << 62, 4}};
  for (const auto& shape : shapes) {
    CAPTURE(shape.size());
    const alloc_probe::Limit probe(kSlack);
    check_contains(error_of([&] {
                     tk::data::TarShardDataset ds(shards, one_field("bin", tk::DType::kU8, shape));
                   }),
                   {"field 'f'"});
    CHECK(probe.refused() == 0);
  }
}

TEST_CASE("npy bounds: huge declared shapes say too large or truncated, never trailing bytes") {
  TempDir dir;
  std::mt19937_64 rng(7);
  const std::int64_t kMax = std::numeric_limits<std::int64_t>::max();
  std::vector<std::vector<std::int64_t>> shapes = {
      {kMax, 2},
      {kMax},
      {std::int64_t{1} << 62, 4},
      {0, std::int64_t{1} << 40, std::int64_t{1} << 40}};
  for (int k = 0; k < 200; ++k) {
    std::vector<std::int64_t> s;
    const int rank = 1 + int(rng() % 4);
    for (int d = 0; d < rank; ++d) s.push_back(std::int64_t(rng() >> (1 + rng() % 63)));
    if (rng() % 5 == 0) s[rng() % s.size()] = 0;
    shapes.push_back(s);
  }
  for (const auto& shape : shapes) {
    CAPTURE(shape[0]);
    for (tk::DType t : {tk::DType::kU8, tk::DType::kF64}) {
      std::string bytes = raw_npy_header(t, shape);
      // A few data bytes, never more than the shape needs (more would rightly be "trailing").
      std::optional<std::size_t> need = tk::dtype_size(t);
      for (std::int64_t d : shape)
        if (need) need = tk::checked_mul(*need, std::size_t(d));
      const std::size_t most = need ? std::min<std::size_t>(*need, 100) : 100;
      bytes += std::string(std::size_t(rng() % (most + 1)), '\0');
      write_file(dir / "h.npy", bytes_of(bytes));
      const alloc_probe::Limit probe(bytes.size() + kSlack);
      try {
        tk::io::NpyFile f(dir / "h.npy");
        // Accepted: then it really holds every byte its header promises.
        CHECK(f.header().data_offset + f.header().data_bytes == bytes.size());
      } catch (const tk::Error& e) {
        const std::string what = e.what();
        check_contains(what, {"h.npy"});
        CHECK_MESSAGE(what.find("trailing") == std::string::npos, what);
        CHECK_MESSAGE((what.find("truncated") != std::string::npos ||
                       what.find("too large") != std::string::npos),
                      what);
      }
      CHECK(probe.refused() == 0);
    }
  }
  // A header describing more than 2^63 bytes is refused even when an extent is 0 (numpy does):
  // its rows would have a byte size no size_t holds.
  const std::vector<std::int64_t> zero_rows{0, std::int64_t{1} << 40, std::int64_t{1} << 40};
  write_file(dir / "z.npy", bytes_of(raw_npy_header(tk::DType::kF32, zero_rows)));
  check_contains(error_of([&] {
                   tk::data::NpyDataset ds({{"x", dir / "z.npy"}});
                 }),
                 {"z.npy", "too large"});
  // check_npy_size with a header whose end overflows says truncated.
  tk::io::NpyHeader h;
  h.data_offset = 128;
  h.data_bytes = std::numeric_limits<std::size_t>::max() - 64;
  h.numel = h.data_bytes;
  h.shape = {kMax};
  check_contains(error_of([&] { tk::io::check_npy_size(h, 1000, "x.npy"); }),
                 {"x.npy", "truncated"});
}

TEST_CASE("token shards bounds: seq_len and stride at the limits of size_t are refused") {
  TempDir dir;
  std::vector<std::byte> shard(tk::data::kTokenShardHeaderBytes + 2 * 100);
  const std::int32_t header[3] = {tk::data::kTokenShardMagicGpt2, 1, 100};
  std::memcpy(shard.data(), header, sizeof header);
  write_file(dir / "t.bin", shard);
  const std::vector<std::filesystem::path> paths{dir / "t.bin"};
  const std::size_t kMax = std::numeric_limits<std::size_t>::max();
  for (std::size_t seq_len : {kMax, kMax - 1, kMax / 2, kMax / 4 + 1}) {
    CAPTURE(seq_len);
    check_contains(error_of([&] { tk::data::TokenShardDataset ds(paths, {.seq_len = seq_len}); }),
                   {"seq_len"});
  }
  // Ordinary options still work, including a huge stride (one window).
  tk::data::TokenShardDataset one(paths, {.seq_len = 10, .stride = kMax});
  CHECK(one.size() == 1);
  // Declared token counts beyond the file say truncated, for random counts and sizes.
  std::mt19937 rng(3);
  for (int k = 0; k < 50; ++k) {
    const std::int32_t tokens = std::int32_t(rng() >> (1 + rng() % 31));
    const std::size_t have = rng() % 300;
    std::vector<std::byte> b(tk::data::kTokenShardHeaderBytes + 2 * have);
    const std::int32_t h[3] = {tk::data::kTokenShardMagicGpt2, 1, tokens};
    std::memcpy(b.data(), h, sizeof h);
    write_file(dir / "r.bin", b);
    const alloc_probe::Limit probe(b.size() + kSlack);
    const std::vector<std::filesystem::path> p{dir / "r.bin"};
    if (std::size_t(tokens) == have && have >= 5) {
      tk::data::TokenShardDataset ds(p, {.seq_len = 4});
      CHECK(ds.shard_tokens(0) == have);
    } else {
      const std::string what = error_of([&] { tk::data::TokenShardDataset ds(p, {.seq_len = 4}); });
      check_contains(what, {"r.bin"});
      if (std::size_t(tokens) > have) check_contains(what, {"truncated"});
    }
    CHECK(probe.refused() == 0);
  }
}

TEST_CASE("tar bounds: max_member_bytes, sources of unknown size and allocation failure") {
  std::mt19937 rng(11);
  for (int k = 0; k < 40; ++k) {
    CAPTURE(k);
    const std::size_t actual = 1 + rng() % 5000;
    std::vector<std::byte> tar;
    add_header(tar, "000000.bin", '0', actual);
    add_data(tar, std::string(actual, 'q'));
    add_end(tar);
    // The cap: members above it are refused by read_data() (with how to raise it), and can
    // still be skipped or read into the caller's buffer.
    const std::uint64_t cap = rng() % (2 * actual);
    tk::io::TarReader r = tk::io::TarReader::from_memory(tar, "cap.tar", {.max_member_bytes = cap});
    REQUIRE(r.next());
    if (actual > cap) {
      check_contains(error_of([&] { (void)r.read_data(); }),
                     {"cap.tar", "000000.bin", "max_member_bytes", "raise"});
      std::vector<std::byte> part(actual / 2);
      r.read(part);
      CHECK_FALSE(r.next());
    } else {
      CHECK(r.read_data().size() == actual);
    }
  }
  // A stream of unknown size declaring far more than it holds: read in chunks, so memory
  // follows the bytes that are there; the member is reported truncated.
  for (std::uint64_t declared : {std::uint64_t{1} << 29, std::uint64_t{1} << 40}) {
    CAPTURE(declared);
    std::vector<std::byte> tar;
    add_header(tar, "000000.bin", '0', declared, true);
    add_data(tar, std::string(3000, 's'));
    const alloc_probe::Limit probe(4 * tar.size() + kSlack);
    tk::io::TarReader r(std::make_unique<StreamSource>(tar), "stream.tar",
                        {.max_member_bytes = std::uint64_t{1} << 50});
    REQUIRE(r.next());
    check_contains(error_of([&] { (void)r.read_data(); }),
                   {"stream.tar", "000000.bin", "truncated", "ends after 3072"});
    CHECK(probe.refused() == 0);
  }
  // The default cap applies to streams: 1.5 GiB is refused before anything is read.
  {
    std::vector<std::byte> tar;
    add_header(tar, "000000.bin", '0', std::uint64_t{3} << 29);
    tk::io::TarReader r(std::make_unique<StreamSource>(tar), "stream.tar");
    REQUIRE(r.next());
    check_contains(error_of([&] { (void)r.read_data(); }), {"stream.tar", "max_member_bytes"});
  }
  // An allocation that fails although the bytes are there is an Error naming the member.
  {
    std::vector<std::byte> tar;
    add_header(tar, "big/000000.bin", '0', 200000);
    add_data(tar, std::string(200000, 'b'));
    add_end(tar);
    tk::io::TarReader r = tk::io::TarReader::from_memory(tar, "oom.tar");
    REQUIRE(r.next());
    const alloc_probe::Limit probe(100000);
    check_contains(error_of([&] { (void)r.read_data(); }),
                   {"oom.tar", "big/000000.bin", "cannot allocate 200000 bytes"});
  }
  // TarShardDataset passes its max_member_bytes on; .npy members are bounded by their field.
  TempDir dir;
  {
    std::vector<std::byte> tar;
    add_header(tar, "000000.json", '0', 5000);
    add_data(tar, "[1, 2" + std::string(4994, ' ') + "]");
    add_end(tar);
    write_file(dir / "m.tar", tar);
    tk::data::TarShardOptions o = one_field("json", tk::DType::kI32, {2});
    o.max_member_bytes = 4096;
    tk::data::TarShardDataset ds(std::vector<std::string>{(dir / "m.tar").string()}, o);
    std::vector<std::byte> sample(8);
    const std::vector<std::span<std::byte>> spans{std::span<std::byte>(sample)};
    check_contains(error_of([&] { ds.next(tk::data::SampleRef(spans)); }),
                   {"m.tar", "000000.json", "max_member_bytes"});
    o.max_member_bytes = 5000;
    tk::data::TarShardDataset ok(std::vector<std::string>{(dir / "m.tar").string()}, o);
    CHECK(ok.next(tk::data::SampleRef(spans)));
  }
  {
    std::vector<std::byte> tar;
    add_header(tar, "000000.npy", '0', 20000);
    add_data(tar, std::string(20000, 'n'));
    add_end(tar);
    write_file(dir / "n.tar", tar);
    tk::data::TarShardDataset ds(std::vector<std::string>{(dir / "n.tar").string()},
                                 one_field("npy", tk::DType::kF32, {4}));
    std::vector<std::byte> sample(16);
    const std::vector<std::span<std::byte>> spans{std::span<std::byte>(sample)};
    check_contains(error_of([&] { ds.next(tk::data::SampleRef(spans)); }),
                   {"n.tar", "000000.npy", "20000 bytes, more than a .npy of field 'f'"});
  }
}

TEST_CASE("tar bounds: a FIFO has no known size; skipped members are read through") {
  TempDir dir;
  std::vector<std::byte> tar;
  for (int k = 0; k < 6; ++k) {
    const std::string data(std::size_t(100 + 700 * k), char('a' + k));
    add_header(tar, "00000" + std::to_string(k) + ".bin", '0', data.size());
    add_data(tar, data);
  }
  add_end(tar);
  const std::filesystem::path fifo = dir / "pipe.tar";
  REQUIRE(::mkfifo(fifo.c_str(), 0600) == 0);
  // The reader stops at the end-of-archive blocks and closes the pipe, possibly before the
  // writer has sent the rest of the padding: that write must fail with EPIPE, not kill the test.
  const auto previous_sigpipe = std::signal(SIGPIPE, SIG_IGN);
  std::thread writer([&] {
    std::FILE* f = std::fopen(fifo.c_str(), "wb");
    if (f == nullptr) return;
    std::fwrite(tar.data(), 1, tar.size(), f);
    std::fclose(f);
  });
  std::vector<std::string> seen;
  try {
    tk::io::TarReader r = tk::io::TarReader::open(fifo);
    int k = 0;
    while (r.next()) {
      if (k % 2 == 1) {  // read every other member; the rest must be skipped by reading
        const std::vector<std::byte> d = r.read_data();
        CHECK(d.size() == std::size_t(100 + 700 * k));
        CHECK(d.back() == std::byte('a' + k));
      }
      seen.push_back(r.entry().name);
      ++k;
    }
  } catch (const tk::Error& e) {
    FAIL_CHECK(e.what());
  }
  writer.join();
  std::signal(SIGPIPE, previous_sigpipe);
  CHECK(seen.size() == 6);
}
