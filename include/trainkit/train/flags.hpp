// SPDX-License-Identifier: MIT
// trainkit/train/flags.hpp: `train::Flags`, typed command-line flags for trainers. Each flag binds
// a variable (bool, int, int64, double, float, string) that holds its default, with help text and
// a role: kRun flags define the run (model sizes, learning rate, seed: saved into checkpoints and
// checked on resume), kSession flags belong to one process (threads, output directory, resume).
// `--config run.json` reads flag values from a JSON object before the command line overrides
// them; `--help` prints the generated usage. Errors name the flag and what was expected.
//
//   train::Flags flags("mlp", "Trains an MLP classifier on .npy features");
//   flags.add("lr", cfg.lr, "peak learning rate").add("out", cfg.out, "run dir", kSession);
//   if (!flags.parse(argc, argv)) return 0;  // --help was printed
#pragma once

#include <charconv>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <exception>
#include <limits>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <string_view>
#include <system_error>
#include <type_traits>
#include <utility>
#include <variant>
#include <vector>

#include "trainkit/config.hpp"
#include "trainkit/core/state_dict.hpp"
#include "trainkit/error.hpp"
#include "trainkit/io/json.hpp"
#include "trainkit/io/utf8.hpp"

TRAINKIT_NAMESPACE_BEGIN
namespace train {

/// Whether a flag's value defines the run (saved with checkpoints, checked on resume) or only
/// this process.
enum class FlagRole : std::uint8_t { kRun, kSession };
inline constexpr FlagRole kRun = FlagRole::kRun;
inline constexpr FlagRole kSession = FlagRole::kSession;

/// The values a number flag accepts (every bound optional): `{.at_least = 1}`,
/// `{.at_least = 0, .below = 1}`. Checked for the command line, --config and adopt().
struct FlagRange {
  std::optional<double> at_least = std::nullopt, above = std::nullopt, at_most = std::nullopt,
                        below = std::nullopt;
};

/// A set of typed flags bound to the caller's variables (which hold the defaults).
class Flags {
 public:
  /// The largest --config file read (a run configuration is a few hundred bytes).
  static constexpr std::size_t kMaxConfigBytes = std::size_t{1} << 20;

  Flags(std::string program, std::string summary)
      : program_(std::move(program)), summary_(std::move(summary)) {}

  /// Binds flag `--name` to `value` (bool, int, std::int64_t, double, float or std::string).
  /// Names are lower case letters, digits and '-'; "help" and "config" are taken. Throws
  /// trainkit::Error for a bad or repeated name. The variable must outlive the Flags.
  template <class T>
  Flags& add(std::string name, T& value, std::string help, FlagRole role = FlagRole::kRun) {
    static_assert(std::is_same_v<T, bool> || std::is_same_v<T, int> ||
                      std::is_same_v<T, std::int64_t> || std::is_same_v<T, double> ||
                      std::is_same_v<T, float> || std::is_same_v<T, std::string>,
                  "train::Flags::add: flags are bool, int, std::int64_t, double, float or "
                  "std::string");
    check_name(name);
    Flag f{std::move(name), std::move(help), role, &value, {}};
    f.default_text = text_of(f);
    flags_.push_back(std::move(f));
    return *this;
  }
  /// The same for a number flag whose values must lie in `range` (see FlagRange). Throws when
  /// the flag is not a number or its default is outside the range.
  template <class T>
  Flags& add(std::string name, T& value, std::string help, FlagRange range,
             FlagRole role = FlagRole::kRun) {
    static_assert(std::is_arithmetic_v<T> && !std::is_same_v<T, bool>,
                  "train::Flags::add: a range is for number flags");
    add(std::move(name), value, std::move(help), role);
    if (range.at_least) limit(*range.at_least, Bound::kAtLeast, ">= ");
    if (range.above) limit(*range.above, Bound::kAbove, "> ");
    if (range.at_most) limit(*range.at_most, Bound::kAtMost, "<= ");
    if (range.below) limit(*range.below, Bound::kBelow, "< ");
    return *this;
  }

