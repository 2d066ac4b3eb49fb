// Resumed runs and honest console output: metrics.jsonl keeps the history up to the resume step
// (also when a run is resumed twice from one checkpoint), TensorBoard supersedes the steps past it
// the way SummaryWriter(purge_step=N) does, the progress rate counts from the resume step, one step
// numbering in every output, logging at an explicit step, and MFU above 100% shown as it is.
#include <doctest/doctest.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <limits>
#include <map>
#include <random>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include <trainkit/io/json.hpp>
#include <trainkit/io/tfevents.hpp>
#include <trainkit/monitor/json_writer.hpp>
#include <trainkit/monitor/monitor.hpp>
#include <trainkit/monitor/progress.hpp>
#include <trainkit/monitor/throughput.hpp>

#include "monitor/monitor_test_util.hpp"
#include "support/file_size_limit.hpp"

namespace io = trainkit::io;
namespace mon = trainkit::monitor;

namespace {
std::int64_t g_ns = 1'000'000'000;
std::int64_t fake_clock() noexcept { return g_ns; }

using monitor_test::read_stream;

std::vector<std::string> lines_of(const std::string& text) {
  std::vector<std::string> out;
  std::size_t begin = 0;
  while (begin < text.size()) {
    const std::size_t end = text.find('\n', begin);
    if (end == std::string::npos) {
      out.push_back(text.substr(begin));
      break;
    }
    out.push_back(text.substr(begin, end - begin));
    begin = end + 1;
  }
  return out;
}

std::int64_t step_of(const std::string& line) {
  const auto json = io::Json::try_parse(line);
  REQUIRE_MESSAGE(json.has_value(), "not JSON: " << line);
  REQUIRE(json->is_object());
  REQUIRE(json->find("step") != nullptr);
  return json->at("step").as_int();
}

// ---- a minimal tensorboard.Event decoder (the fields the monitor writes) ----------------------
struct Decoded {
  std::int64_t step = 0;
  bool has_file_version = false;
  int session_status = -1;  // SessionLog.status; -1 = no session_log
  std::vector<std::pair<std::string, float>> values;
};

struct Cursor {
  const unsigned char* p;
  const unsigned char* end;
  std::uint64_t varint() {
    std::uint64_t v = 0;
    for (int shift = 0; p < end && shift < 64; shift += 7) {
      const unsigned char b = *p++;
      v |= static_cast<std::uint64_t>(b & 0x7F) << shift;
      if ((b & 0x80) == 0) return v;
    }
    FAIL("bad varint");
    return 0;
  }
  // Calls f(field, wire_type, payload cursor or value) for each field.
  template <class F>
  void fields(F&& f) {
    while (p < end) {
      const std::uint64_t key = varint();
      const int field = static_cast<int>(key >> 3);
      const int type = static_cast<int>(key & 7);
      if (type == 0) {
        f(field, type, Cursor{p, p}, varint());
      } else if (type == 1 || type == 5) {
        const std::size_t n = type == 1 ? 8 : 4;
        REQUIRE(static_cast<std::size_t>(end - p) >= n);
        std::uint64_t v = 0;
        for (std::size_t i = 0; i < n; ++i) v |= static_cast<std::uint64_t>(p[i]) << (8 * i);
        p += n;
        f(field, type, Cursor{p, p}, v);
      } else if (type == 2) {
        const std::uint64_t n = varint();
        REQUIRE(static_cast<std::uint64_t>(end - p) >= n);
        const Cursor sub{p, p + n};
        p += n;
        f(field, type, sub, 0);
      } else {
        FAIL("unexpected wire type " << type);
      }
    }
  }
};

Decoded decode_event(const std::string& bytes) {
  Decoded d;
  Cursor c{reinterpret_cast<const unsigned char*>(bytes.data()),
           reinterpret_cast<const unsigned char*>(bytes.data()) + bytes.size()};
  c.fields([&](int field, int, Cursor sub, std::uint64_t v) {
    if (field == 2) d.step = static_cast<std::int64_t>(v);
    if (field == 3) d.has_file_version = true;
    if (field == 7) {
      d.session_status = 0;
      sub.fields([&](int f, int, Cursor, std::uint64_t x) {
        if (f == 1) d.session_status = static_cast<int>(x);
      });
    }
    if (field == 5) {
      sub.fields([&](int f, int, Cursor value, std::uint64_t) {
        if (f != 1) return;
        std::string tag;
        float simple = NAN;
        value.fields([&](int vf, int, Cursor vs, std::uint64_t x) {
          if (vf == 1) tag.assign(reinterpret_cast<const char*>(vs.p), vs.end - vs.p);
          if (vf == 2) {
            const auto bits = static_cast<std::uint32_t>(x);
            std::memcpy(&simple, &bits, 4);
          }
        });
        d.values.emplace_back(tag, simple);
      });
    }
  });
  return d;
}

// What TensorBoard shows for `tag` in a run directory: every event file in name order, a
// SessionLog START at step s discarding the points at steps >= s read so far (its purge rule).
std::vector<std::pair<std::int64_t, float>> tensorboard_view(const std::string& dir,
                                                             const std::string& tag) {
  auto files = monitor_test::files_with(dir, "tfevents");
  std::sort(files.begin(), files.end());
  std::vector<std::pair<std::int64_t, float>> points;
  for (const auto& f : files) {
    for (const auto& r : io::read_tfrecords(f).records) {
      const Decoded d = decode_event(r);
      if (d.session_status == 1) {
        std::erase_if(points, [&](const auto& p) { return p.first >= d.step; });
      }
      for (const auto& [t, v] : d.values)
        if (t == tag) points.emplace_back(d.step, v);
    }
  }
  return points;
}

// Sleeps into the next wall-clock second: event file names carry whole seconds, and TensorBoard
// reads a directory's files in name order.
void next_second() {
  const auto now = std::chrono::system_clock::now().time_since_epoch();
  const auto ms = std::chrono::duration_cast<std::chrono::milliseconds>(now).count() % 1000;
  std::this_thread::sleep_for(std::chrono::milliseconds(1005 - ms));
}

struct RunSpec {
  std::string dir;
  bool tensorboard = false;
  std::int64_t log_every = 1;
};

// One process's worth of training: steps [from, to), loss = tag + step / 1024 (exact in float).
// A fresh run (resume < 0) logs the initial validation loss at step 0.
void run(const RunSpec& spec, std::int64_t resume, std::int64_t from, std::int64_t to, int tag) {
  mon::Monitor m({.total_steps = to,
                  .log_every = spec.log_every,
                  .resume_step = resume,
                  .log_dir = spec.tensorboard ? spec.dir + "/tb" : std::string(),
                  .metrics_file = spec.dir + "/metrics.jsonl",
                  .progress = mon::ProgressStyle::kOff,
                  .console = nullptr,
                  .tokens_per_step = 64,
                  .gpu_monitor = false,
                  .clock = fake_clock});
  if (resume < 0) m.log_metrics(0, {{"val/loss", 9.5}});
  for (std::int64_t s = from; s < to; ++s) {
    m.begin_step(s);
    g_ns += 10'000'000;
    m.end_step({.loss = tag + static_cast<double>(s) / 1024.0});
  }
}
}  // namespace

