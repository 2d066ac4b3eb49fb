// Tests of train/flags.hpp: every accepted spelling sets the bound variable, every malformed one
// is an error naming the flag; --config files are typed and checked; run_config() round-trips
// random values exactly through adopt(), and adopt() lists every setting that differs.
#include <doctest/doctest.h>

#include <cstdint>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <random>
#include <limits>
#include <map>
#include <new>
#include <stdexcept>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include <trainkit/error.hpp>
#include <trainkit/train/flags.hpp>

namespace {
namespace tk = trainkit;
namespace train = trainkit::train;
namespace fs = std::filesystem;

struct Cfg {
  bool flag = false;
  int layers = 4;
  std::int64_t steps = 300;
  double lr = 3e-3;
  float dropout = 0.1f;
  std::string out = "runs/x";
};

train::Flags make(Cfg& c) {
  train::Flags f("prog", "A test program.");
  f.add("flag", c.flag, "a switch")
      .add("layers", c.layers, "blocks")
      .add("steps", c.steps, "steps", train::kSession)
      .add("lr", c.lr, "learning rate")
      .add("dropout", c.dropout, "dropout probability")
      .add("out", c.out, "run directory", train::kSession);
  return f;
}

bool parse(train::Flags& f, std::vector<std::string_view> args) { return f.parse(args); }

fs::path write_file(const std::string& name, const std::string& text) {
  const fs::path p = fs::temp_directory_path() / ("trainkit_flags_" + name);
  std::ofstream(p, std::ios::binary) << text;
  return p;
}

TEST_CASE("Flags: defaults stay, every spelling sets its variable") {
  Cfg c;
  train::Flags f = make(c);
  REQUIRE(parse(f, {}));
  CHECK(c.layers == 4);
  CHECK_FALSE(f.given("layers"));
  REQUIRE(parse(f, {"--layers", "7", "--steps=12", "--lr", "1e-4", "--dropout=0.25", "--flag",
                    "--out", "a b"}));
  CHECK(c.layers == 7);
  CHECK(c.steps == 12);
  CHECK(c.lr == 1e-4);
  CHECK(c.dropout == 0.25f);
  CHECK(c.flag);
  CHECK(c.out == "a b");
  CHECK(f.given("layers"));
  CHECK(f.given("out"));
  REQUIRE(parse(f, {"--no-flag"}));
  CHECK_FALSE(c.flag);
  REQUIRE(parse(f, {"--flag=true"}));
  CHECK(c.flag);
  REQUIRE(parse(f, {"--flag=0"}));
  CHECK_FALSE(c.flag);
  REQUIRE(parse(f, {"--out="}));
  CHECK(c.out.empty());
  REQUIRE(parse(f, {"--lr", "-2.5"}));  // a value may start with '-'
  CHECK(c.lr == -2.5);
}

TEST_CASE("Flags: malformed command lines are errors naming the flag") {
  Cfg c;
  train::Flags f = make(c);
  const auto fails = [&](std::vector<std::string_view> args, const char* text) {
    CAPTURE(text);
    CHECK_THROWS_WITH_AS(parse(f, args), doctest::Contains(text), tk::Error);
  };
  fails({"--nope", "1"}, "unknown flag --nope");
  fails({"layers"}, "unexpected argument 'layers'");
  fails({"--layers"}, "--layers needs a value (INT)");
  fails({"--layers", "4x"}, "--layers is '4x', not an integer");
  fails({"--layers", "99999999999"}, "not an integer in range");
  fails({"--steps", "1.5"}, "--steps is '1.5', not an integer");
  fails({"--lr", "nan"}, "not a finite number");
  fails({"--lr", "inf"}, "not a finite number");
  fails({"--lr", ""}, "not a finite number");
  fails({"--dropout", "1e39"}, "not a number in range");
  fails({"--flag=yes"}, "not true or false");
  fails({"--no-flag=1"}, "takes no value");
  fails({"--no-layers"}, "unknown flag --no-layers");
  fails({"--layers", "1", "--layers=2"}, "--layers is given twice");
  fails({"--config"}, "--config needs a file name");
  fails({"--config", "/nonexistent/run.json"}, "cannot open --config file");
}

TEST_CASE("Flags: bad definitions are refused") {
  Cfg c;
  train::Flags f("prog", "");
  f.add("lr", c.lr, "");
  CHECK_THROWS_WITH_AS(f.add("lr", c.lr, ""), doctest::Contains("defined twice"), tk::Error);
  for (const char* bad : {"", "Upper", "-x", "help", "config", "no-x", "a_b", "a b"})
    CHECK_THROWS_WITH_AS(f.add(bad, c.layers, ""), doctest::Contains("not a usable flag name"),
                         tk::Error);
}

TEST_CASE("Flags: ranges are checked on the command line, in --config and on adopt") {
  std::int64_t steps = 10;
  double p = 0.1;
  int threads = 0;
  train::Flags f("prog", "");
  f.add("steps", steps, "steps", {.at_least = 1}, train::kSession)
      .add("p", p, "probability", {.at_least = 0, .below = 1})
      .add("threads", threads, "threads", {.above = -1, .at_most = 64});
  const auto fails = [&](std::vector<std::string_view> args, const char* text) {
    CAPTURE(text);
    CHECK_THROWS_WITH_AS(parse(f, args), doctest::Contains(text), tk::Error);
  };
  fails({"--steps", "0"}, "--steps is '0', not a value >= 1");
  fails({"--steps", "-5"}, "--steps is '-5', not a value >= 1");
  fails({"--p", "1"}, "--p is '1', not a value < 1");
  fails({"--p", "-0.001"}, "not a value >= 0");
  fails({"--threads", "65"}, "not a value <= 64");
  fails({"--threads", "-1"}, "not a value > -1");
  CHECK(parse(f, {"--steps", "1", "--p", "0.999", "--threads", "64"}));
  CHECK(steps == 1);
  CHECK(p == 0.999);
  CHECK(threads == 64);
  const fs::path cfg = write_file("range.json", R"({"p": 1.5})");
  fails({"--config", cfg.string()}, "'p' is '1.5', not a value < 1");
  CHECK(p == 0.999);      // the failed parse left the flags as they were, --p given
  REQUIRE(parse(f, {}));  // nothing given: adopt takes (and checks) the saved value
  CHECK_THROWS_WITH_AS(f.adopt({{"p", "2"}}, "ckpt/step_4"),
                       doctest::Contains("saved setting 'p' is '2', not a value < 1"), tk::Error);
  const std::string u = f.usage();
  CHECK(u.find("(default: 0.1, >= 0, < 1; fixed by a resumed checkpoint)") != std::string::npos);
  // Integer flags are checked exactly, not through a double: 2^53 + 1 is above 2^53, and the
  // largest int64 is below 2^63.
  std::int64_t tokens = 0, big = 0;
  train::Flags g("prog", "");
  g.add("tokens", tokens, "", {.at_most = 9007199254740992.0})
      .add("big", big, "", {.below = 9223372036854775808.0});
  CHECK_THROWS_WITH_AS(parse(g, {"--tokens", "9007199254740993"}),
                       doctest::Contains("not a value <= 9007199254740992"), tk::Error);
  CHECK(parse(g, {"--tokens", "9007199254740992", "--big", "9223372036854775807"}));
  CHECK(tokens == 9007199254740992);
  CHECK(big == std::numeric_limits<std::int64_t>::max());
  // An empty --config is refused, and counts as given.
  fails({"--config="}, "--config needs a file name, not ''");
  fails({"--config=", "--config=x.json"}, "--config needs a file name, not ''");
  fails({"--config=x.json", "--config", "y.json"}, "--config is given twice");
  // A default outside its own range is a definition error.
  double lr = 0.0;
  CHECK_THROWS_WITH_AS(f.add("lr", lr, "", {.above = 0}),
                       doctest::Contains("the default of --lr, 0, is not > 0"), tk::Error);
}

TEST_CASE("Flags: --help prints the usage with types and defaults") {
  Cfg c;
  train::Flags f = make(c);
  const std::string u = f.usage();
  CHECK(u.find("usage: prog [flags]") != std::string::npos);
  CHECK(u.find("--layers INT") != std::string::npos);
  CHECK(u.find("(default: 0.003; fixed by a resumed checkpoint)") != std::string::npos);
  CHECK(u.find("--out TEXT") != std::string::npos);
  CHECK(u.find("--config FILE") != std::string::npos);
  CHECK_FALSE(parse(f, {"--layers", "9", "--help"}));
}

TEST_CASE("Flags: --config sets typed values, the command line overrides them") {
  Cfg c;
  train::Flags f = make(c);
  const fs::path p = write_file(
      "ok.json",
      R"({"layers": 6, "lr": 0.5, "flag": true, "out": "r", "steps": 18446744073709551615})");
  CHECK_THROWS_WITH_AS(parse(f, {"--config", p.string()}),
                       doctest::Contains("not an integer in range"), tk::Error);
  const fs::path q =
      write_file("ok2.json", R"({"layers": 6, "lr": 0.5, "flag": true, "out": "r"})");
  REQUIRE(parse(f, {"--layers", "8", "--config=" + q.string()}));
  CHECK(c.layers == 8);  // the command line wins, wherever --config stands
  CHECK(c.lr == 0.5);
  CHECK(c.flag);
  CHECK(c.out == "r");
  CHECK(f.given("lr"));
  CHECK_FALSE(f.given("dropout"));

  const auto fails = [&](const std::string& text, const char* what) {
    CAPTURE(text);
    const fs::path bad = write_file("bad.json", text);
    CHECK_THROWS_WITH_AS(parse(f, {"--config", bad.string()}), doctest::Contains(what), tk::Error);
  };
  fails(R"({"nope": 1})", "sets 'nope', which is not a flag");
  fails(R"({"layers": "6"})", "'layers' must be a number");
  fails(R"({"layers": 6.5})", "not an integer");
  fails(R"({"flag": 1})", "'flag' must be true or false");
  fails(R"({"out": 3})", "'out' must be a string");
  fails(R"([1, 2])", "must hold a JSON object");
  fails(R"({"layers": 6,})", "--config file");
  fails(R"({"layers": 6, "layers": 7})", "--config file");
  fails(std::string(train::Flags::kMaxConfigBytes + 1, ' '), "is larger than");
  // Beyond int64 below zero, and a NUL inside a text value: named, not cut or passed on.
  fails(R"({"steps": -9223372036854775809})", "'steps' is");
  fails(R"({"steps": -9223372036854775809})", "not a number in range");
  fails(R"({"out": "a\u0000b"})", "'out' holds a NUL character");
  fails(R"({"out": "a\u0000b"})", "without NUL characters");
  CHECK(c.out == "r");
}

TEST_CASE("Flags: run_config round-trips random values exactly through adopt") {
  std::mt19937_64 rng(11);
  for (int trial = 0; trial < 200; ++trial) {
    Cfg a;
    train::Flags fa = make(a);
    std::uint64_t bits = rng();
    double lr = 0.0;
    std::memcpy(&lr, &bits, sizeof lr);
    if (!std::isfinite(lr)) lr = static_cast<double>(rng() % 1000) * 1e-7;
    const std::string lr_text = tk::StateDict::number_to_string(lr);
    const std::string layers_text = std::to_string(static_cast<int>(rng() % 2000) - 1000);
    const float d = static_cast<float>(rng() % 100000) / 7.0f;
    const std::string d_text = std::to_string(d);  // 6 decimals: not the float's shortest form
    REQUIRE(parse(fa, {"--lr", lr_text, "--layers", layers_text, "--dropout", d_text,
                       rng() % 2 ? "--flag" : "--no-flag"}));
    const auto saved = fa.run_config();
    CHECK(saved.count("steps") == 0);  // kSession flags are not part of the run
    CHECK(saved.count("out") == 0);
    Cfg b;
    train::Flags fb = make(b);
    REQUIRE(parse(fb, {}));
    fb.adopt(saved, "ckpt/step_000000001");
    CHECK(std::memcmp(&a.lr, &b.lr, sizeof a.lr) == 0);
    CHECK(std::memcmp(&a.dropout, &b.dropout, sizeof a.dropout) == 0);
    CHECK(a.layers == b.layers);
    CHECK(a.flag == b.flag);
    CHECK(fb.run_config() == saved);
  }
}

TEST_CASE("Flags: adopt lists every differing and unknown setting") {
  Cfg a;
  train::Flags fa = make(a);
  REQUIRE(parse(fa, {"--lr", "0.01", "--layers", "3"}));
  auto saved = fa.run_config();

  Cfg b;
  train::Flags fb = make(b);
  REQUIRE(parse(fb, {"--lr", "0.02", "--layers", "3", "--dropout", "0.5", "--steps", "9"}));
  try {
    fb.adopt(saved, "run/ckpt/step_000000010");
    FAIL("adopt accepted differing settings");
  } catch (const tk::Error& e) {
    const std::string m = e.what();
    CHECK(m.find("cannot resume from run/ckpt/step_000000010") != std::string::npos);
    CHECK(m.find("--lr: the run has 0.01, the command line 0.02") != std::string::npos);
    CHECK(m.find("--dropout: the run has 0.1, the command line 0.5") != std::string::npos);
    CHECK(m.find("--layers") == std::string::npos);  // equal: not listed
    CHECK(m.find("--steps") == std::string::npos);   // a session flag may change
  }
  saved["width"] = "64";
  Cfg c;
  train::Flags fc = make(c);
  REQUIRE(parse(fc, {}));
  CHECK_THROWS_WITH_AS(fc.adopt(saved, "x"), doctest::Contains("'width' = 64 is not a run setting"),
                       tk::Error);
  saved.erase("width");
  saved["layers"] = "three";
  CHECK_THROWS_WITH_AS(fc.adopt(saved, "x"), doctest::Contains("saved setting 'layers' is 'three'"),
                       tk::Error);
  // A setting the saved run did not have (a flag added since) keeps its current value.
  saved.erase("layers");
  Cfg d;
  train::Flags fd = make(d);
  REQUIRE(parse(fd, {"--layers", "5"}));
  fd.adopt(saved, "x");
  CHECK(d.layers == 5);
  CHECK(d.lr == 0.01);
}

}  // namespace

