// Step timeline: span arithmetic with a fake clock, windows, the trace ring buffer and the Chrome
// trace JSON (parsed by Python's json when available, and checked structurally here).
#include <doctest/doctest.h>

#include <cstdint>
#include <string>

#include <trainkit/io/json.hpp>
#include <trainkit/monitor/json_writer.hpp>
#include <trainkit/monitor/timeline.hpp>

#include "monitor/monitor_test_util.hpp"
#include "support/file_size_limit.hpp"

namespace mon = trainkit::monitor;
using mon::Phase;

namespace {
std::int64_t g_fake_ns = 0;
std::int64_t fake_clock() noexcept { return g_fake_ns; }
void advance_ms(double ms) { g_fake_ns += static_cast<std::int64_t>(ms * 1e6); }

// One synthetic step: data 2 ms, forward 3 ms, backward 5 ms, optimizer 1 ms, 0.5 ms untracked.
void run_step(mon::Timeline& tl, std::int64_t step) {
  tl.begin_step(step);
  {
    auto s = tl.span(Phase::kDataWait);
    advance_ms(2);
  }
  {
    auto s = tl.span(Phase::kForward);
    advance_ms(3);
  }
  tl.begin(Phase::kBackward);
  advance_ms(5);
  tl.end(Phase::kBackward);
  {
    auto s = tl.span(Phase::kOptimizer);
    advance_ms(1);
  }
  advance_ms(0.5);
  tl.end_step();
}
}  // namespace

TEST_CASE("timeline arithmetic over a window of steps") {
  g_fake_ns = 1'000'000'000;
  mon::Timeline tl({.nvtx = false, .clock = fake_clock});
  for (int s = 10; s < 14; ++s) run_step(tl, s);
  advance_ms(4);  // a gap between steps (logging) counts in elapsed time, not in a step
  run_step(tl, 14);
  const auto w = tl.take_window();
  CHECK(w.steps == 5);
  CHECK(w.first_step == 10);
  CHECK(w.last_step == 14);
  CHECK(w.elapsed_s == doctest::Approx(5 * 11.5e-3 + 4e-3).epsilon(1e-12));
  CHECK(w.in_step_s == doctest::Approx(5 * 11.5e-3).epsilon(1e-12));
  CHECK(w.step_s() == doctest::Approx((5 * 11.5e-3 + 4e-3) / 5).epsilon(1e-12));
  CHECK(w.host_s[static_cast<int>(Phase::kDataWait)] == doctest::Approx(10e-3).epsilon(1e-12));
  CHECK(w.phase_s(Phase::kForward) == doctest::Approx(15e-3).epsilon(1e-12));
  CHECK(w.phase_s(Phase::kBackward) == doctest::Approx(25e-3).epsilon(1e-12));
  CHECK(w.phase_s(Phase::kOptimizer) == doctest::Approx(5e-3).epsilon(1e-12));
  CHECK(w.phase_s(Phase::kCommunication) == 0.0);
  CHECK(w.other_s() == doctest::Approx(5 * 0.5e-3 + 4e-3).epsilon(1e-9));
  CHECK(w.fraction(Phase::kDataWait) == doctest::Approx(10.0 / 61.5).epsilon(1e-12));

  // The next window starts fresh.
  run_step(tl, 15);
  const auto w2 = tl.take_window();
  CHECK(w2.steps == 1);
  CHECK(w2.first_step == 15);
  CHECK(w2.elapsed_s == doctest::Approx(11.5e-3).epsilon(1e-12));
  CHECK(w2.phase_s(Phase::kForward) == doctest::Approx(3e-3).epsilon(1e-12));
  const auto empty = tl.take_window();
  CHECK(empty.steps == 0);
  CHECK(empty.elapsed_s == 0.0);
  CHECK(empty.step_s() == 0.0);
}

TEST_CASE("timeline: repeated spans add up, a window cut mid-step keeps the step whole") {
  g_fake_ns = 0;
  mon::Timeline tl({.nvtx = false, .clock = fake_clock});
  tl.begin_step(0);
  for (int micro = 0; micro < 4; ++micro) {  // gradient accumulation
    auto f = tl.span(Phase::kForward);
    advance_ms(1);
    f.end();
    f.end();  // idempotent
    auto b = tl.span(Phase::kBackward);
    advance_ms(2);
  }
  const auto cut = tl.take_window();  // step 0 still open: nothing ended yet
  CHECK(cut.steps == 0);
  advance_ms(1);
  tl.end_step();
  const auto w = tl.take_window();
  CHECK(w.steps == 1);
  CHECK(w.elapsed_s == doctest::Approx(13e-3).epsilon(1e-12));
  // Spans ended before the cut were counted in the first window.
  CHECK(cut.phase_s(Phase::kForward) == doctest::Approx(4e-3).epsilon(1e-12));
  CHECK(cut.phase_s(Phase::kBackward) == doctest::Approx(8e-3).epsilon(1e-12));
  CHECK(w.phase_s(Phase::kForward) == 0.0);
  // begin_step on an open step ends it first; begin on an open phase ends that span first.
  tl.begin_step(1);
  tl.begin(Phase::kDataWait);
  advance_ms(2);
  tl.begin(Phase::kDataWait);
  advance_ms(3);
  tl.end(Phase::kDataWait);
  tl.end(Phase::kDataWait);  // nothing open: no-op
  tl.begin_step(2);
  tl.end_step();
  const auto w3 = tl.take_window();
  CHECK(w3.steps == 2);
  CHECK(w3.phase_s(Phase::kDataWait) == doctest::Approx(5e-3).epsilon(1e-12));
}