TEST_CASE("metrics.jsonl: a resumed run appends, dropping lines past the resume step") {
  std::mt19937_64 rng(20240611);
  for (int config = 0; config < 16; ++config) {
    monitor_test::ScratchDir dir("resume_metrics");
    const RunSpec spec{.dir = dir.str(), .log_every = 1 + static_cast<std::int64_t>(rng() % 6)};
    const auto n1 = 1 + static_cast<std::int64_t>(rng() % 40);
    const auto r = static_cast<std::int64_t>(rng() % (n1 + 1));  // the checkpoint's step
    const auto n2 = r + 1 + static_cast<std::int64_t>(rng() % 20);
    const auto n3 = r + 1 + static_cast<std::int64_t>(rng() % 30);
    CAPTURE(config);
    CAPTURE(spec.log_every);
    CAPTURE(n1);
    CAPTURE(r);
    CAPTURE(n2);
    CAPTURE(n3);
    run(spec, -1, 0, n1, 1);
    const auto first = lines_of(monitor_test::read_file(dir / "metrics.jsonl"));
    run(spec, r, r, n2, 2);  // resumed from step r, stops (crashes) before the next checkpoint
    // A torn last line, as a kill inside write(2) leaves it.
    monitor_test::write_file(dir / "metrics.jsonl",
                             monitor_test::read_file(dir / "metrics.jsonl") + "{\"step\":99");
    run(spec, r, r, n3, 3);  // resumed from the same checkpoint again
    const std::string text = monitor_test::read_file(dir / "metrics.jsonl");
    INFO(text);
    REQUIRE(!text.empty());
    CHECK(text.back() == '\n');
    const auto lines = lines_of(text);
    // The first run's lines up to step r, byte for byte, then the last run's.
    std::vector<std::string> kept;
    for (const auto& l : first)
      if (step_of(l) <= r) kept.push_back(l);
    REQUIRE(lines.size() >= kept.size());
    CHECK(std::equal(kept.begin(), kept.end(), lines.begin()));
    CHECK(lines.front().find("\"val/loss\"") != std::string::npos);  // step 0 of the first run
    std::int64_t previous = -1;
    for (std::size_t i = 0; i < lines.size(); ++i) {
      const std::int64_t s = step_of(lines[i]);
      CHECK(s > previous);  // no step twice, none out of order
      previous = s;
      if (i >= kept.size()) {
        CHECK(s > r);
        CHECK(s <= n3);
        CHECK((s % spec.log_every == 0 || s == n3));  // the steps an uninterrupted run logs
      }
    }
    // Summaries at the multiples of log_every past r, and one for the rest at the end.
    const auto last_run_lines = static_cast<std::int64_t>(lines.size() - kept.size());
    CHECK(last_run_lines ==
          n3 / spec.log_every - r / spec.log_every + (n3 % spec.log_every != 0 ? 1 : 0));
    CHECK(previous == n3);
    // Nothing else left behind in the run directory.
    CHECK(monitor_test::files_with(dir.str(), "metrics").size() == 1);
  }
}