  /// Parses the command line (argv[0] is skipped): `--name value`, `--name=value`, and for bools
  /// `--name`, `--no-name`, `--name=true|false`. `--config FILE` (anywhere) is read first: a JSON
  /// object of flag names without dashes to values of the flags' types. Returns false when
  /// `--help` / `-h` was given (the usage is printed to stdout). Throws trainkit::Error naming
  /// the flag for an unknown flag, a missing or malformed value, a number out of range or not
  /// finite, a flag given twice, or a bad config file; the variables and given() are then left
  /// as they were before the call.
  bool parse(int argc, const char* const* argv) {
    std::vector<std::string_view> args;
    for (int i = 1; i < argc; ++i) args.emplace_back(argv[i]);
    return parse(args);
  }
  bool parse(int argc, char** argv) { return parse(argc, const_cast<const char* const*>(argv)); }
  bool parse(const std::vector<std::string_view>& args) {
    const Snapshot before = snapshot();
    try {
      return parse_args(args);
    } catch (...) {
      restore(before);
      throw;
    }
  }

  /// True when `name` was set by the command line or the config file (not left at its default).
  bool given(std::string_view name) const { return given_.count(std::string(name)) != 0; }

  /// The kRun flags as name -> canonical text (numbers in their shortest exact form): what a
  /// checkpoint stores to check a resume against.
  TRAINKIT_INLINE std::map<std::string, std::string> run_config() const;

  /// Takes a resumed run's settings: every kRun flag not given here takes the saved value; a
  /// given one must equal it. Throws trainkit::Error listing every differing flag (saved and
  /// given value) and every saved setting this program does not define; `where` names the
  /// checkpoint. Saved configurations without a flag (added since) keep its current value. On
  /// an error no variable is changed.
  void adopt(const std::map<std::string, std::string>& saved, std::string_view where) {
    const Snapshot before = snapshot();
    try {
      adopt_settings(saved, where);
    } catch (...) {
      restore(before);
      throw;
    }
  }

  /// The usage text --help prints: summary, then every flag with its type, default and help.
  TRAINKIT_INLINE std::string usage() const;

 private:
  using Target = std::variant<bool*, int*, std::int64_t*, double*, float*, std::string*>;
  enum class Bound : std::uint8_t { kAtLeast, kAbove, kAtMost, kBelow };
  struct Limit {
    double bound;
    Bound kind;
    std::string text;  // ">= 1", "< 1"
  };
  struct Flag {
    std::string name, help;
    FlagRole role;
    Target target;
    std::string default_text;
    std::vector<Limit> limits = {};
  };

  // long double: exact for every int64 value and every double bound (x86-64's 64-bit and
  // AArch64's 113-bit significands), so an integer flag is checked exactly, not rounded.
  TRAINKIT_INLINE static bool within(long double v, const Limit& l);
  TRAINKIT_INLINE static long double number_of(const Flag& f);
  TRAINKIT_INLINE void limit(double bound, Bound kind, const char* relation);

  TRAINKIT_INLINE void check_name(const std::string& name) const;

  Flag* find(std::string_view name) {
    for (Flag& f : flags_)
      if (f.name == name) return &f;
    return nullptr;
  }
  const Flag* find(std::string_view name) const { return const_cast<Flags*>(this)->find(name); }

  static std::string_view type_name(const Flag& f) {
    constexpr std::string_view kNames[] = {"BOOL", "INT", "INT", "NUMBER", "NUMBER", "TEXT"};
    return kNames[f.target.index()];
  }

  TRAINKIT_INLINE static std::string text_of(const Flag& f);

  /// Every flag's value and given(): what a failed parse() or adopt() puts back.
  struct Snapshot {
    std::vector<std::variant<bool, int, std::int64_t, double, float, std::string>> values;
    std::set<std::string> given;
  };
  Snapshot snapshot() const {
    Snapshot s{{}, given_};
    for (const Flag& f : flags_) std::visit([&](auto* p) { s.values.emplace_back(*p); }, f.target);
    return s;
  }
  void restore(const Snapshot& s) {
    for (std::size_t i = 0; i < flags_.size(); ++i)
      std::visit([&](auto* p) { *p = std::get<std::remove_pointer_t<decltype(p)>>(s.values[i]); },
                 flags_[i].target);
    given_ = s.given;
  }
  TRAINKIT_INLINE bool parse_args(const std::vector<std::string_view>& args);
  TRAINKIT_INLINE void adopt_settings(const std::map<std::string, std::string>& saved,
                                      std::string_view where);

  /// Parses `text` into the flag's variable; `who` names the source in errors.
  TRAINKIT_INLINE void set_from_text(Flag& f, std::string_view text, const std::string& who);

  template <class Fail>
  static void check_limits(const Flag& f, long double v, const Fail& fail) {
    for (const Limit& l : f.limits)
      if (!within(v, l)) fail("a value " + l.text);
  }

