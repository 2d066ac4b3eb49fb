// SPDX-License-Identifier: MIT
// Tests of trainkit/io/safetensors.hpp: the writer against the reference test vectors
// (the byte images of the safetensors crate's own tests and fixtures written by the Python
// reference in tests/fixtures/safetensors/), zero-copy reading of every dtype, one crafted bad file
// per validation rule (the error must name the file and the rule), sharded index files, and a
// simulated full disk during save.
#include <doctest/doctest.h>

#include <algorithm>
#include <cctype>
#include <cstddef>
#include <chrono>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <iterator>
#include <map>
#include <optional>
#include <random>
#include <string>
#include <string_view>
#include <vector>

#include "io/io_test_util.hpp"
#include "trainkit/core/any_tensor.hpp"
#include "trainkit/core/half.hpp"
#include "trainkit/io/safetensors.hpp"

namespace io = trainkit::io;
using io::SafetensorsRule;
using io_test::TempDir;
using trainkit::AnyTensor;
using trainkit::AnyTensorView;
using trainkit::DType;
using trainkit::Shape;

namespace {

const std::string kFixtures = std::string(TRAINKIT_TEST_DATA_DIR) + "/safetensors/";

std::string hex_bytes(std::string_view hex) {
  std::string out;
  for (std::size_t i = 0; i + 1 < hex.size(); i += 2)
    out += char(std::stoi(std::string(hex.substr(i, 2)), nullptr, 16));
  return out;
}

std::string u64le(std::uint64_t v) {
  std::string s;
  for (int i = 0; i < 8; ++i) s += char((v >> (8 * i)) & 0xff);
  return s;
}

/// A file image: 8-byte length (the JSON's, unless given) + JSON + data.
std::string st_image(std::string_view json, std::string_view data = {},
                     std::optional<std::uint64_t> length = std::nullopt) {
  return u64le(length.value_or(json.size())) + std::string(json) + std::string(data);
}

bool contains(const std::string& haystack, std::string_view needle) {
  return haystack.find(needle) != std::string::npos;
}

/// The file must be refused by the mapped reader, the read()-based loader and the buffer reader,
/// each time naming the file and the rule (and `detail`, e.g. the tensor) with Error::code() ==
/// rule.
void expect_rule(const std::string& image, SafetensorsRule rule, std::string_view detail = {}) {
  const std::string rule_name = io::safetensors_rule_name(rule);
  CAPTURE(rule_name);
  TempDir dir;
  const auto path = dir / "crafted_bad.safetensors";
  io_test::write_file(path, image);
  const auto check_error = [&](const trainkit::Error& e, const std::string& source) {
    const std::string what = e.what();
    CAPTURE(what);
    CHECK(contains(what, "'" + source + "'"));
    CHECK(contains(what, rule_name));
    if (!detail.empty()) CHECK(contains(what, detail));
    CHECK(e.code() == static_cast<long long>(rule));
    CHECK(e.library() == "io");
  };
  bool threw = false;
  try {
    io::SafetensorsFile f(path);
  } catch (const trainkit::Error& e) {
    threw = true;
    check_error(e, path.string());
  }
  CHECK_MESSAGE(threw, "SafetensorsFile accepted a file breaking ", rule_name);
  threw = false;
  try {
    (void)io::load_safetensors(path);
  } catch (const trainkit::Error& e) {
    threw = true;
    check_error(e, path.string());
  }
  CHECK_MESSAGE(threw, "load_safetensors accepted a file breaking ", rule_name);
  threw = false;
  try {
    (void)io::SafetensorsFile::from_buffer(std::as_bytes(std::span(image)), "buffer.st");
  } catch (const trainkit::Error& e) {
    threw = true;
    check_error(e, "buffer.st");
  }
  CHECK_MESSAGE(threw, "from_buffer accepted a buffer breaking ", rule_name);
}

/// A deterministic tensor: byte j = (37 j + 11 k + 5) mod 256 (bool: (j + k) mod 2), the
/// pattern tests/fixtures/safetensors/generate.py uses.
AnyTensor pattern_tensor(DType t, const Shape& shape, int k) {
  AnyTensor a(t, shape);
  for (std::size_t j = 0; j < a.bytes(); ++j)
    a.data()[j] = std::byte(t == DType::kBool ? (j + std::size_t(k)) % 2
                                              : (37 * j + 11 * std::size_t(k) + 5) % 256);
  return a;
}

bool same_bytes(const AnyTensorView& a, const AnyTensorView& b) {
  return a.dtype() == b.dtype() && a.shape() == b.shape() && a.bytes() == b.bytes() &&
         (a.bytes() == 0 || std::memcmp(a.data(), b.data(), a.bytes()) == 0);
}

const Shape kFixtureShapes[] = {Shape{},        Shape{0},          Shape{3},   Shape{2, 3},
                                Shape{2, 0, 4}, Shape{1, 2, 3, 2}, Shape{5, 1}};

/// The tensors of tests/fixtures/safetensors/python_all_dtypes.safetensors.
std::vector<io::NamedTensor> fixture_all_dtypes(std::vector<AnyTensor>& storage) {
  storage.clear();
  std::vector<io::NamedTensor> out;
  int k = 0;
  for (DType t : trainkit::kAllDTypes) {
    std::string lower(trainkit::dtype_name(t));
    for (char& c : lower) c = char(std::tolower(static_cast<unsigned char>(c)));
    storage.push_back(pattern_tensor(t, kFixtureShapes[k % 7], k));
    out.push_back({"layer." + std::to_string((7 * k) % 15) + "." + lower, AnyTensorView()});
    ++k;
  }
  for (std::size_t i = 0; i < out.size(); ++i) out[i].tensor = storage[i];
  return out;
}

}  // namespace

