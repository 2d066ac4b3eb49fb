// The Monitor facade: summary arithmetic with a fake clock (step time, samples/s, tokens/s,
// TFLOP/s, MFU), input-bound detection with a synthetic slow loader (real sleeps), and every
// output: console lines, JSON-lines metrics, TensorBoard scalars, Chrome trace, rank handling.
#include <doctest/doctest.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <limits>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include <trainkit/io/tfevents.hpp>
#include <trainkit/monitor/monitor.hpp>

#include "monitor/monitor_test_util.hpp"

namespace mon = trainkit::monitor;
using mon::Phase;

namespace {
std::int64_t g_ns = 0;
std::int64_t fake_clock() noexcept { return g_ns; }
void advance_ms(double ms) { g_ns += static_cast<std::int64_t>(ms * 1e6); }

using monitor_test::read_stream;

// The number after "key": in a JSON line.
double json_number(const std::string& line, const std::string& key) {
  const auto at = line.find("\"" + key + "\":");
  REQUIRE(at != std::string::npos);
  return std::strtod(line.c_str() + at + key.size() + 3, nullptr);
}

// A 10 ms step under the fake clock: data 1, forward 3, backward 5, optimizer 1.
void fake_step(mon::Monitor& m, std::int64_t step, double loss) {
  m.begin_step(step);
  {
    auto s = m.span(Phase::kDataWait);
    advance_ms(1);
  }
  {
    auto s = m.span(Phase::kForward);
    advance_ms(3);
  }
  {
    auto s = m.span(Phase::kBackward);
    advance_ms(5);
  }
  {
    auto s = m.span(Phase::kOptimizer);
    advance_ms(1);
  }
  m.end_step({.loss = loss});
}
}  // namespace

