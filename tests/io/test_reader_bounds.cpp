// SPDX-License-Identifier: MIT
// Size arithmetic on untrusted values: the checked functions of trainkit/core/checked.hpp against
// 128-bit reference arithmetic, and the JSON and safetensors readers on inputs crafted to
// overflow sizes, recurse deeply or exhaust memory. An allocation probe makes memory exhaustion
// deterministic (requests above a bound fail with std::bad_alloc).
#include <doctest/doctest.h>

#include <climits>
#include <cstdint>
#include <cstring>
#include <limits>
#include <optional>
#include <random>
#include <string>
#include <string_view>
#include <vector>

#include "data/alloc_probe.hpp"
#include "trainkit/core/checked.hpp"
#include "trainkit/io/json.hpp"
#include "trainkit/io/safetensors.hpp"

namespace tk = trainkit;
namespace io = trainkit::io;
using io::Json;

namespace {

__extension__ typedef unsigned __int128 u128;
__extension__ typedef __int128 i128;

std::string error_text(const auto& f) {
  try {
    f();
  } catch (const tk::Error& e) {
    return e.what();
  }
  FAIL_CHECK("expected trainkit::Error");
  return "";
}

/// A safetensors image with `header` as its JSON (padded with spaces to 8) and `data` bytes.
std::vector<std::byte> safetensors_image(std::string header, std::size_t data) {
  while ((8 + header.size()) % 8 != 0) header += ' ';
  std::vector<std::byte> out(8 + header.size() + data);
  for (int i = 0; i < 8; ++i) out[std::size_t(i)] = std::byte((header.size() >> (8 * i)) & 0xff);
  std::memcpy(out.data() + 8, header.data(), header.size());
  return out;
}

/// Counts values and string bytes (keys included) of a parsed document.
void measure(const Json& v, std::size_t& values, std::size_t& string_bytes) {
  ++values;
  if (v.is_string()) string_bytes += v.as_string().size();
  if (v.is_array())
    for (const Json& e : v.as_array()) measure(e, values, string_bytes);
  if (v.is_object()) {
    for (const io::JsonMember& m : v.as_object()) {
      string_bytes += m.key.size();
      measure(m.value, values, string_bytes);
    }
  }
}

}  // namespace

TEST_CASE("checked arithmetic: add, mul and cast agree with 128-bit arithmetic") {
  std::mt19937_64 rng(99);
  const auto pick = [&] {
    switch (rng() % 4) {
      case 0: return rng();
      case 1: return rng() >> (rng() % 64);
      case 2: return std::uint64_t(0) - (rng() % 3);
      default: return rng() % 5;
    }
  };
  for (int k = 0; k < 20000; ++k) {
    const std::uint64_t a = pick(), b = pick();
    const u128 sum = u128(a) + b, prod = u128(a) * b;
    const auto s = tk::checked_add(a, b);
    const auto p = tk::checked_mul(a, b);
    CHECK(s.has_value() == (sum <= UINT64_MAX));
    CHECK(p.has_value() == (prod <= UINT64_MAX));
    if (s) CHECK(*s == std::uint64_t(sum));
    if (p) CHECK(*p == std::uint64_t(prod));
    const auto x = std::int64_t(a), y = std::int64_t(b);
    const i128 ssum = i128(x) + y, sprod = i128(x) * y;
    const auto ss = tk::checked_add(x, y);
    const auto sp = tk::checked_mul(x, y);
    CHECK(ss.has_value() == (ssum >= INT64_MIN && ssum <= INT64_MAX));
    CHECK(sp.has_value() == (sprod >= INT64_MIN && sprod <= INT64_MAX));
    if (ss) CHECK(*ss == std::int64_t(ssum));
    if (sp) CHECK(*sp == std::int64_t(sprod));
    const auto a32 = std::uint32_t(a), b32 = std::uint32_t(b);
    CHECK(tk::checked_mul(a32, b32).has_value() == (std::uint64_t(a32) * b32 <= UINT32_MAX));
    CHECK(tk::checked_cast<std::uint32_t>(a).has_value() == (a <= UINT32_MAX));
    CHECK(tk::checked_cast<std::int64_t>(a).has_value() == (a <= std::uint64_t(INT64_MAX)));
    CHECK(tk::checked_cast<std::size_t>(x).has_value() == (x >= 0));
  }
  CHECK_FALSE(tk::checked_mul(std::int64_t{-1}, INT64_MIN).has_value());
  CHECK(tk::checked_mul(std::int64_t{-1}, INT64_MAX) == -INT64_MAX);
  const std::vector<std::uint64_t> dims{std::uint64_t{1} << 40, std::uint64_t{1} << 40, 0};
  CHECK_FALSE(tk::checked_product(std::span<const std::uint64_t>(dims)).has_value());
  const std::vector<std::uint64_t> zero_first{0, std::uint64_t{1} << 40, std::uint64_t{1} << 40};
  CHECK(tk::checked_product(std::span<const std::uint64_t>(zero_first)) == 0u);
  // The throwing forms name what was being computed.
  const std::string what = error_text(
      [] { (void)tk::checked_mul(std::uint64_t{1} << 40, std::uint64_t{1} << 30, "tensor 'w'"); });
  CHECK(what.find("size overflow: tensor 'w'") != std::string::npos);
  CHECK(tk::checked_add(std::size_t{2}, std::size_t{3}, "x") == 5u);
  CHECK(error_text([] { (void)tk::checked_cast<std::uint8_t>(300, "a byte"); }).find("a byte") !=
        std::string::npos);
}

