// Tests of ckpt/checkpointer.hpp: the directory layout and manifest, save/list/latest/load,
// every-N-steps and every-T-seconds, keep-last and keep-best rotation, replacing a step,
// skipping corrupt and incomplete checkpoints (and never deleting foreign directories), async
// snapshots, configuration errors that resume must not skip, multi-rank shards with an index
// (ThreadComm ranks as threads), and a full disk (RLIMIT_FSIZE in a forked child).
#include <doctest/doctest.h>

#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <memory>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include <sys/resource.h>
#include <sys/stat.h>
#include <unistd.h>

#include <trainkit/ckpt/checkpointer.hpp>
#include <trainkit/dist/thread_comm.hpp>
#include <trainkit/error.hpp>
#include <trainkit/exec/host.hpp>
#include <trainkit/io/json.hpp>
#include <trainkit/io/safetensors.hpp>
#include <trainkit/nn/param_arena.hpp>
#include <trainkit/optim/adamw.hpp>
#include <trainkit/optim/ema.hpp>

#include "ckpt/ckpt_test_util.hpp"
#include "ckpt_tools/crash_state.hpp"
#include "support/time_scale.hpp"

namespace {
namespace tk = trainkit;
namespace ckpt = trainkit::ckpt;
namespace io = trainkit::io;
namespace dist = trainkit::dist;
using ckpt_test::TempDir;
using ckpt_tools::CrashState;

std::vector<std::int64_t> steps_of(const std::vector<ckpt::CheckpointInfo>& v) {
  std::vector<std::int64_t> out;
  for (const auto& i : v) out.push_back(i.step);
  return out;
}

/// Collects log lines instead of printing them.
struct LogSink {
  std::vector<std::string> lines;
  std::function<void(const std::string&)> fn() {
    return [this](const std::string& s) { lines.push_back(s); };
  }
  bool contains(const std::string& s) const {
    for (const auto& l : lines)
      if (l.find(s) != std::string::npos) return true;
    return false;
  }
};

}  // namespace

TEST_CASE("Checkpointer: layout, manifest, save -> list -> latest -> load") {
  TempDir dir;
  CrashState s(0.01);
  s.set(42);
  ckpt::Checkpointer ck(dir.path(), {.durable = false});
  CHECK_FALSE(ck.latest().has_value());
  const auto path = ck.save(s.state, {{"val_loss", 0.25}});
  CHECK(path == dir / "step_000000042");
  CHECK(ckpt_test::entries(path) == std::vector<std::string>{"checkpoint.json", "model.safetensors",
                                                             "train_state.safetensors"});
  CHECK(ckpt_test::entries(dir.path()) == std::vector<std::string>{"step_000000042"});

  const io::Json m = io::Json::parse(ckpt_test::read_file(path / "checkpoint.json"), "manifest");
  CHECK(m.at("format").as_string() == "trainkit.checkpoint");
  CHECK(m.at("step").as_int() == 42);
  CHECK(m.at("epoch").as_int() == 4);
  CHECK(m.at("metrics").at("val_loss").as_double() == 0.25);
  CHECK(m.at("metadata").at("step_text").as_string() == "42");
  CHECK(m.at("model").as_string() == "model.safetensors");
  CHECK(m.at("files").at("model.safetensors").at("bytes").as_uint() ==
        std::filesystem::file_size(path / "model.safetensors"));

  // Model file: PyTorch names only; state file: every other tensor, scalars in __metadata__.
  const io::SafetensorsFile model(path / "model.safetensors");
  CHECK(model.names().size() == 3);
  CHECK(model.metadata().at("format") == "pt");
  const io::SafetensorsFile state(path / "train_state.safetensors");
  CHECK(state.contains("counter.values"));
  CHECK(state.metadata().at("trainer.step") == "42");
  CHECK(state.metadata().at("rng.position") == "420");
  CHECK(state.metadata().at("user.step_text") == "42");

  const auto info = ck.latest();
  REQUIRE(info.has_value());
  CHECK(info->step == 42);
  CHECK(info->metrics.at("val_loss") == 0.25);
  CrashState fresh(0.01);
  CHECK(fresh.check() != "");
  ck.load(*info, fresh.state);
  CHECK(fresh.check() == "");
  CHECK(fresh.state.step == 42);
}

TEST_CASE("Checkpointer: every_steps, every_seconds, due() never repeats a step") {
  TempDir dir;
  CrashState s(0.001);
  ckpt::Checkpointer ck(dir.path(), {.every_steps = 3, .keep_last = 0, .durable = false});
  for (std::int64_t step = 1; step <= 10; ++step) {
    s.set(step);
    ck.maybe_save(s.state);
  }
  CHECK(steps_of(ck.list()) == std::vector<std::int64_t>{3, 6, 9});
  CHECK_FALSE(ck.due(9));  // saved already
  CHECK(ck.due(12));

  TempDir dir2;
  ckpt::Checkpointer timed(dir2.path(), {.every_seconds = 1.0, .durable = false});
  s.set(1);
  CHECK_FALSE(timed.maybe_save(s.state));
  std::this_thread::sleep_for(std::chrono::milliseconds(1050));
  s.set(2);
  CHECK(timed.maybe_save(s.state));
  s.set(3);
  CHECK_FALSE(timed.maybe_save(s.state));  // the clock restarted at the save
  CHECK(steps_of(timed.list()) == std::vector<std::int64_t>{2});
}

