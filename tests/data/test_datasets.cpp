// SPDX-License-Identifier: MIT
// Datasets over files written by numpy, tarfile and tools/write_token_shard.py: NpyDataset,
// TokenShardDataset, TarShardDataset, shard patterns, and their errors on bad input.
#include <doctest/doctest.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <set>
#include <string>
#include <vector>

#include <trainkit/data/npy_dataset.hpp>
#include <trainkit/data/shard_pattern.hpp>
#include <trainkit/data/tar_shards.hpp>
#include <trainkit/data/token_shards.hpp>
#include <trainkit/io/tar.hpp>

#include "data_test_util.hpp"

namespace tk = trainkit;
using data_test::check_contains;
using data_test::error_of;
using data_test::fixture;
using data_test::read_file;
using data_test::TempDir;
using data_test::write_file;

static_assert(tk::data::Dataset<tk::data::NpyDataset>);
static_assert(tk::data::Dataset<tk::data::TokenShardDataset>);
static_assert(tk::data::StreamingDataset<tk::data::TarShardDataset>);

namespace {

/// A packed sample buffer for a dataset's fields.
struct SampleBuffer {
  explicit SampleBuffer(std::span<const tk::data::FieldSpec> fields) {
    std::size_t total = 0;
    for (const auto& f : fields) total += f.bytes();
    bytes.resize(total);
    std::size_t off = 0;
    for (const auto& f : fields) {
      spans.emplace_back(bytes.data() + off, f.bytes());
      off += f.bytes();
    }
  }
  tk::data::SampleRef ref() const { return tk::data::SampleRef(spans); }
  template <class T>
  T at(std::size_t field, std::size_t i = 0) const {
    T v;
    std::memcpy(&v, spans[field].data() + i * sizeof(T), sizeof(T));
    return v;
  }
  std::vector<std::byte> bytes;
  std::vector<std::span<std::byte>> spans;
};

tk::data::TarShardOptions wds_options() {
  tk::data::TarShardOptions o;
  o.fields = {{"x", "npy", tk::DType::kF32, {4}},
              {"label", "cls", tk::DType::kI64, {}},
              {"pair", "json", tk::DType::kI32, {2}},
              {"raw", "bin", tk::DType::kU8, {8}}};
  return o;
}

/// Reads a whole epoch of a tar dataset, returning each sample's key number (from its label
/// fields) after checking every field against gen_fixtures.py's formulas.
std::vector<int> read_epoch(tk::data::TarShardDataset& ds) {
  SampleBuffer s(ds.fields());
  std::vector<int> keys;
  while (ds.next(s.ref())) {
    const int k = static_cast<int>(s.at<float>(0, 0)) / 10;
    for (int j = 0; j < 4; ++j)
      CHECK(s.at<float>(0, static_cast<std::size_t>(j)) == float(k * 10 + j));
    CHECK(s.at<std::int64_t>(1) == k % 10);
    CHECK(s.at<std::int32_t>(2, 0) == k);
    CHECK(s.at<std::int32_t>(2, 1) == -k);
    for (std::size_t j = 0; j < 8; ++j) CHECK(s.at<std::uint8_t>(3, j) == (k + int(j)) % 256);
    keys.push_back(k);
  }
  return keys;
}

}  // namespace

