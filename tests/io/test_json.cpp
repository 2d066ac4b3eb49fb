// SPDX-License-Identifier: MIT
// Tests of trainkit/io/json.hpp: the strict parser (grammar, escapes, UTF-8, duplicates, depth,
// trailing garbage) and the serde_json-compatible writer.
#include <doctest/doctest.h>

#include <cstdint>
#include <limits>
#include <string>
#include <string_view>

#include "trainkit/core/rng.hpp"
#include "trainkit/error.hpp"
#include "trainkit/io/json.hpp"

namespace io = trainkit::io;
using io::Json;

namespace {

io::JsonParseError parse_error(std::string_view text, io::JsonLimits limits = {}) {
  io::JsonParseError error;
  const auto v = Json::try_parse(text, &error, limits);
  CHECK_MESSAGE(!v.has_value(), "expected a parse error for: ", std::string(text));
  return error;
}

}  // namespace

TEST_CASE("json: parses every kind and round-trips compactly") {
  const std::string text =
      R"({"a":1,"b":-42,"c":"x","d":[1,[2,[]],{}],"e":{"f":null,"g":true,"h":false},"i":1.5e-3})";
  const Json j = Json::parse(text);
  REQUIRE(j.is_object());
  CHECK(j.size() == 6);
  CHECK(j.at("a").as_uint() == 1);
  CHECK(j.at("b").as_int() == -42);
  CHECK(j.at("c").as_string() == "x");
  CHECK(j.at("d").as_array()[1].as_array()[0].as_int() == 2);
  CHECK(j.at("e").at("f").is_null());
  CHECK(j.at("e").at("g").as_bool());
  CHECK_FALSE(j.at("e").at("h").as_bool());
  CHECK(j.at("i").is_number());
  CHECK_FALSE(j.at("i").is_integer());
  CHECK(j.at("i").number_text() == "1.5e-3");
  CHECK(j.at("i").as_double() == doctest::Approx(0.0015));
  CHECK(j.dump() == text);  // compact output, member order kept
  CHECK(Json::parse(j.dump()) == j);
  CHECK(j.find("zz") == nullptr);
  CHECK_THROWS_WITH(j.at("zz"), doctest::Contains("no member 'zz'"));
}

TEST_CASE("json: integers cover int64 and uint64; larger ones stay numbers") {
  CHECK(Json::parse("18446744073709551615").as_uint() == 18446744073709551615ull);
  CHECK(Json::parse("-9223372036854775808").as_int() == INT64_MIN);
  CHECK(Json::parse("9223372036854775807").as_int() == INT64_MAX);
  CHECK_THROWS_WITH(Json::parse("9223372036854775808").as_int(),
                    doctest::Contains("does not fit int64"));
  CHECK_THROWS_WITH(Json::parse("-1").as_uint(), doctest::Contains("negative"));
  const Json big = Json::parse("18446744073709551616");
  CHECK(big.kind() == Json::Kind::kNumber);
  CHECK_FALSE(big.is_unsigned());
  CHECK(big.dump() == "18446744073709551616");
  CHECK(Json::parse("-0").as_int() == 0);
  CHECK(Json::parse("-0").dump() == "0");
  CHECK(Json::parse("1e999").as_double() == std::numeric_limits<double>::infinity());
  CHECK(Json::parse("1e-999").as_double() == 0.0);
  CHECK(Json(std::int64_t{-5}).dump() == "-5");
  CHECK(Json(std::uint64_t{7}).as_int() == 7);
  CHECK(Json::number("2.5").as_double() == 2.5);
  CHECK_THROWS(Json::number("2.5x"));
}

TEST_CASE("json: number grammar is strict") {
  for (const char* bad :
       {"01", "+1", "1.", ".5", "1e", "1e+", "-", "--1", "0x10", "NaN", "Infinity", "1.5.2"}) {
    CAPTURE(bad);
    CHECK(parse_error(bad).kind == io::JsonErrorKind::kSyntax);
  }
  for (const char* good : {"0", "-0.0", "1E5", "1e+5", "123.456e-7", "-12"}) {
    CAPTURE(good);
    CHECK(Json::parse(good).is_number());
  }
}

TEST_CASE("json: string escapes, \\u and surrogate pairs decode to UTF-8") {
  const Json j = Json::parse(R"("a\"b\\c\/d\b\f\n\r\t\u00e9\u20ac\ud83d\ude00\u0000")");
  const std::string expected =
      std::string("a\"b\\c/d\b\f\n\r\t\xc3\xa9\xe2\x82\xac\xf0\x9f\x98\x80") + std::string(1, '\0');
  CHECK(j.as_string() == expected);
  // serde_json's escaping: \" \\ \b \f \n \r \t, other controls as lowercase \u00xx; '/' and
  // non-ASCII as is.
  CHECK(j.dump() == "\"a\\\"b\\\\c/d\\b\\f\\n\\r\\t\xc3\xa9\xe2\x82\xac\xf0\x9f\x98\x80\\u0000\"");
  CHECK(Json(std::string("\x01\x1f")).dump() == "\"\\u0001\\u001f\"");
  CHECK(Json::parse(R"("\u00E9")").as_string() == "\xc3\xa9");  // upper-case hex accepted
}