TEST_CASE("Checkpointer: keep the last K and the best K by a metric") {
  TempDir dir;
  CrashState s(0.001);
  ckpt::Checkpointer ck(dir.path(), {.keep_last = 2,
                                     .best_metric = "val_loss",
                                     .best_mode = ckpt::MetricMode::kMin,
                                     .keep_best = 2,
                                     .durable = false});
  const double losses[] = {0.9, 0.3, 0.5, 0.2, 0.8, 0.7, 0.6};
  for (std::int64_t step = 1; step <= 7; ++step) {
    s.set(step);
    ck.save(s.state, {{"val_loss", losses[step - 1]}});
  }
  // Last two: 6, 7; best two: 4 (0.2), 2 (0.3).
  CHECK(steps_of(ck.list()) == std::vector<std::int64_t>{2, 4, 6, 7});
  REQUIRE(ck.best().has_value());
  CHECK(ck.best()->step == 4);

  TempDir dir2;
  ckpt::Checkpointer mx(dir2.path(), {.keep_last = 1,
                                      .best_metric = "acc",
                                      .best_mode = ckpt::MetricMode::kMax,
                                      .keep_best = 1,
                                      .durable = false});
  const double acc[] = {0.5, 0.9, 0.7};
  for (std::int64_t step = 1; step <= 3; ++step) {
    s.set(step);
    mx.save(s.state, {{"acc", acc[step - 1]}});
  }
  s.set(4);
  mx.save(s.state);  // no metric: never "best", still the newest
  CHECK(steps_of(mx.list()) == std::vector<std::int64_t>{2, 4});
}

TEST_CASE("Checkpointer: saving a step again replaces its checkpoint") {
  TempDir dir;
  CrashState s(0.001);
  ckpt::Checkpointer ck(dir.path(), {.durable = false});
  s.set(5);
  ck.save(s.state, {{"v", 1.0}});
  s.state.metadata["step_text"] = "changed";
  ck.save(s.state, {{"v", 2.0}});
  const auto all = ck.list();
  REQUIRE(all.size() == 1);
  CHECK(all[0].metrics.at("v") == 2.0);
  CHECK(all[0].metadata.at("step_text") == "changed");
  CHECK(ckpt_test::entries(dir.path()) == std::vector<std::string>{"step_000000005"});
}

TEST_CASE("Checkpointer: a save behind newer checkpoints sets them aside, so resume takes it") {
  // A run sent back to an older checkpoint (to restart before a loss spike, say) saves again:
  // the abandoned run's later checkpoints are not its past. Left in place, resume() would pick
  // them and keep-last would count them.
  using Steps = std::vector<std::int64_t>;
  TempDir dir;
  CrashState s(0.001);
  LogSink log;
  ckpt::Checkpointer ck(dir.path(), {.keep_last = 3, .durable = false, .log = log.fn()});
  for (const std::int64_t step : {100, 200, 300, 400}) {
    s.set(step);
    ck.save(s.state);
  }
  REQUIRE(steps_of(ck.list()) == Steps{200, 300, 400});
  ck.load(ck.list().front(), s.state);
  CHECK(s.counter == 200);
  s.set(250);
  ck.save(s.state);
  CHECK(steps_of(ck.list()) == Steps{200, 250});
  CHECK(ckpt_test::entries(dir.path()) ==
        std::vector<std::string>{".step_000000300.superseded", ".step_000000400.superseded",
                                 "step_000000200", "step_000000250"});
  CHECK(log.contains("step_000000300"));
  CHECK(log.contains("newer than step 250"));
  CrashState fresh(0.001);
  const auto resumed = ck.resume(fresh.state);
  REQUIRE(resumed.has_value());
  CHECK(resumed->step == 250);
  CHECK(fresh.counter == 250);

  // Saving the newest step again replaces it as before (nothing set aside); going back once more
  // sets aside a step whose name is taken already: it gets a number.
  ck.load(ck.list().front(), s.state);
  s.set(210);
  ck.save(s.state);
  CHECK(steps_of(ck.list()) == Steps{200, 210});
  ck.save(s.state);
  s.set(250);
  ck.save(s.state);
  ck.load(ck.list()[1], s.state);
  CHECK(s.counter == 210);
  for (const std::int64_t step : {220, 230, 240}) {
    s.set(step);
    ck.save(s.state);
  }
  // keep-last counts only this run's checkpoints.
  CHECK(steps_of(ck.list()) == Steps{220, 230, 240});
  CHECK(ckpt_test::entries(dir.path()) ==
        std::vector<std::string>{".step_000000250.superseded", ".step_000000250.superseded.1",
                                 ".step_000000300.superseded", ".step_000000400.superseded",
                                 "step_000000220", "step_000000230", "step_000000240"});
  // A step directory of someone else's files is left alone, as everywhere.
  std::filesystem::create_directory(dir.path() / "step_000000900");
  ckpt_test::write_file(dir.path() / "step_000000900" / "notes.txt", "mine");
  s.set(245);
  ck.save(s.state);
  CHECK(ckpt_test::read_file(dir.path() / "step_000000900" / "notes.txt") == "mine");
}