TEST_CASE("monitor summary: step time, throughput, MFU and all outputs") {
  monitor_test::ScratchDir dir("monitor");
  std::FILE* console = std::tmpfile();
  REQUIRE(console != nullptr);
  g_ns = 5'000'000'000;
  {
    mon::Monitor m({.total_steps = 8,
                    .log_every = 4,
                    .log_dir = dir / "tb",
                    .metrics_file = dir / "metrics.jsonl",
                    .chrome_trace = dir / "trace.json",
                    .progress = mon::ProgressStyle::kPlain,
                    .console = console,
                    .samples_per_step = 32,
                    .tokens_per_step = 32 * 128,
                    .flops_per_step = 2e11,
                    .peak_flops = 1e14,
                    .gpu_monitor = false,
                    .clock = fake_clock});
    CHECK(m.peak_flops() == 1e14);
    CHECK(m.peak_label() == "configured");
    for (int s = 0; s < 4; ++s) fake_step(m, s, 4.0 - s);
    REQUIRE(m.last_summary().has_value());
    const mon::StepSummary& s = *m.last_summary();
    CHECK(s.step == 4);  // steps completed (the loop index of the last step + 1)
    CHECK(s.steps == 4);
    CHECK(s.step_time_s == doctest::Approx(10e-3).epsilon(1e-9));
    CHECK(s.samples_per_s == doctest::Approx(3200.0).epsilon(1e-9));
    CHECK(s.tokens_per_s == doctest::Approx(409600.0).epsilon(1e-9));
    CHECK(s.tokens_per_s_global == s.tokens_per_s);
    CHECK(s.flops_per_s == doctest::Approx(2e13).epsilon(1e-9));
    CHECK(s.mfu == doctest::Approx(0.2).epsilon(1e-9));
    CHECK(s.data_wait_fraction == doctest::Approx(0.1).epsilon(1e-9));
    CHECK(s.timeline.fraction(Phase::kBackward) == doctest::Approx(0.5).epsilon(1e-9));
    CHECK(s.loss_last == 1.0);
    CHECK(s.loss_mean == 2.5);
    CHECK(s.host_memory.peak_rss > 0);
    // Per-step overrides: step 4 processes twice the tokens.
    m.begin_step(4);
    advance_ms(10);
    m.end_step({.loss = 0.5, .tokens = 8192});
    for (int st = 5; st < 8; ++st) fake_step(m, st, 0.5);
    CHECK(m.last_summary()->step == 8);
    CHECK(m.last_summary()->tokens_per_s == doctest::Approx(5 * 4096 / 40e-3).epsilon(1e-9));
    CHECK(m.last_summary()->data_wait_fraction == doctest::Approx(0.075).epsilon(1e-9));
    m.close();
  }
  const std::string text = read_stream(console);
  std::fclose(console);
  INFO(text);
  CHECK(text.find("[trainkit] step 4/8 | 10 ms/step | 3.2k samples/s | 410k tok/s | 20 TFLOP/s | "
                  "MFU 20.0% of 100 TFLOP/s (configured) | data 10.0% fwd 30.0% bwd 50.0% "
                  "opt 10.0% other 0.0% | loss 1 | host peak ") != std::string::npos);
  CHECK(text.find("[trainkit] step 8/8 |") != std::string::npos);
  CHECK(text.find("train step 8/8 (100.0%)") != std::string::npos);
  CHECK(text.find("warning") == std::string::npos);  // 10% is not above the 10% threshold

  // JSON lines: one object per summary.
  const std::string jsonl = monitor_test::read_file(dir / "metrics.jsonl");
  const auto newline = jsonl.find('\n');
  REQUIRE(newline != std::string::npos);
  const std::string first = jsonl.substr(0, newline);
  CHECK(std::count(jsonl.begin(), jsonl.end(), '\n') == 2);
  CHECK(first.rfind("{\"step\":4,", 0) == 0);
  CHECK(json_number(first, "mfu") == doctest::Approx(0.2).epsilon(1e-9));
  CHECK(json_number(first, "tokens_per_s") == doctest::Approx(409600.0).epsilon(1e-9));
  CHECK(json_number(first, "data_wait_s") == doctest::Approx(4e-3).epsilon(1e-9));
  CHECK(first.find("\"input_bound\":false") != std::string::npos);
  CHECK(first.find("\"peak\":\"configured\"") != std::string::npos);

  // TensorBoard: loss every step plus the summary scalars.
  const auto files = monitor_test::files_with(dir / "tb", "tfevents");
  REQUIRE(files.size() == 1);
  const auto recs = trainkit::io::read_tfrecords(files[0]);
  int loss_events = 0;
  int mfu_events = 0;
  for (const auto& r : recs.records) {
    if (r.find("train/loss") != std::string::npos) ++loss_events;
    if (r.find("perf/mfu_pct") != std::string::npos) ++mfu_events;
  }
  CHECK(loss_events == 8);
  CHECK(mfu_events == 2);
  const std::string all = monitor_test::read_file(files[0]);
  for (const char* tag : {"perf/step_time_ms", "perf/tokens_per_s", "perf/tflops",
                          "time/data_wait_pct", "time/backward_pct", "memory/host_peak_rss_gib"}) {
    CHECK_MESSAGE(all.find(tag) != std::string::npos, tag);
  }

  // Chrome trace written at close.
  const std::string trace = monitor_test::read_file(dir / "trace.json");
  CHECK(trace.find("\"name\":\"step 8\"") != std::string::npos);
  CHECK(trace.find("\"name\":\"optimizer\"") != std::string::npos);
}

namespace {
// Ten real steps: the loader sleeps `load_ms`, compute sleeps `compute_ms`.
mon::StepSummary run_loader(double load_ms, double compute_ms, std::string& console_text) {
  std::FILE* console = std::tmpfile();
  REQUIRE(console != nullptr);
  mon::StepSummary out;
  {
    mon::Monitor m({.log_every = 10,
                    .progress = mon::ProgressStyle::kOff,
                    .console = console,
                    .samples_per_step = 8,
                    .gpu_monitor = false});
    for (int step = 0; step < 10; ++step) {
      m.begin_step(step);
      {
        auto s = m.span(Phase::kDataWait);
        if (load_ms > 0)
          std::this_thread::sleep_for(std::chrono::duration<double, std::milli>(load_ms));
      }
      {
        auto s = m.span(Phase::kForward);
        std::this_thread::sleep_for(std::chrono::duration<double, std::milli>(compute_ms));
      }
      m.end_step();
    }
    REQUIRE(m.last_summary().has_value());
    out = *m.last_summary();
  }
  console_text = read_stream(console);
  std::fclose(console);
  return out;
}
}  // namespace