TEST_CASE("monitor: a step that did not end is not reported; bad step indices are refused") {
  monitor_test::ScratchDir dir("unfinished");
  {
    mon::Monitor m({.log_every = 4,
                    .metrics_file = dir / "metrics.jsonl",
                    .console = nullptr,
                    .gpu_monitor = false,
                    .clock = fake_clock});
    for (std::int64_t s = 0; s < 6; ++s) {
      m.begin_step(s);
      g_ns += 1'000'000;
      m.end_step({.loss = 1.0 + static_cast<double>(s)});
    }
    m.begin_step(6);  // the task throws here: end_step is never called
    g_ns += 1'000'000;
    CHECK_THROWS_WITH_AS(m.begin_step(std::numeric_limits<std::int64_t>::max()),
                         doctest::Contains("a step index is at least 0 and below 2^63 - 1"),
                         trainkit::Error);
    CHECK_THROWS_AS(m.begin_step(-1), trainkit::Error);
    m.close();
  }
  const auto lines = lines_of(monitor_test::read_file(dir / "metrics.jsonl"));
  REQUIRE(lines.size() == 2);
  CHECK(step_of(lines[0]) == 4);
  const auto last = io::Json::parse(lines[1]);
  CHECK(last.at("step").as_int() == 6);  // steps 5 and 6 (indices 4, 5), not the unfinished 7th
  CHECK(last.at("steps").as_int() == 2);
  CHECK(last.at("loss").as_double() == 6.0);
}