TEST_CASE("Checkpointer: corrupt and incomplete checkpoints are skipped, stale temps removed") {
  TempDir dir;
  CrashState s(0.05);
  LogSink log;
  {
    ckpt::Checkpointer ck(dir.path(), {.keep_last = 0, .durable = false});
    for (std::int64_t step = 1; step <= 4; ++step) {
      s.set(step);
      ck.save(s.state);
    }
  }
  // step 4: a flipped bit in the model data; step 3: a file missing; plus debris.
  const auto p4 = dir / "step_000000004/model.safetensors";
  std::string bytes = ckpt_test::read_file(p4);
  bytes[bytes.size() / 2] = static_cast<char>(bytes[bytes.size() / 2] ^ 0x10);
  ckpt_test::write_file(p4, bytes);
  std::filesystem::remove(dir / "step_000000003/train_state.safetensors");
  std::filesystem::create_directories(dir / ".step_000000005.tmp");
  ckpt_test::write_file(dir / ".step_000000005.tmp/model.safetensors", "partial");
  std::filesystem::create_directories(dir / "step_000000006");  // a half-deleted checkpoint
  ckpt_test::write_file(dir / "step_000000006/train_state.safetensors", "x");
  std::filesystem::create_directories(dir / "step_000000007");  // someone else's directory
  ckpt_test::write_file(dir / "step_000000007/notes.txt", "mine");

  // A watcher (another process's root) leaves everything as it is.
  ckpt::Checkpointer watcher(dir.path(), {.durable = false, .remove_stale = false});
  CHECK(std::filesystem::exists(dir / ".step_000000005.tmp"));
  CHECK(std::filesystem::exists(dir / "step_000000006"));
  ckpt::Checkpointer ck(dir.path(), {.keep_last = 0, .durable = false, .log = log.fn()});
  CHECK_FALSE(std::filesystem::exists(dir / ".step_000000005.tmp"));
  // Step directories are not deleted at construction: resume() quarantines the damaged ones.
  CHECK(std::filesystem::exists(dir / "step_000000006"));
  CHECK(std::filesystem::exists(dir / "step_000000007/notes.txt"));
  // Structure: 3 is incomplete; 4 looks complete until its content is hashed.
  CHECK(steps_of(ck.list()) == std::vector<std::int64_t>{1, 2, 4});
  CHECK(ck.latest(ckpt::Verify::kStructure)->step == 4);
  const auto latest = ck.latest();
  REQUIRE(latest.has_value());
  CHECK(latest->step == 2);
  CHECK(log.contains("step_000000004/model.safetensors' is corrupt"));

  // load() of the corrupt one throws and changes nothing.
  CrashState other(0.05);
  other.set(77);
  CHECK_THROWS_WITH_AS(ck.load(ck.list().back(), other.state), doctest::Contains("is corrupt"),
                       tk::Error);
  CHECK(other.check() == "");
  CHECK(other.state.step == 77);

  // resume() takes step 2 and moves the damaged step 4 aside (it must not count as "last").
  CrashState fresh(0.05);
  const auto resumed = ck.resume(fresh.state);
  REQUIRE(resumed.has_value());
  CHECK(resumed->step == 2);
  CHECK(fresh.check() == "");
  CHECK(steps_of(ck.list()) == std::vector<std::int64_t>{1, 2});
  CHECK(std::filesystem::exists(dir / ".step_000000004.corrupt/model.safetensors"));
  CHECK(std::filesystem::exists(dir / ".step_000000003.corrupt"));  // incomplete: damaged too
  CHECK(std::filesystem::exists(dir / ".step_000000006.corrupt"));  // no manifest
  CHECK(log.contains("step_000000006' has no readable checkpoint.json"));
  CHECK(std::filesystem::exists(dir / "step_000000007/notes.txt"));  // not ours: left alone
  CHECK(log.contains("ignoring '" + (dir / "step_000000007").string() + "': not a checkpoint"));
  ckpt::Checkpointer again(dir.path(), {.durable = false});  // stale cleanup keeps it
  CHECK(std::filesystem::exists(dir / ".step_000000004.corrupt"));
}

TEST_CASE("Checkpointer: resume on an empty directory; configuration errors are not skipped") {
  TempDir dir;
  CrashState s(0.001);
  s.set(9);
  ckpt::Checkpointer ck(dir.path(), {.durable = false});
  CHECK_FALSE(ck.resume(s.state).has_value());
  CHECK(s.check() == "");  // untouched
  ck.save(s.state);

  // A TrainState without a model loads the rest; one with a model needs a model file.
  tk::PhiloxStream rng(1);
  std::int64_t dummy = 0;
  ckpt::TrainState no_model;
  no_model.add("rng", rng)
      .add(
          "counter", [&] { return tk::StateDict{}; },
          [&](const tk::StateDict& sd) { dummy = sd.get_int("counter"); });
  CHECK(ck.resume(no_model).has_value());
  CHECK(dummy == 9);
  CHECK(rng.position() == 90);

  TempDir dir2;
  ckpt::Checkpointer no_model_ck(dir2.path(), {.durable = false});
  no_model.step = 3;
  no_model_ck.save(no_model);
  CHECK(ckpt_test::entries(dir2 / "step_000000003") ==
        std::vector<std::string>{"checkpoint.json", "train_state.safetensors"});
  CrashState with_model(0.001);
  CHECK_THROWS_WITH_AS(no_model_ck.resume(with_model.state),
                       doctest::Contains("holds no model, but a model is registered"), tk::Error);

  // A different model is an error of this run, not a damaged checkpoint.
  CrashState bigger(0.002);
  CHECK_THROWS_WITH_AS(ck.resume(bigger.state), doctest::Contains("encoder.weight"), tk::Error);

  CHECK_THROWS_AS(ckpt::Checkpointer(dir.path(), {.world_size = 2}), tk::Error);  // no barrier
  CHECK_THROWS_AS(ckpt::Checkpointer(dir.path(), {.rank = 2, .world_size = 2, .barrier = [] {}}),
                  tk::Error);
  CHECK_THROWS_AS(
      ckpt::Checkpointer(dir.path(), {.every_seconds = 1, .world_size = 2, .barrier = [] {}}),
      tk::Error);
}

TEST_CASE("Checkpointer: a step directory of someone else's files is never saved over") {
  for (const bool async : {false, true}) {
    CAPTURE(async);
    TempDir dir;
    CrashState s(0.001);
    s.set(5);
    ckpt::Checkpointer ck(dir.path(), {.async = async, .durable = false});
    std::filesystem::create_directories(dir / "step_000000005");
    ckpt_test::write_file(dir / "step_000000005" / "my_notes.txt", "mine");
    CHECK_THROWS_WITH_AS(ck.save(s.state),
                         doctest::Contains("holds files a checkpoint does not consist of; step 5 "
                                           "is not saved over them"),
                         tk::Error);
    ck.wait();
    CHECK(ckpt_test::read_file(dir / "step_000000005" / "my_notes.txt") == "mine");
    s.set(6);
    ck.save(s.state);  // other steps save as before
    ck.wait();
    CHECK(steps_of(ck.list()) == std::vector<std::int64_t>{6});
    CHECK(ckpt_test::read_file(dir / "step_000000005" / "my_notes.txt") == "mine");
    // A step a directory name cannot record is refused before anything is written.
    s.state.step = std::int64_t{1'000'000'000'000'000'000};
    CHECK_THROWS_WITH_AS(ck.save(s.state), doctest::Contains("above the largest"), tk::Error);
    ck.wait();
    CHECK(steps_of(ck.list()) == std::vector<std::int64_t>{6});
  }
}