TEST_CASE("NpyDataset: rows of numpy files, any dtype, first axes must agree") {
  tk::data::NpyDataset ds({{"x", fixture("npy/features.npy")}, {"y", fixture("npy/labels.npy")}});
  CHECK(ds.size() == 37);
  REQUIRE(ds.fields().size() == 2);
  CHECK(ds.fields()[0].name == "x");
  CHECK(ds.fields()[0].dtype == tk::DType::kF32);
  CHECK(ds.fields()[0].shape == std::vector<std::int64_t>{5});
  CHECK(ds.fields()[1].dtype == tk::DType::kI64);
  CHECK(ds.fields()[1].shape.empty());
  SampleBuffer s(ds.fields());
  for (std::size_t i : {0u, 17u, 36u}) {
    ds.read(i, s.ref());
    for (std::size_t j = 0; j < 5; ++j) CHECK(s.at<float>(0, j) == 0.5f * float(i * 5 + j));
    CHECK(s.at<std::int64_t>(1) == std::int64_t(i % 10));
  }
  check_contains(ds.describe(17), {"features.npy' row 17"});
  check_contains(error_of([&] { ds.read(37, s.ref()); }),
                 {"sample 37 out of range", "features.npy"});
  // A destination with fewer fields than files is refused (read() indexed past its end).
  const tk::data::SampleRef first_only(std::span(s.spans).first(1));
  check_contains(error_of([&] { ds.read(0, first_only); }),
                 {"NpyDataset: destination has 1 fields, expected 2"});

  tk::data::NpyDataset img({{"image", fixture("npy/images_u8.npy")}});
  CHECK(img.fields()[0].shape == std::vector<std::int64_t>{3, 4, 5});
  CHECK(img.fields()[0].dtype == tk::DType::kU8);

  check_contains(error_of([] {
                   tk::data::NpyDataset bad({{"x", fixture("npy/features.npy")},
                                             {"y", fixture("npy/labels_short.npy")}});
                 }),
                 {"sample count mismatch", "labels_short.npy", "36 rows", "features.npy", "37"});
  check_contains(error_of([] {
                   tk::data::NpyDataset bad({{"s", fixture("npy/scalar_i8.npy")}});
                 }),
                 {"scalar_i8.npy", "0-d"});
  check_contains(error_of([] {
                   tk::data::NpyDataset bad(
                       {{"x", fixture("npy/features.npy")}, {"x", fixture("npy/labels.npy")}});
                 }),
                 {"field 'x' given twice"});
  check_contains(error_of([] {
                   tk::data::NpyDataset bad({{"x", fixture("npy/big_f4.npy")}});
                 }),
                 {"big_f4.npy", "byte order"});
}

TEST_CASE("write_token_shard: the bytes tools/write_token_shard.py writes") {
  const std::vector<std::byte> want = data_test::read_file(fixture("tokens/tok_000000.bin"));
  std::vector<std::uint16_t> tokens((want.size() - tk::data::kTokenShardHeaderBytes) / 2);
  std::memcpy(tokens.data(), want.data() + tk::data::kTokenShardHeaderBytes, tokens.size() * 2);
  TempDir dir;
  tk::data::write_token_shard(dir.path() / "out.bin", tokens);
  CHECK(data_test::read_file(dir.path() / "out.bin") == want);
  tk::data::write_token_shard(dir.path() / "empty.bin", {});
  CHECK(data_test::read_file(dir.path() / "empty.bin").size() == tk::data::kTokenShardHeaderBytes);
}

