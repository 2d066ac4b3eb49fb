// Tests of how the Checkpointer treats damaged checkpoints: every byte a resume depends on is
// verified (the manifest carries its own XXH64; every file a resume reads must be listed in it),
// every checkpoint skipped is logged with its reason and moved aside as `.<name>.corrupt`, and a
// resume that finds no usable checkpoint but damaged ones says so instead of starting fresh.
// Damage is drawn at random: truncated, missing or bit-flipped files, empty, missing or garbage
// manifests, and single edited bytes anywhere in a manifest.
#include <doctest/doctest.h>

#include <cstdint>
#include <filesystem>
#include <random>
#include <string>
#include <vector>

#include <trainkit/ckpt/checkpointer.hpp>
#include <trainkit/error.hpp>
#include <trainkit/io/json.hpp>

#include "ckpt/ckpt_test_util.hpp"
#include "ckpt_tools/crash_state.hpp"

namespace {
namespace tk = trainkit;
namespace ckpt = trainkit::ckpt;
namespace fs = std::filesystem;
using ckpt_test::TempDir;
using ckpt_tools::CrashState;

struct Log {
  std::vector<std::string> lines;
  std::function<void(const std::string&)> fn() {
    return [this](const std::string& s) { lines.push_back(s); };
  }
  bool contains(const std::string& a, const std::string& b = {}) const {
    for (const auto& l : lines)
      if (l.find(a) != std::string::npos && l.find(b) != std::string::npos) return true;
    return false;
  }
  std::string all() const {
    std::string out;
    for (const auto& l : lines) out += l + "\n";
    return out;
  }
};

std::string step_name(std::int64_t step) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "step_%09lld", static_cast<long long>(step));
  return buf;
}

/// Saves steps 1..n (CrashState values; metadata "lr" = "0.003") under `root`.
void save_steps(const fs::path& root, std::int64_t n) {
  CrashState s(0.01);
  ckpt::Checkpointer ck(root, {.keep_last = 0, .durable = false});
  for (std::int64_t step = 1; step <= n; ++step) {
    s.set(step);
    s.state.metadata["lr"] = "0.003";
    ck.save(s.state, {{"val_loss", 1.0 / double(step)}});
  }
}

enum class Damage : int {
  kTruncateModel,
  kTruncateState,
  kEmptyManifest,
  kMissingManifest,
  kGarbageManifest,
  kMissingState,
  kFlipModelData,
  kEditManifestByte,
  kCount,
};
const char* const kDamageNames[] = {"truncated model",   "truncated state",     "empty manifest",
                                    "missing manifest",  "garbage manifest",    "missing state",
                                    "flipped model bit", "edited manifest byte"};

/// One random byte of `path` replaced by a different one.
void edit_byte(const fs::path& path, std::mt19937& rng) {
  std::string text = ckpt_test::read_file(path);
  REQUIRE(!text.empty());
  const std::size_t at = std::uniform_int_distribution<std::size_t>(0, text.size() - 1)(rng);
  const char old = text[at];
  // Mostly printable replacements (digits above all: the silent edit), sometimes any byte.
  static const std::string kPrintable = "0123456789012345678901234567890123456789abcdef \",:{}\n";
  char c = old;
  while (c == old) {
    c = std::uniform_int_distribution<int>(0, 3)(rng) == 0
            ? static_cast<char>(std::uniform_int_distribution<int>(0, 255)(rng))
            : kPrintable[std::uniform_int_distribution<std::size_t>(0, kPrintable.size() - 1)(rng)];
  }
  text[at] = c;
  ckpt_test::write_file(path, text);
}

void damage(const fs::path& dir, Damage kind, std::mt19937& rng) {
  const auto truncate = [&](const fs::path& p) {
    const auto size = fs::file_size(p);
    fs::resize_file(p, std::uniform_int_distribution<std::uintmax_t>(0, size - 1)(rng));
  };
  switch (kind) {
    case Damage::kTruncateModel: truncate(dir / "model.safetensors"); break;
    case Damage::kTruncateState: truncate(dir / "train_state.safetensors"); break;
    case Damage::kEmptyManifest: ckpt_test::write_file(dir / "checkpoint.json", ""); break;
    case Damage::kMissingManifest: fs::remove(dir / "checkpoint.json"); break;
    case Damage::kGarbageManifest:
      ckpt_test::write_file(dir / "checkpoint.json", "{\"format\": \"trainkit.checkp");
      break;
    case Damage::kMissingState: fs::remove(dir / "train_state.safetensors"); break;
    case Damage::kFlipModelData: {
      const fs::path p = dir / "model.safetensors";
      std::string bytes = ckpt_test::read_file(p);
      const std::size_t at =
          bytes.size() - 1 - std::uniform_int_distribution<std::size_t>(0, 999)(rng);
      bytes[at] =
          static_cast<char>(bytes[at] ^ (1 << std::uniform_int_distribution<int>(0, 7)(rng)));
      ckpt_test::write_file(p, bytes);
      break;
    }
    case Damage::kEditManifestByte: edit_byte(dir / "checkpoint.json", rng); break;
    case Damage::kCount: break;
  }
}