TEST_CASE("Checkpointer: a file, FIFO or dangling link named like a step is never saved over") {
  // The commit exchanges the temp directory with whatever holds the step's name and deletes what
  // it got back: that must never be someone's file.
  for (const bool async : {false, true}) {
    for (int kind = 0; kind < 3; ++kind) {
      CAPTURE(async);
      CAPTURE(kind);
      TempDir dir;
      CrashState s(0.001);
      ckpt::Checkpointer ck(dir.path(), {.keep_last = 1, .async = async, .durable = false});
      const std::filesystem::path taken = dir / "step_000000009";
      if (kind == 0) ckpt_test::write_file(taken, "my precious notes");
      if (kind == 1) REQUIRE(::mkfifo(taken.c_str(), 0600) == 0);
      if (kind == 2) std::filesystem::create_symlink(dir / "nowhere", taken);
      s.set(9);
      CHECK_THROWS_WITH_AS(
          ck.save(s.state),
          doctest::Contains("step_000000009' exists and is not a directory; step 9 is not saved"),
          tk::Error);
      ck.wait();
      const std::filesystem::file_status st = std::filesystem::symlink_status(taken);
      if (kind == 0) CHECK(ckpt_test::read_file(taken) == "my precious notes");
      if (kind == 1) CHECK(std::filesystem::is_fifo(st));
      if (kind == 2) CHECK(std::filesystem::is_symlink(st));
      s.set(10);  // other steps save as before, and rotation leaves the file alone
      ck.save(s.state);
      s.set(11);
      ck.save(s.state);
      ck.wait();
      CHECK(steps_of(ck.list()) == std::vector<std::int64_t>{11});
      CHECK(std::filesystem::symlink_status(taken).type() == st.type());
    }
  }
  // A link to a directory still counts as the step's directory (as before).
  TempDir dir;
  CrashState s(0.001);
  std::filesystem::create_directories(dir / "elsewhere");
  std::filesystem::create_directory_symlink(dir / "elsewhere", dir / "step_000000003");
  ckpt::Checkpointer ck(dir.path(), {.durable = false});
  s.set(3);
  ck.save(s.state);
  CHECK(steps_of(ck.list()) == std::vector<std::int64_t>{3});
}

TEST_CASE("Checkpointer: a root or prefix with a NUL is refused before anything is touched") {
  // The system cuts a path at a NUL: "<dir>\0x" is <dir>, and the removal of a stale temp
  // directory of "<dir>\0x" would delete <dir> itself, its checkpoints and every other file.
  TempDir dir;
  CrashState s(0.001);
  const std::filesystem::path root = dir / "run";
  {
    ckpt::Checkpointer ck(root, {.keep_last = 0, .durable = false});
    s.set(1);
    ck.save(s.state);
  }
  ckpt_test::write_file(root / "notes.txt", "mine");
  for (const bool async : {false, true}) {
    CAPTURE(async);
    const std::filesystem::path bad(root.native() + std::string("\0x", 2));
    std::string error;
    try {
      ckpt::Checkpointer ck(bad, {.keep_last = 0, .async = async, .durable = false});
      s.set(2);
      ck.save(s.state);
      ck.wait();
    } catch (const tk::Error& e) {
      error = e.what();
    }
    CHECK(error.find("ckpt::Checkpointer: the root '" + root.string() + "?x' contains a NUL") !=
          std::string::npos);
    error.clear();
    try {
      ckpt::Checkpointer ck(root,
                            {.async = async, .durable = false, .prefix = std::string("s\0", 2)});
      s.set(3);
      ck.save(s.state);
      ck.wait();
    } catch (const tk::Error& e) {
      error = e.what();
    }
    CHECK(error.find("bad directory prefix 's?'") != std::string::npos);
    CHECK(ckpt_test::entries(root) == std::vector<std::string>{"notes.txt", "step_000000001"});
    CHECK(ckpt_test::read_file(root / "notes.txt") == "mine");
  }
  ckpt::Checkpointer ck(root, {.durable = false});
  CrashState fresh(0.001);
  REQUIRE(ck.resume(fresh.state).has_value());
  CHECK(fresh.state.step == 1);
  CHECK(fresh.check() == "");
}

TEST_CASE("Checkpointer: a resume refused for its components changes nothing, the model included") {
  TempDir dir;
  CrashState s(0.001);
  s.set(4);
  ckpt::Checkpointer ck(dir.path(), {.durable = false});
  ck.save(s.state);
  CrashState other(0.001);
  other.set(1);
  std::int64_t extra = 3;
  other.state.add(
      "sched",
      [&] {
        tk::StateDict sd;
        sd.set("x", extra);
        return sd;
      },
      [&](const tk::StateDict& sd) { extra = sd.get_int("x"); });
  CHECK_THROWS_WITH_AS(ck.resume(other.state),
                       doctest::Contains("no state for component(s) 'sched'"), tk::Error);
  CHECK(other.check() == "");  // step 1's values everywhere, the parameters included
  CHECK(other.state.step == 1);
  CHECK(extra == 3);
  CHECK(steps_of(ck.list()) == std::vector<std::int64_t>{4});  // not damaged: not moved
}