TEST_CASE("TokenShardDataset: (input, target) windows over llm.c shards") {
  const tk::data::TokenShardDataset ds(fixture("tokens/tok_00000{0..1}.bin"), {.seq_len = 8});
  CHECK(ds.num_shards() == 2);
  CHECK(ds.shard_tokens(0) == 1000);
  CHECK(ds.shard_tokens(1) == 517);
  CHECK(ds.size() == (1000 - 1) / 8 + (517 - 1) / 8);
  SampleBuffer s(ds.fields());
  CHECK(ds.fields()[0].name == "input");
  CHECK(ds.fields()[1].name == "target");
  ds.read(0, s.ref());
  for (std::size_t t = 0; t < 8; ++t) {
    CHECK(s.at<std::int32_t>(0, t) == std::int32_t((t * 7) % 50257));
    CHECK(s.at<std::int32_t>(1, t) == std::int32_t(((t + 1) * 7) % 50257));
  }
  ds.read(123, s.ref());  // the last window of shard 0 starts at token 984 and ends at 992
  CHECK(s.at<std::int32_t>(1, 7) == std::int32_t((992 * 7) % 50257));
  ds.read(124, s.ref());  // the first window of shard 1
  CHECK(s.at<std::int32_t>(0, 0) == 5);
  CHECK(s.at<std::int32_t>(1, 0) == 18);
  check_contains(ds.describe(124), {"tok_000001.bin' tokens from 0"});
  const tk::data::SampleRef input_only(std::span(s.spans).first(1));
  check_contains(error_of([&] { ds.read(0, input_only); }),
                 {"TokenShardDataset: destination has 1 fields, expected 2"});

  const tk::data::TokenShardDataset wide(
      fixture("tokens/tok_llama.bin"),
      {.seq_len = 10, .stride = 5, .token_dtype = tk::DType::kI64});
  CHECK(wide.size() == (300 - 11) / 5 + 1);
  SampleBuffer w(wide.fields());
  wide.read(3, w.ref());
  CHECK(w.at<std::int64_t>(0, 0) == 70015);
  CHECK(w.at<std::int64_t>(1, 9) == 70025);
  check_contains(error_of([] {
                   tk::data::TokenShardDataset bad(fixture("tokens/tok_llama.bin"),
                                                   {.seq_len = 4, .token_dtype = tk::DType::kU16});
                 }),
                 {"tok_llama.bin", "uint32 tokens", "U16"});
}

TEST_CASE("TokenShardDataset: a uint32 token past 2^31 - 1 is refused for I32, not wrapped") {
  std::vector<std::byte> bytes = read_file(fixture("tokens/tok_llama.bin"));
  const std::uint32_t huge = 0x80000001u;
  std::memcpy(bytes.data() + tk::data::kTokenShardHeaderBytes + 4 * 17, &huge, 4);
  TempDir dir;
  write_file(dir / "llama.bin", bytes);
  const std::vector<std::filesystem::path> shard{dir / "llama.bin"};
  const tk::data::TokenShardDataset i32(shard, {.seq_len = 10, .stride = 5});
  SampleBuffer s(i32.fields());
  i32.read(0, s.ref());  // tokens 0..10
  check_contains(error_of([&] { i32.read(2, s.ref()); }),
                 {"llama.bin", "token 17 is 2147483649", "damaged"});
  const tk::data::TokenShardDataset i64(
      shard, {.seq_len = 10, .stride = 5, .token_dtype = tk::DType::kI64});
  SampleBuffer w(i64.fields());
  i64.read(2, w.ref());
  CHECK(w.at<std::int64_t>(0, 7) == 2147483649);
}

TEST_CASE("TokenShardDataset: wrong magic, version or size name the shard") {
  const std::vector<std::byte> good = read_file(fixture("tokens/tok_000001.bin"));
  TempDir dir;
  auto error_for = [&](std::vector<std::byte> bytes) {
    write_file(dir / "bad.bin", bytes);
    return error_of([&] {
      tk::data::TokenShardDataset ds(std::vector<std::filesystem::path>{dir / "bad.bin"},
                                     {.seq_len = 4});
    });
  };
  std::vector<std::byte> magic = good;
  magic[0] = std::byte{0};
  check_contains(error_for(magic), {"bad.bin", "bad magic", "20240520"});
  std::vector<std::byte> version = good;
  version[4] = std::byte{2};
  check_contains(error_for(version), {"bad.bin", "version 2"});
  check_contains(error_for({good.begin(), good.end() - 2}), {"bad.bin", "truncated", "517 tokens"});
  std::vector<std::byte> extra = good;
  extra.push_back(std::byte{0});
  check_contains(error_for(extra), {"bad.bin", "trailing garbage"});
  check_contains(error_for({good.begin(), good.begin() + 100}),
                 {"bad.bin", "shorter than the 1024-byte header"});
  check_contains(error_of([] {
                   tk::data::TokenShardDataset ds(fixture("tokens/tok_000001.bin"),
                                                  {.seq_len = 600});
                 }),
                 {"holds a window of seq_len + 1 = 601"});
}