TEST_CASE("json: bad strings are rejected with the right kind") {
  CHECK(parse_error(R"("\ud800")").kind == io::JsonErrorKind::kInvalidUtf8);
  CHECK(parse_error(R"("\udc00")").kind == io::JsonErrorKind::kInvalidUtf8);
  CHECK(parse_error(R"("\ud800\u0041")").kind == io::JsonErrorKind::kInvalidUtf8);
  CHECK(parse_error(R"("\u12")").kind == io::JsonErrorKind::kSyntax);
  CHECK(parse_error(R"("\u12zz")").kind == io::JsonErrorKind::kSyntax);
  CHECK(parse_error(R"("\x")").kind == io::JsonErrorKind::kSyntax);
  CHECK(parse_error("\"abc").kind == io::JsonErrorKind::kSyntax);
  CHECK(parse_error("\"a\nb\"").kind == io::JsonErrorKind::kSyntax);  // raw control char
  CHECK(parse_error("\"\xff\"").kind == io::JsonErrorKind::kInvalidUtf8);
  CHECK(parse_error("\"\xc0\xaf\"").kind == io::JsonErrorKind::kInvalidUtf8);      // overlong '/'
  CHECK(parse_error("\"\xed\xa0\x80\"").kind == io::JsonErrorKind::kInvalidUtf8);  // surrogate
  CHECK(parse_error("\"\xf4\x90\x80\x80\"").kind == io::JsonErrorKind::kInvalidUtf8);  // >10FFFF
  CHECK(parse_error("\"\xe2\x82\"").kind == io::JsonErrorKind::kInvalidUtf8);          // truncated
  const io::JsonParseError e = parse_error("\"ok\xfe\"");
  CHECK(e.offset == 3);
}

TEST_CASE("json: is_valid_utf8 on edge sequences") {
  CHECK(io::is_valid_utf8(""));
  CHECK(io::is_valid_utf8("plain ascii text that is longer than eight bytes"));
  CHECK(io::is_valid_utf8(
      "\x7f\xc2\x80\xdf\xbf\xe0\xa0\x80\xef\xbf\xbf\xf0\x90\x80\x80\xf4\x8f\xbf\xbf"));
  std::size_t at = 99;
  CHECK_FALSE(io::is_valid_utf8("abcdefghij\x80", &at));
  CHECK(at == 10);
  CHECK_FALSE(io::is_valid_utf8("\xe0\x9f\xbf"));      // overlong 3-byte
  CHECK_FALSE(io::is_valid_utf8("\xf0\x8f\xbf\xbf"));  // overlong 4-byte
  CHECK_FALSE(io::is_valid_utf8("\xf5\x80\x80\x80"));
  CHECK_FALSE(io::is_valid_utf8("\xc1\xbf"));
}

TEST_CASE("json: duplicates, trailing garbage and structure errors") {
  io::JsonParseError e = parse_error(R"({"a":1,"b":2,"a":3})");
  CHECK(e.kind == io::JsonErrorKind::kDuplicateKey);
  CHECK(e.key == "a");
  // A large object takes the sort-based check.
  std::string big = "{";
  for (int i = 0; i < 40; ++i) big += "\"k" + std::to_string(i) + "\":" + std::to_string(i) + ",";
  big += "\"k17\":0}";
  e = parse_error(big);
  CHECK(e.kind == io::JsonErrorKind::kDuplicateKey);
  CHECK(e.key == "k17");
  // Keys equal after unescaping are duplicates too.
  CHECK(parse_error(R"({"a":1,"\u0061":2})").kind == io::JsonErrorKind::kDuplicateKey);
  // The same key in different objects is fine.
  CHECK(Json::parse(R"({"a":{"a":1},"b":{"a":2}})").at("b").at("a").as_int() == 2);

  for (const char* bad :
       {"", " ", "{", "}", "{\"a\"}", "{\"a\":}", "{\"a\":1,}", "[1,]", "[1 2]", "{a:1}",
        "{\"a\":1} x", "{} {}", "tru", "nul", "[", "{\"a\":1 \"b\":2}", "\x00"}) {
    CAPTURE(bad);
    CHECK(parse_error(bad).kind == io::JsonErrorKind::kSyntax);
  }
  CHECK(parse_error(std::string_view("{}\0", 3)).kind == io::JsonErrorKind::kSyntax);
  CHECK(Json::parse(" \t\r\n{} \n").is_object());  // JSON whitespace around the value is fine
  CHECK_THROWS_WITH(Json::parse("{\"a\":1,}", "my.json"),
                    doctest::Contains("my.json: invalid JSON at byte 7"));
}