TEST_CASE("Checkpointer: a resume refused by the TrainState names the checkpoint's file") {
  // Resuming with changed settings: another set of components, or a component that refuses the
  // state it saved. The error must say which checkpoint (and file) it is about.
  TempDir dir;
  CrashState s(0.001);
  s.set(4);
  ckpt::Checkpointer ck(dir.path(), {.durable = false});
  ck.save(s.state);
  const std::string file = (dir / "step_000000004" / "train_state.safetensors").string();
  const std::string prefix = "cannot restore the training state from '" + file + "': ";
  for (int variant = 0; variant < 2; ++variant) {
    CAPTURE(variant);
    CrashState other(0.001);
    other.set(1);
    tk::ckpt::TrainState fewer;  // variant 1: the same model, no "counter"
    tk::nn::ParamArena<> arena;
    std::string message = "no state for component(s) 'sched'";
    if (variant == 0)
      other.state.add(
          "sched", [] { return tk::StateDict(); }, [](const tk::StateDict&) {});
    if (variant == 1) {
      for (const tk::nn::ParamInfo& p : other.arena.infos()) arena.add(p.name, p.shape);
      arena.finalize();
      fewer.model(arena).add("rng", other.rng);
      message = "has state for component(s) 'counter' that are not registered";
    }
    tk::ckpt::TrainState& target = variant == 1 ? fewer : other.state;
    std::string error;
    try {
      (void)ck.resume(target);
    } catch (const tk::Error& e) {
      error = e.what();
    }
    CHECK(error.find(prefix) != std::string::npos);
    CHECK(error.find(message) != std::string::npos);
    error.clear();
    try {
      ck.load(ck.list().at(0), target);
    } catch (const tk::Error& e) {
      error = e.what();
    }
    CHECK(error.find(prefix) != std::string::npos);
    CHECK(error.find(message) != std::string::npos);
    CHECK(other.state.step == 1);
  }
  // A component that refuses the state it finds (a changed configuration) is named with the file.
  CrashState refusing(0.001);
  refusing.set(1);
  ckpt::Checkpointer writer(dir / "b", {.durable = false});
  std::int64_t width = 8;
  refusing.state.add(
      "loader",
      [&] {
        tk::StateDict sd;
        sd.set("width", width);
        return sd;
      },
      [&](const tk::StateDict& sd) {
        TRAINKIT_CHECK(sd.get_int("width") == width, "loader: saved with width ",
                       sd.get_int("width"), ", configured with ", width);
      });
  refusing.set(6);
  writer.save(refusing.state);
  width = 16;
  refusing.set(1);
  std::string error;
  try {
    (void)writer.resume(refusing.state);
  } catch (const tk::Error& e) {
    error = e.what();
  }
  CHECK(error.find("cannot restore the training state from '" +
                   (dir / "b" / "step_000000006" / "train_state.safetensors").string() +
                   "': ckpt: restoring component 'loader' failed") != std::string::npos);
  CHECK(error.find("failed: loader: saved with width 8, configured with 16") != std::string::npos);
  CHECK(error.find("trainkit: ", 1) == std::string::npos);  // one "trainkit: ", in front
}

TEST_CASE("Checkpointer: a root the system cannot read now is an error, not a fresh start") {
  CHECK(ckpt::detail::system_refused(tk::Error("x", "os", ENOMEM)));
  CHECK(ckpt::detail::system_refused(tk::Error("x", "os", EMFILE)));
  CHECK(ckpt::detail::system_refused(std::bad_alloc()));
  CHECK_FALSE(ckpt::detail::system_refused(tk::Error("x", "os", ENOENT)));  // a missing file
  CHECK_FALSE(ckpt::detail::system_refused(tk::Error("x")));                // what a file says
  TempDir dir;
  CrashState s(0.001);
  s.set(3);
  ckpt::Checkpointer ck(dir.path(), {.durable = false});
  ck.save(s.state);
  CrashState fresh(0.001);
  fresh.set(1);
  // No file descriptor left (every number below the limit in use): listing the root fails.
  rlimit old{};
  REQUIRE(::getrlimit(RLIMIT_NOFILE, &old) == 0);
  const int lowest_free = ::dup(0);
  REQUIRE(lowest_free >= 0);
  ::close(lowest_free);
  rlimit tight = old;
  tight.rlim_cur = static_cast<rlim_t>(lowest_free);
  std::string error;
  bool fresh_start = false;
  REQUIRE(::setrlimit(RLIMIT_NOFILE, &tight) == 0);
  try {
    fresh_start = !ck.resume(fresh.state).has_value();
  } catch (const tk::Error& e) {
    error = e.what();
  }
  REQUIRE(::setrlimit(RLIMIT_NOFILE, &old) == 0);
  CHECK_FALSE(fresh_start);
  CHECK(error.find("cannot list the checkpoints in") != std::string::npos);
  CHECK(fresh.check() == "");
  CHECK(fresh.state.step == 1);
  CHECK(ckpt_test::entries(dir.path()) == std::vector<std::string>{"step_000000003"});
  const auto resumed = ck.resume(fresh.state);  // the system allows it again
  REQUIRE(resumed.has_value());
  CHECK(resumed->step == 3);
  CHECK(fresh.check() == "");
}