TEST_CASE("shard patterns: bash brace expansion") {
  using tk::data::expand_shard_pattern;
  using V = std::vector<std::string>;
  CHECK(expand_shard_pattern("data-{000000..000002}.tar") ==
        V{"data-000000.tar", "data-000001.tar", "data-000002.tar"});
  CHECK(expand_shard_pattern("s{8..11}") == V{"s8", "s9", "s10", "s11"});
  CHECK(expand_shard_pattern("s{01..3}") == V{"s01", "s02", "s03"});
  CHECK(expand_shard_pattern("{1..10..4}") == V{"1", "5", "9"});
  CHECK(expand_shard_pattern("{3..1}") == V{"3", "2", "1"});
  CHECK(expand_shard_pattern("{-1..1}") == V{"-1", "0", "1"});
  CHECK(expand_shard_pattern("{a..c}") == V{"a", "b", "c"});
  CHECK(expand_shard_pattern("{a..e..2}") == V{"a", "c", "e"});
  CHECK(expand_shard_pattern("{e..a..-3}") == V{"e", "b"});
  // Steps past the range, or past int (they hung, or overflowed): the first letter, as bash.
  for (const char* big : {"x{a..c..4294967296}", "x{a..c..2147483648}", "x{c..a..999999999999}"})
    CHECK(expand_shard_pattern(big) == V{big[2] == 'a' ? "xa" : "xc"});
  CHECK(expand_shard_pattern("{a,b}{1,2}") == V{"a1", "a2", "b1", "b2"});
  CHECK(expand_shard_pattern("x{a,{b,c}d}y") == V{"xay", "xbdy", "xcdy"});
  CHECK(expand_shard_pattern("lit{eral}.tar") == V{"lit{eral}.tar"});
  CHECK(expand_shard_pattern("x{y{1..3}") == V{"x{y1", "x{y2", "x{y3"});  // as bash
  CHECK(expand_shard_pattern("{{a,b}") == V{"{a", "{b"});
  CHECK(expand_shard_pattern("a-{0..1}.tar::b.tar") == V{"a-0.tar", "a-1.tar", "b.tar"});
  check_contains(error_of([] { (void)expand_shard_pattern(""); }), {"names no shards"});
  CHECK(expand_shard_pattern("{,a}::{,}") == V{"a"});  // empty words are dropped, as in bash
  check_contains(error_of([] { (void)expand_shard_pattern("{,}"); }), {"names no shards"});
  // A letter range needs two letters, as in bash: other ends keep the braces literal instead
  // of spanning the punctuation between ('/' included).
  CHECK(expand_shard_pattern("s{1..a}") == V{"s{1..a}"});
  CHECK(expand_shard_pattern("s{/..a}") == V{"s{/..a}"});
  CHECK(expand_shard_pattern("{Y..a}").size() == 9);  // two letters: Y Z [ \ ] ^ _ ` a

  // Expansions past the caps are refused before they take the memory: products of ranges,
  // many comma lists, long names times a range, one range too long.
  CHECK(expand_shard_pattern("{1..1000000}").size() == tk::data::kMaxShardNames);
  std::string lists;
  for (int i = 0; i < 40; ++i) lists += "{a,b}";  // 2^40 names
  // Empty words are dropped but still cost time each: 2^21 of them are refused (2^40 of them
  // ran for hours).
  std::string empties;
  for (int i = 0; i < 21; ++i) empties += "{,}";
  check_contains(error_of([&] { (void)expand_shard_pattern(empties); }),
                 {"expands to more than 1000000 names", "surely a typo"});
  const std::string long_name = std::string(1000, 'n') + "-{0..99999}.tar";  // 100 MB
  for (const std::string& p : {std::string("s{0..9999}-{0..9999}.tar"), lists, long_name})
    check_contains(error_of([&] { (void)expand_shard_pattern(p); }),
                   {"expands to more than 1000000 names or 64 MiB", "surely a typo"});
  check_contains(error_of([] { (void)expand_shard_pattern("x{0..999999999999999999}"); }),
                 {"range {0..999999999999999999} has 1000000000000000000 elements"});
}

