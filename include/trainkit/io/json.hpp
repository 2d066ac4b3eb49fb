// SPDX-License-Identifier: MIT
// trainkit/io/json.hpp: `Json`, a strict parser and writer for the JSON that file formats carry
// (safetensors headers, model.safetensors.index.json, test manifests). Parsing survives any input
// (it is fuzzed): UTF-8 is validated, duplicate keys, trailing garbage and deep nesting are errors,
// numbers that are not integers are kept as their literal text. Output is compact like serde_json.
// What a parse builds is bounded by its input: every value, string byte and member comes from at
// least one input byte, nesting is capped (kJsonMaxDepth whatever the limits say, so recursion
// cannot exhaust the stack), and running out of memory is a parse error, never std::bad_alloc.
#pragma once

#include <algorithm>
#include <charconv>
#include <concepts>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <new>
#include <optional>
#include <string>
#include <string_view>
#include <system_error>
#include <type_traits>
#include <utility>
#include <vector>

#include "trainkit/config.hpp"
#include "trainkit/error.hpp"
#include "trainkit/io/utf8.hpp"

TRAINKIT_NAMESPACE_BEGIN
namespace io {

/// Appends `s` as a JSON string literal (with quotes), escaping like serde_json: `"` `\` and
/// control characters (\b \f \n \r \t, others as \u00xx); everything else, including non-ASCII
/// UTF-8, is copied as is. `s` must be valid UTF-8 (checked by callers that take user strings).
TRAINKIT_INLINE void append_json_string(std::string& out, std::string_view s);

/// The deepest nesting any parse accepts, whatever JsonLimits::max_depth says: the parser
/// recurses once per level, and this keeps it far from the end of even a small thread stack.
inline constexpr int kJsonMaxDepth = 1000;

/// Limits applied while parsing untrusted text.
struct JsonLimits {
  /// Nesting of arrays/objects; deeper input is an error, never a crash. Values above
  /// kJsonMaxDepth act as kJsonMaxDepth.
  int max_depth = 64;
  /// Elements of one array; a longer one is an error (kTooLong) found before it is all built:
  /// a format whose arrays are short keeps a large text from becoming a far larger tree.
  std::size_t max_array = std::numeric_limits<std::size_t>::max();
};

/// Why a parse failed (JsonParseError::kind), so callers can map it to their own rules.
enum class JsonErrorKind : std::uint8_t {
  kSyntax,        ///< not JSON (or trailing characters after the value)
  kInvalidUtf8,   ///< a string holds bytes that are not UTF-8, or an unpaired \u surrogate
  kDuplicateKey,  ///< an object names the same key twice (JsonParseError::key says which)
  kTooDeep,       ///< nesting deeper than JsonLimits::max_depth (or kJsonMaxDepth)
  kTooLong,       ///< an array longer than JsonLimits::max_array
  kOutOfMemory,   ///< the parsed value did not fit in memory (std::bad_alloc while building it)
};

struct JsonParseError {
  JsonErrorKind kind = JsonErrorKind::kSyntax;
  std::size_t offset = 0;  ///< byte offset into the text where the problem was found
  std::string message;     ///< what was expected or found
  std::string key;  ///< the repeated key as decoded, for kDuplicateKey (escape it to show it)
};

class Json;
namespace detail {
class JsonParser;
// A template so that it is only instantiated where Json is complete (inside Json's member
// functions), which lets Json hold a vector of its own members.
template <class T>
concept JsonInteger = std::is_integral_v<T> && !std::is_same_v<T, bool>;
template <class J>
struct JsonMemberOf {
  std::string key;
  J value;
};
}  // namespace detail

/// One member of a JSON object.
using JsonMember = detail::JsonMemberOf<Json>;

/// A JSON value: null, bool, integer (the full int64 and uint64 ranges), number (any other numeric
/// literal, kept as text), string (UTF-8), array, or object (members in document order; keys
/// unique when parsed). Accessors throw trainkit::Error on a kind mismatch.
class Json {
 public:
  enum class Kind : std::uint8_t { kNull, kBool, kInteger, kNumber, kString, kArray, kObject };
  using Array = std::vector<Json>;
  using Object = std::vector<JsonMember>;