TEST_CASE("json: a repeated key is shown escaped and bounded in the parse error") {
  const auto message_of = [](const std::string& text) {
    try {
      (void)Json::parse(text, "keys.json");
    } catch (const trainkit::Error& e) {
      return std::string(e.what());
    }
    FAIL("expected a duplicate-key error");
    return std::string();
  };
  const auto check_one_line = [](const std::string& m) {
    CAPTURE(m);
    for (const char c : m) {
      const auto u = static_cast<unsigned char>(c);
      CHECK((u >= 0x20 && u != 0x7f));
    }
  };
  // Control characters (decoded from \n, \u0000, \u001f) become \xNN, never raw bytes.
  for (const bool large : {false, true}) {  // linear check, then the sorted one (> 16 members)
    CAPTURE(large);
    std::string head = "{";
    if (large)
      for (int i = 0; i < 20; ++i) head += "\"k" + std::to_string(i) + "\":0,";
    const std::string text = head + R"("a\nb\u0000c\u001f\\":1,"a\nb\u0000c\u001f\\":2})";
    const std::string m = message_of(text);
    check_one_line(m);
    CHECK(m.find("keys.json: invalid JSON at byte") != std::string::npos);
    CHECK(m.find("'a\\x0ab\\x00c\\x1f\\x5c'") != std::string::npos);
    // The error itself keeps the key as decoded, for callers that map it.
    CHECK(parse_error(text).key == std::string("a\nb\0c\x1f\\", 7));
  }
  // A long key (random letters and \n escapes) is cut to 200 bytes before escaping, with "...".
  trainkit::PhiloxStream rng(7);
  for (const std::size_t n :
       {std::size_t{199}, std::size_t{200}, std::size_t{201}, std::size_t{10000}}) {
    CAPTURE(n);
    std::string key, escaped;
    for (std::size_t i = 0; i < n; ++i) {
      const bool newline = rng.next_u32() % 8 == 0;
      key += newline ? "\\n" : std::string(1, static_cast<char>('a' + rng.next_u32() % 26));
      if (i < 200) escaped += newline ? "\\x0a" : std::string(1, key.back());
    }
    const std::string m = message_of("{\"" + key + "\":1,\"" + key + "\":2}");
    check_one_line(m);
    CHECK(m.size() < 1200);
    CHECK(m.find("'" + escaped + (n > 200 ? "...'" : "'")) != std::string::npos);
  }
}

TEST_CASE("json: the depth limit stops deep nesting without recursion blowing up") {
  std::string deep(100000, '[');
  CHECK(parse_error(deep).kind == io::JsonErrorKind::kTooDeep);
  const std::string ok = std::string(64, '[') + std::string(64, ']');
  CHECK(Json::parse(ok).is_array());
  const std::string too = std::string(65, '[') + std::string(65, ']');
  CHECK(parse_error(too).kind == io::JsonErrorKind::kTooDeep);
  CHECK(parse_error("{\"a\":{\"b\":{}}}", io::JsonLimits{.max_depth = 2}).kind ==
        io::JsonErrorKind::kTooDeep);
  CHECK(Json::try_parse("{\"a\":{\"b\":1}}", nullptr, io::JsonLimits{.max_depth = 2}));
  // The length limit: an array of max_array elements parses, one more is refused where it is.
  CHECK(Json::try_parse("[1,2,3]", nullptr, io::JsonLimits{.max_array = 3}));
  const io::JsonParseError e = parse_error("{\"x\":[[1,2,3,4]]}", io::JsonLimits{.max_array = 3});
  CHECK(e.kind == io::JsonErrorKind::kTooLong);
  CHECK(e.offset == 13);  // at the fourth element
}

TEST_CASE("json: building values and pretty printing") {
  Json root = Json::object();
  root.set("name", "w");
  root.set("n", 3);
  Json arr = Json::array();
  arr.push_back(1);
  arr.push_back("two");
  arr.push_back(Json::object());
  root.set("list", std::move(arr));
  root.set("n", 4);  // replaces, keeps position
  CHECK(root.dump() == R"({"name":"w","n":4,"list":[1,"two",{}]})");
  CHECK(root.dump(2) ==
        "{\n  \"name\": \"w\",\n  \"n\": 4,\n  \"list\": [\n    1,\n    \"two\",\n    {}\n  ]\n}");
  CHECK(Json::parse(root.dump(2)) == root);
  CHECK_THROWS_WITH(root.as_array(), doctest::Contains("JSON value is object, expected array"));
  CHECK_THROWS_WITH(Json(std::string("\xff")).dump(), doctest::Contains("not UTF-8"));
}