TEST_CASE("metrics.jsonl: a line the disk refuses is cut off; trimming keeps line ends") {
  monitor_test::ScratchDir dir("metrics_full");
  const std::string path = dir / "m.jsonl";
  {
    mon::MetricsFile f(path);
    f.write(1, {{"loss", 2.5}});
    // The file size limit stops the next line part-way (as a full disk does).
    const std::uint64_t size = monitor_test::read_file(path).size();
    const std::string error = trainkit_test::error_under_file_size_limit(size + 10, [&] {
      f.write(2, {{"loss", 1.25}, {"tokens_per_s", 12345.5}});
    });
    CHECK(error.find("m.jsonl") != std::string::npos);
    CHECK(error.find("EFBIG") != std::string::npos);
    f.write(3, {{"loss", 1.0}});  // space again: the next line follows a whole one
  }
  CHECK(monitor_test::read_file(path) == "{\"step\":1,\"loss\":2.5}\n{\"step\":3,\"loss\":1}\n");

  // A blank line dropped and a newline added to the last line: the same size, but rewritten.
  monitor_test::write_file(path, "{\"step\":1,\"loss\":2}\n\n{\"step\":2,\"loss\":1}");
  {
    mon::MetricsFile f = mon::MetricsFile::resumed(path, 10);
    f.write(11, {{"loss", 0.5}});
  }
  CHECK(monitor_test::read_file(path) ==
        "{\"step\":1,\"loss\":2}\n{\"step\":2,\"loss\":1}\n{\"step\":11,\"loss\":0.5}\n");
}

TEST_CASE("metrics.jsonl: resuming keeps or drops steps of any integer size, never throws") {
  // Lines another program wrote may hold integer steps past int64; comparing them once threw an
  // error that did not name the file, and the run could not resume.
  const std::vector<std::string> lines = {
      "{\"step\":1}",
      "{\"step\":18446744073709551615}",
      "{\"step\":18446744073709551616}",  // past uint64: a plain number, not an integer
      "{\"step\":9223372036854775808}",
      "{\"step\":-9223372036854775809}",
      "{\"step\":-9223372036854775808}",
      "{\"step\":9223372036854775807}",
      "{\"step\":-3}"};
  constexpr std::int64_t kMax = std::numeric_limits<std::int64_t>::max();
  constexpr std::int64_t kMin = std::numeric_limits<std::int64_t>::min();
  const std::vector<std::pair<std::int64_t, std::vector<std::size_t>>> cases = {
      {5, {0, 4, 5, 7}}, {kMax, {0, 4, 5, 6, 7}}, {-2, {4, 5, 7}}, {kMin, {4, 5}}, {0, {4, 5, 7}}};
  monitor_test::ScratchDir dir("resume_bigstep");
  const std::string path = dir / "metrics.jsonl";
  for (const auto& [limit, kept] : cases) {
    CAPTURE(limit);
    std::string text;
    for (const auto& l : lines) text += l + "\n";
    monitor_test::write_file(path, text);
    std::size_t dropped = 0;
    CHECK_NOTHROW(dropped = mon::keep_metrics_through_step(path, limit));
    CHECK(dropped == lines.size() - kept.size());
    std::string want;
    for (const std::size_t i : kept) want += lines[i] + "\n";
    CHECK(monitor_test::read_file(path) == want);
  }
}

TEST_CASE("metrics.jsonl: appending after a torn last line starts a line of its own") {
  // MetricsFile(path, /*append=*/true) once glued its first line to a torn one a killed writer
  // left, so readers lost both.
  std::string many;
  for (int i = 0; i < 3000; ++i) many += "{\"step\":" + std::to_string(i) + "}\n";
  const std::string long_torn = "{\"step\":2,\"x\":\"" + std::string(10000, 'a');
  const std::vector<std::pair<std::string, std::string>> cases = {
      {"", ""},
      {"{\"step\":1}\n", "{\"step\":1}\n"},
      {"{\"step\":1}\n{\"step\":2,\"lo", "{\"step\":1}\n"},
      {"{\"step\":1}\n{\"step\":2}", "{\"step\":1}\n{\"step\":2}\n"},  // whole: kept
      {"{\"step\":2,\"lo", ""},
      {"{\"step\":1}\n" + long_torn, "{\"step\":1}\n"},
      {long_torn, ""},
      {many + "{\"step\":3000,", many}};
  monitor_test::ScratchDir dir("metrics_append");
  const std::string path = dir / "m.jsonl";
  for (std::size_t c = 0; c < cases.size(); ++c) {
    CAPTURE(c);
    monitor_test::write_file(path, cases[c].first);
    {
      mon::MetricsFile f(path, /*append=*/true);
      f.write(9000, {{"loss", 0.5}});
    }
    const std::string text = monitor_test::read_file(path);
    CHECK(text == cases[c].second + "{\"step\":9000,\"loss\":0.5}\n");
    for (const auto& line : lines_of(text)) CHECK(io::Json::try_parse(line).has_value());
  }
}