TEST_CASE("TarShardDataset: WebDataset shards in order, every field decoded") {
  tk::data::TarShardOptions o = wds_options();
  o.shuffle_shards = false;
  tk::data::TarShardDataset ds(fixture("tar/wds-{000000..000002}.tar"), o);
  std::vector<int> expected;
  for (int s = 0; s < 3; ++s)
    for (int i = 0; i < 7; ++i) expected.push_back(s * 100 + i);
  CHECK(read_epoch(ds) == expected);
  ds.start(1, 0);
  CHECK(read_epoch(ds) == expected);
  ds.start(0, 9);
  CHECK(read_epoch(ds) == std::vector<int>(expected.begin() + 9, expected.end()));
  check_contains(error_of([&] { ds.start(0, 22); }), {"cannot skip to sample 22", "only 21"});

  // Long GNU names: the key is the whole path up to the basename's first dot.
  tk::data::TarShardDataset gnu(fixture("tar/gnu_long.tar"), o);
  CHECK(read_epoch(gnu) == std::vector<int>{0, 1, 2});
  check_contains(gnu.describe_current(),
                 {"gnu_long.tar", "a_rather_long_directory_name_", "/000002"});
}

TEST_CASE("TarShardDataset: shard shuffle, shuffle buffer, ranks: pure functions of the seed") {
  tk::data::TarShardOptions o = wds_options();
  o.shuffle_buffer = 5;
  o.seed = 11;
  tk::data::TarShardDataset ds(fixture("tar/wds-{000000..000002}.tar"), o);
  const std::vector<int> e0 = read_epoch(ds);
  REQUIRE(e0.size() == 21);
  std::vector<int> sorted = e0;
  std::sort(sorted.begin(), sorted.end());
  CHECK(std::adjacent_find(sorted.begin(), sorted.end()) == sorted.end());
  ds.start(0, 0);
  CHECK(read_epoch(ds) == e0);
  ds.start(1, 0);
  const std::vector<int> e1 = read_epoch(ds);
  CHECK(e1 != e0);
  for (std::uint64_t skip : {1u, 6u, 20u}) {
    ds.start(1, skip);
    CHECK(read_epoch(ds) == std::vector<int>(e1.begin() + std::ptrdiff_t(skip), e1.end()));
  }
  tk::data::TarShardDataset again(fixture("tar/wds-{000000..000002}.tar"), o);
  CHECK(read_epoch(again) == e0);

  std::set<int> all;
  o.world_size = 3;
  for (std::size_t r = 0; r < 3; ++r) {
    o.rank = r;
    tk::data::TarShardDataset part(fixture("tar/wds-{000000..000002}.tar"), o);
    CHECK(part.shards_for_epoch(4).size() == 1);
    part.start(4, 0);
    const std::vector<int> keys = read_epoch(part);
    CHECK(keys.size() == 7);
    all.insert(keys.begin(), keys.end());
  }
  CHECK(all.size() == 21);
  o.world_size = 4;
  o.rank = 0;
  check_contains(
      error_of([&] { tk::data::TarShardDataset bad(fixture("tar/wds-{000000..000002}.tar"), o); }),
      {"3 shard(s) cannot feed 4 ranks"});
}