TEST_CASE("Checkpointer: a manifest intact by its checksum but missing a field names itself") {
  TempDir dir;
  CrashState s(0.001);
  s.set(2);
  ckpt::Checkpointer ck(dir.path(), {.durable = false});
  ck.save(s.state);
  const auto file = dir / "step_000000002" / "checkpoint.json";
  const std::string good = ckpt_test::read_file(file);
  // The text with `edit` applied, resealed with the checksum of its new content.
  const auto resealed = [&](const std::string& from, const std::string& to) {
    std::string text = good;
    const std::size_t at = text.find(from);
    REQUIRE(at != std::string::npos);
    text.replace(at, from.size(), to);
    const std::size_t digits = ckpt::detail::kManifestPrefix.size();
    text.replace(digits, 16, ckpt::hex64(ckpt::detail::manifest_checksum(text)));
    return text;
  };
  const std::string where = file.string();
  struct Case {
    std::string from, to, message;
  };
  const Case cases[] = {{"\"epoch\": 0,", "", "JSON object has no member 'epoch'"},
                        {"\"epoch\": 0", "\"epoch\": \"zero\"", "is string, expected"},
                        {"\"step\": 2", "\"step\": true", "is bool, expected"}};
  for (const Case& c : cases) {
    CAPTURE(c.from);
    const std::string text = resealed(c.from, c.to);
    std::string error;
    try {
      (void)ckpt::detail::parse_manifest(text, file.parent_path(), where);
    } catch (const tk::Error& e) {
      error = e.what();
    }
    CHECK(error.find("checkpoint manifest '" + where + "' is malformed (") != std::string::npos);
    CHECK(error.find(c.message) != std::string::npos);
  }
  CHECK(ckpt::detail::parse_manifest(good, file.parent_path(), where).step == 2);
}

TEST_CASE("Checkpointer: a resealed manifest's odd version or file name is named, escaped") {
  TempDir dir;
  CrashState s(0.001);
  s.set(2);
  ckpt::Checkpointer ck(dir.path(), {.keep_last = 0, .durable = false});
  ck.save(s.state);
  s.set(3);
  ck.save(s.state);
  const auto file = dir / "step_000000003" / "checkpoint.json";
  const std::string good = ckpt_test::read_file(file);
  const auto resealed = [&](const std::string& from, const std::string& to) {
    std::string text = good;
    const std::size_t at = text.find(from);
    REQUIRE(at != std::string::npos);
    text.replace(at, from.size(), to);
    const std::size_t digits = ckpt::detail::kManifestPrefix.size();
    text.replace(digits, 16, ckpt::hex64(ckpt::detail::manifest_checksum(text)));
    return text;
  };
  const std::string where = file.string();
  const std::string listed = "\"model.safetensors\": {";
  const std::string extra = "\"bytes\": 1, \"xxh64\": \"0000000000000000\"}, " + listed;
  struct Case {
    std::string from, to, message;
  };
  const Case cases[] = {
      {"\"version\": 2", "\"version\": 2.5", "' has version 2.5, which is not a manifest version"},
      {"\"version\": 2", "\"version\": 1e30", "' has version 1e30, which is not a manifest"},
      {"\"version\": 2", "\"version\": -2", "' has version -2, which is not a manifest version"},
      {"\"version\": 2", "\"version\": 99999999999999999999", "' has version 9999"},
      // A NUL would cut the path short: the size check would read model.safetensors instead.
      {listed, "\"model.safetensors\\u0000x\": {" + extra,
       "' lists the file 'model.safetensors?x', which is not a plain file name"},
      {listed, "\"a\\u001b[31mred\\n\": {" + extra,
       "' lists the file 'a?[31mred?', which is not a plain file name"},
      {listed, "\"x/\\u001b[2J\": {" + extra, "' lists the file 'x/?[2J', which is not a plain"},
  };
  for (const Case& c : cases) {
    CAPTURE(c.to);
    const std::string text = resealed(c.from, c.to);
    std::string error;
    try {
      (void)ckpt::detail::parse_manifest(text, file.parent_path(), where);
    } catch (const tk::Error& e) {
      error = e.what();
    }
    CHECK(error.find("checkpoint manifest '" + where + c.message) != std::string::npos);
    CHECK(error.find('\x1b') == std::string::npos);
    CHECK(error.find('\n') == std::string::npos);
  }
  // In place, such a checkpoint is skipped (quarantined) like any damaged one.
  ckpt_test::write_file(file, resealed(listed, "\"model.safetensors\\u0000x\": {" + extra));
  CrashState fresh(0.001);
  std::vector<std::string> lines;
  ckpt::Checkpointer reader(
      dir.path(), {.durable = false, .log = [&](const std::string& m) { lines.push_back(m); }});
  const auto info = reader.resume(fresh.state);
  REQUIRE(info.has_value());
  CHECK(info->step == 2);
  CHECK(fresh.check() == "");
  CHECK(reader.quarantined().size() == 1);
}

TEST_CASE("Checkpointer: names and texts a manifest cannot hold are refused, naming them") {
  TempDir dir;
  CrashState s(0.001);
  s.set(2);
  ckpt::Checkpointer ck(dir.path(), {.durable = false});
  CHECK_THROWS_WITH_AS(ck.save(s.state, {{"val/\xff", 1.0}}),
                       doctest::Contains("step 2: metric name 'val/"), tk::Error);
  s.state.metadata["note"] = "caf\xe9";  // Latin-1, not UTF-8
  CHECK_THROWS_WITH_AS(ck.save(s.state),
                       doctest::Contains("the value of metadata key 'note', 'caf"), tk::Error);
  s.state.metadata["note"] = "caf\xc3\xa9";
  ck.save(s.state, {{"val/loss", 1.0}});
  CHECK(steps_of(ck.list()) == std::vector<std::int64_t>{2});
}

TEST_CASE("Checkpointer: async saves snapshot the state, write in the background") {
  TempDir dir;
  CrashState s(4.0);
  ckpt::Checkpointer ck(dir.path(), {.keep_last = 2, .async = true, .durable = false});
  for (std::int64_t step = 1; step <= 3; ++step) {
    s.set(step);
    ck.save(s.state);
    // Training continues at once: change everything; the checkpoint must keep the snapshot.
    s.set(1000 + step);
  }
  ck.wait();
  const ckpt::SaveStats st = ck.last_stats();
  CHECK(st.bytes > 4u << 20);
  CHECK(st.write_seconds > 0);
  CHECK(steps_of(ck.list()) == std::vector<std::int64_t>{2, 3});
  CrashState fresh(4.0);
  REQUIRE(ck.resume(fresh.state).has_value());
  CHECK(fresh.state.step == 3);
  CHECK(fresh.check() == "");
}