TEST_CASE("safetensors writer: reference test vectors, byte for byte") {
  const float v6[] = {0, 1, 2, 3, 4, 5};
  // The crate's test_serialization: 96 bytes, a 64-byte header needing no padding.
  const auto bytes1 =
      io::safetensors_bytes({{"attn.0", AnyTensorView(DType::kF32, {1, 2, 3}, v6)}});
  CHECK(io_test::to_string(bytes1) ==
        hex_bytes("4000000000000000") +
            R"({"attn.0":{"dtype":"F32","shape":[1,2,3],"data_offsets":[0,24]}})" +
            hex_bytes("000000000000803f0000004000004040000080400000a040"));
  // test_serialization_forced_alignement: 65-byte JSON + 7 spaces.
  const auto bytes2 =
      io::safetensors_bytes({{"attn0", AnyTensorView(DType::kF32, {1, 1, 2, 3}, v6)}});
  REQUIRE(bytes2.size() == 8 + 72 + 24);
  CHECK(io_test::to_string(bytes2).substr(0, 8) == u64le(72));
  CHECK(io_test::to_string(bytes2).substr(8 + 65, 7) == "       ");
  // test_empty and metadata only.
  CHECK(io_test::to_string(io::safetensors_bytes({})) ==
        hex_bytes("08000000000000007b7d202020202020"));
  CHECK(io_test::to_string(io::safetensors_bytes({}, {{"framework", "pt"}})) ==
        u64le(40) + R"({"__metadata__":{"framework":"pt"}})" + "     ");
  // The 160-byte vector: F32 sorts before F16, metadata first.
  const trainkit::f16 h[] = {trainkit::f16(1.0f), trainkit::f16(2.0f)};
  const float three = 3.0f;
  const auto bytes5 = io::safetensors_bytes(
      {{"b", AnyTensorView(DType::kF16, {2}, h)}, {"a", AnyTensorView(DType::kF32, {1}, &three)}},
      {{"format", "pt"}});
  CHECK(
      io_test::to_string(bytes5) ==
      hex_bytes("9000000000000000") +
          R"({"__metadata__":{"format":"pt"},"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]},"b":{"dtype":"F16","shape":[2],"data_offsets":[4,8]}})" +
          "      " + hex_bytes("00004040003c0040"));

  // The same five files as written by the Python reference (tests/fixtures/safetensors).
  CHECK(io_test::to_string(bytes1) ==
        io_test::read_file(kFixtures + "vec_serialization.safetensors"));
  CHECK(io_test::to_string(bytes2) ==
        io_test::read_file(kFixtures + "vec_forced_alignment.safetensors"));
  CHECK(io_test::to_string(io::safetensors_bytes({})) ==
        io_test::read_file(kFixtures + "vec_empty.safetensors"));
  CHECK(io_test::to_string(io::safetensors_bytes({}, {{"framework", "pt"}})) ==
        io_test::read_file(kFixtures + "vec_metadata_only.safetensors"));
  CHECK(io_test::to_string(bytes5) ==
        io_test::read_file(kFixtures + "vec_f32_f16_metadata.safetensors"));
}

TEST_CASE("safetensors writer: every dtype matches the Python reference writer's file") {
  std::vector<AnyTensor> storage;
  const auto tensors = fixture_all_dtypes(storage);
  const std::string ours = io_test::to_string(io::safetensors_bytes(tensors, {{"format", "pt"}}));
  const std::string theirs = io_test::read_file(kFixtures + "python_all_dtypes.safetensors");
  REQUIRE(!theirs.empty());
  CHECK(ours.size() == theirs.size());
  CHECK(ours == theirs);

  // And the reference's file reads back to the same tensors, zero-copy and aligned.
  const io::SafetensorsFile f(kFixtures + "python_all_dtypes.safetensors");
  CHECK(f.size() == tensors.size());
  CHECK(f.zero_copy());
  CHECK(f.metadata() == io::SafetensorsMetadata{{"format", "pt"}});
  for (const auto& t : tensors) {
    CAPTURE(t.name);
    REQUIRE(f.contains(t.name));
    const AnyTensorView v = f.tensor(t.name);
    CHECK(same_bytes(v, t.tensor));
    if (v.bytes() != 0)
      CHECK(reinterpret_cast<std::uintptr_t>(v.data()) % trainkit::dtype_size(v.dtype()) == 0);
  }
  const auto loaded = io::load_safetensors(kFixtures + "python_all_dtypes.safetensors");
  CHECK(loaded.size() == tensors.size());
  for (const auto& t : tensors) CHECK(same_bytes(loaded.at(t.name), t.tensor));
}

TEST_CASE("safetensors writer: order is dtype (descending reference order) then name") {
  const double d[1] = {1};
  const float f[2] = {1, 2};
  const std::uint8_t u[3] = {1, 2, 3};
  const bool b[1] = {true};
  const trainkit::bf16 bf[1] = {trainkit::bf16(1.0f)};
  const std::int64_t i64[1] = {-1};
  const std::vector<io::NamedTensor> tensors = {
      {"z_u8", AnyTensorView(DType::kU8, {3}, u)},   {"b_f32", AnyTensorView(DType::kF32, {2}, f)},
      {"a_f32", AnyTensorView(DType::kF32, {1}, f)}, {"flag", AnyTensorView(DType::kBool, {1}, b)},
      {"m_f64", AnyTensorView(DType::kF64, {1}, d)}, {"bf", AnyTensorView(DType::kBF16, {1}, bf)},
      {"i", AnyTensorView(DType::kI64, {1}, i64)}};
  const io::SafetensorsLayout layout = io::plan_safetensors(tensors);
  std::vector<std::string> order;
  for (std::size_t i : layout.order) order.push_back(tensors[i].name);
  // I64 > F64 > F32 > BF16 > U8 > BOOL in the reference's enum.
  CHECK(order == std::vector<std::string>{"i", "m_f64", "a_f32", "b_f32", "bf", "z_u8", "flag"});
  CHECK(layout.offsets[6] == 0);   // i
  CHECK(layout.offsets[4] == 8);   // m_f64
  CHECK(layout.offsets[2] == 16);  // a_f32
  CHECK(layout.offsets[1] == 20);  // b_f32
  CHECK(layout.data_bytes == 8 + 8 + 4 + 8 + 2 + 3 + 1);
  CHECK(layout.prefix.size() % 8 == 0);

  // Names compare as bytes (UTF-8 after ASCII), like Rust's String ordering.
  const std::vector<io::NamedTensor> names = {{"\xc3\xa9", AnyTensorView(DType::kU8, {1}, u)},
                                              {"z", AnyTensorView(DType::kU8, {1}, u)},
                                              {"Z", AnyTensorView(DType::kU8, {1}, u)}};
  const auto l2 = io::plan_safetensors(names);
  CHECK(names[l2.order[0]].name == "Z");
  CHECK(names[l2.order[1]].name == "z");
  CHECK(names[l2.order[2]].name == "\xc3\xa9");
}