TEST_CASE("TarShardDataset: missing members, bad members and truncated shards") {
  tk::data::TarShardOptions o = wds_options();
  o.shuffle_shards = false;
  tk::data::TarShardDataset missing(fixture("tar/missing_member.tar"), o);
  SampleBuffer s(missing.fields());
  CHECK(missing.next(s.ref()));
  check_contains(error_of([&] { missing.next(s.ref()); }),
                 {"missing_member.tar", "sample '000001' has no member '.cls'", "field 'label'",
                  "members: .bin, .json, .npy, .txt"});

  tk::data::TarShardOptions wrong = o;
  wrong.fields[0].dtype = tk::DType::kF64;
  tk::data::TarShardDataset bad_npy(fixture("tar/wds-000000.tar"), wrong);
  SampleBuffer s2(bad_npy.fields());
  check_contains(error_of([&] { bad_npy.next(s2.ref()); }),
                 {"wds-000000.tar", "000000.npy", "holds F32 (4,)", "expects F64"});

  tk::data::TarShardOptions short_bin = o;
  short_bin.fields[3].shape = {16};
  tk::data::TarShardDataset bad_bin(fixture("tar/wds-000000.tar"), short_bin);
  SampleBuffer s3(bad_bin.fields());
  check_contains(error_of([&] { bad_bin.next(s3.ref()); }),
                 {"000000.bin", "8 bytes", "needs exactly 16", "pad = true"});
  short_bin.fields[3].pad = true;
  tk::data::TarShardDataset padded(fixture("tar/wds-000000.tar"), short_bin);
  SampleBuffer s4(padded.fields());
  REQUIRE(padded.next(s4.ref()));
  CHECK(s4.at<std::uint8_t>(3, 7) == 7);
  CHECK(s4.at<std::uint8_t>(3, 8) == 0);

  tk::data::TarShardOptions text = o;
  text.fields = {{"doc", "json", tk::DType::kU8, {16}, true}, {"label", "cls", tk::DType::kU8, {}}};
  tk::data::TarShardDataset raw_json(fixture("tar/wds-000000.tar"), text);
  SampleBuffer s5(raw_json.fields());
  REQUIRE(raw_json.next(s5.ref()));
  REQUIRE(raw_json.next(s5.ref()));
  CHECK(std::string(reinterpret_cast<const char*>(s5.spans[0].data())) == "[1, -1]");
  CHECK(s5.at<std::uint8_t>(1) == 1);

  TempDir dir;
  // JSON numbers a float field cannot hold are refused, as integers out of range are.
  {
    tk::io::TarWriter w(dir / "big.tar");
    w.add("000.json", std::string_view("[1e39, 70000]"));
    w.close();
  }
  for (const auto& [dtype, text] :
       {std::pair{tk::DType::kF32, "value 1e+39 does not fit field 'v' (F32)"},
        std::pair{tk::DType::kF16, "value 1e+39 does not fit field 'v' (F16)"}}) {
    tk::data::TarShardOptions big = o;
    big.fields = {{"v", "json", dtype, {2}}};
    tk::data::TarShardDataset ds(std::vector<std::string>{(dir / "big.tar").string()}, big);
    SampleBuffer sb(ds.fields());
    check_contains(error_of([&] { ds.next(sb.ref()); }), {"big.tar", "000.json", text});
  }
  tk::data::TarShardOptions half = o;
  half.fields = {{"v", "json", tk::DType::kF16, {2}}};
  {
    tk::io::TarWriter w(dir / "half.tar");
    w.add("000.json", std::string_view("[65504, 70000]"));
    w.close();
  }
  tk::data::TarShardDataset hd(std::vector<std::string>{(dir / "half.tar").string()}, half);
  SampleBuffer hb(hd.fields());
  check_contains(error_of([&] { hd.next(hb.ref()); }),
                 {"value 70000 does not fit field 'v' (F16)"});
  // JSON that is not a number or an array of numbers is refused, not read around: missing
  // values, trailing commas and two top-level values (they were taken as [1, 2]).
  int json_case = 0;
  for (const char* bad : {"[1,,2]", "[,1,2]", "[1,2,]", "[1][2]", "1,2", "[1,2]]", "[[1,2]"}) {
    const std::string name = "bad" + std::to_string(json_case++) + ".tar";
    {
      tk::io::TarWriter w(dir / name);
      w.add("000.json", std::string_view(bad));
      w.close();
    }
    tk::data::TarShardOptions two = o;
    two.fields = {{"v", "json", tk::DType::kF32, {2}}};
    tk::data::TarShardDataset ds(std::vector<std::string>{(dir / name).string()}, two);
    SampleBuffer sb(ds.fields());
    INFO(bad);
    check_contains(error_of([&] { ds.next(sb.ref()); }),
                   {name, "000.json", "not a number or an array of numbers"});
  }
  for (const char* good : {" [ 1 , 2 ] ", "[[1],[2]]", "[[1,2]]", "[1,[2]]", "[1e0,2.0]"}) {
    {
      tk::io::TarWriter w(dir / "good.tar");
      w.add("000.json", std::string_view(good));
      w.close();
    }
    tk::data::TarShardOptions two = o;
    two.fields = {{"v", "json", tk::DType::kF32, {2}}};
    tk::data::TarShardDataset ds(std::vector<std::string>{(dir / "good.tar").string()}, two);
    SampleBuffer sb(ds.fields());
    INFO(good);
    REQUIRE(ds.next(sb.ref()));
    CHECK(sb.at<float>(0, 0) == 1.0f);
    CHECK(sb.at<float>(0, 1) == 2.0f);
  }
  // Two fields cannot take one member.
  tk::data::TarShardOptions twice = o;
  twice.fields = {{"a", "bin", tk::DType::kU8, {8}}, {"b", "BIN", tk::DType::kU8, {8}}};
  check_contains(
      error_of([&] { tk::data::TarShardDataset d(fixture("tar/wds-000000.tar"), twice); }),
      {"fields 'a' and 'b' both take the member '.bin'"});

  const std::vector<std::byte> good = read_file(fixture("tar/wds-000001.tar"));
  write_file(dir / "cut.tar", {good.begin(), good.begin() + 5000});
  tk::data::TarShardDataset cut(std::vector<std::string>{(dir / "cut.tar").string()}, o);
  SampleBuffer s6(cut.fields());
  check_contains(error_of([&] {
                   while (cut.next(s6.ref())) {
                   }
                 }),
                 {"cut.tar", "truncated"});
}