Damage random_damage(std::mt19937& rng) {
  return static_cast<Damage>(std::uniform_int_distribution<int>(0, int(Damage::kCount) - 1)(rng));
}

}  // namespace

TEST_CASE("damaged checkpoints: one edited byte anywhere in the manifest is detected") {
  std::mt19937 rng(20260601);
  for (int trial = 0; trial < 60; ++trial) {
    CAPTURE(trial);
    TempDir dir;
    save_steps(dir.path(), 2);
    edit_byte(dir / "step_000000002/checkpoint.json", rng);
    Log log;
    ckpt::Checkpointer ck(dir.path(), {.durable = false, .log = log.fn()});
    // Not listed, not the latest (by structure or content), not resumed from.
    for (const ckpt::CheckpointInfo& info : ck.list()) CHECK(info.step == 1);
    const auto latest = ck.latest(ckpt::Verify::kStructure);
    REQUIRE(latest.has_value());
    CHECK(latest->step == 1);
    CrashState fresh(0.01);
    const auto info = ck.resume(fresh.state);
    REQUIRE(info.has_value());
    CHECK(info->step == 1);
    CHECK(fresh.check() == "");
    CHECK_MESSAGE(log.contains("step_000000002", "checkpoint.json"), log.all());
  }
}

TEST_CASE("damaged checkpoints: an edited setting in the manifest never reaches a resumed run") {
  TempDir dir;
  save_steps(dir.path(), 2);
  const fs::path manifest = dir / "step_000000002/checkpoint.json";
  std::string text = ckpt_test::read_file(manifest);
  const std::size_t at = text.find("\"0.003\"");
  REQUIRE(at != std::string::npos);
  text[at + 5] = '4';  // lr 0.003 -> 0.004: still valid JSON
  ckpt_test::write_file(manifest, text);
  Log log;
  ckpt::Checkpointer ck(dir.path(), {.durable = false, .log = log.fn()});
  const auto latest = ck.latest(ckpt::Verify::kFull);
  REQUIRE(latest.has_value());
  CHECK(latest->metadata.at("lr") == "0.003");
  CHECK(latest->step == 1);
  CHECK_MESSAGE(log.contains("step_000000002", "checksum"), log.all());
}

TEST_CASE("damaged checkpoints: every one skipped is logged with its reason and quarantined") {
  std::mt19937 rng(20260602);
  for (int trial = 0; trial < 40; ++trial) {
    CAPTURE(trial);
    TempDir dir;
    const std::int64_t n = std::uniform_int_distribution<std::int64_t>(2, 5)(rng);
    const std::int64_t good = std::uniform_int_distribution<std::int64_t>(1, n - 1)(rng);
    save_steps(dir.path(), n);
    std::vector<Damage> kinds;
    for (std::int64_t step = good + 1; step <= n; ++step) {
      kinds.push_back(random_damage(rng));
      CAPTURE(kDamageNames[int(kinds.back())]);
      damage(dir / step_name(step), kinds.back(), rng);
    }
    Log log;
    ckpt::Checkpointer ck(dir.path(), {.keep_last = 0, .durable = false, .log = log.fn()});
    CrashState fresh(0.01);
    const auto info = ck.resume(fresh.state);
    REQUIRE(info.has_value());
    CHECK(info->step == good);
    CHECK(fresh.check() == "");
    for (std::int64_t step = good + 1; step <= n; ++step) {
      const Damage kind = kinds[std::size_t(step - good - 1)];
      CAPTURE(step);
      CAPTURE(kDamageNames[int(kind)]);
      CHECK_MESSAGE(log.contains(step_name(step), "skipping"), log.all());
      CHECK(fs::exists(dir / ("." + step_name(step) + ".corrupt")));
      CHECK_FALSE(fs::exists(dir / step_name(step)));
    }
    // The next save of a quarantined step leaves the quarantined copy for inspection.
    fresh.set(good + 1);
    ck.save(fresh.state);
    CHECK(fs::exists(dir / ("." + step_name(good + 1) + ".corrupt")));
    CHECK(fs::exists(dir / step_name(good + 1) / "checkpoint.json"));
  }
}