  Json() noexcept = default;
  Json(std::nullptr_t) noexcept {}                         // NOLINT: implicit, like a literal
  Json(bool b) noexcept : kind_(Kind::kBool), flag_(b) {}  // NOLINT
  template <detail::JsonInteger T>
  Json(T v) noexcept : kind_(Kind::kInteger) {  // NOLINT
    if constexpr (std::is_signed_v<T>) {
      flag_ = v < 0;
      magnitude_ = v < 0 ? std::uint64_t(0) - std::uint64_t(v) : std::uint64_t(v);
    } else {
      magnitude_ = v;
    }
  }
  Json(std::string s) : kind_(Kind::kString), text_(std::move(s)) {}  // NOLINT
  Json(std::string_view s) : kind_(Kind::kString), text_(s) {}        // NOLINT
  Json(const char* s) : kind_(Kind::kString), text_(s) {}             // NOLINT

  static Json array() {
    Json j;
    j.kind_ = Kind::kArray;
    return j;
  }
  static Json object() {
    Json j;
    j.kind_ = Kind::kObject;
    return j;
  }
  /// A number from its JSON literal (e.g. "1.5e3"); throws unless `literal` is a JSON number.
  static Json number(std::string_view literal);

  Kind kind() const noexcept { return kind_; }
  bool is_null() const noexcept { return kind_ == Kind::kNull; }
  bool is_bool() const noexcept { return kind_ == Kind::kBool; }
  bool is_integer() const noexcept { return kind_ == Kind::kInteger; }
  bool is_number() const noexcept { return kind_ == Kind::kInteger || kind_ == Kind::kNumber; }
  bool is_string() const noexcept { return kind_ == Kind::kString; }
  bool is_array() const noexcept { return kind_ == Kind::kArray; }
  bool is_object() const noexcept { return kind_ == Kind::kObject; }
  /// An integer that is >= 0 and fits uint64.
  bool is_unsigned() const noexcept { return kind_ == Kind::kInteger && !flag_; }

  bool as_bool() const {
    expect(Kind::kBool);
    return flag_;
  }
  /// Throws unless this is an integer in [0, 2^64).
  std::uint64_t as_uint() const {
    expect(Kind::kInteger);
    TRAINKIT_CHECK(!flag_, "JSON integer -", magnitude_, " is negative, expected >= 0");
    return magnitude_;
  }
  /// Throws unless this is an integer in the int64 range.
  TRAINKIT_INLINE std::int64_t as_int() const;
  /// Any number as a double (integers round to nearest).
  double as_double() const;
  // Checked accessors, const and mutable: each pair is a kind check and a return (sharing a body
  // between the two needs C++23's explicit object parameter).
  const std::string& as_string() const {
    expect(Kind::kString);
    return text_;
  }
  /// The literal text of a kNumber value.
  const std::string& number_text() const {
    expect(Kind::kNumber);
    return text_;
  }
  const Array& as_array() const {
    expect(Kind::kArray);
    return array_;
  }
  Array& as_array() {
    expect(Kind::kArray);
    return array_;
  }
  const Object& as_object() const {
    expect(Kind::kObject);
    return object_;
  }
  Object& as_object() {
    expect(Kind::kObject);
    return object_;
  }

  /// Elements of an array or members of an object (0 for other kinds).
  std::size_t size() const noexcept {
    return kind_ == Kind::kArray ? array_.size() : kind_ == Kind::kObject ? object_.size() : 0;
  }

  /// The member named `key` of an object, or null when absent (throws if not an object).
  const Json* find(std::string_view key) const;
  Json* find(std::string_view key);
  /// Object member access; throws trainkit::Error naming the key when absent.
  const Json& at(std::string_view key) const;
  /// Sets (replaces or appends) an object member; returns the stored value.
  Json& set(std::string key, Json value);
  /// Appends to an array.
  void push_back(Json value) {
    expect(Kind::kArray);
    array_.push_back(std::move(value));
  }

  /// Serializes compactly (serde_json style: no spaces) when `indent` < 0, otherwise pretty with
  /// `indent` spaces per level and ": " after keys (Python json.dumps(indent=N) layout). Strings
  /// must be valid UTF-8 (throws otherwise: the output would not be JSON).
  std::string dump(int indent = -1) const {
    std::string out;
    dump_to(out, indent, 0);
    return out;
  }
  void dump_to(std::string& out, int indent = -1, int level = 0) const;