TEST_CASE("metrics.jsonl: resuming without an earlier file starts one") {
  monitor_test::ScratchDir dir("resume_nofile");
  run({.dir = dir.str(), .log_every = 2}, 10, 10, 14, 1);
  const auto lines = lines_of(monitor_test::read_file(dir / "metrics.jsonl"));
  REQUIRE(lines.size() == 2);
  CHECK(step_of(lines[0]) == 12);
  CHECK(step_of(lines[1]) == 14);
}

TEST_CASE("TensorBoard: a resumed run supersedes the steps past the resume point") {
  std::mt19937_64 rng(77);
  for (int config = 0; config < 2; ++config) {
    monitor_test::ScratchDir dir("resume_tb");
    const RunSpec spec{.dir = dir.str(),
                       .tensorboard = true,
                       .log_every = 1 + static_cast<std::int64_t>(rng() % 5)};
    const auto n1 = 2 + static_cast<std::int64_t>(rng() % 30);
    const auto r = static_cast<std::int64_t>(rng() % n1);
    const auto n2 = r + 1 + static_cast<std::int64_t>(rng() % 20);
    const auto n3 = r + 1 + static_cast<std::int64_t>(rng() % 20);
    CAPTURE(n1);
    CAPTURE(r);
    CAPTURE(n2);
    CAPTURE(n3);
    run(spec, -1, 0, n1, 1);
    next_second();
    run(spec, r, r, n2, 2);
    next_second();
    run(spec, r, r, n3, 3);

    // The resumed files start like SummaryWriter(purge_step=r + 1)'s: file_version, then
    // file_version and SessionLog START at the purge step.
    auto files = monitor_test::files_with(dir / "tb", "tfevents");
    std::sort(files.begin(), files.end());
    REQUIRE(files.size() == 3);
    for (std::size_t f = 1; f < 3; ++f) {
      const auto recs = io::read_tfrecords(files[f]).records;
      REQUIRE(recs.size() >= 3);
      CHECK(decode_event(recs[0]).has_file_version);
      const Decoded again = decode_event(recs[1]);
      CHECK(again.has_file_version);
      CHECK(again.step == r + 1);
      const Decoded start = decode_event(recs[2]);
      CHECK(start.session_status == 1);
      CHECK(start.step == r + 1);
    }
    std::vector<std::pair<std::int64_t, float>> want;
    for (std::int64_t s = 0; s < r; ++s) want.emplace_back(s + 1, 1.0f + float(s) / 1024.0f);
    for (std::int64_t s = r; s < n3; ++s) want.emplace_back(s + 1, 3.0f + float(s) / 1024.0f);
    CHECK(tensorboard_view(dir / "tb", "train/loss") == want);
    const auto val = tensorboard_view(dir / "tb", "val/loss");
    REQUIRE(val.size() == 1);
    CHECK(val[0].first == 0);

    // TensorBoard's own reader agrees.
    if (!monitor_test::python_has("tensorboard")) {
      if (monitor_test::python_checks_required()) FAIL_CHECK("cannot import tensorboard");
      continue;
    }
    mon::JsonWriter expected;
    expected.begin_object().key("runs").begin_object().key(dir / "tb").begin_object();
    expected.key("scalars").begin_object().key("train/loss").begin_array();
    for (const auto& [s, v] : want)
      expected.begin_array().value(s).value(static_cast<double>(v)).end_array();
    expected.end_array().key("val/loss").begin_array();
    expected.begin_array().value(0).value(9.5).end_array();
    expected.end_array().end_object().end_object().end_object().end_object();
    monitor_test::write_file(dir / "expected.json", expected.str());
    std::string output;
    const int rc = monitor_test::run_command(
        monitor_test::python_command() + " \"" + TRAINKIT_TEST_DATA_DIR +
            "/tfevents/check_with_tensorboard.py\" \"" + (dir / "expected.json") + "\"",
        output);
    INFO(output);
    CHECK(rc == 0);
  }
}