TEST_CASE("chrome trace: valid JSON with step and phase events, newest kept") {
  g_fake_ns = 0;
  mon::Timeline tl({.trace_capacity = 12, .nvtx = false, .rank = 3, .clock = fake_clock});
  for (int s = 0; s < 5; ++s) run_step(tl, s);  // 5 spans per step: 25 spans, 12 kept
  CHECK(tl.trace_size() == 12);
  const std::string json = tl.chrome_trace_json();
  CHECK(json.rfind("{\"displayTimeUnit\":\"ms\",\"traceEvents\":[", 0) == 0);
  CHECK(json.find("\"name\":\"step 4\"") != std::string::npos);
  CHECK(json.find("\"name\":\"step 0\"") == std::string::npos);  // dropped: oldest
  CHECK(json.find("\"name\":\"backward\"") != std::string::npos);
  CHECK(json.find("\"pid\":3") != std::string::npos);
  // Step 4 began at 4 * 11.5 ms = 46000 us and lasted 11.5 ms.
  CHECK(json.find("\"name\":\"step 4\",\"cat\":\"step\",\"ph\":\"X\",\"ts\":46000,\"dur\":11500") !=
        std::string::npos);
  // Balanced brackets outside strings: a cheap structural check that needs no parser.
  int depth = 0;
  bool in_string = false;
  for (std::size_t i = 0; i < json.size(); ++i) {
    const char c = json[i];
    if (in_string) {
      if (c == '\\') ++i;
      else if (c == '"') in_string = false;
      continue;
    }
    if (c == '"') in_string = true;
    if (c == '{' || c == '[') ++depth;
    if (c == '}' || c == ']') --depth;
    REQUIRE(depth >= 0);
  }
  CHECK(depth == 0);

  monitor_test::ScratchDir dir("trace");
  const std::string path = dir / "trace.json";
  tl.write_chrome_trace(path);
  CHECK(monitor_test::read_file(path) == json);
  if (monitor_test::python_has("json")) {
    std::string output;
    const std::string cmd = monitor_test::python_command() +
                            " -c \"import json,sys; d=json.load(open(sys.argv[1])); "
                            "ev=[e for e in d['traceEvents'] if e['ph']=='X']; "
                            "assert len(ev)==12, len(ev); "
                            "assert all(e['dur']>=0 and 'ts' in e for e in ev); print('ok')\" \"" +
                            path + "\"";
    CHECK(monitor_test::run_command(cmd, output) == 0);
    CHECK(output.find("ok") != std::string::npos);
  }
  CHECK_THROWS_AS(tl.write_chrome_trace(dir / "no/such/dir/trace.json"), trainkit::Error);

  // A write that fails (a file size limit, as a full disk) leaves the earlier trace whole.
  REQUIRE(json.size() > 100);
  const std::string error =
      trainkit_test::error_under_file_size_limit(100, [&] { tl.write_chrome_trace(path); });
  CHECK(error.find("trace.json") != std::string::npos);
  CHECK(monitor_test::read_file(path) == json);
}

TEST_CASE("JsonWriter escapes strings and writes non-finite numbers as null") {
  mon::JsonWriter w;
  w.begin_object().key("s").value("a\"b\\c\n\x01").key("x").value(0.1).key("n").value(NAN);
  w.key("i").value(std::int64_t{-7}).key("b").value(false).key("a").begin_array().value(1).value(2);
  w.end_array().end_object();
  CHECK(w.str() ==
        "{\"s\":\"a\\\"b\\\\c\\n\\u0001\",\"x\":0.1,\"n\":null,\"i\":-7,\"b\":false,"
        "\"a\":[1,2]}");
  // Bytes that are not UTF-8 become U+FFFD, one per bad byte; well-formed sequences pass.
  mon::JsonWriter u;
  u.begin_object().key("caf\xe9").value("\xc3\xa9 \xe2\x82\xac \xf0\x9f\x98\x80 \xed\xa0\x80 \xc3");
  u.end_object();
  CHECK(u.str() ==
        "{\"caf\xef\xbf\xbd\":\"\xc3\xa9 \xe2\x82\xac \xf0\x9f\x98\x80 "
        "\xef\xbf\xbd\xef\xbf\xbd\xef\xbf\xbd \xef\xbf\xbd\"}");
  CHECK(trainkit::io::Json::parse(u.str()).find("caf\xef\xbf\xbd") != nullptr);
}
