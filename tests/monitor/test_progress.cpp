// Console progress: a bar redrawn in place on a terminal (a pseudo-terminal from posix_openpt, no
// extra link flags), plain greppable lines on a file, and messages that keep the bar intact.
#include <doctest/doctest.h>
#include <fcntl.h>
#include <stdlib.h>
#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <string>

#include <trainkit/monitor/progress.hpp>

namespace mon = trainkit::monitor;

namespace {
std::int64_t g_ns = 0;
std::int64_t fake_clock() noexcept { return g_ns; }

std::size_t count(const std::string& s, const std::string& what) {
  std::size_t n = 0;
  for (std::size_t at = s.find(what); at != std::string::npos; at = s.find(what, at + 1)) ++n;
  return n;
}

// A pseudo-terminal pair: Progress writes to the slave, the test reads what a terminal would get.
struct Pty {
  int master = -1;
  std::FILE* slave = nullptr;
  Pty() {
    master = ::posix_openpt(O_RDWR | O_NOCTTY);
    REQUIRE(master >= 0);
    REQUIRE(::grantpt(master) == 0);
    REQUIRE(::unlockpt(master) == 0);
    const char* name = ::ptsname(master);
    REQUIRE(name != nullptr);
    const int fd = ::open(name, O_RDWR | O_NOCTTY);
    REQUIRE(fd >= 0);
    slave = ::fdopen(fd, "w");
    REQUIRE(slave != nullptr);
    ::fcntl(master, F_SETFL, ::fcntl(master, F_GETFL) | O_NONBLOCK);
  }
  ~Pty() {
    if (slave != nullptr) std::fclose(slave);
    if (master >= 0) ::close(master);
  }
  // Reads what is available (keeps the pty buffer from filling up and blocking the writer).
  void drain(std::string& out) const {
    char buffer[4096];
    for (;;) {
      const ssize_t n = ::read(master, buffer, sizeof buffer);
      if (n <= 0) break;
      out.append(buffer, static_cast<std::size_t>(n));
    }
  }
};
}  // namespace

TEST_CASE("format_duration") {
  CHECK(mon::format_duration(0) == "00:00");
  CHECK(mon::format_duration(59.4) == "00:59");
  CHECK(mon::format_duration(61) == "01:01");
  CHECK(mon::format_duration(3725) == "1:02:05");
  CHECK(mon::format_duration(NAN) == "--:--");
  CHECK(mon::format_duration(-1) == "--:--");
  // Estimates beyond a century (a huge step count at a slow rate) are no estimate, not garbage.
  CHECK(mon::format_duration(1e19) == "--:--");
  CHECK(mon::format_duration(9.3e18) == "--:--");
  CHECK(mon::format_duration(3.1e9) != "--:--");
}

TEST_CASE("progress on a terminal: one bar redrawn in place with rate, ETA and loss") {
  Pty pty;
  std::string out;
  g_ns = 0;
  {
    mon::Progress p({.total = 100,
                     .stream = pty.slave,
                     .bar_interval_secs = 0.0,
                     .bar_width = 20,
                     .clock = fake_clock});
    CHECK(p.style() == mon::ProgressStyle::kBar);
    for (int step = 1; step <= 100; ++step) {
      g_ns += 100'000'000;  // 0.1 s per step: 10 it/s
      p.update(step, 2.0 - step * 0.01);
      if (step == 50) p.message("[trainkit] step 50 summary");
      pty.drain(out);
    }
    CHECK(p.rate() == doctest::Approx(10.0));
    p.finish();
  }
  pty.drain(out);
  INFO(out);
  CHECK(count(out, "\r") >= 100);      // redrawn in place, not scrolled
  CHECK(count(out, "\x1b[K") >= 100);  // each redraw clears the rest of the line
  CHECK(out.find("train  50%|##########          | 50/100 [00:05<00:05, 10 it/s, loss 1.5]") !=
        std::string::npos);
  CHECK(out.find("train 100%|####################| 100/100 [00:10<00:00, 10 it/s, loss 1]") !=
        std::string::npos);
  // The message erased the bar, got its own line, and the bar came back below it.
  const auto at = out.find("\r\x1b[K[trainkit] step 50 summary");
  REQUIRE(at != std::string::npos);
  CHECK(out.find("\rtrain  50%", at) != std::string::npos);
  // finish() ends the bar's line.
  CHECK(out.substr(out.size() - 2) == "\r\n");
}