  /// Parses one JSON value (surrounded by optional whitespace) from untrusted text. Throws
  /// trainkit::Error "<source>: invalid JSON at byte N: ..." on any error; a repeated key is
  /// shown escaped (printable_bytes) and cut to its first 200 bytes.
  static Json parse(std::string_view text, std::string_view source = "JSON text",
                    const JsonLimits& limits = {});
  /// Like parse() but returns std::nullopt and fills `*error` (when given) instead of throwing.
  static std::optional<Json> try_parse(std::string_view text, JsonParseError* error = nullptr,
                                       const JsonLimits& limits = {});

  friend bool operator==(const Json& a, const Json& b);

  TRAINKIT_INLINE static const char* kind_name(Kind k) noexcept;

 private:
  friend class detail::JsonParser;
  void expect(Kind k) const {
    TRAINKIT_CHECK(kind_ == k, "JSON value is ", kind_name(kind_), ", expected ", kind_name(k));
  }

  Kind kind_ = Kind::kNull;
  bool flag_ = false;            // kBool: the value; kInteger: negative
  std::uint64_t magnitude_ = 0;  // kInteger: absolute value
  std::string text_;             // kString: the value; kNumber: the literal
  Array array_;
  Object object_;
};

inline bool operator==(const Json& a, const Json& b) {
  if (a.kind_ != b.kind_) return false;
  switch (a.kind_) {
    case Json::Kind::kNull: return true;
    case Json::Kind::kBool: return a.flag_ == b.flag_;
    case Json::Kind::kInteger:
      return a.magnitude_ == b.magnitude_ && (a.flag_ == b.flag_ || a.magnitude_ == 0);
    case Json::Kind::kNumber:
    case Json::Kind::kString: return a.text_ == b.text_;
    case Json::Kind::kArray: return a.array_ == b.array_;
    case Json::Kind::kObject:
      return std::equal(a.object_.begin(), a.object_.end(), b.object_.begin(), b.object_.end(),
                        [](const JsonMember& x, const JsonMember& y) {
                          return x.key == y.key && x.value == y.value;
                        });
  }
  return false;
}

inline Json* Json::find(std::string_view key) {
  return const_cast<Json*>(static_cast<const Json*>(this)->find(key));
}

inline const Json& Json::at(std::string_view key) const {
  const Json* v = find(key);
  TRAINKIT_CHECK(v != nullptr, "JSON object has no member '", key, "'");
  return *v;
}

inline Json& Json::set(std::string key, Json value) {
  if (Json* v = find(key)) return *v = std::move(value);
  object_.push_back(JsonMember{std::move(key), std::move(value)});
  return object_.back().value;
}

namespace detail {

/// The recursive-descent parser behind Json::parse (use Json::parse / try_parse).
class JsonParser {
 public:
  JsonParser(std::string_view text, const JsonLimits& limits)
      : text_(text), limits_(limits), max_depth_(std::min(limits.max_depth, kJsonMaxDepth)) {}

  TRAINKIT_INLINE std::optional<Json> run(JsonParseError* error);

  /// Checks the number grammar at text_[pos_]; returns the literal's end and whether it has a
  /// fraction or exponent, or npos on a syntax error.
  TRAINKIT_INLINE static std::size_t scan_number(std::string_view t, std::size_t p, bool* integral);

 private:
  TRAINKIT_INLINE bool fail(JsonErrorKind kind, std::string message, std::string key = {});

  TRAINKIT_INLINE void skip_space();

  TRAINKIT_INLINE bool literal(std::string_view word);

  TRAINKIT_INLINE bool parse_value(Json& out, int depth);

  TRAINKIT_INLINE bool parse_number(Json& out);

  TRAINKIT_INLINE static int hex_value(char c) noexcept;

  TRAINKIT_INLINE bool hex4(unsigned& v);

  TRAINKIT_INLINE static void append_utf8(std::string& out, unsigned cp);

  // At the opening quote; leaves pos_ after the closing quote.
  TRAINKIT_INLINE bool parse_string(std::string& out);

  TRAINKIT_INLINE bool parse_array(Json& out, int depth);

  TRAINKIT_INLINE bool parse_object(Json& out, int depth);