  TRAINKIT_INLINE void read_config(const std::string& path);

  std::string program_, summary_;
  std::vector<Flag> flags_;
  std::set<std::string> given_;
};

/// What a trainer's main() does with an exception that ends it: prints "PROGRAM: error: MESSAGE"
/// on stderr, MESSAGE without the "trainkit: " or "PROGRAM: " that trainkit's errors and Flags'
/// own start with, and returns 1, the exit status to return:
///
///   int main(int argc, char** argv) try { ... } catch (const std::exception& e) {
///     return train::report_error("my_trainer", e);
///   }
TRAINKIT_INLINE int report_error(std::string_view program, const std::exception& e);

#if TRAINKIT_IMPL

TRAINKIT_INLINE int report_error(std::string_view program, const std::exception& e) {
  std::string_view what = e.what();
  if (what.starts_with("trainkit: ")) what.remove_prefix(10);
  if (what.starts_with(program) && what.substr(program.size()).starts_with(": "))
    what.remove_prefix(program.size() + 2);
  std::fprintf(stderr, "%.*s: error: %.*s\n", int(program.size()), program.data(), int(what.size()),
               what.data());
  return 1;
}

TRAINKIT_INLINE bool Flags::parse_args(const std::vector<std::string_view>& args) {
  given_.clear();
  std::vector<std::pair<std::string, std::string>> pairs;  // (name, value) from the command line
  std::string config_file;
  bool config_given = false;
  for (std::size_t i = 0; i < args.size(); ++i) {
    std::string_view a = args[i];
    if (a == "--help" || a == "-h") {
      std::fputs(usage().c_str(), stdout);
      return false;
    }
    TRAINKIT_CHECK(a.size() > 2 && a.starts_with("--"), program_, ": unexpected argument '",
                   io::printable_bytes(a), "' (flags are --name value; see --help)");
    a.remove_prefix(2);
    std::string name(a.substr(0, a.find('=')));
    std::optional<std::string> value;
    if (a.find('=') != std::string_view::npos) value = std::string(a.substr(a.find('=') + 1));
    const Flag* f = find(name);
    if (f == nullptr && name.starts_with("no-")) {
      const Flag* negated = find(name.substr(3));
      if (negated != nullptr && std::holds_alternative<bool*>(negated->target)) {
        TRAINKIT_CHECK(!value, program_, ": --", name, " takes no value");
        pairs.emplace_back(name.substr(3), "false");
        continue;
      }
    }
    if (name == "config") {
      TRAINKIT_CHECK(!config_given, program_, ": --config is given twice");
      config_given = true;
      if (!value) {
        TRAINKIT_CHECK(i + 1 < args.size(), program_, ": --config needs a file name");
        value = std::string(args[++i]);
      }
      TRAINKIT_CHECK(!value->empty(), program_, ": --config needs a file name, not ''");
      config_file = *value;
      continue;
    }
    TRAINKIT_CHECK(f != nullptr, program_, ": unknown flag --", io::printable_bytes(name),
                   " (see --help)");
    if (!value) {
      if (std::holds_alternative<bool*>(f->target)) {
        value = "true";
      } else {
        TRAINKIT_CHECK(i + 1 < args.size(), program_, ": --", name, " needs a value (",
                       type_name(*f), ")");
        value = std::string(args[++i]);
      }
    }
    pairs.emplace_back(std::move(name), std::move(*value));
  }
  std::set<std::string> seen;
  for (const auto& [name, value] : pairs)
    TRAINKIT_CHECK(seen.insert(name).second, program_, ": --", name, " is given twice");
  if (!config_file.empty()) read_config(config_file);
  for (const auto& [name, value] : pairs) {
    set_from_text(*find(name), value, "--" + name);
    given_.insert(name);
  }
  return true;
}

TRAINKIT_INLINE std::map<std::string, std::string> Flags::run_config() const {
  std::map<std::string, std::string> out;
  for (const Flag& f : flags_)
    if (f.role == FlagRole::kRun) out[f.name] = text_of(f);
  return out;
}

TRAINKIT_INLINE void Flags::adopt_settings(const std::map<std::string, std::string>& saved,
                                           std::string_view where) {
  // Names and values come from a checkpoint (and the command line): shown escaped.
  std::string problems;
  for (const auto& [name, text] : saved) {
    Flag* f = find(name);
    if (f == nullptr || f->role != FlagRole::kRun) {
      problems += "\n  '" + io::printable_bytes(name) + "' = " + io::printable_bytes(text) +
                  " is not a run setting of " + program_;
      continue;
    }
    if (given(name)) {
      if (text_of(*f) != text)
        problems += "\n  --" + name + ": the run has " + io::printable_bytes(text) +
                    ", the command line " + io::printable_bytes(text_of(*f));
    } else {
      set_from_text(*f, text, io::printable_bytes(where) + ": saved setting '" + name + "'");
    }
  }
  TRAINKIT_CHECK(problems.empty(), program_, ": cannot resume from ", io::printable_bytes(where),
                 ", whose run was started with other settings:", problems,
                 "\n(leave these flags out to continue that run, or start a new run elsewhere)");
}

TRAINKIT_INLINE std::string Flags::usage() const {
  std::string out = "usage: " + program_ + " [flags]\n" + summary_ + "\n\nflags:\n";
  const auto line = [&](const std::string& left, const std::string& right) {
    out += "  " + left;
    out += left.size() < 26 ? std::string(26 - left.size(), ' ') : "\n" + std::string(28, ' ');
    out += right + "\n";
  };
  for (const Flag& f : flags_) {
    std::string left = "--" + f.name;
    if (!std::holds_alternative<bool*>(f.target)) left += " " + std::string(type_name(f));
    std::string right = f.help + " (default: " + (f.default_text.empty() ? "\"\"" : f.default_text);
    for (const Limit& l : f.limits) right += ", " + l.text;
    right += f.role == FlagRole::kRun ? "; fixed by a resumed checkpoint)" : ")";
    line(left, right);
  }
  line("--config FILE", "read flag values from a JSON object {\"name\": value, ...}");
  line("--help", "print this and exit");
  return out;
}

TRAINKIT_INLINE bool Flags::within(long double v, const Limit& l) {
  const long double bound = l.bound;
  switch (l.kind) {
    case Bound::kAtLeast: return v >= bound;
    case Bound::kAbove: return v > bound;
    case Bound::kAtMost: return v <= bound;
    case Bound::kBelow: return v < bound;
  }
  return false;
}

TRAINKIT_INLINE long double Flags::number_of(const Flag& f) {
  return std::visit(
      [](auto* p) -> long double {
        using T = std::remove_pointer_t<decltype(p)>;
        if constexpr (std::is_arithmetic_v<T> && !std::is_same_v<T, bool>) {
          return static_cast<long double>(*p);
        } else {
          return 0.0L;
        }
      },
      f.target);
}

TRAINKIT_INLINE void Flags::limit(double bound, Bound kind, const char* relation) {
  Flag& f = flags_.back();
  Limit l{bound, kind, std::string(relation).append(StateDict::number_to_string(bound))};
  TRAINKIT_CHECK(within(number_of(f), l), program_, ": the default of --", f.name, ", ",
                 f.default_text, ", is not ", l.text);
  f.limits.push_back(std::move(l));
}

TRAINKIT_INLINE void Flags::check_name(const std::string& name) const {
  bool ok = !name.empty() && name.front() != '-' && name != "help" && name != "config" &&
            !name.starts_with("no-");
  for (char c : name) ok = ok && ((c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '-');
  TRAINKIT_CHECK(ok, program_, ": '", name,
                 "' is not a usable flag name (lower case letters, digits and '-'; not help, "
                 "config or no-...)");
  TRAINKIT_CHECK(find(name) == nullptr, program_, ": flag --", name, " is defined twice");
}

TRAINKIT_INLINE std::string Flags::text_of(const Flag& f) {
  return std::visit(
      [](auto* p) -> std::string {
        using T = std::remove_pointer_t<decltype(p)>;
        if constexpr (std::is_same_v<T, bool>) {
          return *p ? "true" : "false";
        } else if constexpr (std::is_same_v<T, std::string>) {
          return *p;
        } else if constexpr (std::is_same_v<T, float>) {
          char buffer[32];  // the shortest text that reads back to the same float
          const auto [end, ec] = std::to_chars(buffer, buffer + sizeof buffer, *p);
          return ec == std::errc() ? std::string(buffer, end) : std::string("nan");
        } else if constexpr (std::is_same_v<T, double>) {
          return StateDict::number_to_string(*p);
        } else {
          return std::to_string(*p);
        }
      },
      f.target);
}

TRAINKIT_INLINE void Flags::set_from_text(Flag& f, std::string_view text, const std::string& who) {
  const auto fail = [&](std::string_view expected) {
    TRAINKIT_FAIL(program_, ": ", who, " is '", io::printable_bytes(text), "', not ", expected);
  };
  std::visit(
      [&](auto* p) {
        using T = std::remove_pointer_t<decltype(p)>;
        if constexpr (std::is_same_v<T, bool>) {
          if (text == "true" || text == "1") *p = true;
          else if (text == "false" || text == "0") *p = false;
          else fail("true or false");
        } else if constexpr (std::is_same_v<T, std::string>) {
          // A path or name with a NUL would be cut there by the system: refuse it (--config
          // JSON can spell one as \u0000; a command line cannot).
          TRAINKIT_CHECK(text.find('\0') == std::string_view::npos, program_, ": ", who,
                         " holds a NUL character; expected text without NUL characters");
          *p = std::string(text);
        } else if constexpr (std::is_floating_point_v<T>) {
          T v = 0;  // parsed in T itself, so a float's shortest text reads back exactly
          const auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), v);
          if (ec == std::errc::result_out_of_range) fail("a number in range");
          if (ec != std::errc() || end != text.data() + text.size() || !std::isfinite(v))
            fail("a finite number");
          check_limits(f, double(v), fail);
          *p = v;
        } else {
          T v = 0;
          const auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), v);
          if (ec == std::errc::result_out_of_range) fail("an integer in range");
          if (ec != std::errc() || end != text.data() + text.size()) fail("an integer");
          check_limits(f, static_cast<long double>(v), fail);
          *p = v;
        }
      },
      f.target);
}