TEST_CASE("safetensors writer: alignment option and bad input") {
  const float f[3] = {1, 2, 3};
  for (std::size_t align : {8, 64, 4096}) {
    io::SafetensorsWriteOptions opt;
    opt.alignment = align;
    const auto bytes = io::safetensors_bytes({{"x", AnyTensorView(DType::kF32, {3}, f)}}, {}, opt);
    const auto file = io::SafetensorsFile::from_buffer(bytes);
    CHECK(file.header().data_offset() % align == 0);
    CHECK(file.tensor("x").as<float, 1>()(2) == 3.0f);
  }
  io::SafetensorsWriteOptions bad;
  bad.alignment = 12;
  CHECK_THROWS_WITH(io::safetensors_bytes({}, {}, bad), doctest::Contains("power of two"));
  for (const std::size_t huge :
       {std::size_t{1} << 21, std::size_t{1} << 44, std::size_t{1} << 63}) {
    bad.alignment = huge;  // refused before the header is padded to it
    CHECK_THROWS_WITH_AS(io::safetensors_bytes({}, {}, bad),
                         doctest::Contains("is not a power of two in [8, 2^20]"), trainkit::Error);
  }

  const auto expect_invalid = [](const std::vector<io::NamedTensor>& t,
                                 const io::SafetensorsMetadata& m, std::string_view what) {
    try {
      (void)io::safetensors_bytes(t, m);
      FAIL("writer accepted bad input: ", what);
    } catch (const trainkit::Error& e) {
      CHECK(contains(e.what(), "InvalidArgument"));
      CHECK(contains(e.what(), what));
      CHECK(e.code() == static_cast<long long>(SafetensorsRule::kInvalidArgument));
    }
  };
  const AnyTensorView v(DType::kF32, {1}, f);
  expect_invalid({{"a", v}, {"a", v}}, {}, "'a' appears twice");
  {  // equal names of different dtypes, another tensor sorting between them
    const std::int64_t i64 = 1;
    const double f64 = 2.0;
    expect_invalid({{"a", AnyTensorView(DType::kI64, {1}, &i64)},
                    {"b", AnyTensorView(DType::kF64, {1}, &f64)},
                    {"a", v}},
                   {}, "'a' appears twice");
  }
  expect_invalid({{"__metadata__", v}}, {}, "reserved");
  expect_invalid({{"bad\xff", v}}, {}, "not UTF-8");
  expect_invalid({}, {{"k", "\xc0\x80"}}, "not UTF-8");
  expect_invalid({{"null", AnyTensorView(DType::kF32, {4}, nullptr)}}, {}, "null data pointer");
  // An empty tensor needs no data pointer, and an empty name is legal (as in the reference).
  const auto ok = io::safetensors_bytes({{"", AnyTensorView(DType::kF32, {0, 4}, nullptr)}});
  CHECK(io::SafetensorsFile::from_buffer(ok).tensor("").numel() == 0);
  // Names and metadata that need JSON escapes survive a round trip.
  const std::string odd = "q\"b\\n\n\x01\xf0\x9f\x98\x80";
  const auto esc = io::safetensors_bytes({{odd, v}}, {{odd, odd}});
  const auto back = io::SafetensorsFile::from_buffer(esc);
  CHECK(back.contains(odd));
  CHECK(back.metadata().at(odd) == odd);
}

TEST_CASE("safetensors: every dtype round-trips through a file, zero-copy") {
  TempDir dir;
  const auto path = dir / "all.safetensors";
  std::vector<AnyTensor> storage;
  std::vector<io::NamedTensor> tensors;
  int k = 0;
  for (DType t : trainkit::kAllDTypes) {
    for (const Shape& s : {Shape{}, Shape{0}, Shape{4, 3}, Shape{2, 1, 3}}) {
      storage.push_back(pattern_tensor(t, s, k));
      tensors.push_back(
          {std::string(trainkit::dtype_name(t)) + "/" + std::to_string(k++), AnyTensorView()});
    }
  }
  for (std::size_t i = 0; i < tensors.size(); ++i) tensors[i].tensor = storage[i];
  io::save_safetensors(path, tensors, {{"step", "42"}, {"format", "pt"}});
  CHECK(dir.entries() == std::vector<std::string>{"all.safetensors"});

  const io::SafetensorsFile f(path);
  CHECK(f.source() == path.string());
  CHECK(f.size() == tensors.size());
  CHECK(f.zero_copy());
  CHECK(f.metadata().size() == 2);
  CHECK(f.metadata().at("step") == "42");
  const auto mapped_lo = reinterpret_cast<std::uintptr_t>(f.tensor_at(0).data());
  for (const auto& t : tensors) {
    CAPTURE(t.name);
    const AnyTensorView v = f.tensor(t.name);
    CHECK(same_bytes(v, t.tensor));
    CHECK(f.info(t.name).dtype_name == trainkit::dtype_name(t.tensor.dtype()));
    // Zero-copy: the view points into the mapping, past the header.
    CHECK(reinterpret_cast<std::uintptr_t>(v.data()) >= mapped_lo);
  }
  // Typed access through the view.
  const auto m = f.tensor("F32/6").as<float, 2>();
  CHECK(m.size(0) == 4);
  std::uint32_t bits = 0;
  std::memcpy(&bits, &m(0, 0), 4);
  CHECK(bits == 0xb6916c47u);  // bytes 47 6c 91 b6: (37j + 11*6 + 5) mod 256, j = 0..3
  CHECK(f.copy("BF16/14").bytes() == 24);
  CHECK_THROWS_WITH(f.tensor("nope"), doctest::Contains("TensorNotFound"));
  CHECK_THROWS_WITH(f.tensor("nope"), doctest::Contains(path.string().c_str()));
  CHECK(f.find("nope") == nullptr);

  // The read()-based loader gives the same tensors.
  const auto loaded = io::load_safetensors(path);
  for (const auto& t : tensors) CHECK(same_bytes(loaded.at(t.name), t.tensor));

  // Saving again replaces the file; a moved-from reader still works from its new owner.
  io::SafetensorsFile moved = io::SafetensorsFile(path);
  io::save_safetensors(path, {{"only", storage[2]}});
  CHECK(moved.size() == tensors.size());  // the old mapping survives the rename
  CHECK(same_bytes(moved.tensor(tensors[5].name), tensors[5].tensor));
  CHECK(io::SafetensorsFile(path).names() == std::vector<std::string>{"only"});
}