TEST_CASE("Checkpointer: async snapshots in reused memory write the files a sync save writes") {
  // A model with an AdamW and an Ema whose state changes between saves; the async checkpointer's
  // staging memory is reused from the second save on, and each of its checkpoints must hold the
  // bytes of the synchronous one of the same step, although training changes everything right
  // after save() returns. With overlap_snapshot the copies of the parameters and of the
  // optimizer's and Ema's state are made by the writer thread after save() returns: the
  // optimizer step and the Ema update that follow at once (or after a forward-like read of the
  // parameters) must wait for them, and a direct write waits through wait_snapshot(). Random
  // shapes (large enough, in some trials, for the copies to be split among threads) and a random
  // number of steps between saves.
  std::mt19937 rng(20261205);
  for (int trial = 0; trial < 6; ++trial) {
    const bool overlap = trial % 2 == 1;
    CAPTURE(trial);
    CAPTURE(overlap);
    const auto dim = [&](int lo, int hi) {
      return std::uniform_int_distribution<std::int64_t>(lo, hi)(rng);
    };
    const bool large = trial == 5;  // > 64 MiB of parameters + state: the parallel copy
    tk::exec::Host exec(2);
    tk::nn::ParamArena<> arena;
    const std::int64_t in = large ? dim(1800, 2100) : dim(1, 400);
    const std::int64_t out = large ? dim(2000, 2300) : dim(1, 300);
    arena.add("a.weight", tk::Shape{in, out}, tk::nn::Init::normal(0.0f, 0.1f));
    arena.add("a.bias", tk::Shape{out});
    arena.add("b.weight", tk::Shape{dim(1, 40), in}, tk::nn::Init::normal(0.0f, 0.1f));
    arena.finalize();
    arena.initialize(3 + trial);
    tk::optim::AdamW<> opt(arena, {.lr = 1e-2, .amsgrad = trial % 3 == 0});
    tk::optim::Ema<> ema(arena, {.decay = 0.9});
    ckpt::TrainState state;
    state.model(arena).add("optimizer", opt).add("ema", ema);
    TempDir sync_dir, async_dir;
    ckpt::Checkpointer sync(sync_dir.path(), {.keep_last = 10, .durable = false});
    ckpt::Checkpointer async(
        async_dir.path(),
        {.keep_last = 10, .async = true, .overlap_snapshot = overlap, .durable = false});
    const auto train = [&](int k) {
      for (std::int64_t i = 0; i < arena.buffer_numel(); ++i)
        arena.grads_data()[i] =
            arena.padding_mask().real(i) ? float((i * 7 + k * 13) % 23) * 0.01f - 0.1f : 0.0f;
      opt.step(exec);
      ema.update(exec);
    };
    // Under a sanitizer the large trial (~40x slower there: minutes) saves twice, not four times.
    const int steps = large && trainkit_test::kSanitized ? 2 : 4;
    double copy_seconds = 0;
    for (int step = 1; step <= steps; ++step) {
      train(step);
      state.step = step;
      sync.save(state);
      async.save(state);
      // Training goes on while the write (and with overlap_snapshot the copies) are in flight.
      const int kind = std::uniform_int_distribution<int>(0, 2)(rng);
      if (kind == 0) {
        train(100 + step);
      } else if (kind == 1) {  // a forward pass reads the parameters, then the step
        float sum = 0;
        for (std::int64_t i = 0; i < arena.buffer_numel(); ++i) sum += arena.params_data()[i];
        CHECK(std::isfinite(sum));
        train(200 + step);
      } else {  // a direct write, after wait_snapshot()
        async.wait_snapshot();
        arena.params_data()[0] += 1.0f;
      }
      async.wait();
      copy_seconds += async.last_stats().copy_seconds;
    }
    CHECK((copy_seconds > 0) == overlap);
    CHECK(tk::detail::pending_snapshot_copies().load() == 0);
    for (int step = 1; step <= steps; ++step) {
      CAPTURE(step);
      for (const char* file : {"model.safetensors", "train_state.safetensors"}) {
        CAPTURE(file);
        CHECK(ckpt_test::read_file(sync.path_for(step) / file) ==
              ckpt_test::read_file(async.path_for(step) / file));
      }
    }
  }
}

TEST_CASE("Checkpointer: overlap_snapshot needs async") {
  TempDir dir;
  CHECK_THROWS_WITH_AS(ckpt::Checkpointer(dir.path(), {.overlap_snapshot = true}),
                       doctest::Contains("overlap_snapshot needs async = true"), tk::Error);
}

TEST_CASE("Checkpointer: async errors surface from wait() and the next save()") {
  TempDir dir;
  CrashState s(0.001);
  ckpt::Checkpointer ck(dir.path(), {.async = true, .durable = false});
  s.set(1);
  ck.save(s.state);
  ck.wait();
  // Make the next write fail: the root becomes read-only (skipped when running as root, which
  // ignores permissions; the disk-full test below covers async failures too).
  std::filesystem::permissions(
      dir.path(), std::filesystem::perms::owner_read | std::filesystem::perms::owner_exec);
  if (std::filesystem::exists(dir.path()) && ::access(dir.path().c_str(), W_OK) != 0) {
    s.set(2);
    ck.save(s.state);
    CHECK_THROWS_AS(ck.wait(), tk::Error);
    CHECK_NOTHROW(ck.wait());  // reported once
  }
  std::filesystem::permissions(dir.path(), std::filesystem::perms::owner_all);
  s.set(3);
  ck.save(s.state);
  ck.wait();
  CHECK(ck.latest()->step == 3);
}