TEST_CASE("json bounds: a huge max_depth cannot make deep input exhaust the stack") {
  const std::string deep(400000, '[');
  for (int limit : {INT_MAX, 1 << 20, 100000}) {
    CAPTURE(limit);
    io::JsonParseError error;
    CHECK_FALSE(Json::try_parse(deep, &error, io::JsonLimits{.max_depth = limit}));
    CHECK(error.kind == io::JsonErrorKind::kTooDeep);
    CHECK(error.message == "nesting deeper than " + std::to_string(io::kJsonMaxDepth));
  }
  std::string objects;
  for (int i = 0; i < 200000; ++i) objects += "{\"a\":";
  io::JsonParseError error;
  CHECK_FALSE(Json::try_parse(objects, &error, io::JsonLimits{.max_depth = INT_MAX}));
  CHECK(error.kind == io::JsonErrorKind::kTooDeep);
  // Moderate depths below the ceiling still parse when allowed.
  const std::string ok = std::string(500, '[') + std::string(500, ']');
  CHECK(Json::try_parse(ok, nullptr, io::JsonLimits{.max_depth = 500}));
}

TEST_CASE("json bounds: running out of memory is a parse error, not std::bad_alloc") {
  std::string big = "[0";
  for (int i = 0; i < 200000; ++i) big += ",0";
  big += "]";
  std::string strings = "{";
  for (int i = 0; i < 20000; ++i) strings += (i ? ",\"" : "\"") + std::to_string(i) + "\":\"v\"";
  strings += "}";
  for (const std::string* text : {&big, &strings}) {
    const alloc_probe::Limit probe(256 << 10);
    io::JsonParseError error;
    std::optional<Json> v;
    CHECK_NOTHROW(v = Json::try_parse(*text, &error));
    CHECK_FALSE(v.has_value());
    CHECK(error.kind == io::JsonErrorKind::kOutOfMemory);
    CHECK(error.message.find("out of memory") != std::string::npos);
    const std::string what = error_text([&] { (void)Json::parse(*text, "big.json"); });
    CHECK(what.find("big.json") != std::string::npos);
    CHECK(probe.refused() > 0);
  }
  // The same text parses without the probe.
  CHECK(Json::parse(big).size() == 200001);
}

TEST_CASE("json bounds: parsed values and strings never outnumber the input bytes") {
  std::mt19937 rng(5);
  const char* atoms[] = {"0",
                         "-1",
                         "1.5e3",
                         "true",
                         "null",
                         "\"\"",
                         "\"abc\"",
                         "\"\\u00e9\"",
                         "[]",
                         "{}",
                         "18446744073709551616"};
  for (int k = 0; k < 300; ++k) {
    // A random nested document.
    std::string text;
    int depth = 0;
    std::vector<char> open;
    std::vector<int> count;
    const int steps = int(rng() % 200);
    for (int s = 0; s < steps; ++s) {
      const bool in_object = !open.empty() && open.back() == '{';
      if (!open.empty() && count.back() > 0) text += ',';
      if (in_object) text += "\"k" + std::to_string(count.back()) + "\":";
      if (!open.empty()) ++count.back();
      const unsigned r = rng() % 10;
      if (r < 2 && depth < 30) {
        const char c = r == 0 ? '[' : '{';
        text += c;
        open.push_back(c);
        count.push_back(0);
        ++depth;
      } else {
        text += atoms[rng() % std::size(atoms)];
        if (open.empty()) break;
        if (rng() % 4 == 0) {
          text += open.back() == '[' ? ']' : '}';
          open.pop_back();
          count.pop_back();
          --depth;
          if (open.empty()) break;
        }
      }
    }
    while (!open.empty()) {
      if (open.back() == '{' && count.back() == 0) text += "";
      text += open.back() == '[' ? ']' : '}';
      open.pop_back();
      count.pop_back();
    }
    if (text.empty()) text = "0";
    CAPTURE(text);
    const std::optional<Json> v = Json::try_parse(text);
    REQUIRE(v.has_value());
    std::size_t values = 0, bytes = 0;
    measure(*v, values, bytes);
    CHECK(values <= text.size());
    CHECK(bytes <= text.size());
    CHECK(Json::parse(v->dump()) == *v);
  }
}