TEST_CASE("safetensors: load_safetensors reads big tensors in pieces on several threads") {
  TempDir dir;
  const auto path = dir / "big.safetensors";
  // 20 MiB + a bit: three 8 MiB pieces, the last one partial, plus small tensors around it.
  AnyTensor big = pattern_tensor(DType::kU16, {5, 1024 * 1024 * 2 + 3}, 7);
  AnyTensor small = pattern_tensor(DType::kF64, {3}, 8);
  AnyTensor empty = pattern_tensor(DType::kF32, {0}, 9);
  io::save_safetensors(path, {{"big", big}, {"small", small}, {"empty", empty}});
  for (unsigned threads : {1u, 3u, 0u}) {
    CAPTURE(threads);
    const auto loaded = io::load_safetensors(path, {.threads = threads});
    REQUIRE(loaded.size() == 3);
    CHECK(same_bytes(loaded.at("big"), big));
    CHECK(same_bytes(loaded.at("small"), small));
    CHECK(same_bytes(loaded.at("empty"), empty));
  }
  // A truncated file is refused before anything is read.
  std::filesystem::resize_file(path, std::filesystem::file_size(path) - 1);
  CHECK_THROWS_WITH(io::load_safetensors(path, {.threads = 3}),
                    doctest::Contains("MetadataIncompleteBuffer"));
}

TEST_CASE("safetensors reader: accepted variations") {
  // The minimal file of the crate's test_deserialization: I32 [2, 2] and 16 zero bytes.
  const std::string base = R"({"test":{"dtype":"I32","shape":[2,2],"data_offsets":[0,16]}})";
  // (from_buffer borrows: the images must outlive the readers.)
  const std::string img1 = st_image(base, std::string(16, '\0'));
  auto f = io::SafetensorsFile::from_buffer(std::as_bytes(std::span(img1)));
  CHECK(f.tensor("test").shape() == Shape{2, 2});
  CHECK(f.tensor("test").as<std::int32_t, 2>()(1, 1) == 0);

  // Leading/trailing JSON whitespace (accepted since safetensors #686), unknown fields,
  // __metadata__ null / {} / anywhere, and tensors listed out of offset order.
  const std::string img2 = st_image(
      " \t\n{\"b\":{\"data_offsets\":[1,2],\"shape\":[1],\"dtype\":\"U8\",\"extra\":[1.5,{}]},"
      "\"__metadata__\":null,\"a\":{\"dtype\":\"U8\",\"shape\":[],\"data_offsets\":[0,1]}} \r\n",
      "xy");
  f = io::SafetensorsFile::from_buffer(std::as_bytes(std::span(img2)));
  CHECK(f.names() == std::vector<std::string>{"a", "b"});
  CHECK(char(f.tensor("b").data()[0]) == 'y');
  CHECK(f.metadata().empty());
  const std::string img3 = st_image(R"({"__metadata__":{}})");
  CHECK(io::SafetensorsFile::from_buffer(std::as_bytes(std::span(img3))).size() == 0);

  // Several empty tensors share offset 0..0.
  const std::string img4 = st_image(
      R"({"e1":{"dtype":"F32","shape":[0],"data_offsets":[0,0]},"e2":{"dtype":"F64","shape":[3,0],"data_offsets":[0,0]},"x":{"dtype":"I8","shape":[2],"data_offsets":[0,2]}})",
      "\x01\xff");
  f = io::SafetensorsFile::from_buffer(std::as_bytes(std::span(img4)));
  CHECK(f.size() == 3);
  CHECK(f.tensor("x").as<std::int8_t, 1>()(1) == -1);
}

TEST_CASE("safetensors reader: misaligned tensors are copied into aligned memory") {
  // An unpadded 8 + 57-byte header puts the data at an odd offset (files from old writers).
  const std::string json = R"({"w":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}})";
  REQUIRE((8 + json.size()) % 4 != 0);
  const float vals[2] = {1.5f, -2.0f};
  const std::string img = st_image(json, std::string(reinterpret_cast<const char*>(vals), 8));
  TempDir dir;
  io_test::write_file(dir / "odd.safetensors", img);
  const io::SafetensorsFile f(dir / "odd.safetensors");
  CHECK_FALSE(f.zero_copy());
  const AnyTensorView v = f.tensor("w");
  CHECK(reinterpret_cast<std::uintptr_t>(v.data()) % 4 == 0);
  CHECK(v.as<float, 1>()(0) == 1.5f);
  CHECK(v.as<float, 1>()(1) == -2.0f);
  CHECK(io::load_safetensors(dir / "odd.safetensors").at("w").as<float, 1>()(1) == -2.0f);
}

TEST_CASE("safetensors reader: dtypes trainkit lacks are validated and listed, not viewed") {
  const std::string img = st_image(
      R"({"c":{"dtype":"C64","shape":[1],"data_offsets":[0,8]},"q":{"dtype":"F4","shape":[4],"data_offsets":[8,10]},"s":{"dtype":"F8_E8M0","shape":[1],"data_offsets":[10,11]}})",
      "abcdefghijk");
  const auto f = io::SafetensorsFile::from_buffer(std::as_bytes(std::span(img)), "mx.safetensors");
  CHECK(f.size() == 3);
  CHECK_FALSE(f.info("c").dtype.has_value());
  CHECK(f.info("q").dtype_name == "F4");
  CHECK(f.raw_bytes("q").size() == 2);
  CHECK(char(f.raw_bytes("s")[0]) == 'k');
  try {
    (void)f.tensor("c");
    FAIL("C64 view accepted");
  } catch (const trainkit::Error& e) {
    CHECK(contains(e.what(), "mx.safetensors"));
    CHECK(contains(e.what(), "Unsupported"));
    CHECK(contains(e.what(), "'c'"));
    CHECK(contains(e.what(), "C64"));
  }
}