TEST_CASE("Checkpointer: full disk (RLIMIT_FSIZE) - clear error, previous checkpoint intact") {
  for (const bool async : {false, true}) {
    CAPTURE(async);
    TempDir dir;
    {
      CrashState s(1.0);
      s.set(1);
      ckpt::Checkpointer ck(dir.path(), {.durable = true});
      ck.save(s.state);
    }
    // The child can create files up to 256 KiB: the 1 MiB model file fails with EFBIG.
    const int rc = ckpt_test::in_child_with_file_limit(256 << 10, [&]() -> int {
      CrashState s(1.0);
      s.set(2);
      ckpt::Checkpointer ck(
          dir.path(), {.every_steps = 1, .async = async, .durable = true, .log = [](auto&) {}});
      try {
        ck.save(s.state);
        ck.wait();
      } catch (const tk::Error& e) {
        const std::string what = e.what();
        if (what.find("EFBIG") == std::string::npos) return 2;
        if (what.find("model.safetensors") == std::string::npos) return 3;
        // A sync save that failed is not recorded as done: maybe_save tries the step again.
        if (!async && !ck.due(2)) return 4;
        return 0;
      }
      return 1;  // no error
    });
    CHECK(rc == 0);
    ckpt::Checkpointer ck(dir.path(), {.durable = false});
    CHECK(ckpt_test::entries(dir.path()) == std::vector<std::string>{"step_000000001"});
    const auto info = ck.latest();
    REQUIRE(info.has_value());
    CHECK(info->step == 1);
    CrashState fresh(1.0);
    ck.load(*info, fresh.state);
    CHECK(fresh.check() == "");
  }
}

TEST_CASE("Checkpointer: 3 ranks (ThreadComm) - replicated shards, index, per-rank state") {
  for (const bool async : {false, true}) {
    CAPTURE(async);
    TempDir dir;  // a run of its own (in the first run's root, its step 10 would set 11 aside)
    const auto group = std::make_shared<dist::ThreadGroup>(3);  // the checkpointer's own comm
    dist::ThreadComm::run(3, [&](dist::ThreadComm& comm) {
      dist::ThreadComm ck_comm(group, comm.rank());
      CrashState s(0.3);
      s.set(10);
      s.counter = 10 + comm.rank();  // rank-specific state
      ckpt::Checkpointer ck(dir.path(), {.keep_last = 1,
                                         .async = async,
                                         .durable = false,
                                         .rank = comm.rank(),
                                         .world_size = 3,
                                         .barrier = ckpt::comm_barrier(ck_comm)});
      // CrashState's counter check requires values == counter * (i + 1): consistent per rank.
      ck.save(s.state);
      s.set(async ? 12 : 11);
      s.counter = s.state.step + comm.rank();
      ck.save(s.state);
      ck.wait();
      comm.barrier().wait();
      CrashState fresh(0.3);
      const auto info = ck.resume(fresh.state);
      REQUIRE(info.has_value());
      CHECK(info->step == s.state.step);
      CHECK(fresh.counter == s.state.step + comm.rank());
      fresh.counter = fresh.state.step;  // the rest of check() expects the shared value
      CHECK(fresh.check() == "");
      comm.barrier().wait();
    });
    const std::string step = async ? "step_000000012" : "step_000000011";
    CHECK(ckpt_test::entries(dir.path()) == std::vector<std::string>{step});
    CHECK(ckpt_test::entries(dir / step) ==
          std::vector<std::string>{
              "checkpoint.json", "model-00001-of-00003.safetensors",
              "model-00002-of-00003.safetensors", "model-00003-of-00003.safetensors",
              "model.safetensors.index.json", "train_state-rank00000.safetensors",
              "train_state-rank00001.safetensors", "train_state-rank00002.safetensors"});
    const io::SafetensorsIndex index =
        io::load_safetensors_index(dir / step / io::kSafetensorsIndexName);
    CHECK(index.weight_map.size() == 3);
    CHECK(index.files().size() == 2);  // the big tensor alone, then the two small ones
    // The index is what Hugging Face loaders read: the whole model through it.
    CrashState single(0.3);
    ckpt::load_model(single.arena, dir / step);
    single.state.step = async ? 12 : 11;
    CHECK(single.arena.params_data()[5] == CrashState::value(single.state.step, 5));
  }
}

TEST_CASE("Checkpointer: 2 ranks with distinct parameters (ModelSharding::kLocal)") {
  TempDir dir;
  dist::ThreadComm::run(2, [&](dist::ThreadComm& comm) {
    const int r = comm.rank();
    tk::nn::ParamArena<> arena;
    arena.add("layers." + std::to_string(r) + ".weight", tk::Shape{4, 4});
    arena.finalize();
    for (int i = 0; i < 16; ++i) arena.params_data()[i] = float(r * 100 + i);
    ckpt::TrainState state;
    state.model(arena);
    state.step = 7;
    ckpt::Checkpointer ck(dir.path(), {.durable = false,
                                       .rank = r,
                                       .world_size = 2,
                                       .barrier = ckpt::comm_barrier(comm),
                                       .sharding = ckpt::ModelSharding::kLocal});
    ck.save(state);
    for (int i = 0; i < 16; ++i) arena.params_data()[i] = -1;
    REQUIRE(ck.resume(state).has_value());
    for (int i = 0; i < 16; ++i) CHECK(arena.params_data()[i] == float(r * 100 + i));
  });
  const io::SafetensorsIndex index =
      io::load_safetensors_index(dir / "step_000000007" / io::kSafetensorsIndexName);
  CHECK(index.weight_map.at("layers.1.weight") == "model-00002-of-00002.safetensors");
  // A run with another world_size cannot take the per-rank state, and says so.
  ckpt::Checkpointer one(dir.path(), {.durable = false});
  ckpt::TrainState bare;
  CHECK_THROWS_WITH_AS(one.resume(bare), doctest::Contains("written by 2 rank(s); this run has 1"),
                       tk::Error);
  // newest_usable (what resume() would restore) makes the same check: no checkpoint to pick.
  CHECK_THROWS_WITH_AS(one.newest_usable(),
                       doctest::Contains("written by 2 rank(s); this run has 1"), tk::Error);
}