TRAINKIT_INLINE void Flags::read_config(const std::string& path) {
  std::string text;
  {
    std::FILE* file = std::fopen(path.c_str(), "rb");
    TRAINKIT_CHECK(file != nullptr, program_, ": cannot open --config file '",
                   io::printable_bytes(path), "'");
    char buffer[4096];
    std::size_t n = 0;
    while ((n = std::fread(buffer, 1, sizeof buffer, file)) > 0) {
      if (text.size() + n > kMaxConfigBytes) {
        std::fclose(file);
        TRAINKIT_FAIL(program_, ": --config file '", io::printable_bytes(path), "' is larger than ",
                      kMaxConfigBytes, " bytes; a run configuration is a small JSON object");
      }
      text.append(buffer, n);
    }
    std::fclose(file);
  }
  // The path, keys and values are shown escaped in errors (the file's text is untrusted).
  const std::string where = "--config file '" + io::printable_bytes(path) + "'";
  const io::Json root = io::Json::parse(text, where);
  TRAINKIT_CHECK(root.is_object(), program_, ": ", where,
                 " must hold a JSON object of flag names to values");
  for (const io::JsonMember& m : root.as_object()) {
    Flag* f = find(m.key);
    TRAINKIT_CHECK(f != nullptr, program_, ": ", where, " sets '", io::printable_bytes(m.key),
                   "', which is not a flag (see --help)");
    const std::string who = where + ": '" + m.key + "'";  // a flag's name: printable
    const bool is_bool = std::holds_alternative<bool*>(f->target);
    const bool is_text = std::holds_alternative<std::string*>(f->target);
    if (is_bool) {
      TRAINKIT_CHECK(m.value.is_bool(), program_, ": ", who, " must be true or false");
      set_from_text(*f, m.value.as_bool() ? "true" : "false", who);
    } else if (is_text) {
      TRAINKIT_CHECK(m.value.is_string(), program_, ": ", who, " must be a string");
      set_from_text(*f, m.value.as_string(), who);
    } else {
      TRAINKIT_CHECK(m.value.is_number(), program_, ": ", who, " must be a number");
      std::string number;
      if (!m.value.is_integer()) {
        number = m.value.number_text();
      } else if (m.value.is_unsigned()) {
        number = std::to_string(m.value.as_uint());
      } else {
        try {
          number = std::to_string(m.value.as_int());
        } catch (const Error&) {  // below -2^63: no flag takes it
          TRAINKIT_FAIL(program_, ": ", who, " is ", m.value.as_double(),
                        ", not a number in range");
        }
      }
      set_from_text(*f, number, who);
    }
    given_.insert(m.key);
  }
}

#endif  // TRAINKIT_IMPL

}  // namespace train
TRAINKIT_NAMESPACE_END