namespace {

/// True when `text` holds a control byte other than a line feed (an error message must not:
/// the text would reach a terminal raw).
bool has_raw_control(const std::string& text) {
  for (const char ch : text) {
    const auto c = static_cast<unsigned char>(ch);
    if ((c < 0x20 && c != '\n') || c == 0x7f) return true;
  }
  return false;
}

/// The message of the trainkit::Error `f` throws ("" when it does not throw).
template <class F>
std::string message_of(F&& f) {
  try {
    f();
  } catch (const tk::Error& e) {
    return e.what();
  }
  return "";
}

}  // namespace

TEST_CASE("Flags: names and values from a config file, a checkpoint or argv are shown escaped") {
  Cfg c;
  train::Flags f = make(c);
  const std::vector<std::pair<std::string, std::string>> configs = {
      {R"({"\u001b[2Jevil": 1})", R"(sets '\x1b[2Jevil', which is not a flag)"},
      {R"({"lr": 1, "layers": "x\u0007"})", "'layers' must be a number"},
      {R"({"flag": true, "out": 3})", "'out' must be a string"}};
  for (const auto& [text, expected] : configs) {
    CAPTURE(text);
    const fs::path p = write_file("escape.json", text);
    const std::string m = message_of([&] { parse(f, {"--config", p.string()}); });
    CHECK(m.find(expected) != std::string::npos);
    CHECK_FALSE(has_raw_control(m));
  }
  // Command line text.
  for (const std::vector<std::string_view>& args : std::vector<std::vector<std::string_view>>{
           {"--lr", "1\x1b[2J"}, {"\x1b[2J"}, {"--\x1b[2Jx", "1"}, {"--flag=\x07"}}) {
    const std::string m = message_of([&] { parse(f, args); });
    CHECK(m.find("prog: ") != std::string::npos);
    CHECK_FALSE(has_raw_control(m));
  }
  CHECK(message_of([&] {
          parse(f, {"--lr", "1\x1b[2J"});
        }).find(R"(is '1\x1b[2J', not)") != std::string::npos);
  // A checkpoint's saved settings: an unknown name, a bad value, a differing value.
  Cfg d;
  train::Flags fd = make(d);
  REQUIRE(parse(fd, {"--out", "x", "--lr", "0.5"}));
  const std::vector<std::map<std::string, std::string>> saved = {
      {{"\x1b[2Jname", "1"}}, {{"layers", "\x1b[2J"}}, {{"lr", "0.25\x1b[2J"}}};
  for (const auto& s : saved) {
    const std::string m = message_of([&] { fd.adopt(s, "run/ckpt\x1b[0m"); });
    const bool named =
        m.find("cannot resume from run/ckpt\\x1b[0m") != std::string::npos ||
        m.find("run/ckpt\\x1b[0m: saved setting 'layers' is '\\x1b[2J'") != std::string::npos;
    CHECK(named);
    CHECK_FALSE(has_raw_control(m));
  }
}

TEST_CASE("Flags: a failed parse or adopt leaves every variable and given() as it was") {
  std::mt19937_64 rng(5);
  // Configs and command lines whose error comes after valid settings of other flags.
  const std::vector<std::string> configs = {R"({"layers": 7, "lr": 0.5, "out": 3})",
                                            R"({"flag": true, "dropout": 0.5, "nope": 1})",
                                            R"({"steps": 9, "out": "y", "layers": 1.5})"};
  const std::vector<std::vector<std::string>> lines = {
      {"--layers", "9", "--lr", "x"},
      {"--out", "z", "--flag", "--steps", "-"},
      {"--dropout", "0.25", "--layers", "2", "--layers", "3"},
      {"--lr", "0.125", "--unknown", "1"}};
  for (int trial = 0; trial < 40; ++trial) {
    Cfg c;
    train::Flags f = make(c);
    // A first parse that succeeds, with random values.
    const std::string layers = std::to_string(static_cast<int>(rng() % 100));
    const std::string lr = tk::StateDict::number_to_string(static_cast<double>(rng() % 1000) / 8);
    REQUIRE(parse(f, {"--layers", layers, "--lr", lr, rng() % 2 ? "--flag" : "--no-flag"}));
    const Cfg before = c;
    const auto check_unchanged = [&] {
      CHECK(c.flag == before.flag);
      CHECK(c.layers == before.layers);
      CHECK(c.steps == before.steps);
      CHECK(c.lr == before.lr);
      CHECK(c.dropout == before.dropout);
      CHECK(c.out == before.out);
      CHECK(f.given("layers"));
      CHECK(f.given("lr"));
      CHECK_FALSE(f.given("out"));
    };
    if (trial % 2 == 0) {
      const std::string& text = configs[rng() % configs.size()];
      CAPTURE(text);
      const fs::path p = write_file("restore.json", text);
      CHECK_THROWS_AS(parse(f, {"--config", p.string()}), tk::Error);
    } else {
      const std::vector<std::string>& line = lines[rng() % lines.size()];
      CHECK_THROWS_AS(parse(f, std::vector<std::string_view>(line.begin(), line.end())), tk::Error);
    }
    check_unchanged();
    // adopt: a flag that is not given takes its saved value before a differing one is found.
    Cfg other;
    train::Flags g = make(other);
    REQUIRE(parse(g, {"--layers", "77", "--dropout", "0.75"}));
    auto saved = g.run_config();
    saved["lr"] = "0.0078125";  // lr is given in f with another value
    CHECK_THROWS_WITH_AS(f.adopt(saved, "ckpt"), doctest::Contains("--layers: the run has 77"),
                         tk::Error);
    check_unchanged();
    saved["layers"] = before.layers == 77 ? "78" : "77";
    saved["dropout"] = "not a number";
    CHECK_THROWS_AS(f.adopt(saved, "ckpt"), tk::Error);
    check_unchanged();
  }
}

#if __has_include(<unistd.h>)
#include <unistd.h>

namespace {
/// What train::report_error(program, e) writes on stderr (fd 2 sent to a file meanwhile).
std::string reported(std::string_view program, const std::exception& e, int* status) {
  const fs::path file = fs::temp_directory_path() / "trainkit_test_report_error.txt";
  std::fflush(stderr);
  const int saved = ::dup(2);
  REQUIRE(saved >= 0);
  std::FILE* f = std::fopen(file.string().c_str(), "w");
  REQUIRE(f != nullptr);
  ::dup2(::fileno(f), 2);
  *status = train::report_error(program, e);
  std::fflush(stderr);
  ::dup2(saved, 2);
  ::close(saved);
  std::fclose(f);
  std::ifstream in(file);
  std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  fs::remove(file);
  return text;
}
}  // namespace

TEST_CASE("report_error prints PROGRAM: error: without trainkit's or the program's own prefix") {
  int status = 0;
  Cfg c;
  train::Flags flags("my_trainer", "test");
  flags.add("steps", c.steps, "steps", {.at_least = 1});
  const char* argv[] = {"my_trainer", "--steps", "0"};
  try {
    flags.parse(3, argv);
    FAIL("--steps 0 was accepted");
  } catch (const tk::Error& e) {
    const std::string text = reported("my_trainer", e, &status);
    CHECK(status == 1);
    CHECK(text.starts_with("my_trainer: error: --steps is '0', not a value >= 1"));
    CHECK(text.ends_with("\n"));
    CHECK(text.find("trainkit: ") == std::string::npos);
  }
  CHECK(reported("x", tk::Error("trainkit: bad file"), &status) == "x: error: bad file\n");
  CHECK(reported("x", std::bad_alloc(), &status) ==
        "x: error: " + std::string(std::bad_alloc().what()) + "\n");
  // Only a whole "PROGRAM: " prefix goes: "xy: ..." is not x's own.
  CHECK(reported("x", std::runtime_error("xy: z"), &status) == "x: error: xy: z\n");
  CHECK(reported("x", std::runtime_error(""), &status) == "x: error: \n");
}
#endif