TEST_CASE("session_log START event: the bytes Python protobuf writes (python check)") {
  io::ProtoWriter e;
  io::encode_session_start_event(e, 1700000000.5, 41);
  // Event{wall_time=1700000000.5, step=41, session_log{status=START}}
  CHECK(e.bytes() == monitor_test::from_hex("09 00 00 20 40 fc 54 d9 41 10 29 3a 02 08 01"));
  io::encode_file_version_event(e, 1700000000.5, 41);
  CHECK(e.bytes() ==
        monitor_test::from_hex("09 00 00 20 40 fc 54 d9 41 10 29 1a 0d") + "brain.Event:2");
  if (!monitor_test::python_has("tensorboard")) return;
  std::string output;
  const int rc =
      monitor_test::run_command(monitor_test::python_command() +
                                    " -c \"from tensorboard.compat.proto import event_pb2 as p; "
                                    "e = p.Event(wall_time=1700000000.5, step=41, "
                                    "session_log=p.SessionLog(status=p.SessionLog.START)); "
                                    "print(e.SerializeToString().hex())\"",
                                output);
  REQUIRE(rc == 0);
  io::encode_session_start_event(e, 1700000000.5, 41);
  std::string hex;
  for (const unsigned char c : e.bytes()) {
    char two[3];
    std::snprintf(two, sizeof two, "%02x", c);
    hex += two;
  }
  CHECK(output.substr(0, output.find('\n')) == hex);
}

TEST_CASE("progress after a resume: rate and ETA count from the resume step") {
  std::mt19937_64 rng(5);
  for (int config = 0; config < 8; ++config) {
    const auto resume = 1 + static_cast<std::int64_t>(rng() % 5000);
    const auto total = resume + 100 + static_cast<std::int64_t>(rng() % 1000);
    const double step_s = 0.05 + 0.01 * static_cast<double>(rng() % 100);  // 0.05 .. 1.04 s
    CAPTURE(resume);
    CAPTURE(step_s);
    std::FILE* out = std::tmpfile();
    REQUIRE(out != nullptr);
    {
      mon::Progress p({.total = total,
                       .initial = resume,
                       .style = mon::ProgressStyle::kPlain,
                       .stream = out,
                       .line_every_steps = 1,
                       .clock = fake_clock});
      for (std::int64_t s = resume + 1; s <= resume + 3; ++s) {
        g_ns += static_cast<std::int64_t>(step_s * 1e9);
        p.update(s);
      }
      CHECK(p.rate() == doctest::Approx(1.0 / step_s).epsilon(1e-6));
    }
    const std::string text = read_stream(out);
    std::fclose(out);
    INFO(text);
    char want[64];
    std::snprintf(want, sizeof want, ", %.3g it/s", 1.0 / step_s);
    CHECK(lines_of(text).size() >= 3);
    for (const auto& line : lines_of(text)) CHECK(line.find(want) != std::string::npos);
    CHECK(text.find("<" + mon::format_duration(static_cast<double>(total - resume - 3) * step_s)) !=
          std::string::npos);
  }
  // Through the Monitor: resume_step starts the bar there.
  std::FILE* out = std::tmpfile();
  {
    mon::Monitor m({.total_steps = 1000,
                    .log_every = 1000,
                    .resume_step = 600,
                    .progress = mon::ProgressStyle::kPlain,
                    .console = out,
                    .gpu_monitor = false,
                    .clock = fake_clock});
    for (std::int64_t s = 600; s < 1000; ++s) {
      m.begin_step(s);
      g_ns += 500'000'000;  // 2 steps per second
      m.end_step();
    }
  }
  const std::string text = read_stream(out);
  std::fclose(out);
  INFO(text);
  CHECK(text.find("train step 1000/1000 (100.0%) [03:20<00:00, 2 it/s]") != std::string::npos);
}