TEST_CASE("safetensors reader: every validation rule has a crafted bad file") {
  using R = SafetensorsRule;
  const std::string ok_u8 = R"({"a":{"dtype":"U8","shape":[1],"data_offsets":[0,1]}})";

  SUBCASE("HeaderTooSmall") {
    expect_rule("", R::kHeaderTooSmall);
    expect_rule(std::string("\x05\0\0\0\0", 5), R::kHeaderTooSmall, "5 bytes");
  }
  SUBCASE("HeaderTooLarge") {
    expect_rule(std::string("<\0\0\0\0\xff\xff\xff", 8), R::kHeaderTooLarge);
    expect_rule(st_image("{}", "", 100'000'001), R::kHeaderTooLarge, "100000001");
  }
  SUBCASE("InvalidHeaderLength") {
    expect_rule(st_image("{}", "", 100), R::kInvalidHeaderLength, "header length 100");
  }
  SUBCASE("InvalidHeader (not UTF-8)") {
    expect_rule(st_image("\xff"), R::kInvalidHeader, "UTF-8");
    expect_rule(st_image("{\"\xc3\x28\":1}"), R::kInvalidHeader);
  }
  SUBCASE("InvalidHeaderDeserialization") {
    const auto bad = [&](const std::string& json, std::string_view detail = {},
                         std::string_view data = {}) {
      CAPTURE(json);
      expect_rule(st_image(json, data), R::kInvalidHeaderDeserialization, detail);
    };
    bad("{", "not valid JSON");
    bad(std::string("\0{}", 3), "not valid JSON");  // must start with '{' (or whitespace)
    bad(std::string("{}\0", 3), "not valid JSON");  // padding must be spaces, not NULs
    bad("{} x", "trailing characters");
    bad("[]", "expected an object");
    bad(R"({"a":1})", "tensor 'a'");
    bad(R"({"a":{"dtype":"F33","shape":[1],"data_offsets":[0,4]}})", "unknown dtype 'F33'");
    bad(R"({"a":{"dtype":"f32","shape":[1],"data_offsets":[0,4]}})", "unknown dtype");
    bad(R"({"a":{"shape":[1],"data_offsets":[0,1]}})", "missing field 'dtype'");
    bad(R"({"a":{"dtype":"U8","data_offsets":[0,1]}})", "missing field 'shape'");
    bad(R"({"a":{"dtype":"U8","shape":[1]}})", "missing field 'data_offsets'");
    bad(R"({"a":{"dtype":5,"shape":[1],"data_offsets":[0,1]}})", "'dtype' is not a string");
    bad(R"({"a":{"dtype":"U8","shape":[-1],"data_offsets":[0,1]}})", "integers >= 0", "x");
    bad(R"({"a":{"dtype":"U8","shape":[1.0],"data_offsets":[0,1]}})", "integers >= 0", "x");
    bad(R"({"a":{"dtype":"U8","shape":[18446744073709551616],"data_offsets":[0,1]}})",
        "integers >= 0", "x");
    bad(R"({"a":{"dtype":"U8","shape":1,"data_offsets":[0,1]}})", "not an array", "x");
    bad(R"({"a":{"dtype":"U8","shape":[1],"data_offsets":[0,1,1]}})", "two integers", "x");
    bad(R"({"a":{"dtype":"U8","shape":[1],"data_offsets":[0]}})", "two integers", "x");
    bad(R"({"a":{"dtype":"U8","shape":[1],"data_offsets":[0,-1]}})", "two integers", "x");
    bad(R"({"__metadata__":{"n":1}})", "expected a string");
    bad(R"({"__metadata__":{"n":{"x":"y"}}})", "expected a string");
    bad(R"({"__metadata__":"pt"})", "__metadata__");
    bad(R"({"__metadata__":{"dtype":"U8","shape":[1],"data_offsets":[0,1]}})", "expected a string",
        "x");
    bad(R"({"a":{"dtype":"U8","shape":[[[[[[[[1]]]]]]]],"data_offsets":[0,1]}})", "", "x");
    {  // 4 MB of zeros in one shape: refused as it is read (not built into a tree of gigabytes)
      std::string zeros = R"({"a":{"dtype":"U8","shape":[)";
      for (int i = 0; i < (1 << 21); ++i) zeros += i == 0 ? "0" : ",0";
      zeros += R"(],"data_offsets":[0,0]}})";
      const auto t0 = std::chrono::steady_clock::now();
      bad(zeros, "an array of more than 64 elements");
      CHECK(std::chrono::steady_clock::now() - t0 < std::chrono::seconds(2));
    }
  }
  SUBCASE("InvalidOffset") {
    expect_rule(st_image(R"({"a":{"dtype":"U8","shape":[1],"data_offsets":[1,2]}})", "xx"),
                R::kInvalidOffset, "tensor 'a'");  // a hole before the first tensor
    expect_rule(
        st_image(
            R"({"a":{"dtype":"U8","shape":[2],"data_offsets":[0,2]},"b":{"dtype":"U8","shape":[2],"data_offsets":[1,3]}})",
            "xyz"),
        R::kInvalidOffset, "tensor 'b'");  // overlap
    expect_rule(
        st_image(
            R"({"a":{"dtype":"U8","shape":[1],"data_offsets":[0,1]},"b":{"dtype":"U8","shape":[1],"data_offsets":[2,3]}})",
            "xyz"),
        R::kInvalidOffset, "tensor 'b'");  // hole between tensors
    expect_rule(
        st_image(
            R"({"a":{"dtype":"U8","shape":[2],"data_offsets":[0,2]},"b":{"dtype":"U8","shape":[1],"data_offsets":[2,1]}})",
            "xy"),
        R::kInvalidOffset, "tensor 'b'");  // end < begin
  }
  SUBCASE("ValidationOverflow") {
    expect_rule(
        st_image(R"({"a":{"dtype":"U8","shape":[2,18446744073709551614],"data_offsets":[0,4]}})",
                 "xxxx"),
        R::kValidationOverflow, "tensor 'a'");
    expect_rule(
        st_image(R"({"a":{"dtype":"F64","shape":[4611686018427387904],"data_offsets":[0,8]}})",
                 std::string(8, 'x')),
        R::kValidationOverflow);  // numel fits, numel * 64 bits does not
  }
  SUBCASE("MisalignedSlice") {
    expect_rule(st_image(R"({"q":{"dtype":"F4","shape":[3],"data_offsets":[0,2]}})", "xx"),
                R::kMisalignedSlice, "tensor 'q'");
  }
  SUBCASE("TensorInvalidInfo") {
    expect_rule(st_image(R"({"w":{"dtype":"F32","shape":[2],"data_offsets":[0,4]}})", "xxxx"),
                R::kTensorInvalidInfo, "tensor 'w' spans 4 bytes but 2 elements of F32 need 8");
  }
  SUBCASE("MetadataIncompleteBuffer") {
    const std::string good = st_image(
        R"({"test":{"dtype":"I32","shape":[2,2],"data_offsets":[0,16]}})", std::string(16, '\0'));
    expect_rule(good + "extra", R::kMetadataIncompleteBuffer, "trailing bytes");
    expect_rule(good.substr(0, good.size() - 2), R::kMetadataIncompleteBuffer, "truncated");
    expect_rule(st_image(ok_u8), R::kMetadataIncompleteBuffer);
  }
  SUBCASE("DuplicateName") {
    expect_rule(
        st_image(
            R"({"a":{"dtype":"U8","shape":[1],"data_offsets":[0,1]},"a":{"dtype":"U8","shape":[1],"data_offsets":[0,1]}})",
            "x"),
        R::kDuplicateName, "'a' twice");
    expect_rule(
        st_image(R"({"a":{"dtype":"U8","dtype":"U8","shape":[1],"data_offsets":[0,1]}})", "x"),
        R::kDuplicateName, "'dtype' twice");
    expect_rule(st_image(R"({"__metadata__":{"k":"1","k":"2"}})"), R::kDuplicateName);
  }
  SUBCASE("Unsupported (valid, beyond trainkit's types)") {
    expect_rule(
        st_image(R"({"r9":{"dtype":"U8","shape":[1,1,1,1,1,1,1,1,1],"data_offsets":[0,1]}})", "x"),
        R::kUnsupported, "rank 9");
    expect_rule(
        st_image(R"({"big":{"dtype":"U8","shape":[0,18446744073709551615],"data_offsets":[0,0]}})"),
        R::kUnsupported, "2^63");
  }
  SUBCASE("the valid control file opens") {
    const std::string img = st_image(ok_u8, "x");
    CHECK(io::SafetensorsFile::from_buffer(std::as_bytes(std::span(img))).size() == 1);
  }
}

