// SPDX-License-Identifier: MIT
// libFuzzer target: the small text parsers that take what a user or a launcher typed. The
// input's first byte picks one, the rest is its text:
//   0  data::expand_shard_pattern (bash braces, "::" lists)
//   1  dist's Slurm node list (the first host: "rack[1-2]-n[07-09],x")
//   2  dist's Slurm tasks-per-node list ("4(x2),3") for a node picked by the second byte
//   3  train::Flags over a command line (the text's lines are the arguments)
//   4  train::Flags --config FILE (the text is the file)
//   5  train::SearchSpace specs (one per line), then sampled
// Any input must give a result that keeps the parser's promises or a trainkit::Error; crashes,
// sanitizer reports, other exception types and outputs beyond the stated caps are bugs.
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string>
#include <string_view>
#include <vector>

#include <trainkit/data/shard_pattern.hpp>
#include <trainkit/dist/bootstrap.hpp>
#include <trainkit/train/flags.hpp>
#include <trainkit/train/search_space.hpp>

#include "fuzz_alloc_bound.hpp"
#include "fuzz_memfile.hpp"

using fuzz_memfile::check;

namespace {

std::vector<std::string> lines_of(std::string_view text) {
  std::vector<std::string> out;
  std::size_t start = 0;
  for (;;) {
    const std::size_t nl = text.find('\n', start);
    out.emplace_back(text.substr(start, nl == std::string_view::npos ? nl : nl - start));
    if (nl == std::string_view::npos) break;
    start = nl + 1;
  }
  return out;
}

void shard_pattern(std::string_view text) {
  const std::vector<std::string> names = trainkit::data::expand_shard_pattern(text);
  check(!names.empty() && names.size() <= trainkit::data::kMaxShardNames);
  for (const std::string& n : names) check(!n.empty());
}

void flags(const std::vector<std::string>& lines, const std::string* config) {
  namespace tr = trainkit::train;
  bool b = false;
  int i = 3;
  std::int64_t big = 1 << 20;
  double d = 0.5;
  float f = 1.0f;
  std::string s = "x";
  tr::Flags fl("fuzz", "fuzzed flags");
  fl.add("flag", b, "a bool")
      .add("count", i, "an int", tr::FlagRange{.at_least = 1, .at_most = 1000})
      .add("tokens", big, "an int64")
      .add("rate", d, "a double", tr::FlagRange{.above = 0, .below = 1})
      .add("scale", f, "a float")
      .add("name", s, "a string");
  std::vector<std::string> args{"fuzz"};
  if (config != nullptr) {
    args.push_back("--config");
    args.push_back(*config);
  }
  args.insert(args.end(), lines.begin(), lines.end());
  std::vector<std::string_view> views(args.begin() + 1, args.end());
  if (!fl.parse(views)) return;  // --help
  check(i >= 1 && i <= 1000);
  check(d > 0 && d < 1);
  check(std::isfinite(f));
  // What run_config() records reads back to the same values.
  bool b2 = false;
  int i2 = 3;
  std::int64_t big2 = 0;
  double d2 = 0.5;
  float f2 = 0;
  std::string s2;
  tr::Flags again("fuzz", "fuzzed flags");
  again.add("flag", b2, "").add("count", i2, "").add("tokens", big2, "");
  again.add("rate", d2, "").add("scale", f2, "").add("name", s2, "");
  again.adopt(fl.run_config(), "fuzz");
  check(b2 == b && i2 == i && big2 == big && d2 == d && f2 == f && s2 == s);
}

void search_space(const std::vector<std::string>& lines) {
  const trainkit::train::SearchSpace space = trainkit::train::SearchSpace::parse(lines);
  // The canonical specs parse back to themselves.
  check(trainkit::train::SearchSpace::parse(space.specs()).specs() == space.specs());
  for (std::uint64_t trial = 0; trial < 4; ++trial) {
    const trainkit::train::Params p = space.sample(7, trial);
    check(p.items().size() == space.size());
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  if (size == 0) return 0;
  const std::string_view text(reinterpret_cast<const char*>(data) + 1, size - 1);
  const fuzz_alloc::Scope allocations;
  try {
    switch (data[0] % 6) {
      case 0: shard_pattern(text); break;
      case 1: check(!trainkit::dist::detail::first_slurm_host(text).empty()); break;
      case 2: {
        const long node = text.empty() ? 0 : static_cast<unsigned char>(text[0]);
        const std::string value(text.substr(text.empty() ? 0 : 1));
        if (value.find('\0') != std::string::npos) break;  // not an environment value
        ::setenv("TRAINKIT_FUZZ_TASKS_PER_NODE", value.c_str(), 1);
        const auto count =
            trainkit::dist::detail::slurm_node_count("TRAINKIT_FUZZ_TASKS_PER_NODE", node);
        check(!count || *count >= 1);
        break;
      }
      case 3: flags(lines_of(text), nullptr); break;
      case 4: {
        const fuzz_memfile::MemFile file(data + 1, size - 1);
        const std::string path = file.path();
        flags({}, &path);
        break;
      }
      case 5: search_space(lines_of(text)); break;
    }
  } catch (const trainkit::Error&) {
    // refused with a message: fine
  }
  // A parser may allocate for what it returns, but nothing near the process's memory.
  check(allocations.largest() <= (std::size_t{1} << 28));
  return 0;
}