TEST_CASE("one step number everywhere: the optimizer steps completed") {
  monitor_test::ScratchDir dir("convention");
  std::FILE* out = std::tmpfile();
  {
    mon::Monitor m({.total_steps = 6,
                    .log_every = 3,
                    .log_dir = dir / "tb",
                    .metrics_file = dir / "metrics.jsonl",
                    .chrome_trace = dir / "trace.json",
                    .progress = mon::ProgressStyle::kPlain,
                    .console = out,
                    .gpu_monitor = false,
                    .clock = fake_clock});
    for (std::int64_t s = 0; s < 6; ++s) {  // the loop index: 0 for the first step
      m.begin_step(s);
      g_ns += 10'000'000;
      m.log_scalar("train/lr", 0.1 * static_cast<double>(s));
      m.end_step({.loss = static_cast<double>(s)});
      if (s == 2) CHECK(m.last_summary()->step == 3);
    }
  }
  const std::string text = read_stream(out);
  std::fclose(out);
  INFO(text);
  CHECK(text.find("[trainkit] step 3/6 |") != std::string::npos);
  CHECK(text.find("[trainkit] step 6/6 |") != std::string::npos);
  CHECK(text.find("train step 6/6 (100.0%)") != std::string::npos);
  const auto lines = lines_of(monitor_test::read_file(dir / "metrics.jsonl"));
  REQUIRE(lines.size() == 2);
  CHECK(step_of(lines[0]) == 3);
  CHECK(step_of(lines[1]) == 6);
  const auto loss = tensorboard_view(dir / "tb", "train/loss");
  REQUIRE(loss.size() == 6);
  for (std::size_t i = 0; i < loss.size(); ++i) {
    CHECK(loss[i].first == static_cast<std::int64_t>(i) + 1);  // the loss of step i + 1
    CHECK(loss[i].second == static_cast<float>(i));
  }
  const auto lr = tensorboard_view(dir / "tb", "train/lr");
  REQUIRE(lr.size() == 6);
  CHECK(lr.front().first == 1);
  CHECK(tensorboard_view(dir / "tb", "perf/step_time_ms").front().first == 3);
  const std::string trace = monitor_test::read_file(dir / "trace.json");
  CHECK(trace.find("\"name\":\"step 6\"") != std::string::npos);
  CHECK(trace.find("\"name\":\"step 0\"") == std::string::npos);
}

TEST_CASE("log_metrics: scalars at an explicit step in metrics.jsonl and TensorBoard") {
  monitor_test::ScratchDir dir("log_metrics");
  std::mt19937_64 rng(3);
  std::vector<std::pair<std::int64_t, double>> logged;
  {
    mon::Monitor m({.log_every = 4,
                    .log_dir = dir / "tb",
                    .metrics_file = dir / "metrics.jsonl",
                    .console = nullptr,
                    .gpu_monitor = false,
                    .clock = fake_clock});
    m.log_metrics(0, {{"val/loss", 5.25}});  // before the first step: the initial loss
    logged.emplace_back(0, 5.25);
    for (std::int64_t s = 0; s < 8; ++s) {
      m.begin_step(s);
      g_ns += 1'000'000;
      m.end_step();
      if (rng() % 2 == 0) {
        const double v = static_cast<double>(rng() % 1000) / 8.0;
        m.log_metrics(s + 1, {{"val/loss", v}, {"val/ppl", std::exp(v / 100.0)}});
        logged.emplace_back(s + 1, v);
      }
    }
  }
  const auto lines = lines_of(monitor_test::read_file(dir / "metrics.jsonl"));
  std::vector<std::pair<std::int64_t, double>> got;
  for (const auto& l : lines) {
    const auto j = io::Json::parse(l);
    if (const io::Json* v = j.find("val/loss"))
      got.emplace_back(j.at("step").as_int(), v->as_double());
  }
  CHECK(got == logged);
  CHECK(lines.front().rfind("{\"step\":0,", 0) == 0);
  // Names that would repeat a key of the line are refused before anything is written.
  {
    mon::Monitor m({.metrics_file = dir / "refused.jsonl",
                    .console = nullptr,
                    .gpu_monitor = false,
                    .clock = fake_clock});
    CHECK_THROWS_WITH_AS(m.log_metrics(3, {{"step", 1.0}}),
                         doctest::Contains("metric name 'step' is taken"), trainkit::Error);
    CHECK_THROWS_WITH_AS(m.log_metrics(3, {{"x", 2.0}, {"time", 1.0}}),
                         doctest::Contains("metric name 'time' is taken"), trainkit::Error);
    CHECK_THROWS_WITH_AS(m.log_metrics(3, {{"a", 1.0}, {"b", 2.0}, {"a", 3.0}}),
                         doctest::Contains("the metric 'a' is given twice at step 3"),
                         trainkit::Error);
    // Not UTF-8 (TensorBoard would refuse it; in JSON two such names can meet): refused before
    // anything is written, in TensorBoard or in the metrics file.
    CHECK_THROWS_WITH_AS(m.log_metrics(4, {{"ok", 1.0}, {"acc_caf\xe9", 0.5}}),
                         doctest::Contains("metric name 'acc_caf\\xe9' is not UTF-8 (at byte 7)"),
                         trainkit::Error);
    m.log_metrics(4, {{"acc_caf\xc3\xa9", 0.5}});
  }
  const auto refused = lines_of(monitor_test::read_file(dir / "refused.jsonl"));
  REQUIRE(refused.size() == 1);
  CHECK(io::Json::parse(refused[0]).at("step").as_int() == 4);
  const auto tb = tensorboard_view(dir / "tb", "val/loss");
  REQUIRE(tb.size() == logged.size());
  for (std::size_t i = 0; i < tb.size(); ++i) {
    CHECK(tb[i].first == logged[i].first);
    CHECK(tb[i].second == static_cast<float>(logged[i].second));
  }
}