TEST_CASE("safetensors: a full disk during save keeps the previous checkpoint") {
  TempDir dir;
  const auto path = dir / "model.safetensors";
  const std::vector<float> small(10, 1.0f);
  io::save_safetensors(path, {{"w", AnyTensorView(DType::kF32, {10}, small.data())}});
  const std::string before = io_test::read_file(path);

  const std::vector<float> big(1 << 20, 2.0f);  // 4 MiB against a 1 MiB limit
  const std::string message = io_test::run_with_file_size_limit(1 << 20, [&] {
    io::save_safetensors(path, {{"w", AnyTensorView(DType::kF32, {1 << 20}, big.data())}});
  });
  CAPTURE(message);
  CHECK(contains(message, "EFBIG"));
  CHECK(contains(message, path.string()));
  CHECK(io_test::read_file(path) == before);
  CHECK(dir.entries() == std::vector<std::string>{"model.safetensors"});
  CHECK(io::SafetensorsFile(path).tensor("w").as<float, 1>()(9) == 1.0f);
}

TEST_CASE("safetensors index: shard names, JSON layout, round trip and checks") {
  CHECK(io::safetensors_shard_name(0, 3) == "model-00001-of-00003.safetensors");
  CHECK(io::safetensors_shard_name(11, 12, "rank") == "rank-00012-of-00012.safetensors");
  CHECK_THROWS(io::safetensors_shard_name(3, 3));

  io::SafetensorsIndex index;
  index.metadata.set("total_size", 28);
  index.weight_map["b.weight"] = "model-00002-of-00002.safetensors";
  index.weight_map["a.weight"] = "model-00001-of-00002.safetensors";
  index.weight_map["a.bias"] = "model-00001-of-00002.safetensors";
  CHECK(index.to_json() ==
        "{\n  \"metadata\": {\n    \"total_size\": 28\n  },\n  \"weight_map\": {\n"
        "    \"a.bias\": \"model-00001-of-00002.safetensors\",\n"
        "    \"a.weight\": \"model-00001-of-00002.safetensors\",\n"
        "    \"b.weight\": \"model-00002-of-00002.safetensors\"\n  }\n}\n");
  CHECK(index.files() == std::vector<std::string>{"model-00001-of-00002.safetensors",
                                                  "model-00002-of-00002.safetensors"});
  CHECK(index.total_size() == 28u);

  TempDir dir;
  const float a[3] = {1, 2, 3}, bias[1] = {4}, b[3] = {5, 6, 7};
  io::save_safetensors(dir / "model-00001-of-00002.safetensors",
                       {{"a.weight", AnyTensorView(DType::kF32, {3}, a)},
                        {"a.bias", AnyTensorView(DType::kF32, {1}, bias)}});
  io::save_safetensors(dir / "model-00002-of-00002.safetensors",
                       {{"b.weight", AnyTensorView(DType::kF32, {3}, b)}});
  const auto index_path = dir / std::string(io::kSafetensorsIndexName);
  io::save_safetensors_index(index_path, index);
  const io::SafetensorsIndex back = io::load_safetensors_index(index_path);
  CHECK(back.weight_map == index.weight_map);
  CHECK(back.metadata == index.metadata);

  const io::SafetensorsShards shards(index_path);
  CHECK(shards.size() == 3);
  CHECK(shards.shards().size() == 2);
  CHECK(shards.tensor("b.weight").as<float, 1>()(2) == 7.0f);
  CHECK(shards.tensor("a.bias").as<float, 1>()(0) == 4.0f);
  CHECK_THROWS_WITH(shards.tensor("c"), doctest::Contains("no tensor named 'c'"));

  // A map entry its shard does not hold, a missing shard, and malformed indexes.
  index.weight_map["ghost"] = "model-00002-of-00002.safetensors";
  io::save_safetensors_index(index_path, index);
  CHECK_THROWS_WITH(io::SafetensorsShards{index_path}, doctest::Contains("'ghost'"));
  index.weight_map["ghost"] = "model-00009-of-00009.safetensors";
  io::save_safetensors_index(index_path, index);
  CHECK_THROWS_WITH(io::SafetensorsShards{index_path},
                    doctest::Contains("model-00009-of-00009.safetensors"));
  CHECK_THROWS_WITH(io::SafetensorsIndex::parse(R"({"metadata":{}})", "i.json"),
                    doctest::Contains("missing 'weight_map'"));
  CHECK_THROWS_WITH(io::SafetensorsIndex::parse(R"({"weight_map":{"a":1}})", "i.json"),
                    doctest::Contains("weight_map['a'] is not a string"));
  CHECK_THROWS_WITH(io::SafetensorsIndex::parse(R"({"weight_map":{"a":"../x.safetensors"}})"),
                    doctest::Contains("not a relative path"));
  CHECK_THROWS_WITH(io::SafetensorsIndex::parse(R"({"weight_map":{"a":"/x.safetensors"}})"),
                    doctest::Contains("not a relative path"));
  CHECK_THROWS_WITH(io::SafetensorsIndex::parse(R"({"weight_map":{},"weight_map":{}})", "i.json"),
                    doctest::Contains("duplicate key 'weight_map'"));
  // Hugging Face files with only weight_map, or metadata null, are accepted.
  CHECK(io::SafetensorsIndex::parse(R"({"metadata":null,"weight_map":{"x":"m.safetensors"}})")
            .weight_map.size() == 1);
}