TEST_CASE("monitor: a NaN or infinite loss is shown as it is; an unread one is not shown") {
  monitor_test::ScratchDir dir("monitor_nan");
  std::FILE* console = std::tmpfile();
  REQUIRE(console != nullptr);
  g_ns = 5'000'000'000;
  const double nan = std::numeric_limits<double>::quiet_NaN();
  const double inf = std::numeric_limits<double>::infinity();
  std::vector<std::optional<double>> last;
  {
    mon::Monitor m({.total_steps = 8,
                    .log_every = 2,
                    .log_dir = dir / "tb",
                    .metrics_file = dir / "metrics.jsonl",
                    .progress = mon::ProgressStyle::kPlain,
                    .console = console,
                    .gpu_monitor = false,
                    .clock = fake_clock});
    // Windows: {2.5, 2.4}, {2.3, NaN}, {inf, 2.0}... step 6 unread, {unread, unread}.
    const std::optional<double> losses[] = {2.5, 2.4, 2.3,          nan,
                                            2.2, inf, std::nullopt, std::nullopt};
    for (int st = 0; st < 8; ++st) {
      m.begin_step(st);
      advance_ms(10);
      m.end_step({.loss = losses[st]});
      if (st % 2 == 1) last.push_back(m.last_summary()->loss_last);
    }
    m.close();
  }
  REQUIRE(last.size() == 4);
  CHECK(last[0] == 2.4);
  CHECK((last[1] && std::isnan(*last[1])));
  CHECK(last[2] == inf);
  CHECK_FALSE(last[3].has_value());  // no loss read in that window: none shown, not an old one
  const std::string text = read_stream(console);
  std::fclose(console);
  INFO(text);
  CHECK(text.find("step 2/8 |") != std::string::npos);
  CHECK(text.find("| loss 2.4 |") != std::string::npos);
  CHECK(text.find("| loss nan |") != std::string::npos);
  CHECK(text.find("| loss inf |") != std::string::npos);
  const auto step8 = text.find("step 8/8 |");
  REQUIRE(step8 != std::string::npos);
  CHECK(text.find("| loss", step8) == std::string::npos);
  // metrics.jsonl: null where no finite number can stand (JSON has no NaN).
  const std::string jsonl = monitor_test::read_file(dir / "metrics.jsonl");
  CHECK(jsonl.find("\"step\":4,") != std::string::npos);
  CHECK(std::count(jsonl.begin(), jsonl.end(), '\n') == 4);
  // TensorBoard gets every reported loss, NaN and inf included: 6 of the 8 steps.
  const auto files = monitor_test::files_with(dir / "tb", "tfevents");
  REQUIRE(files.size() == 1);
  int loss_events = 0;
  for (const auto& r : trainkit::io::read_tfrecords(files[0]).records)
    if (r.find("train/loss") != std::string::npos) ++loss_events;
  CHECK(loss_events == 6);
}

TEST_CASE("input-bound detection with a synthetic slow loader") {
  std::string slow_text;
  const auto slow = run_loader(4.0, 1.0, slow_text);
  INFO(slow_text);
  CHECK(slow.input_bound);
  CHECK(slow.data_wait_fraction > 0.5);
  CHECK(slow_text.find("[trainkit] warning: input-bound: data-wait is ") != std::string::npos);

  std::string fast_text;
  const auto fast = run_loader(0.0, 3.0, fast_text);
  INFO(fast_text);
  CHECK_FALSE(fast.input_bound);
  CHECK(fast.data_wait_fraction < 0.10);
  CHECK(fast_text.find("warning") == std::string::npos);
  CHECK(fast.samples_per_s > 0.0);
  CHECK(fast.samples_per_s < 8.0 / 3e-3);  // cannot beat the 3 ms compute per step
}