TEST_CASE("progress to a file: plain periodic lines, greppable, no carriage returns") {
  std::FILE* file = std::tmpfile();
  REQUIRE(file != nullptr);
  g_ns = 0;
  {
    mon::Progress p({.total = 100, .stream = file, .line_interval_secs = 1.0, .clock = fake_clock});
    CHECK(p.style() == mon::ProgressStyle::kPlain);
    for (int step = 1; step <= 95; ++step) {
      g_ns += 100'000'000;
      p.update(step, 0.25);
      if (step == 42) p.message("summary at 42");
    }
  }  // the destructor prints the last line (step 95)
  std::rewind(file);
  std::string out;
  char buffer[4096];
  std::size_t n = 0;
  while ((n = std::fread(buffer, 1, sizeof buffer, file)) > 0) out.append(buffer, n);
  std::fclose(file);
  INFO(out);
  CHECK(out.find('\r') == std::string::npos);
  CHECK(out.find("\x1b") == std::string::npos);
  CHECK(count(out, "train step ") == 10);  // steps 10, 20, ..., 90 by time, and 95 at the end
  CHECK(out.find("train step 50/100 (50.0%) [00:05<00:05, 10 it/s, loss 0.25]\n") !=
        std::string::npos);
  CHECK(out.find("train step 95/100 (95.0%)") != std::string::npos);
  CHECK(out.find("summary at 42\n") != std::string::npos);
}

TEST_CASE("progress: step-based lines, unknown totals, and off") {
  std::FILE* file = std::tmpfile();
  REQUIRE(file != nullptr);
  g_ns = 0;
  {
    mon::Progress p({.style = mon::ProgressStyle::kPlain,
                     .stream = file,
                     .line_interval_secs = 1e9,
                     .line_every_steps = 25,
                     .unit = "batch",
                     .clock = fake_clock});
    for (int step = 1; step <= 60; ++step) {
      g_ns += 50'000'000;
      p.update(step);
    }
    p.finish();
    p.finish();
  }
  std::rewind(file);
  std::string out(4096, '\0');
  out.resize(std::fread(out.data(), 1, out.size(), file));
  std::fclose(file);
  INFO(out);
  CHECK(count(out, "train step ") == 3);  // 25, 50, and 60 at finish
  CHECK(out.find("train step 25 [00:01<--:--, 20 batch/s]\n") != std::string::npos);
  CHECK(out.find("train step 60 [") != std::string::npos);

  std::FILE* off_file = std::tmpfile();
  {
    mon::Progress off({.total = 10, .style = mon::ProgressStyle::kOff, .stream = off_file});
    off.update(5);
  }
  CHECK(std::ftell(off_file) == 0);
  std::fclose(off_file);
}

TEST_CASE("progress past its total: drawn once on reaching it, then by the interval only") {
  // A run that goes on past the total it was given once printed a plain line (or redrew the bar)
  // at every step past it.
  for (const auto style : {mon::ProgressStyle::kPlain, mon::ProgressStyle::kBar}) {
    CAPTURE(static_cast<int>(style));
    std::FILE* file = std::tmpfile();
    REQUIRE(file != nullptr);
    g_ns = 0;
    {
      mon::Progress p({.total = 10, .style = style, .stream = file, .clock = fake_clock});
      for (int step = 1; step <= 40; ++step) {
        g_ns += 1'000'000;  // 1 ms per step: neither interval passes
        p.update(step, 0.5);
      }
    }  // finish() shows step 40
    std::rewind(file);
    std::string out(1 << 16, '\0');
    out.resize(std::fread(out.data(), 1, out.size(), file));
    std::fclose(file);
    INFO(out);
    if (style == mon::ProgressStyle::kPlain) {
      CHECK(count(out, "train step ") == 2);
      CHECK(out.find("train step 10/10 (100.0%)") != std::string::npos);
      CHECK(out.find("train step 40/10 (400.0%)") != std::string::npos);
    } else {
      CHECK(count(out, "\r") == 3);  // the first update, step 10 and finish()
      CHECK(out.find("| 10/10 [") != std::string::npos);
      CHECK(out.find("| 40/10 [") != std::string::npos);
    }
  }
}