TEST_CASE("safetensors bounds: shapes whose int64 strides overflow, oversized headers") {
  // Valid for the reference (0 elements) but no int64 stride can describe it.
  for (const char* shape : {"[0,4611686018427387904,4611686018427387904]",
                            "[3037000500,3037000500,0]", "[0,9223372036854775807,2]"}) {
    CAPTURE(shape);
    const std::vector<std::byte> file = safetensors_image(
        std::string("{\"w\":{\"dtype\":\"F32\",\"shape\":") + shape + ",\"data_offsets\":[0,0]}}",
        0);
    const std::string what =
        error_text([&] { (void)io::SafetensorsFile::from_buffer(file, "s.safetensors"); });
    CHECK(what.find("s.safetensors") != std::string::npos);
    CHECK(what.find("tensor 'w'") != std::string::npos);
    CHECK(what.find("Unsupported") != std::string::npos);
  }
  // A zero extent with a modest rest is fine.
  const std::vector<std::byte> empty = safetensors_image(
      "{\"w\":{\"dtype\":\"F32\",\"shape\":[0,1048576,1048576],\"data_offsets\":[0,0]}}", 0);
  CHECK(io::SafetensorsFile::from_buffer(empty).tensor("w").shape().numel() == 0);
  // A shape longer than any rank is refused as it is read, before it is built.
  std::string shape = "[0";
  for (int i = 0; i < 100000; ++i) shape += ",1";
  shape += "]";
  const std::vector<std::byte> long_shape = safetensors_image(
      "{\"w\":{\"dtype\":\"F32\",\"shape\":" + shape + ",\"data_offsets\":[0,0]}}", 0);
  {
    const alloc_probe::Limit probe(long_shape.size() + (64 << 10));
    const std::string what =
        error_text([&] { (void)io::SafetensorsFile::from_buffer(long_shape, "l.safetensors"); });
    CHECK(what.find("l.safetensors") != std::string::npos);
    CHECK(what.find("an array of more than 64 elements") != std::string::npos);
  }
  // A header that does not fit in memory (many tensors) is a safetensors error naming the file.
  std::string many = "{";
  for (int i = 0; i < 20000; ++i)
    many += (i ? ",\"t" : "\"t") + std::to_string(i) +
            "\":{\"dtype\":\"F32\",\"shape\":[0],\"data_offsets\":[0,0]}";
  many += "}";
  const std::vector<std::byte> huge = safetensors_image(many, 0);
  const alloc_probe::Limit probe(huge.size() + (64 << 10));
  const std::string what =
      error_text([&] { (void)io::SafetensorsFile::from_buffer(huge, "h.safetensors"); });
  CHECK(what.find("h.safetensors") != std::string::npos);
  CHECK(what.find("too large to parse") != std::string::npos);
}

TEST_CASE("safetensors bounds: a shape of 65 dimensions is valid JSON, refused for its rank") {
  // safetensors itself opens this file (a shape of any rank is valid); trainkit stops reading
  // at the 65th element and must not call the header malformed JSON.
  std::string shape = "[4";
  for (int i = 0; i < 64; ++i) shape += ",1";
  shape += "]";
  const std::vector<std::byte> rank65 = safetensors_image(
      "{\"w\":{\"dtype\":\"F32\",\"shape\":" + shape + ",\"data_offsets\":[0,16]}}", 16);
  const std::string what =
      error_text([&] { (void)io::SafetensorsFile::from_buffer(rank65, "r65.safetensors"); });
  CHECK(what.find("r65.safetensors") != std::string::npos);
  CHECK(what.find("an array of more than 64 elements") != std::string::npos);
  CHECK(what.find("at most 8 dimensions") != std::string::npos);
  CHECK(what.find("not valid JSON") == std::string::npos);
}