TEST_CASE("safetensors index: a tensor a shard holds must be listed under that shard") {
  // Random sets (tensor counts, splits over shards, names with control bytes); each is opened as
  // written, then with one tensor left out of the index, copied into a second shard, or listed
  // under a shard that does not hold it.
  TempDir dir;
  std::mt19937 rng(12345);
  const auto pick = [&](std::size_t n) { return std::size_t(rng() % n); };
  std::vector<float> values(64);
  for (std::size_t i = 0; i < values.size(); ++i) values[i] = float(i);

  using Layout = std::map<std::string, std::vector<std::string>>;  // shard file -> tensor names
  const auto write_set = [&](const std::filesystem::path& at, const Layout& layout,
                             const io::SafetensorsIndex& index) {
    std::filesystem::create_directories(at);
    for (const auto& [file, names] : layout) {
      std::vector<io::NamedTensor> tensors;
      for (const std::string& name : names)
        tensors.push_back(
            {name, AnyTensorView(DType::kF32, {std::int64_t(name.size() % 8 + 1)}, values.data())});
      io::save_safetensors(at / file, tensors, {}, {.durable = false});
    }
    io::save_safetensors_index(at / std::string(io::kSafetensorsIndexName), index,
                               {.durable = false});
    return at / std::string(io::kSafetensorsIndexName);
  };
  const auto error_of = [](const std::filesystem::path& index_path) {
    try {
      const io::SafetensorsShards shards(index_path);
    } catch (const trainkit::Error& e) {
      return std::string(e.what());
    }
    return std::string("<no error>");
  };
  const auto printable = [](const std::string& name) {
    std::string out = name;
    for (char& c : out)
      if (static_cast<unsigned char>(c) < 0x20) c = '?';
    return out;
  };

  for (int trial = 0; trial < 40; ++trial) {
    CAPTURE(trial);
    const std::size_t n_tensors = 1 + pick(12);
    const std::size_t n_shards = 1 + pick(std::min<std::size_t>(n_tensors, 5));
    Layout layout;
    io::SafetensorsIndex index;
    std::uint64_t total = 0;
    for (std::size_t k = 0; k < n_tensors; ++k) {
      // Every shard gets one tensor first, the rest go anywhere.
      const std::size_t s = k < n_shards ? k : pick(n_shards);
      const std::string file = io::safetensors_shard_name(s, n_shards);
      std::string name = "layers." + std::to_string(k) + (pick(3) == 0 ? ".bi\nas" : ".weight");
      if (pick(4) == 0) name += '\0';
      layout[file].push_back(name);
      index.weight_map[name] = file;
      total += 4 * (name.size() % 8 + 1);
    }
    index.metadata.set("total_size", total);
    const std::string base = "set" + std::to_string(trial);

    // As written (Hugging Face's layout, with metadata): accepted, every tensor where listed.
    {
      const io::SafetensorsShards shards(write_set(dir / (base + "ok"), layout, index));
      CHECK(shards.size() == n_tensors);
      CHECK(shards.shards().size() == n_shards);
      CHECK(shards.index().total_size() == total);
      for (const auto& [name, file] : index.weight_map) {
        CHECK(shards.shard_of(name).source().ends_with(file));
        CHECK(shards.tensor(name).numel() == std::int64_t(name.size() % 8 + 1));
      }
    }
    auto it = index.weight_map.begin();
    std::advance(it, std::ptrdiff_t(pick(index.weight_map.size())));
    const std::string name = it->first, file = it->second;
    const auto check_refused = [&](const std::filesystem::path& index_path,
                                   const std::string& shard, const std::string& listed_under) {
      const std::string m = error_of(index_path);
      CAPTURE(m);
      CHECK(contains(m, "safetensors index '" + index_path.string() + "'"));
      CHECK(contains(m, "does not list tensor '" + printable(name) + "'"));
      CHECK(contains(m, "shard '" + shard + "'"));
      if (!listed_under.empty()) CHECK(contains(m, "lists it under '" + listed_under + "'"));
      for (const char c : m) CHECK(static_cast<unsigned char>(c) >= 0x20);
    };

    // Left out of the index: its shard (still in the set) holds a tensor nobody lists.
    {
      io::SafetensorsIndex smaller = index;
      smaller.weight_map.erase(name);
      Layout kept = layout;
      if (layout.at(file).size() == 1) {  // the index must still name the shard
        smaller.weight_map["kept"] = file;
        kept[file].push_back("kept");
      }
      check_refused(write_set(dir / (base + "unlisted"), kept, smaller), file, "");
    }
    // Listed under its shard and present in another one too; and (the edge) listed under one
    // shard but held only by another. With one shard the other is a new file in the set.
    std::vector<std::string> files;
    for (const auto& [f, names] : layout) files.push_back(f);
    std::string other = "extra.safetensors";
    if (n_shards > 1) {
      do other = files[pick(files.size())];
      while (other == file);
    }
    Layout twice = layout, moved = layout;
    io::SafetensorsIndex twice_index = index, moved_index = index;
    twice[other].push_back(name);
    moved[other].push_back(name);
    auto& from = moved[file];
    from.erase(std::find(from.begin(), from.end(), name));
    if (from.empty()) {  // keep the listed shard a valid file of the set
      from.push_back("kept");
      moved_index.weight_map["kept"] = file;
    }
    if (layout.count(other) == 0) {
      twice[other].push_back("extra.only");
      twice_index.weight_map["extra.only"] = other;
      moved[other].push_back("extra.only");
      moved_index.weight_map["extra.only"] = other;
    }
    check_refused(write_set(dir / (base + "twice"), twice, twice_index), other, file);
    check_refused(write_set(dir / (base + "moved"), moved, moved_index), other, file);
  }
}