TEST_CASE("damaged checkpoints: latest() logs every skipped one, a watcher moves nothing") {
  std::mt19937 rng(20260603);
  for (int trial = 0; trial < 16; ++trial) {
    CAPTURE(trial);
    TempDir dir;
    save_steps(dir.path(), 3);
    const Damage kind = random_damage(rng);
    CAPTURE(kDamageNames[int(kind)]);
    damage(dir / step_name(3), kind, rng);
    Log log;
    const ckpt::Checkpointer watcher(dir.path(),
                                     {.durable = false, .remove_stale = false, .log = log.fn()});
    const auto latest = watcher.latest();
    REQUIRE(latest.has_value());
    CHECK(latest->step == 2);
    CHECK_MESSAGE(log.contains(step_name(3), "skipping"), log.all());
    CHECK(fs::exists(dir / step_name(3)));
  }
}

TEST_CASE("damaged checkpoints: every damaged -> resume fails plainly, again on the next try") {
  std::mt19937 rng(20260604);
  for (int trial = 0; trial < 12; ++trial) {
    CAPTURE(trial);
    TempDir dir;
    const std::int64_t n = std::uniform_int_distribution<std::int64_t>(1, 3)(rng);
    save_steps(dir.path(), n);
    for (std::int64_t step = 1; step <= n; ++step)
      damage(dir / step_name(step), random_damage(rng), rng);
    {
      Log log;
      ckpt::Checkpointer ck(dir.path(), {.durable = false, .log = log.fn()});
      CrashState s(0.01);
      s.set(77);
      try {
        ck.resume(s.state);
        FAIL("resume() returned although every checkpoint is damaged");
      } catch (const tk::Error& e) {
        const std::string what = e.what();
        CHECK_MESSAGE(what.find("no usable checkpoint") != std::string::npos, what);
        for (std::int64_t step = 1; step <= n; ++step)
          CHECK_MESSAGE(what.find("." + step_name(step) + ".corrupt") != std::string::npos, what);
      }
      CHECK(s.state.step == 77);
      CHECK(s.check() == "");
    }
    // Nothing is left to skip now, but the quarantined ones are: no silent fresh start.
    ckpt::Checkpointer ck(dir.path(), {.durable = false, .log = [](const std::string&) {}});
    CrashState s(0.01);
    CHECK_THROWS_WITH_AS(ck.resume(s.state), doctest::Contains("no usable checkpoint"), tk::Error);
  }
}

TEST_CASE("damaged checkpoints: a file a resume reads must be listed in the manifest") {
  std::mt19937 rng(20260605);
  for (int trial = 0; trial < 8; ++trial) {
    CAPTURE(trial);
    TempDir dir;
    save_steps(dir.path(), 2);
    const fs::path step2 = dir / step_name(2);
    // A manifest that is well-formed (and, where manifests carry a checksum, correctly summed)
    // but does not list one of the files; that file is then damaged without changing its size.
    ckpt::CheckpointInfo info = ckpt::detail::read_manifest(step2);
    const bool model = trial % 2 == 0;
    const std::string unlisted = model ? "model.safetensors" : "train_state.safetensors";
    std::erase_if(info.files, [&](const auto& f) { return f.name == unlisted; });
    ckpt_test::write_file(step2 / "checkpoint.json", ckpt::detail::manifest_text(info));
    std::string bytes = ckpt_test::read_file(step2 / unlisted);
    const std::size_t at =
        bytes.size() - 1 - std::uniform_int_distribution<std::size_t>(0, model ? 999 : 7)(rng);
    bytes[at] = static_cast<char>(bytes[at] ^ 0x04);
    ckpt_test::write_file(step2 / unlisted, bytes);

    Log log;
    ckpt::Checkpointer ck(dir.path(), {.durable = false, .log = log.fn()});
    CrashState fresh(0.01);
    std::optional<ckpt::CheckpointInfo> resumed;
    CHECK_NOTHROW(resumed = ck.resume(fresh.state));
    REQUIRE(resumed.has_value());
    CHECK(resumed->step == 1);
    CHECK(fresh.check() == "");
    CHECK_MESSAGE(log.contains(step_name(2), unlisted), log.all());
  }
}