TEST_CASE("MFU above 100% is shown as it is, with where the peak came from and a warning") {
  for (const double ratio : {0.5, 1.5, 3.0}) {
    CAPTURE(ratio);
    std::FILE* out = std::tmpfile();
    monitor_test::ScratchDir dir("mfu");
    {
      mon::Monitor m({.log_every = 2,
                      .metrics_file = dir / "metrics.jsonl",
                      .progress = mon::ProgressStyle::kOff,
                      .console = out,
                      .flops_per_step = ratio * 1e10,  // 10 ms steps: ratio x 1 TFLOP/s
                      .peak_flops = 1e12,
                      .peak_label = "measured: f32 gemm",
                      .gpu_monitor = false,
                      .clock = fake_clock});
      CHECK(m.peak_label() == "measured: f32 gemm");
      for (std::int64_t s = 0; s < 6; ++s) {
        m.begin_step(s);
        g_ns += 10'000'000;
        m.end_step();
      }
      CHECK(m.last_summary()->mfu == doctest::Approx(ratio));
    }
    const std::string text = read_stream(out);
    std::fclose(out);
    INFO(text);
    char want[96];
    std::snprintf(want, sizeof want, "MFU %.1f%% of 1 TFLOP/s (measured: f32 gemm)", 100 * ratio);
    CHECK(text.find(want) != std::string::npos);
    const auto all = lines_of(text);
    const auto warnings = std::count_if(all.begin(), all.end(), [](const std::string& l) {
      return l.find("warning: MFU") != std::string::npos;
    });
    CHECK(warnings == (ratio > 1.0 ? 1 : 0));  // once per run, not every summary
    CHECK(monitor_test::read_file(dir / "metrics.jsonl").find("\"peak\":\"measured: f32 gemm\"") !=
          std::string::npos);
  }
  // Without a label the peak is the caller's: "configured".
  mon::Monitor m({.console = nullptr, .peak_flops = 1e12, .gpu_monitor = false});
  CHECK(m.peak_label() == "configured");
}

TEST_CASE("best_of_probes keeps the fastest of several short probes") {
  std::mt19937_64 rng(11);
  for (int config = 0; config < 20; ++config) {
    const int probes = 1 + static_cast<int>(rng() % 9);
    std::vector<double> rates;
    for (int i = 0; i < probes; ++i) rates.push_back(1.0 + static_cast<double>(rng() % 1000));
    int calls = 0;
    const double best = mon::best_of_probes(probes, [&] { return rates[calls++]; });
    CHECK(calls == probes);
    CHECK(best == *std::max_element(rates.begin(), rates.end()));
  }
  CHECK(mon::measure_cpu_peak_flops(1, 0.02) > 1e8);
}
