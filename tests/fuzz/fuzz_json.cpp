// SPDX-License-Identifier: MIT
// libFuzzer target: io::Json::try_parse / parse on arbitrary text, with a depth limit taken from
// the first byte (up to far beyond kJsonMaxDepth). Any input must either parse or fail with a
// JsonParseError (parse(): trainkit::Error). A parsed value is bounded by its input: it has no
// more values than input bytes, no more string bytes (keys included) than input bytes, and no
// deeper nesting than the limit, and the parse makes no allocation beyond a constant times the
// input size; it survives dump -> parse unchanged, compact and pretty.
#include <climits>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <optional>
#include <string>
#include <string_view>

#include <trainkit/io/json.hpp>

#include "fuzz_alloc_bound.hpp"

namespace io = trainkit::io;

namespace {

void check(bool ok) {
  if (!ok) std::abort();
}

struct Measure {
  std::size_t values = 0, string_bytes = 0;
  int depth = 0;
};

void measure(const io::Json& v, int depth, Measure& m) {
  ++m.values;
  if (depth > m.depth) m.depth = depth;
  if (v.is_string()) m.string_bytes += v.as_string().size();
  if (v.is_number() && !v.is_integer()) m.string_bytes += v.number_text().size();
  if (v.is_array())
    for (const io::Json& e : v.as_array()) measure(e, depth + 1, m);
  if (v.is_object()) {
    for (const io::JsonMember& e : v.as_object()) {
      m.string_bytes += e.key.size();
      measure(e.value, depth + 1, m);
    }
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  if (size == 0) return 0;
  const int limits[] = {64, 1, 2, 8, 100, io::kJsonMaxDepth, 1 << 20, INT_MAX};
  const io::JsonLimits limits_used{.max_depth = limits[data[0] & 7]};
  const std::string_view text(reinterpret_cast<const char*>(data) + 1, size - 1);
  io::JsonParseError error;
  std::optional<io::Json> v;
  {
    // Memory follows the input: at most one value per input byte, vectors at most doubled.
    const fuzz_alloc::Scope scope;
    v = io::Json::try_parse(text, &error, limits_used);
    check(scope.largest() <= 2 * sizeof(io::Json) * (text.size() + 1) + (64 << 10));
  }
  if (!v) {
    check(error.offset <= text.size());
    try {
      (void)io::Json::parse(text, "fuzz.json", limits_used);
      std::abort();  // parse() must agree with try_parse()
    } catch (const trainkit::Error&) {
    }
    return 0;
  }
  Measure m;
  measure(*v, 0, m);
  check(m.values <= text.size());
  check(m.string_bytes <= text.size());
  // Containers count a level each: depth of the deepest value <= the limit (and the ceiling).
  check(m.depth <= limits_used.max_depth && m.depth <= io::kJsonMaxDepth);
  const std::string compact = v->dump();
  const std::optional<io::Json> again = io::Json::try_parse(compact, nullptr, limits_used);
  check(again.has_value() && *again == *v && again->dump() == compact);
  const std::optional<io::Json> pretty = io::Json::try_parse(v->dump(2), nullptr, limits_used);
  check(pretty.has_value() && *pretty == *v);
  return 0;
}