TEST_CASE("damaged checkpoints: allow_fresh_start returns nullopt and logs the quarantined") {
  std::mt19937 rng(20260606);
  TempDir dir;
  save_steps(dir.path(), 2);
  damage(dir / step_name(1), Damage::kTruncateState, rng);
  damage(dir / step_name(2), random_damage(rng), rng);
  for (int attempt = 0; attempt < 2; ++attempt) {  // damaged now, then quarantined earlier
    CAPTURE(attempt);
    Log log;
    ckpt::Checkpointer ck(dir.path(), {.durable = false, .log = log.fn()});
    CrashState s(0.01);
    s.set(5);
    std::optional<ckpt::CheckpointInfo> info;
    CHECK_NOTHROW(info = ck.resume(s.state, {.allow_fresh_start = true}));
    CHECK_FALSE(info.has_value());
    CHECK(s.check() == "");
    CHECK(s.state.step == 5);
    CHECK_MESSAGE(log.contains("no usable checkpoint", ".step_000000002.corrupt"), log.all());
    CHECK_MESSAGE(log.contains("starting fresh"), log.all());
    CHECK(ck.quarantined().size() == 2);
  }
  {  // Without it the error says how to allow it: the option, or the name a program gives it.
    ckpt::Checkpointer ck(dir.path(), {.durable = false});
    CrashState s(0.01);
    CHECK_THROWS_WITH_AS(ck.resume(s.state), doctest::Contains("(LoadOptions::allow_fresh_start)"),
                         tk::Error);
    CHECK_THROWS_WITH_AS(ck.resume(s.state, {.fresh_start_setting = "--allow-fresh-start"}),
                         doctest::Contains("allow a fresh start (--allow-fresh-start)"), tk::Error);
  }
  // A fresh root, no damage: nullopt without a word, as always.
  TempDir empty;
  Log log;
  ckpt::Checkpointer ck(empty.path(), {.durable = false, .log = log.fn()});
  CrashState s(0.01);
  CHECK_FALSE(ck.resume(s.state).has_value());
  CHECK(log.lines.empty());
}

TEST_CASE("damaged checkpoints: newest_usable() picks what resume() restores") {
  std::mt19937 rng(20260607);
  for (int trial = 0; trial < 12; ++trial) {
    CAPTURE(trial);
    TempDir dir;
    save_steps(dir.path(), 4);
    const std::int64_t good = std::uniform_int_distribution<std::int64_t>(1, 3)(rng);
    // Content damage that the structure check cannot see, so that latest(kStructure) would
    // name a checkpoint that resume() then rejects.
    for (std::int64_t step = good + 1; step <= 4; ++step)
      damage(dir / step_name(step), Damage::kFlipModelData, rng);
    Log log;
    ckpt::Checkpointer ck(dir.path(), {.durable = false, .log = log.fn()});
    CHECK(ck.latest(ckpt::Verify::kStructure)->step == 4);
    const auto chosen = ck.newest_usable();
    REQUIRE(chosen.has_value());
    CHECK(chosen->step == good);
    CHECK(chosen->metadata.at("lr") == "0.003");
    CHECK(ck.quarantined().size() == std::size_t(4 - good));
    CrashState s(0.01);
    const auto info = ck.resume(s.state);
    REQUIRE(info.has_value());
    CHECK(info->step == good);
    CHECK(s.check() == "");
  }
}

TEST_CASE("damaged checkpoints: a version-1 manifest (no checksum) is refused, not quarantined") {
  TempDir dir;
  save_steps(dir.path(), 2);
  // What an older trainkit wrote: the same manifest without its checksum member, version 1.
  const fs::path manifest = dir / step_name(2) / "checkpoint.json";
  tk::io::Json root = tk::io::Json::parse(ckpt_test::read_file(manifest), "manifest");
  tk::io::Json v1 = tk::io::Json::object();
  for (const tk::io::JsonMember& m : root.as_object())
    if (m.key != "manifest_xxh64") v1.set(m.key, m.key == "version" ? tk::io::Json(1) : m.value);
  ckpt_test::write_file(manifest, v1.dump(2) + "\n");
  Log log;
  ckpt::Checkpointer ck(dir.path(), {.durable = false, .log = log.fn()});
  CrashState s(0.01);
  CHECK_THROWS_WITH_AS(ck.resume(s.state),
                       doctest::Contains("has version 1, which carries no checksum"), tk::Error);
  CHECK(fs::exists(manifest));
  CHECK(ck.quarantined().empty());
  CHECK_THROWS_WITH_AS(ckpt::detail::read_manifest(manifest.parent_path()),
                       doctest::Contains("use the trainkit that wrote it"), tk::Error);
  // A version-2 manifest stripped of its checksum is damaged, not old.
  v1.set("version", tk::io::Json(2));
  ckpt_test::write_file(manifest, v1.dump(2) + "\n");
  CrashState t(0.01);
  const auto info = ck.resume(t.state);
  REQUIRE(info.has_value());
  CHECK(info->step == 1);
  CHECK(log.contains("does not start with its manifest_xxh64 checksum"));
}