TEST_CASE("safetensors: SafetensorsBacking::kCopy survives a truncation in place after open") {
  // A mapped file that another process truncates faults when its pages are touched; a file read
  // into memory at open (kCopy) keeps the bytes it read, and loads name the file they fail on.
  TempDir dir;
  const auto path = dir / "t.safetensors";
  AnyTensor big = pattern_tensor(DType::kF32, {64, 1024}, 3);  // 256 KiB: many pages
  AnyTensor small = pattern_tensor(DType::kI16, {5}, 4);
  io::save_safetensors(path, {{"big", big}, {"small", small}}, {{"note", "kept"}});

  const io::SafetensorsFile copied(path, io::SafetensorsBacking::kCopy);
  std::filesystem::resize_file(path, 0);
  CHECK(copied.source() == path.string());
  CHECK(copied.zero_copy());
  CHECK(same_bytes(copied.tensor("big"), big));
  CHECK(same_bytes(copied.tensor("small"), small));
  CHECK(copied.metadata().at("note") == "kept");

  // The same from a MappedFile read with copied(), handed over.
  io::save_safetensors(path, {{"big", big}, {"small", small}}, {{"note", "kept"}});
  const io::SafetensorsFile adopted(io::MappedFile::copied(path));
  std::filesystem::resize_file(path, 100);
  CHECK(adopted.source() == path.string());
  CHECK(same_bytes(adopted.tensor("big"), big));

  // A file that is already short when read is refused by its rules, naming it.
  CHECK_THROWS_WITH(io::SafetensorsFile(path, io::SafetensorsBacking::kCopy),
                    doctest::Contains(path.string().c_str()));
  CHECK_THROWS_WITH(io::MappedFile::copied(dir / "missing"), doctest::Contains("cannot open"));
  CHECK_THROWS_WITH(io::MappedFile::copied(dir.path()), doctest::Contains("not a regular file"));
  std::filesystem::resize_file(path, 0);
  CHECK(io::MappedFile::copied(path).empty());
}

TEST_CASE("safetensors: load_safetensors hands out the metadata when asked") {
  TempDir dir;
  const auto path = dir / "m.safetensors";
  AnyTensor t = pattern_tensor(DType::kF32, {3}, 5);
  io::save_safetensors(path, {{"t", t}}, {{"format", "pt"}, {"step", "12"}});
  io::SafetensorsMetadata metadata;
  const auto loaded = io::load_safetensors(path, {}, &metadata);
  CHECK(same_bytes(loaded.at("t"), t));
  CHECK(metadata == io::SafetensorsMetadata{{"format", "pt"}, {"step", "12"}});
}

TEST_CASE("safetensors: a BOOL tensor holding bytes other than 0/1 is refused at open") {
  // torch saves a uint8 tensor viewed as bool (t.view(torch.bool)) with its bytes as they are;
  // handing those out as C++ bools would be undefined, so every reader refuses the file, naming
  // the tensor and the first bad element.
  std::string flags(6000, '\0');
  for (std::size_t i = 0; i < flags.size(); i += 3) flags[i] = '\1';
  flags[4999] = '\7';  // in the second 4 KiB block: the first bad element, not the first block
  flags[5500] = '\2';
  const std::string json = R"({"ok":{"dtype":"U8","shape":[2],"data_offsets":[0,2]},)"
                           R"("mask":{"dtype":"BOOL","shape":[6000],"data_offsets":[2,6002]}})";
  const std::string image = st_image(json, std::string("\x05\x09", 2) + flags);
  expect_rule(image, SafetensorsRule::kUnsupported,
              "BOOL tensor 'mask' element 4999 holds the byte 7");

  TempDir dir;
  const auto path = dir / "mask.safetensors";
  io_test::write_file(path, image);
  CHECK_THROWS_WITH_AS(io::SafetensorsFile(path, io::SafetensorsBacking::kCopy),
                       doctest::Contains((path.string() + "': Unsupported: BOOL tensor 'mask' "
                                                          "element 4999 holds the byte 7")
                                             .c_str()),
                       trainkit::Error);

  // The same file with only 0 and 1 in the BOOL tensor (and 5, 9 in the U8 one) opens.
  flags[4999] = '\1';
  flags[5500] = '\0';
  io_test::write_file(path, st_image(json, std::string("\x05\x09", 2) + flags));
  for (const auto backing : {io::SafetensorsBacking::kMap, io::SafetensorsBacking::kCopy}) {
    const io::SafetensorsFile f(path, backing);
    CHECK(std::memcmp(f.tensor("mask").data(), flags.data(), flags.size()) == 0);
    CHECK(std::to_integer<int>(f.tensor("ok").data()[1]) == 9);
  }
  const auto loaded = io::load_safetensors(path);
  CHECK(std::memcmp(loaded.at("mask").data(), flags.data(), flags.size()) == 0);
}