TEST_CASE("monitor on a rank other than 0 prints and writes nothing by default") {
  monitor_test::ScratchDir dir("rank1");
  std::FILE* console = std::tmpfile();
  {
    mon::Monitor m({.log_every = 2,
                    .rank = 1,
                    .world_size = 2,
                    .log_dir = dir / "tb",
                    .metrics_file = dir / "metrics.jsonl",
                    .chrome_trace = dir / "trace.json",
                    .console = console,
                    .tokens_per_step = 100,
                    .gpu_monitor = false});
    for (int s = 0; s < 4; ++s) {
      m.begin_step(s);
      m.end_step({.loss = 1.0});
    }
    REQUIRE(m.last_summary().has_value());
    CHECK(m.last_summary()->tokens_per_s_global == 2 * m.last_summary()->tokens_per_s);
  }
  CHECK(read_stream(console).empty());
  std::fclose(console);
  CHECK(monitor_test::files_with(dir / "tb", "tfevents").empty());
  CHECK(monitor_test::files_with(dir.str(), "metrics").empty());
  CHECK(monitor_test::files_with(dir.str(), "trace").empty());

  // all_ranks: every rank writes, with a per-rank suffix or run directory.
  {
    mon::Monitor m({.log_every = 2,
                    .rank = 1,
                    .world_size = 2,
                    .all_ranks = true,
                    .log_dir = dir / "tb",
                    .metrics_file = dir / "metrics.jsonl",
                    .chrome_trace = dir / "trace.json",
                    .console = nullptr,
                    .gpu_monitor = false});
    for (int s = 0; s < 2; ++s) {
      m.begin_step(s);
      m.end_step();
    }
  }
  CHECK(monitor_test::files_with(dir / "tb/rank1", "tfevents").size() == 1);
  CHECK(monitor_test::files_with(dir.str(), "metrics.jsonl.rank1").size() == 1);
  CHECK(monitor_test::files_with(dir.str(), "trace.json.rank1").size() == 1);
}

TEST_CASE("monitor: GPU sampler off the GPU path prints at most one info line") {
  std::FILE* console = std::tmpfile();
  {
    mon::Monitor m({.progress = mon::ProgressStyle::kOff, .console = console, .gpu_monitor = true});
    REQUIRE(m.gpu_monitor() != nullptr);
    m.begin_step(0);
    m.end_step();
  }
  const std::string text = read_stream(console);
  std::fclose(console);
  INFO(text);
  CHECK(std::count(text.begin(), text.end(), '\n') <= 2);  // the info line and one summary
  CHECK(text.find("[trainkit] step 1 |") != std::string::npos);
}

TEST_CASE("format_summary leaves out what is unknown") {
  mon::StepSummary s;
  s.step = 12;
  s.steps = 1;
  s.step_time_s = 0.25;
  s.timeline.steps = 1;
  s.timeline.elapsed_s = 0.25;
  s.timeline.host_s[0] = 0.05;
  const std::string line = mon::format_summary(s, 0);
  CHECK(line == "[trainkit] step 12 | 250 ms/step | data 20.0% other 80.0%");
  CHECK_THROWS_AS(mon::Monitor({.log_every = 0}), trainkit::Error);
}

TEST_CASE("monitor: the directories of metrics_file and chrome_trace are made at the start") {
  // The trace is written at close(): a missing directory once failed the run only at its end,
  // after every step had been trained, and metrics_file needed log_dir to have made its directory.
  monitor_test::ScratchDir dir("outdirs");
  const std::string metrics = dir / "a/b/metrics.jsonl";
  const std::string trace = dir / "c/d/trace.json";
  {
    mon::Monitor m({.log_every = 2,
                    .metrics_file = metrics,
                    .chrome_trace = trace,
                    .console = nullptr,
                    .gpu_monitor = false});
    for (int s = 0; s < 3; ++s) {
      m.begin_step(s);
      m.end_step({.loss = 1.0});
    }
    CHECK_NOTHROW(m.close());
  }
  CHECK(monitor_test::read_file(metrics).find("\"step\":2,") != std::string::npos);
  CHECK(monitor_test::read_file(trace).find("\"traceEvents\"") != std::string::npos);
  // A directory that cannot be made (a file is in the way) is an error now, naming the option.
  monitor_test::write_file(dir / "file", "x");
  CHECK_THROWS_WITH_AS(
      mon::Monitor(
          {.chrome_trace = dir / "file/trace.json", .console = nullptr, .gpu_monitor = false}),
      doctest::Contains("of chrome_trace '"), trainkit::Error);
  CHECK_THROWS_WITH_AS(
      mon::Monitor(
          {.metrics_file = dir / "file/m.jsonl", .console = nullptr, .gpu_monitor = false}),
      doctest::Contains("of metrics_file '"), trainkit::Error);
}
