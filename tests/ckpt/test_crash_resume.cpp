// Crash safety and exact resume with a real child process (tests/ckpt_tools/ckpt_trainer):
// - a child saving checkpoints in a loop is SIGKILLed at random moments, 50 times, sync and
//   async; after each kill the newest complete checkpoint loads and verifies, every listed one
//   is intact, progress never goes back, and the kills demonstrably hit saves in progress;
// - an MLP with dropout, AdamW + warmup/cosine and a shuffled Prefetcher trained 30 steps
//   straight vs killed (kill -9) mid-step and resumed: the same loss sequence, bit for bit, and
//   byte-identical final model and training-state files.
#include <doctest/doctest.h>

#include <chrono>
#include <cstdint>
#include <cstdio>
#include <map>
#include <random>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include <trainkit/ckpt/checkpointer.hpp>

#include "ckpt/ckpt_test_util.hpp"
#include "ckpt_tools/crash_state.hpp"
#include "support/time_scale.hpp"

#ifndef TRAINKIT_CKPT_TRAINER
#error "TRAINKIT_CKPT_TRAINER (the path of ckpt_trainer) is set by tests/ckpt_tools/CMakeLists.txt"
#endif

namespace {
namespace ckpt = trainkit::ckpt;
using ckpt_test::Child;
using ckpt_test::TempDir;

const std::string kTrainer = TRAINKIT_CKPT_TRAINER;

/// step -> every loss bit pattern logged for it (a resumed run logs replayed steps again).
std::map<std::int64_t, std::vector<std::string>> read_losses(const std::filesystem::path& file) {
  std::map<std::int64_t, std::vector<std::string>> out;
  std::istringstream in(ckpt_test::read_file(file));
  std::string line;
  while (std::getline(in, line)) {
    std::istringstream l(line);
    std::int64_t step = -1;
    std::string bits;
    if (l >> step >> bits && bits.size() == 8) out[step].push_back(bits);
  }
  return out;
}

}  // namespace

TEST_CASE("crash safety: SIGKILL at random moments never leaves a partial checkpoint") {
  TempDir dir;
  const auto root = dir / "ckpt";
  const auto log = dir / "child.log";
  std::mt19937 rng(20260530);
  std::int64_t last = 0;
  int mid_write = 0, with_checkpoint = 0;
  const auto t0 = std::chrono::steady_clock::now();
  constexpr int kTrials = 50;
  for (int trial = 0; trial < kTrials; ++trial) {
    CAPTURE(trial);
    const bool async = trial % 3 == 2;
    {
      Child child({kTrainer, "crash-loop", root.string(), "2", async ? "--async" : "--sync"}, log);
      if (trial == 0) {  // let the first save complete, however slow the disk
        // (Only look: a Checkpointer here would remove the child's temp directory as stale.)
        const auto committed = [&] {
          for (const std::string& name : ckpt_test::entries(root))
            if (name.starts_with("step_") &&
                std::filesystem::exists(root / name / "checkpoint.json"))
              return true;
          return false;
        };
        for (int k = 0; k < 500 && !committed(); ++k)
          std::this_thread::sleep_for(std::chrono::milliseconds(10));
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(
          std::uniform_int_distribution<>(15, 150)(rng) * trainkit_test::time_scale()));
      const int status = child.kill();
      REQUIRE_MESSAGE((WIFSIGNALED(status) && WTERMSIG(status) == SIGKILL),
                      "the child exited on its own:\n", ckpt_test::read_file(log));
    }
    if (!std::filesystem::exists(root)) continue;
    for (const std::string& name : ckpt_test::entries(root))
      if (name.starts_with(".step_") && name.ends_with(".tmp")) {
        ++mid_write;
        break;
      }
    std::vector<std::string> skipped;
    ckpt::Checkpointer ck(
        root, {.durable = false, .log = [&](const std::string& s) { skipped.push_back(s); }});
    const auto latest = ck.latest();
    CHECK(skipped.empty());  // nothing complete-looking is ever damaged
    if (!latest) {
      CHECK(last == 0);  // only before the first save ever completed
      continue;
    }
    ++with_checkpoint;
    CHECK(latest->step >= last);
    last = latest->step;
    // Every checkpoint that counts as complete loads, verifies and holds its step's values.
    for (const ckpt::CheckpointInfo& info : ck.list()) {
      ckpt_tools::CrashState s(2);
      ck.load(info, s.state);
      CHECK(s.state.step == info.step);
      CHECK(s.check() == "");
    }
  }
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  MESSAGE(kTrials, " kills in ", seconds, " s; ", mid_write,
          " hit a save in progress; newest step ", last);
  CHECK(with_checkpoint == kTrials);
  CHECK(mid_write >= kTrials / 5);  // the kills did interrupt writes
  CHECK(last >= kTrials / 2);       // progress across kills (each child continues the last)
}

TEST_CASE("exact resume: train N straight == train k, kill -9 mid-step, resume, continue to N") {
  for (const bool async : {false, true}) {
    CAPTURE(async);
    TempDir dir;
    const auto straight = dir / "straight";
    const auto resumed = dir / "resumed";
    std::filesystem::create_directories(straight);
    std::filesystem::create_directories(resumed);
    const std::string every = async ? "1" : "4";
    const std::vector<std::string> mode = {async ? "--async" : "--sync"};
    const auto args = [&](const std::filesystem::path& d, std::vector<std::string> extra) {
      std::vector<std::string> a = {kTrainer, "train", d.string(), "30", "--every", every};
      a.insert(a.end(), mode.begin(), mode.end());
      a.insert(a.end(), extra.begin(), extra.end());
      return a;
    };
    REQUIRE(ckpt_test::run(args(straight, {}), dir / "straight.log") == 0);
    // Killed in the middle of step 14 (after its optimizer step), with the checkpoint of step
    // 12 (sync, every 4) or of step 13 (async, every step, possibly still being written).
    REQUIRE(ckpt_test::run(args(resumed, {"--kill-at", "13"}), dir / "resumed.log") ==
            128 + SIGKILL);
    REQUIRE(ckpt_test::run(args(resumed, {}), dir / "resumed.log") == 0);
    const std::string log = ckpt_test::read_file(dir / "resumed.log");
    CHECK_MESSAGE(log.find(async ? "resumed at step 1" : "resumed at step 12") != std::string::npos,
                  log);

    const auto a = read_losses(straight / "losses.txt");
    const auto b = read_losses(resumed / "losses.txt");
    REQUIRE(a.size() == 30);
    REQUIRE(b.size() == 30);
    std::size_t replayed = 0;
    for (const auto& [step, bits] : a) {
      CAPTURE(step);
      REQUIRE(bits.size() == 1);
      for (const std::string& x : b.at(step)) CHECK(x == bits[0]);  // replays too
      replayed += b.at(step).size() - 1;
    }
    // Sync: step 13 ran before the kill and again after resuming from step 12.
    if (!async) CHECK(replayed == 1);
    // Bitwise-equal parameters and optimizer/schedule/loader/RNG state at step 30.
    for (const char* file : {"model.safetensors", "train_state.safetensors"}) {
      CAPTURE(file);
      const std::string x = ckpt_test::read_file(straight / "ckpt/step_000000030" / file);
      const std::string y = ckpt_test::read_file(resumed / "ckpt/step_000000030" / file);
      REQUIRE(!x.empty());
      CHECK(x == y);
    }
    // ... and the trajectory did move (the loss changed over training).
    CHECK(*a.at(1).begin() != *a.at(30).begin());
  }
}