TEST_CASE("damaged checkpoints: manifest_text -> parse_manifest round trip, random content") {
  std::mt19937 rng(20260608);
  const std::vector<std::string> chars = {"a", "X", "0",  "9",  " ",    "_",
                                          "-", ".", ":",  "\"", "\\",   "/",
                                          "{", "}", "\n", "\t", "\x01", "\xc3\xa9"};
  const auto random_text = [&](std::size_t max) {
    std::string s;
    const std::size_t n = std::uniform_int_distribution<std::size_t>(0, max)(rng);
    for (std::size_t i = 0; i < n; ++i)
      s += chars[std::uniform_int_distribution<std::size_t>(0, chars.size() - 1)(rng)];
    return s;
  };
  for (int trial = 0; trial < 200; ++trial) {
    CAPTURE(trial);
    ckpt::CheckpointInfo info;
    info.path = "/some/dir";
    info.step = std::uniform_int_distribution<std::int64_t>(0, std::int64_t(1) << 40)(rng);
    info.epoch = std::uniform_int_distribution<std::int64_t>(0, 1000)(rng);
    info.world_size = std::uniform_int_distribution<int>(1, 4)(rng);
    info.created_unix = std::uniform_int_distribution<std::int64_t>(0, 2000000000)(rng);
    const int nm = std::uniform_int_distribution<int>(0, 3)(rng);
    for (int i = 0; i < nm; ++i)
      info.metrics[random_text(8)] = std::uniform_real_distribution<double>(-10, 10)(rng);
    const int nd = std::uniform_int_distribution<int>(0, 5)(rng);
    for (int i = 0; i < nd; ++i) info.metadata[random_text(10)] = random_text(30);
    const bool model = trial % 3 != 0;
    for (int r = 0; r < info.world_size; ++r) {
      if (model)
        info.files.push_back({ckpt::detail::model_file_name(r, info.world_size), 100u + r, rng()});
      info.files.push_back({ckpt::detail::state_file_name(r, info.world_size), 50u + r, rng()});
    }
    if (model) {
      info.model_file = info.world_size == 1 ? "model.safetensors" : "model.safetensors.index.json";
      if (info.world_size > 1) info.files.push_back({info.model_file, 10, rng()});
    }
    const std::string text = ckpt::detail::manifest_text(info);
    const ckpt::CheckpointInfo back = ckpt::detail::parse_manifest(text, info.path, "m");
    CHECK(back.step == info.step);
    CHECK(back.epoch == info.epoch);
    CHECK(back.world_size == info.world_size);
    CHECK(back.metrics == info.metrics);
    CHECK(back.metadata == info.metadata);
    CHECK(back.model_file == info.model_file);
    REQUIRE(back.files.size() == info.files.size());
    for (std::size_t i = 0; i < info.files.size(); ++i) {
      CHECK(back.files[i].name == info.files[i].name);
      CHECK(back.files[i].bytes == info.files[i].bytes);
      CHECK(back.files[i].xxh64 == info.files[i].xxh64);
    }
    // Any single changed byte fails (the checksum covers all of it).
    std::string edited = text;
    const std::size_t at = std::uniform_int_distribution<std::size_t>(0, text.size() - 1)(rng);
    edited[at] =
        static_cast<char>(edited[at] ^ (1 << std::uniform_int_distribution<int>(0, 7)(rng)));
    CHECK_THROWS_AS(ckpt::detail::parse_manifest(edited, info.path, "m"), tk::Error);
    // Truncated anywhere: fails too.
    CHECK_THROWS_AS(
        ckpt::detail::parse_manifest(std::string_view(text).substr(0, at), info.path, "m"),
        tk::Error);
  }
}