  std::string_view text_;
  JsonLimits limits_;
  int max_depth_;
  std::size_t pos_ = 0;
  JsonParseError error_;
};

#if TRAINKIT_IMPL

TRAINKIT_INLINE std::optional<Json> JsonParser::run(JsonParseError* error) {
  try {
    Json value;
    skip_space();
    if (parse_value(value, 0)) {
      skip_space();
      if (pos_ == text_.size()) return value;
      fail(JsonErrorKind::kSyntax, "trailing characters after the JSON value");
    }
  } catch (const std::bad_alloc&) {
    // The partial value is gone by now, so there is room for the message.
    fail(JsonErrorKind::kOutOfMemory,
         ::trainkit::detail::concat("out of memory building the value of a ", text_.size(),
                                    "-byte JSON text"));
  }
  if (error != nullptr) *error = std::move(error_);
  return std::nullopt;
}

TRAINKIT_INLINE std::size_t JsonParser::scan_number(std::string_view t, std::size_t p,
                                                    bool* integral) {
  const auto digit = [&](std::size_t i) { return i < t.size() && t[i] >= '0' && t[i] <= '9'; };
  *integral = true;
  if (p < t.size() && t[p] == '-') ++p;
  if (!digit(p)) return std::string_view::npos;
  if (t[p] == '0') {
    ++p;
    if (digit(p)) return std::string_view::npos;  // leading zeros are not JSON
  } else {
    while (digit(p)) ++p;
  }
  if (p < t.size() && t[p] == '.') {
    *integral = false;
    ++p;
    if (!digit(p)) return std::string_view::npos;
    while (digit(p)) ++p;
  }
  if (p < t.size() && (t[p] == 'e' || t[p] == 'E')) {
    *integral = false;
    ++p;
    if (p < t.size() && (t[p] == '+' || t[p] == '-')) ++p;
    if (!digit(p)) return std::string_view::npos;
    while (digit(p)) ++p;
  }
  return p;
}

TRAINKIT_INLINE bool JsonParser::fail(JsonErrorKind kind, std::string message, std::string key) {
  error_.kind = kind;
  error_.offset = pos_;
  error_.message = std::move(message);
  error_.key = std::move(key);
  return false;
}

TRAINKIT_INLINE void JsonParser::skip_space() {
  while (pos_ < text_.size()) {
    const char c = text_[pos_];
    if (c != ' ' && c != '\t' && c != '\n' && c != '\r') break;
    ++pos_;
  }
}

TRAINKIT_INLINE bool JsonParser::literal(std::string_view word) {
  if (text_.substr(pos_, word.size()) != word)
    return fail(JsonErrorKind::kSyntax, "invalid literal");
  pos_ += word.size();
  return true;
}

TRAINKIT_INLINE bool JsonParser::parse_value(Json& out, int depth) {
  if (pos_ >= text_.size()) return fail(JsonErrorKind::kSyntax, "unexpected end of input");
  switch (text_[pos_]) {
    case '{': return parse_object(out, depth + 1);
    case '[': return parse_array(out, depth + 1);
    case '"': out.kind_ = Json::Kind::kString; return parse_string(out.text_);
    case 't': out = Json(true); return literal("true");
    case 'f': out = Json(false); return literal("false");
    case 'n': out = Json(); return literal("null");
    default: return parse_number(out);
  }
}

TRAINKIT_INLINE bool JsonParser::parse_number(Json& out) {
  bool integral = true;
  const std::size_t end = scan_number(text_, pos_, &integral);
  if (end == std::string_view::npos)
    return fail(JsonErrorKind::kSyntax,
                "expected a value (object, array, string, number, true, false or null)");
  const std::string_view lit = text_.substr(pos_, end - pos_);
  if (integral) {
    const bool negative = lit[0] == '-';
    const std::string_view digits = lit.substr(negative ? 1 : 0);
    std::uint64_t m = 0;
    const auto r = std::from_chars(digits.data(), digits.data() + digits.size(), m);
    if (r.ec == std::errc()) {
      out = Json();
      out.kind_ = Json::Kind::kInteger;
      out.flag_ = negative && m != 0;
      out.magnitude_ = m;
      pos_ = end;
      return true;
    }
    // Beyond uint64: keep as a plain number, as serde_json turns it into a float.
  }
  out = Json();
  out.kind_ = Json::Kind::kNumber;
  out.text_.assign(lit);
  pos_ = end;
  return true;
}

TRAINKIT_INLINE int JsonParser::hex_value(char c) noexcept {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  if (c >= 'A' && c <= 'F') return c - 'A' + 10;
  return -1;
}

TRAINKIT_INLINE bool JsonParser::hex4(unsigned& v) {
  v = 0;
  if (text_.size() - pos_ < 4) return fail(JsonErrorKind::kSyntax, "truncated \\u escape");
  for (int k = 0; k < 4; ++k) {
    const int h = hex_value(text_[pos_ + std::size_t(k)]);
    if (h < 0) return fail(JsonErrorKind::kSyntax, "invalid hex digit in \\u escape");
    v = v * 16 + unsigned(h);
  }
  pos_ += 4;
  return true;
}

TRAINKIT_INLINE void JsonParser::append_utf8(std::string& out, unsigned cp) {
  if (cp < 0x80) {
    out += char(cp);
  } else if (cp < 0x800) {
    out += char(0xc0 | (cp >> 6));
    out += char(0x80 | (cp & 0x3f));
  } else if (cp < 0x10000) {
    out += char(0xe0 | (cp >> 12));
    out += char(0x80 | ((cp >> 6) & 0x3f));
    out += char(0x80 | (cp & 0x3f));
  } else {
    out += char(0xf0 | (cp >> 18));
    out += char(0x80 | ((cp >> 12) & 0x3f));
    out += char(0x80 | ((cp >> 6) & 0x3f));
    out += char(0x80 | (cp & 0x3f));
  }
}

TRAINKIT_INLINE bool JsonParser::parse_string(std::string& out) {
  out.clear();
  ++pos_;
  for (;;) {
    std::size_t run = pos_;
    while (run < text_.size()) {
      const auto c = static_cast<unsigned char>(text_[run]);
      if (c == '"' || c == '\\' || c < 0x20) break;
      ++run;
    }
    const std::string_view chunk = text_.substr(pos_, run - pos_);
    std::size_t bad = 0;
    if (!is_valid_utf8(chunk, &bad)) {
      pos_ += bad;
      return fail(JsonErrorKind::kInvalidUtf8, "string is not valid UTF-8");
    }
    out.append(chunk);
    pos_ = run;
    if (pos_ >= text_.size()) return fail(JsonErrorKind::kSyntax, "unterminated string");
    const char c = text_[pos_];
    if (c == '"') {
      ++pos_;
      return true;
    }
    if (c != '\\')
      return fail(JsonErrorKind::kSyntax, "control character in string (must be escaped)");
    if (++pos_ >= text_.size()) return fail(JsonErrorKind::kSyntax, "unterminated escape");
    const char e = text_[pos_++];
    switch (e) {
      case '"': out += '"'; break;
      case '\\': out += '\\'; break;
      case '/': out += '/'; break;
      case 'b': out += '\b'; break;
      case 'f': out += '\f'; break;
      case 'n': out += '\n'; break;
      case 'r': out += '\r'; break;
      case 't': out += '\t'; break;
      case 'u': {
        unsigned cp = 0;
        if (!hex4(cp)) return false;
        if (cp >= 0xdc00 && cp <= 0xdfff)
          return fail(JsonErrorKind::kInvalidUtf8, "unpaired low surrogate in \\u escape");
        if (cp >= 0xd800 && cp <= 0xdbff) {
          if (text_.substr(pos_, 2) != "\\u")
            return fail(JsonErrorKind::kInvalidUtf8, "unpaired high surrogate in \\u escape");
          pos_ += 2;
          unsigned lo = 0;
          if (!hex4(lo)) return false;
          if (lo < 0xdc00 || lo > 0xdfff)
            return fail(JsonErrorKind::kInvalidUtf8, "high surrogate not followed by a low one");
          cp = 0x10000 + ((cp - 0xd800) << 10) + (lo - 0xdc00);
        }
        append_utf8(out, cp);
        break;
      }
      default: --pos_; return fail(JsonErrorKind::kSyntax, "invalid escape in string");
    }
  }
}

TRAINKIT_INLINE bool JsonParser::parse_array(Json& out, int depth) {
  if (depth > max_depth_)
    return fail(JsonErrorKind::kTooDeep,
                ::trainkit::detail::concat("nesting deeper than ", max_depth_));
  out = Json::array();
  ++pos_;
  skip_space();
  if (pos_ < text_.size() && text_[pos_] == ']') {
    ++pos_;
    return true;
  }
  for (;;) {
    skip_space();
    Json element;
    if (out.array_.size() == limits_.max_array)
      return fail(
          JsonErrorKind::kTooLong,
          ::trainkit::detail::concat("an array of more than ", limits_.max_array, " elements"));
    if (!parse_value(element, depth)) return false;
    out.array_.push_back(std::move(element));
    skip_space();
    if (pos_ >= text_.size()) return fail(JsonErrorKind::kSyntax, "unterminated array");
    if (text_[pos_] == ']') {
      ++pos_;
      return true;
    }
    if (text_[pos_] != ',') return fail(JsonErrorKind::kSyntax, "expected ',' or ']'");
    ++pos_;
  }
}

TRAINKIT_INLINE bool JsonParser::parse_object(Json& out, int depth) {
  if (depth > max_depth_)
    return fail(JsonErrorKind::kTooDeep,
                ::trainkit::detail::concat("nesting deeper than ", max_depth_));
  out = Json::object();
  const std::size_t start = pos_;
  ++pos_;
  skip_space();
  if (pos_ < text_.size() && text_[pos_] == '}') {
    ++pos_;
    return true;
  }
  for (;;) {
    skip_space();
    if (pos_ >= text_.size() || text_[pos_] != '"')
      return fail(JsonErrorKind::kSyntax, "expected a string key");
    JsonMember member;
    const std::size_t key_pos = pos_;
    if (!parse_string(member.key)) return false;
    // Small objects: linear duplicate check now; large ones are checked once at the end.
    if (out.object_.size() < 16) {
      for (const JsonMember& m : out.object_) {
        if (m.key == member.key) {
          pos_ = key_pos;
          return fail(JsonErrorKind::kDuplicateKey, "duplicate key", member.key);
        }
      }
    }
    skip_space();
    if (pos_ >= text_.size() || text_[pos_] != ':')
      return fail(JsonErrorKind::kSyntax, "expected ':' after a key");
    ++pos_;
    skip_space();
    if (!parse_value(member.value, depth)) return false;
    out.object_.push_back(std::move(member));
    skip_space();
    if (pos_ >= text_.size()) return fail(JsonErrorKind::kSyntax, "unterminated object");
    if (text_[pos_] == '}') {
      ++pos_;
      break;
    }
    if (text_[pos_] != ',') return fail(JsonErrorKind::kSyntax, "expected ',' or '}'");
    ++pos_;
  }
  const auto& members = out.object_;
  if (members.size() > 16) {
    std::vector<std::uint32_t> order(members.size());
    for (std::size_t i = 0; i < order.size(); ++i) order[i] = std::uint32_t(i);
    std::sort(order.begin(), order.end(),
              [&](std::uint32_t a, std::uint32_t b) { return members[a].key < members[b].key; });
    for (std::size_t i = 1; i < order.size(); ++i) {
      if (members[order[i]].key == members[order[i - 1]].key) {
        pos_ = start;
        return fail(JsonErrorKind::kDuplicateKey, "duplicate key in the object starting here",
                    members[order[i]].key);
      }
    }
  }
  return true;
}

#endif  // TRAINKIT_IMPL

}  // namespace detail

inline std::optional<Json> Json::try_parse(std::string_view text, JsonParseError* error,
                                           const JsonLimits& limits) {
  return detail::JsonParser(text, limits).run(error);
}

#if TRAINKIT_IMPL

TRAINKIT_INLINE void append_json_string(std::string& out, std::string_view s) {
  static constexpr char kHex[] = "0123456789abcdef";
  out += '"';
  std::size_t run = 0;  // start of the current run of bytes that need no escape
  for (std::size_t i = 0; i < s.size(); ++i) {
    const auto c = static_cast<unsigned char>(s[i]);
    if (c >= 0x20 && c != '"' && c != '\\') continue;
    out.append(s, run, i - run);
    run = i + 1;
    switch (c) {
      case '"': out += "\\\""; break;
      case '\\': out += "\\\\"; break;
      case '\b': out += "\\b"; break;
      case '\f': out += "\\f"; break;
      case '\n': out += "\\n"; break;
      case '\r': out += "\\r"; break;
      case '\t': out += "\\t"; break;
      default:
        out += "\\u00";
        out += kHex[c >> 4];
        out += kHex[c & 15];
    }
  }
  out.append(s, run, s.size() - run);
  out += '"';
}

TRAINKIT_INLINE std::int64_t Json::as_int() const {
  expect(Kind::kInteger);
  const std::uint64_t limit = std::uint64_t(std::numeric_limits<std::int64_t>::max()) + flag_;
  TRAINKIT_CHECK(magnitude_ <= limit, "JSON integer ", flag_ ? "-" : "", magnitude_,
                 " does not fit int64");
  return flag_ ? std::int64_t(std::uint64_t(0) - magnitude_) : std::int64_t(magnitude_);
}

TRAINKIT_INLINE const char* Json::kind_name(Kind k) noexcept {
  switch (k) {
    case Kind::kNull: return "null";
    case Kind::kBool: return "bool";
    case Kind::kInteger: return "integer";
    case Kind::kNumber: return "number";
    case Kind::kString: return "string";
    case Kind::kArray: return "array";
    case Kind::kObject: return "object";
  }
  return "?";
}

TRAINKIT_INLINE const Json* Json::find(std::string_view key) const {
  expect(Kind::kObject);
  for (const JsonMember& m : object_)
    if (m.key == key) return &m.value;
  return nullptr;
}

TRAINKIT_INLINE double Json::as_double() const {
  TRAINKIT_CHECK(is_number(), "JSON value is ", kind_name(kind_), ", expected a number");
  if (kind_ == Kind::kInteger) return flag_ ? -double(magnitude_) : double(magnitude_);
  double v = 0;
  const auto r = std::from_chars(text_.data(), text_.data() + text_.size(), v);
  if (r.ec != std::errc::result_out_of_range) return v;
  // Out of range: a negative exponent underflowed to zero, anything else overflowed.
  const bool negative = text_[0] == '-';
  if (text_.find("e-") != std::string::npos || text_.find("E-") != std::string::npos)
    return negative ? -0.0 : 0.0;
  return negative ? -std::numeric_limits<double>::infinity()
                  : std::numeric_limits<double>::infinity();
}

TRAINKIT_INLINE void Json::dump_to(std::string& out, int indent, int level) const {
  const auto newline = [&](int lvl) {
    if (indent < 0) return;
    out += '\n';
    out.append(std::size_t(indent) * std::size_t(lvl), ' ');
  };
  switch (kind_) {
    case Kind::kNull: out += "null"; return;
    case Kind::kBool: out += flag_ ? "true" : "false"; return;
    case Kind::kInteger: {
      if (flag_ && magnitude_ != 0) out += '-';
      char buf[24];
      const auto r = std::to_chars(buf, buf + sizeof buf, magnitude_);
      out.append(buf, r.ptr);
      return;
    }
    case Kind::kNumber: out += text_; return;
    case Kind::kString:
      TRAINKIT_CHECK(is_valid_utf8(text_), "cannot write a JSON string that is not UTF-8");
      append_json_string(out, text_);
      return;
    case Kind::kArray:
      out += '[';
      for (std::size_t i = 0; i < array_.size(); ++i) {
        if (i) out += ',';
        newline(level + 1);
        array_[i].dump_to(out, indent, level + 1);
      }
      if (!array_.empty()) newline(level);
      out += ']';
      return;
    case Kind::kObject:
      out += '{';
      for (std::size_t i = 0; i < object_.size(); ++i) {
        if (i) out += ',';
        newline(level + 1);
        TRAINKIT_CHECK(is_valid_utf8(object_[i].key), "cannot write a JSON key that is not UTF-8");
        append_json_string(out, object_[i].key);
        out += indent < 0 ? ":" : ": ";
        object_[i].value.dump_to(out, indent, level + 1);
      }
      if (!object_.empty()) newline(level);
      out += '}';
      return;
  }
}

TRAINKIT_INLINE Json Json::parse(std::string_view text, std::string_view source,
                                 const JsonLimits& limits) {
  JsonParseError error;
  std::optional<Json> v = try_parse(text, &error, limits);
  if (!v) {
    std::string what = error.message;
    // The key is text from the input: shown escaped (one line, no control bytes) and bounded.
    if (error.kind == JsonErrorKind::kDuplicateKey) {
      what += " '" + ::trainkit::detail::printable_prefix(error.key) + "'";
    }
    TRAINKIT_FAIL(source, ": invalid JSON at byte ", error.offset, ": ", what);
  }
  return std::move(*v);
}

TRAINKIT_INLINE Json Json::number(std::string_view literal) {
  bool integral = true;
  const std::size_t end = detail::JsonParser::scan_number(literal, 0, &integral);
  TRAINKIT_CHECK(end == literal.size() && !literal.empty(), "'", literal, "' is not a JSON number");
  return parse(literal);
}

#endif  // TRAINKIT_IMPL

}  // namespace io
TRAINKIT_NAMESPACE_END