TEST_CASE("TarShardDataset: a bool .npy member holding bytes other than 0 and 1 is refused") {
  // np.save of a uint8 array viewed as bool keeps its bytes; read as C++ bools they would be
  // neither true nor false. The same refusal as NpyFile's, naming the shard and the member.
  TempDir dir;
  const std::vector<std::int64_t> shape{4};
  for (const auto& [bytes, good] : {std::pair{std::string("\x00\x01\x01\x00", 4), true},
                                    std::pair{std::string("\x00\x01\x02\x00", 4), false}}) {
    {
      tk::io::TarWriter w(dir / "mask.tar");
      w.add("000.npy", tk::io::npy_header_bytes(tk::DType::kBool, shape) + bytes);
      w.close();
    }
    tk::data::TarShardOptions o;
    o.shuffle_shards = false;
    o.fields = {{"mask", "npy", tk::DType::kBool, {4}}};
    tk::data::TarShardDataset ds(std::vector<std::string>{(dir / "mask.tar").string()}, o);
    SampleBuffer sb(ds.fields());
    if (good) {
      REQUIRE(ds.next(sb.ref()));
      CHECK(sb.at<bool>(0, 1));
      CHECK_FALSE(sb.at<bool>(0, 3));
    } else {
      check_contains(error_of([&] { ds.next(sb.ref()); }), {"mask.tar", "000.npy"});
    }
  }
}
