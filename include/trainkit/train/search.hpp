// SPDX-License-Identifier: MIT
// trainkit/train/search.hpp: `train::Search`, hyper-parameter search over a SearchSpace with
// random search, asynchronous successive halving (ASHA) or synchronous successive halving, K
// trials at a time, as threads (a callable) or as processes (a command line template whose
// metric is read from the trial's metrics.jsonl). The search's state lives in <dir>/search.json,
// replaced atomically after every event, so running the same search again continues it: finished
// trials are kept, interrupted ones restarted, and a changed space or setting is refused listing
// each difference. Results: a table, <dir>/results.json and TensorBoard's HPARAMS view (<dir>/tb).
#pragma once

#include <algorithm>
#include <atomic>
#include <cctype>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <condition_variable>
#include <csignal>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <filesystem>
#include <fstream>
#include <functional>
#include <iterator>
#include <limits>
#include <map>
#include <mutex>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <system_error>
#include <thread>
#include <utility>
#include <vector>

#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <unistd.h>
#if defined(__linux__)
#include <sys/prctl.h>
#endif

#include "trainkit/ckpt/checkpointer.hpp"
#include "trainkit/config.hpp"
#include "trainkit/core/state_dict.hpp"
#include "trainkit/error.hpp"
#include "trainkit/io/atomic_file.hpp"
#include "trainkit/io/json.hpp"
#include "trainkit/io/tfevents.hpp"
#include "trainkit/io/utf8.hpp"
#include "trainkit/monitor/tensorboard.hpp"
#include "trainkit/train/search_space.hpp"

TRAINKIT_NAMESPACE_BEGIN
namespace train {

/// How trials are scheduled and stopped early.
enum class SearchStrategy : std::uint8_t {
  kRandom,       ///< every trial runs to its end (or max_budget)
  kAsha,         ///< asynchronous successive halving: stop at a rung unless in the top 1/eta
  kSyncHalving,  ///< synchronous successive halving: rounds; deterministic whatever the timing
};

/// "random", "asha", "sh".
inline const char* strategy_name(SearchStrategy s) noexcept {
  switch (s) {
    case SearchStrategy::kRandom: return "random";
    case SearchStrategy::kAsha: return "asha";
    case SearchStrategy::kSyncHalving: return "sh";
  }
  return "?";
}
/// Parses "random", "asha" or "sh"; throws trainkit::Error naming the text otherwise.
inline SearchStrategy parse_strategy(std::string_view text) {
  for (SearchStrategy s :
       {SearchStrategy::kRandom, SearchStrategy::kAsha, SearchStrategy::kSyncHalving})
    if (text == strategy_name(s)) return s;
  TRAINKIT_FAIL("search strategy '", text, "' is not random, asha or sh");
}

/// What a Search does. `dir` is required; asha and sh need `max_budget`.
struct SearchOptions {
  std::filesystem::path dir = {};  ///< search.json, results.json, tb/ and trial_NNN/ directories
  std::uint64_t seed = 0;          ///< trial k's parameters and seed are a function of (seed, k)
  int trials = 10;                 ///< how many trials are sampled (all of them, up front)
  int parallel = 1;                ///< trials running at once (not part of the saved settings)
  SearchStrategy strategy = SearchStrategy::kRandom;
  std::string metric = "metric";  ///< the reported value's name (a process trial's JSON key)
  ckpt::MetricMode mode = ckpt::MetricMode::kMax;  ///< whether higher or lower is better
  /// Budgets are the units of report(): epochs, steps, ... Rungs are min_budget * eta^k below
  /// max_budget; a trial reaching max_budget is complete. 0: no limit (random search only).
  std::int64_t min_budget = 1;
  std::int64_t max_budget = 0;
  int eta = 3;                     ///< keep the top 1/eta at each rung (>= 2)
  bool print = true;               ///< progress lines and the final table on stdout
  bool tensorboard = true;         ///< write <dir>/tb (HPARAMS) when the search ends
  bool durable = true;             ///< fsync search.json after each event (see io::AtomicFile)
  bool handle_signals = true;      ///< SIGINT / SIGTERM stop the search, leaving it resumable
  double poll_seconds = 0.05;      ///< process trials: how often metrics files and exits are read
  double lock_wait_seconds = 120;  ///< process trials: wait for an earlier process of a trial
};

/// Where a trial is.
enum class TrialStatus : std::uint8_t {
  kPending,    ///< not started yet, or to be (re)started
  kRunning,    ///< running (in search.json: it was running when the search stopped)
  kPaused,     ///< sh: reached this round's budget, waiting for the round to end
  kCompleted,  ///< ran to its end or to max_budget
  kStopped,    ///< stopped early by the strategy
  kFailed,     ///< threw, or its process failed (see Trial::error)
};
/// "pending", "running", "paused", "completed", "stopped", "failed".
inline const char* trial_status_name(TrialStatus s) noexcept {
  constexpr const char* kNames[] = {"pending",   "running", "paused",
                                    "completed", "stopped", "failed"};
  return kNames[static_cast<int>(s)];
}

/// One report of a trial: its metric after `budget` units of training.
struct TrialReport {
  std::int64_t budget = 0;
  double value = std::numeric_limits<double>::quiet_NaN();
  friend bool operator==(const TrialReport&, const TrialReport&) = default;
};

/// One trial of a search.
struct Trial {
  int id = 0;
  Params params;
  std::uint64_t seed = 0;  ///< the trial's own seed (SearchSpace::trial_seed)
  TrialStatus status = TrialStatus::kPending;
  std::vector<TrialReport> reports;  ///< in budget order, each budget once
  /// The result: the last reported value, or the objective's return value without reports.
  double metric = std::numeric_limits<double>::quiet_NaN();
  int round = 0;              ///< sh: the round (rung) this trial is admitted to
  int starts = 0;             ///< how often it was started (a restart after an interruption counts)
  std::string error;          ///< why it failed
  std::filesystem::path dir;  ///< <search dir>/trial_NNN
  /// The largest budget reported (0: none).
  std::int64_t budget() const noexcept { return reports.empty() ? 0 : reports.back().budget; }
  bool finished() const noexcept {
    return status == TrialStatus::kCompleted || status == TrialStatus::kStopped ||
           status == TrialStatus::kFailed;
  }
};

/// How Search::run ended.
struct SearchResult {
  std::vector<Trial> trials;  ///< best first (by metric; failed and metric-less trials last)
  bool interrupted = false;   ///< stopped by SIGINT / SIGTERM (run again to continue)
  std::string table;          ///< the printed results table
  /// The best trial (nullptr when no trial has a metric).
  const Trial* best() const {
    return !trials.empty() && !std::isnan(trials.front().metric) ? &trials.front() : nullptr;
  }
};

class Search;

/// What a thread trial sees: its id, seed, directory and budget limit, and report().
class TrialContext {
 public:
  int id() const noexcept { return id_; }
  /// The trial's own seed (different for every trial, fixed by the search's seed).
  std::uint64_t seed() const noexcept { return seed_; }
  /// <search dir>/trial_NNN (created before the trial starts): for its checkpoints and logs.
  const std::filesystem::path& dir() const noexcept { return dir_; }
  /// The search's max_budget (0: none): train at most this far.
  std::int64_t max_budget() const noexcept { return max_budget_; }
  /// Reports the metric after `step` units of budget (increasing; a step at or below one already
  /// reported, as in a restarted trial, is ignored). Returns false when the trial should stop
  /// now: stopped early, max_budget reached, the round's budget reached (sh) or the search is
  /// being interrupted. NaN ranks below every number.
  inline bool report(std::int64_t step, double value);

 private:
  friend class Search;
  TrialContext(Search* search, const Trial& t, std::int64_t max_budget)
      : search_(search), id_(t.id), seed_(t.seed), dir_(t.dir), max_budget_(max_budget) {}
  Search* search_;
  int id_;
  std::uint64_t seed_;
  std::filesystem::path dir_;
  std::int64_t max_budget_;
};

namespace detail {

/// True when `value` is among the best max(1, floor(n / eta)) of `competing` (n values, which
/// include `value` itself): ASHA's promotion rule. Ties are kept; NaN ranks last.
inline bool search_promotable(double value, std::vector<double> competing, int eta, bool maximize) {
  const auto better = [maximize](double a, double b) {
    if (std::isnan(a)) return false;
    if (std::isnan(b)) return true;
    return maximize ? a > b : a < b;
  };
  std::sort(competing.begin(), competing.end(), better);
  const std::size_t keep =
      std::max<std::size_t>(1, competing.size() / static_cast<std::size_t>(eta));
  if (std::isnan(value)) return std::isnan(competing[keep - 1]);
  return !better(competing[keep - 1], value);
}

/// The stop request of a running Search (0: none). One Search runs at a time per process.
inline std::atomic<int>& search_stop_signal() noexcept {
  static std::atomic<int> value{0};
  return value;
}
extern "C" inline void search_signal_handler(int sig) { search_stop_signal().store(sig); }

/// A JSON number (null for NaN and infinities).
inline io::Json search_json_number(double v) {
  if (!std::isfinite(v)) return io::Json();
  return io::Json::number(StateDict::number_to_string(v));
}

/// Reads a small text file whole ("" when it does not exist).
inline std::string search_read_file(const std::filesystem::path& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return {};
  return std::string((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
}

/// The last `max_bytes` bytes of the file at `path` (all of a shorter one; empty when it cannot
/// be read): a trial's log may be gigabytes.
inline std::string search_read_end(const std::filesystem::path& path, std::size_t max_bytes) {
  std::ifstream in(path, std::ios::binary | std::ios::ate);
  if (!in) return {};
  const std::streamoff size = in.tellg();
  if (size <= 0) return {};
  const auto keep = static_cast<std::streamoff>(
      std::min<std::uint64_t>(static_cast<std::uint64_t>(size), max_bytes));
  in.seekg(size - keep);
  std::string out(static_cast<std::size_t>(keep), '\0');
  in.read(out.data(), keep);
  out.resize(static_cast<std::size_t>(in.gcount()));
  return out;
}

/// The last `max_lines` lines of `text`, at most `max_bytes` bytes.
inline std::string search_tail(std::string_view text, int max_lines, std::size_t max_bytes) {
  while (!text.empty() && (text.back() == '\n' || text.back() == '\r')) text.remove_suffix(1);
  std::size_t begin = text.size();
  for (int lines = 0; begin > 0 && lines < max_lines; ++lines) {
    const std::size_t nl = text.rfind('\n', begin - 1);
    begin = nl == std::string_view::npos ? 0 : nl + 1;
    if (nl == std::string_view::npos) break;
    if (lines + 1 < max_lines) begin = nl;
  }
  if (begin > 0 && text[begin] == '\n') ++begin;
  if (text.size() - begin > max_bytes) begin = text.size() - max_bytes;
  return std::string(text.substr(begin));
}

/// The (open, close) positions of each `{name}` in `arg`, where name is letters, digits, '_' and
/// '-' (other braces, such as JSON in a shell script, are left alone).
inline std::vector<std::pair<std::size_t, std::size_t>> search_placeholders(std::string_view arg) {
  std::vector<std::pair<std::size_t, std::size_t>> out;
  for (std::size_t open = arg.find('{'); open != std::string_view::npos;
       open = arg.find('{', open + 1)) {
    std::size_t close = open + 1;
    while (close < arg.size() && (std::isalnum(static_cast<unsigned char>(arg[close])) ||
                                  arg[close] == '_' || arg[close] == '-'))
      ++close;
    if (close < arg.size() && arg[close] == '}' && close > open + 1) out.emplace_back(open, close);
  }
  return out;
}

/// The values of one key in a JSON-lines file that grows (a trial's metrics.jsonl), read
/// incrementally: each poll() reads only the bytes added since the last one, in chunks, and
/// parses the whole lines among them (a partial last line is read again, whole, by a later poll).
/// A file that was replaced (another inode: a resumed Loop rewrites it), shrank, or no longer
/// ends the last line read with the same bytes (truncated and rewritten in place) is read again
/// from its start. values() holds the key's value of each line holding it, in order (NaN for a
/// non-number).
class SearchMetricsReader {
 public:
  /// The largest chunk read at once (a line longer than this is gathered over several chunks).
  static constexpr std::size_t kChunk = std::size_t{1} << 20;

  SearchMetricsReader(std::filesystem::path path, std::string key)
      : path_(std::move(path)), key_(std::move(key)) {}

  /// Reads what was appended since the last poll; a missing or unreadable file holds nothing.
  void poll() {
    const int fd = ::open(path_.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0) {
      reset();
      return;
    }
    struct stat st {};
    if (::fstat(fd, &st) != 0) {
      ::close(fd);
      return;
    }
    const auto size = static_cast<std::uint64_t>(st.st_size);
    bool same = known_ && st.st_dev == dev_ && st.st_ino == ino_ && size >= offset_;
    if (same && !last_line_.empty()) {  // the end of the last line read: still there?
      std::string now(last_line_.size(), '\0');
      same = ::pread(fd, now.data(), now.size(), static_cast<off_t>(offset_ - last_line_.size())) ==
                 static_cast<ssize_t>(now.size()) &&
             now == last_line_;
    }
    if (!same) reset();
    known_ = true;
    dev_ = st.st_dev;
    ino_ = st.st_ino;
    std::string pending;  // the bytes from offset_ that do not end a line yet
    std::string chunk;
    for (std::uint64_t at = offset_; at < size;) {
      chunk.resize(static_cast<std::size_t>(std::min<std::uint64_t>(kChunk, size - at)));
      const ssize_t n = ::pread(fd, chunk.data(), chunk.size(), static_cast<off_t>(at));
      if (n <= 0) break;  // (an error or a file cut meanwhile: the next poll sees it)
      bytes_read_ += static_cast<std::uint64_t>(n);
      at += static_cast<std::uint64_t>(n);
      pending.append(chunk.data(), static_cast<std::size_t>(n));
      std::size_t begin = 0;
      for (std::size_t nl = pending.find('\n'); nl != std::string::npos;
           nl = pending.find('\n', begin)) {
        line(std::string_view(pending).substr(begin, nl - begin));
        begin = nl + 1;
      }
      if (begin > 0) {  // keep the end of the last whole line (with its '\n') to check it
        const std::size_t end = begin - 1;  // its '\n'; pending starts at a line's start
        const std::size_t previous = end == 0 ? std::string::npos : pending.rfind('\n', end - 1);
        const std::size_t start = previous == std::string::npos ? 0 : previous + 1;
        const std::size_t from =
            std::max(start, begin > kLastLineBytes ? begin - kLastLineBytes : 0);
        last_line_.assign(pending, from, begin - from);
      }
      offset_ += begin;
      pending.erase(0, begin);
    }
    ::close(fd);
  }

  const std::vector<double>& values() const noexcept { return values_; }
  /// Bytes read so far (what the polls cost).
  std::uint64_t bytes_read() const noexcept { return bytes_read_; }

 private:
  static constexpr std::size_t kLastLineBytes = 256;

  void reset() noexcept {
    known_ = false;
    offset_ = 0;
    values_.clear();
    last_line_.clear();
  }
  void line(std::string_view text) {
    const std::optional<io::Json> json = io::Json::try_parse(text);
    if (!json || !json->is_object()) return;
    const io::Json* v = json->find(key_);
    if (v == nullptr) return;
    values_.push_back(v->is_number() ? v->as_double() : std::numeric_limits<double>::quiet_NaN());
  }

  std::filesystem::path path_;
  std::string key_;
  bool known_ = false;  // dev_ and ino_ are the file's whose lines values_ holds
  dev_t dev_ = 0;
  ino_t ino_ = 0;
  std::uint64_t offset_ = 0;  // bytes of the whole lines read
  std::string last_line_;     // the last whole line read, '\n' included (its last 256 bytes)
  std::vector<double> values_;
  std::uint64_t bytes_read_ = 0;
};

}  // namespace detail

/// A hyper-parameter search (see the file comment and docs/search.md).
///
///   train::SearchSpace space = train::SearchSpace::parse({"lr=loguniform(1e-4,1e-1)"});
///   train::Search search(space, {.dir = "runs/search", .trials = 20, .parallel = 4,
///                                .strategy = train::SearchStrategy::kAsha,
///                                .metric = "val_accuracy", .max_budget = 9});
///   auto result = search.run([](const train::Params& p, train::TrialContext& ctx) {
///     double acc = 0;
///     for (int epoch = 1; epoch <= ctx.max_budget(); ++epoch) {
///       acc = train_one_epoch(p.get_double("lr"));
///       if (!ctx.report(epoch, acc)) break;
///     }
///     return acc;
///   });
class Search {
 public:
  /// A thread trial: trains with `params`, reports through the context, returns its metric.
  using Objective = std::function<double(const Params&, TrialContext&)>;

  /// Checks the options (nothing is read or written yet). Throws trainkit::Error for an empty
  /// space or dir, trials < 1, parallel < 1, eta < 2, min_budget < 1, or asha / sh without
  /// max_budget >= min_budget.
  Search(SearchSpace space, SearchOptions options)
      : space_(std::move(space)), options_(std::move(options)) {
    TRAINKIT_CHECK(!space_.empty(), "train::Search: the search space has no dimension");
    TRAINKIT_CHECK(!options_.dir.empty(), "train::Search: the search directory (dir) is empty");
    TRAINKIT_CHECK(options_.trials >= 1, "train::Search: trials must be >= 1 (got ",
                   options_.trials, ")");
    TRAINKIT_CHECK(options_.parallel >= 1, "train::Search: parallel must be >= 1 (got ",
                   options_.parallel, ")");
    TRAINKIT_CHECK(options_.eta >= 2, "train::Search: eta must be >= 2 (got ", options_.eta, ")");
    TRAINKIT_CHECK(options_.min_budget >= 1, "train::Search: min_budget must be >= 1 (got ",
                   options_.min_budget, ")");
    TRAINKIT_CHECK(options_.max_budget >= 0, "train::Search: max_budget must be >= 0");
    TRAINKIT_CHECK(
        options_.strategy == SearchStrategy::kRandom || options_.max_budget >= options_.min_budget,
        "train::Search: strategy ", strategy_name(options_.strategy),
        " needs max_budget >= min_budget (got max_budget ", options_.max_budget, ", min_budget ",
        options_.min_budget, ")");
    for (std::int64_t b = options_.min_budget;
         options_.strategy != SearchStrategy::kRandom && b < options_.max_budget;) {
      rung_budgets_.push_back(b);
      if (b > options_.max_budget / options_.eta) break;
      b *= options_.eta;
    }
  }

  Search(const Search&) = delete;
  ~Search() { release_lock(); }
  Search& operator=(const Search&) = delete;

  /// The budgets at which ASHA / sh decide (min_budget * eta^k below max_budget).
  const std::vector<std::int64_t>& rung_budgets() const noexcept { return rung_budgets_; }
  const SearchOptions& options() const noexcept { return options_; }
  const SearchSpace& space() const noexcept { return space_; }

  /// Runs (or continues) the search with thread trials, `parallel` at a time, until every trial
  /// is finished or a signal stops it. An exception thrown by `objective` fails that trial
  /// only. Throws trainkit::Error when search.json is damaged or holds other settings (listing
  /// each difference), or when the state cannot be written.
  SearchResult run(const Objective& objective) {
    TRAINKIT_CHECK(static_cast<bool>(objective), "train::Search::run: no objective");
    start({});
    std::vector<std::thread> workers;
    std::exception_ptr failure;
    std::mutex failure_mutex;
    for (int w = 0; w < options_.parallel; ++w)
      workers.emplace_back([&] {
        try {
          worker(objective);
        } catch (...) {
          std::lock_guard<std::mutex> lock(failure_mutex);
          if (!failure) failure = std::current_exception();
          std::lock_guard<std::mutex> state_lock(mutex_);
          aborted_ = true;
          cv_.notify_all();
        }
      });
    for (std::thread& t : workers) t.join();
    if (failure) {
      finish_run();
      std::rethrow_exception(failure);
    }
    return finish_run();
  }

  /// Runs (or continues) the search with process trials: each trial runs `command` (argv) with
  /// `{dir}` (the trial's directory), `{trial}`, `{seed}`, `{max_budget}` and `{name}` for each
  /// dimension replaced, started by fork/exec with stdout and stderr appended to
  /// <trial dir>/stdout.log and stderr.log. Its metric is read from <trial dir>/metrics.jsonl as
  /// it grows: the n-th line holding options.metric is the report at budget n. A trial the
  /// strategy stops gets SIGTERM (a train::Loop saves a checkpoint and exits 0); a nonzero exit
  /// fails the trial with the tail of its stderr. On Linux a trial also gets SIGTERM when the
  /// search process dies; a rerun waits for such a leftover process of a trial before restarting
  /// it in the same directory (it resumes from its own checkpoint). Throws trainkit::Error for a
  /// command without a dimension's placeholder or with an unknown one, and as run() does.
  SearchResult run_command(const std::vector<std::string>& command) {
    TRAINKIT_CHECK(!command.empty(), "train::Search::run_command: the command is empty");
    check_template(command);
    start(command);
    try {
      process_loop(command);  // ends (or, throwing, stops and reaps) every trial it started
    } catch (...) {
      restore_signals();
      release_lock();
      throw;
    }
    return finish_run();
  }

  /// The results table of the trials as they are now (best first).
  std::string table() const {
    std::lock_guard<std::mutex> lock(mutex_);
    return table_locked(sorted_locked());
  }

  /// search.json's path.
  std::filesystem::path state_path() const { return options_.dir / "search.json"; }

 private:
  friend class TrialContext;

  // ---- settings and state file ------------------------------------------------------------

  std::map<std::string, std::string> settings(const std::vector<std::string>& command) const {
    std::map<std::string, std::string> s;
    s["seed"] = std::to_string(options_.seed);
    s["trials"] = std::to_string(options_.trials);
    s["strategy"] = strategy_name(options_.strategy);
    s["metric"] = options_.metric;
    s["mode"] = options_.mode == ckpt::MetricMode::kMax ? "max" : "min";
    s["min_budget"] = std::to_string(options_.min_budget);
    s["max_budget"] = std::to_string(options_.max_budget);
    s["eta"] = std::to_string(options_.eta);
    std::string cmd;
    for (const std::string& a : command) cmd += (cmd.empty() ? "" : " ") + a;
    s["command"] = cmd;
    return s;
  }

  static std::string trial_dir_name(int id) {
    char name[32];
    std::snprintf(name, sizeof name, "trial_%03d", id);
    return name;
  }

  io::Json state_json_locked() const {
    io::Json root = io::Json::object();
    root.set("format", "trainkit.search");
    root.set("version", 1);
    io::Json space = io::Json::array();
    for (const std::string& s : space_.specs()) space.push_back(s);
    root.set("space", std::move(space));
    io::Json settings_json = io::Json::object();
    for (const auto& [k, v] : settings_) settings_json.set(k, v);
    root.set("settings", std::move(settings_json));
    root.set("round", round_);
    io::Json rungs = io::Json::array();
    for (const auto& rung : rungs_) {
      io::Json r = io::Json::array();
      for (const auto& [id, value] : rung) {
        io::Json e = io::Json::array();
        e.push_back(id);
        e.push_back(detail::search_json_number(value));
        r.push_back(std::move(e));
      }
      rungs.push_back(std::move(r));
    }
    root.set("rungs", std::move(rungs));
    io::Json trials = io::Json::array();
    for (const Trial& t : trials_) {
      io::Json j = io::Json::object();
      j.set("id", t.id);
      io::Json params = io::Json::object();
      for (const auto& [n, v] : t.params.items()) params.set(n, v.text());
      j.set("params", std::move(params));
      j.set("seed", std::to_string(t.seed));
      j.set("status", trial_status_name(t.status));
      j.set("round", t.round);
      j.set("starts", t.starts);
      io::Json reports = io::Json::array();
      for (const TrialReport& r : t.reports) {
        io::Json e = io::Json::array();
        e.push_back(r.budget);
        e.push_back(detail::search_json_number(r.value));
        reports.push_back(std::move(e));
      }
      j.set("reports", std::move(reports));
      j.set("metric", detail::search_json_number(t.metric));
      j.set("error", t.error);
      trials.push_back(std::move(j));
    }
    root.set("trials", std::move(trials));
    return root;
  }

  void save_locked() const {
    io::write_file_atomic(state_path(), std::string_view(state_json_locked().dump(1)),
                          {.durable = options_.durable});
  }

  /// Reads search.json into the state; throws naming the file on any damage.
  void load_locked(const std::string& text) {
    const std::string where = state_path().string();
    const auto bad = [&](const std::string& what) -> void {
      TRAINKIT_FAIL("train::Search: ", where, " is damaged: ", what,
                    " (move it away to start the search afresh)");
    };
    io::JsonParseError perr;
    const std::optional<io::Json> parsed = io::Json::try_parse(text, &perr);
    if (!parsed) bad("invalid JSON at byte " + std::to_string(perr.offset) + ": " + perr.message);
    const io::Json& root = *parsed;
    if (!root.is_object()) bad("not a JSON object");
    const auto member = [&](const io::Json& obj, std::string_view key, io::Json::Kind kind,
                            const std::string& in) -> const io::Json& {
      const io::Json* v = obj.is_object() ? obj.find(key) : nullptr;
      const bool ok = v != nullptr && (v->kind() == kind || (kind == io::Json::Kind::kNumber &&
                                                             (v->is_number() || v->is_null())));
      if (!ok) bad(in + " has no valid '" + std::string(key) + "'");
      return *v;
    };
    const auto integer = [&](const io::Json& v, std::int64_t lo, std::int64_t hi,
                             const std::string& what) -> std::int64_t {
      if (!v.is_integer()) bad(what + " is not an integer");
      if (!v.is_unsigned() && lo >= 0) bad(what + " is out of range");
      const std::int64_t x =
          v.is_unsigned() && v.as_uint() > std::uint64_t(INT64_MAX) ? INT64_MAX : v.as_int();
      if (x < lo || x > hi) bad(what + " is out of range");
      return x;
    };
    const auto number = [&](const io::Json& v, const std::string& what) -> double {
      if (v.is_null()) return std::numeric_limits<double>::quiet_NaN();
      if (!v.is_number()) bad(what + " is not a number");
      return v.as_double();
    };
    if (const io::Json* f = root.find("format");
        f == nullptr || !f->is_string() || f->as_string() != "trainkit.search")
      bad("not a search state file (no \"format\": \"trainkit.search\")");
    if (integer(member(root, "version", io::Json::Kind::kInteger, "the file"), 0, 1000,
                "version") != 1)
      bad("unknown version");

    // Settings first: a changed search is refused before anything else is read.
    std::vector<std::string> saved_space;
    for (const io::Json& s : member(root, "space", io::Json::Kind::kArray, "the file").as_array()) {
      if (!s.is_string()) bad("space holds a non-string");
      saved_space.push_back(s.as_string());
    }
    std::map<std::string, std::string> saved_settings;
    for (const io::JsonMember& m :
         member(root, "settings", io::Json::Kind::kObject, "the file").as_object()) {
      if (!m.value.is_string()) bad("setting '" + m.key + "' is not a string");
      saved_settings[m.key] = m.value.as_string();
    }
    check_same_search(saved_space, saved_settings);

    round_ = static_cast<int>(integer(member(root, "round", io::Json::Kind::kInteger, "the file"),
                                      0, static_cast<std::int64_t>(rung_budgets_.size()), "round"));
    const io::Json::Array& rungs =
        member(root, "rungs", io::Json::Kind::kArray, "the file").as_array();
    if (rungs.size() > rung_budgets_.size() + 1) bad("more rungs than the settings give");
    rungs_.assign(rung_budgets_.size() + 1, {});
    for (std::size_t k = 0; k < rungs.size(); ++k) {
      if (!rungs[k].is_array()) bad("rung " + std::to_string(k) + " is not an array");
      for (const io::Json& e : rungs[k].as_array()) {
        if (!e.is_array() || e.size() != 2) bad("rung " + std::to_string(k) + " holds a bad entry");
        const int id = static_cast<int>(integer(e.as_array()[0], 0, options_.trials - 1,
                                                "a trial id in rung " + std::to_string(k)));
        rungs_[k].emplace_back(id, number(e.as_array()[1], "a value in rung " + std::to_string(k)));
      }
    }
    const io::Json::Array& trials =
        member(root, "trials", io::Json::Kind::kArray, "the file").as_array();
    if (trials.size() != static_cast<std::size_t>(options_.trials))
      bad("it holds " + std::to_string(trials.size()) + " trials, the settings " +
          std::to_string(options_.trials));
    for (std::size_t i = 0; i < trials.size(); ++i) {
      const io::Json& j = trials[i];
      const std::string in = "trial " + std::to_string(i);
      Trial& t = trials_[i];
      if (!j.is_object()) bad(in + " is not an object");
      if (integer(member(j, "id", io::Json::Kind::kInteger, in), 0, options_.trials - 1,
                  in + "'s id") != static_cast<std::int64_t>(i))
        bad(in + " has another id");
      const io::Json& params = member(j, "params", io::Json::Kind::kObject, in);
      bool same = params.size() == t.params.size();
      for (const auto& [n, v] : t.params.items()) {
        const io::Json* p = params.find(n);
        same = same && p != nullptr && p->is_string() && p->as_string() == v.text();
      }
      if (!same)
        bad(in + "'s params are not the ones its seed gives (" + t.params.to_string() + ")");
      const std::string& status = member(j, "status", io::Json::Kind::kString, in).as_string();
      bool known = false;
      for (int s = 0; s <= static_cast<int>(TrialStatus::kFailed); ++s)
        if (status == trial_status_name(static_cast<TrialStatus>(s))) {
          t.status = static_cast<TrialStatus>(s);
          known = true;
        }
      if (!known) bad(in + " has an unknown status '" + status + "'");
      t.round = static_cast<int>(integer(member(j, "round", io::Json::Kind::kInteger, in), 0,
                                         static_cast<std::int64_t>(rung_budgets_.size()),
                                         in + "'s round"));
      t.starts = static_cast<int>(
          integer(member(j, "starts", io::Json::Kind::kInteger, in), 0, 1 << 30, in + "'s starts"));
      for (const io::Json& r : member(j, "reports", io::Json::Kind::kArray, in).as_array()) {
        if (!r.is_array() || r.size() != 2) bad(in + " holds a bad report");
        const std::int64_t b = integer(r.as_array()[0], 1, INT64_MAX, in + "'s report budget");
        if (b <= t.budget()) bad(in + "'s report budgets do not increase");
        t.reports.push_back({b, number(r.as_array()[1], in + "'s report value")});
      }
      t.metric = number(member(j, "metric", io::Json::Kind::kNumber, in), in + "'s metric");
      t.error = member(j, "error", io::Json::Kind::kString, in).as_string();
    }
  }

  void check_same_search(const std::vector<std::string>& saved_space,
                         const std::map<std::string, std::string>& saved) const {
    std::string problems;
    const std::vector<std::string> now_space = space_.specs();
    const auto name_of = [](const std::string& spec) { return spec.substr(0, spec.find('=')); };
    for (const std::string& s : saved_space) {
      const auto it = std::find_if(now_space.begin(), now_space.end(),
                                   [&](const std::string& n) { return name_of(n) == name_of(s); });
      if (it == now_space.end()) problems += "\n  space: the search has " + s + ", now it is gone";
      else if (*it != s) problems += "\n  space: the search has " + s + ", now " + *it;
    }
    for (const std::string& n : now_space)
      if (std::none_of(saved_space.begin(), saved_space.end(),
                       [&](const std::string& s) { return name_of(s) == name_of(n); }))
        problems += "\n  space: " + n + " is new";
    if (problems.empty() && saved_space != now_space)
      problems += "\n  space: the dimensions are in another order";
    for (const auto& [key, value] : settings_) {
      const auto it = saved.find(key);
      if (it == saved.end())
        problems += "\n  " + key + ": not in the saved search, now '" + value + "'";
      else if (it->second != value)
        problems += "\n  " + key + ": the search has '" + it->second + "', now '" + value + "'";
    }
    for (const auto& [key, value] : saved)
      if (!settings_.count(key)) problems += "\n  " + key + ": '" + value + "' is not a setting";
    TRAINKIT_CHECK(problems.empty(), "train::Search: cannot continue the search in ",
                   state_path().string(), ", which was started with other settings:", problems,
                   "\n(use the same settings to continue it, or another directory for a new "
                   "search)");
  }

  /// Creates the directory, takes its lock, loads or creates the state.
  void start(const std::vector<std::string>& command) {
    std::error_code ec;
    std::filesystem::create_directories(options_.dir, ec);
    TRAINKIT_CHECK(!ec, "train::Search: cannot create the search directory ", options_.dir.string(),
                   ": ", ec.message());
    const std::filesystem::path lock_path = options_.dir / ".search.lock";
    lock_fd_ = ::open(lock_path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
    TRAINKIT_CHECK(lock_fd_ >= 0, "train::Search: cannot open ", lock_path.string(), ": ",
                   std::strerror(errno));
    if (::flock(lock_fd_, LOCK_EX | LOCK_NB) != 0) {
      ::close(lock_fd_);
      lock_fd_ = -1;
      TRAINKIT_FAIL("train::Search: another search is running in ", options_.dir.string(),
                    " (its lock ", lock_path.string(), " is held)");
    }
    std::lock_guard<std::mutex> lock(mutex_);
    settings_ = settings(command);
    trials_.clear();
    for (int i = 0; i < options_.trials; ++i) {
      Trial t;
      t.id = i;
      t.params = space_.sample(options_.seed, static_cast<std::uint64_t>(i));
      t.seed = SearchSpace::trial_seed(options_.seed, static_cast<std::uint64_t>(i));
      t.dir = options_.dir / trial_dir_name(i);
      trials_.push_back(std::move(t));
    }
    rungs_.assign(rung_budgets_.size() + 1, {});
    active_.assign(trials_.size(), false);
    round_ = 0;
    aborted_ = false;
    interrupted_ = false;
    const std::string text = detail::search_read_file(state_path());
    resumed_ = std::filesystem::exists(state_path());
    if (resumed_) {
      try {
        load_locked(text);
      } catch (...) {
        release_lock();
        throw;
      }
      int restarted = 0, done = 0;
      for (Trial& t : trials_) {
        if (t.status == TrialStatus::kRunning) {
          t.status = TrialStatus::kPending;
          ++restarted;
        }
        done += t.finished();
      }
      if (options_.print)
        std::printf("search: continuing %s: %d of %d trials finished, %d to restart\n",
                    state_path().string().c_str(), done, options_.trials, restarted);
    }
    advance_round_locked();
    save_locked();
    previous_int_ = previous_term_ = SIG_DFL;
    detail::search_stop_signal().store(0);
    if (options_.handle_signals) {
      previous_int_ = std::signal(SIGINT, detail::search_signal_handler);
      previous_term_ = std::signal(SIGTERM, detail::search_signal_handler);
    }
  }

  void release_lock() noexcept {
    if (lock_fd_ >= 0) ::close(lock_fd_);
    lock_fd_ = -1;
  }

  void restore_signals() noexcept {
    if (options_.handle_signals) {
      std::signal(SIGINT, previous_int_);
      std::signal(SIGTERM, previous_term_);
    }
  }

  SearchResult finish_run() {
    restore_signals();
    SearchResult result;
    {
      std::lock_guard<std::mutex> lock(mutex_);
      result.interrupted = interrupted_;
      result.trials = sorted_locked();
      result.table = table_locked(result.trials);
      const bool done =
          std::all_of(trials_.begin(), trials_.end(), [](const Trial& t) { return t.finished(); });
      if (done && !aborted_) {
        write_results_locked(result.trials);
        if (options_.tensorboard) write_tensorboard_locked();
      }
    }
    if (options_.print) {
      std::printf("%s", result.table.c_str());
      if (result.interrupted)
        std::printf("search: interrupted; run the same command again to continue\n");
      std::fflush(stdout);
    }
    release_lock();
    return result;
  }

  // ---- strategy -----------------------------------------------------------------------------

  bool maximize() const noexcept { return options_.mode == ckpt::MetricMode::kMax; }
  bool stopping() const noexcept { return detail::search_stop_signal().load() != 0 || aborted_; }

  /// The next trial to start (nullopt: none now).
  std::optional<int> next_locked() {
    if (stopping()) return std::nullopt;
    for (Trial& t : trials_)
      if (t.status == TrialStatus::kPending &&
          (options_.strategy != SearchStrategy::kSyncHalving || t.round == round_)) {
        t.status = TrialStatus::kRunning;
        ++t.starts;
        active_[static_cast<std::size_t>(t.id)] = true;
        std::error_code ec;
        std::filesystem::create_directories(t.dir, ec);
        TRAINKIT_CHECK(!ec, "train::Search: cannot create the trial directory ", t.dir.string(),
                       ": ", ec.message());
        save_locked();
        if (options_.print) {
          std::printf("search: trial %d %s: %s\n", t.id, t.starts > 1 ? "restarts" : "starts",
                      t.params.to_string().c_str());
          std::fflush(stdout);
        }
        return t.id;
      }
    return std::nullopt;
  }

  bool all_finished_locked() const {
    return std::all_of(trials_.begin(), trials_.end(), [](const Trial& t) { return t.finished(); });
  }
  bool any_running_locked() const {
    return std::any_of(trials_.begin(), trials_.end(),
                       [](const Trial& t) { return t.status == TrialStatus::kRunning; });
  }

  /// The budget at which a trial of round `round` pauses (sh).
  std::int64_t round_budget(int round) const {
    return static_cast<std::size_t>(round) < rung_budgets_.size()
               ? rung_budgets_[static_cast<std::size_t>(round)]
               : options_.max_budget;
  }

  /// Records a report; returns whether the trial continues.
  bool report_locked(int id, std::int64_t budget, double value) {
    // A non-finite metric (a diverged run) counts as none: search.json stores it as null, so
    // a ranking that took +inf as the best would change when the search is continued.
    if (!std::isfinite(value)) value = std::numeric_limits<double>::quiet_NaN();
    Trial& t = trials_[static_cast<std::size_t>(id)];
    if (t.status != TrialStatus::kRunning) return false;
    const bool sync = options_.strategy == SearchStrategy::kSyncHalving;
    if (budget <= t.budget()) {  // a restarted trial repeating what it reported
      return !stopping() && (!sync || budget < round_budget(t.round));
    }
    t.reports.push_back({budget, value});
    t.metric = value;
    bool go_on = true;
    if (options_.strategy == SearchStrategy::kAsha) {
      for (std::size_t k = 0; k < rung_budgets_.size() && go_on; ++k) {
        if (rung_budgets_[k] > budget) break;
        auto& rung = rungs_[k];
        if (std::any_of(rung.begin(), rung.end(), [&](const auto& e) { return e.first == id; }))
          continue;
        rung.emplace_back(id, value);
        std::vector<double> competing;
        for (const auto& e : rung) competing.push_back(e.second);
        if (!detail::search_promotable(value, competing, options_.eta, maximize())) {
          t.status = TrialStatus::kStopped;
          go_on = false;
          log_locked(t, "stopped at budget " + std::to_string(budget) + " (rung " +
                            std::to_string(k) + ", not in the top 1/" +
                            std::to_string(options_.eta) + " of " + std::to_string(rung.size()) +
                            ")");
        }
      }
      if (go_on && budget >= options_.max_budget) {
        t.status = TrialStatus::kCompleted;
        go_on = false;
        log_locked(t, "completed at budget " + std::to_string(budget));
      }
    } else if (sync) {
      if (budget >= round_budget(t.round)) {
        rungs_[static_cast<std::size_t>(t.round)].emplace_back(id, value);
        t.status = TrialStatus::kPaused;
        go_on = false;
      }
    } else if (options_.max_budget > 0 && budget >= options_.max_budget) {
      t.status = TrialStatus::kCompleted;
      go_on = false;
      log_locked(t, "completed at budget " + std::to_string(budget));
    }
    save_locked();
    if (!go_on) {
      advance_round_locked();
      cv_.notify_all();
    }
    return go_on && !stopping();
  }

  /// A trial's run ended: `returned` is the objective's value (NaN for a process), `error` the
  /// failure (empty: none).
  void end_locked(int id, double returned, const std::string& error) {
    Trial& t = trials_[static_cast<std::size_t>(id)];
    active_[static_cast<std::size_t>(id)] = false;
    if (!error.empty()) {
      if (t.status == TrialStatus::kRunning || t.status == TrialStatus::kPaused) {
        t.status = TrialStatus::kFailed;
        // What a trial printed or threw need not be UTF-8 (or its tail may cut a character):
        // search.json must still be written.
        t.error = io::replace_invalid_utf8(error);
        log_locked(t, "failed: " + t.error);
      }
    } else if (t.status == TrialStatus::kRunning && !stopping()) {
      // (A trial that ends while the search is stopping stays "running": the next run restarts
      // it.)
      if (t.reports.empty())
        t.metric = std::isfinite(returned) ? returned : std::numeric_limits<double>::quiet_NaN();
      if (options_.strategy == SearchStrategy::kSyncHalving) {
        rungs_[static_cast<std::size_t>(t.round)].emplace_back(t.id, t.metric);
        t.status = TrialStatus::kPaused;
      } else {
        t.status = TrialStatus::kCompleted;
        log_locked(t, "completed");
      }
    }
    advance_round_locked();
    save_locked();
    cv_.notify_all();
  }

  /// sh: when every trial of the current round is paused or failed, keeps the best
  /// max(1, floor(n / eta)) for the next round and stops the others.
  void advance_round_locked() {
    if (options_.strategy != SearchStrategy::kSyncHalving) return;
    while (true) {
      std::vector<Trial*> in_round;
      for (Trial& t : trials_)
        if (t.round == round_ && !t.finished()) {
          // Still pending or running, or paused but its run has not returned yet.
          if (t.status != TrialStatus::kPaused || active_[static_cast<std::size_t>(t.id)]) return;
          in_round.push_back(&t);
        }
      if (in_round.empty()) return;
      const bool last = static_cast<std::size_t>(round_) >= rung_budgets_.size();
      if (last) {
        for (Trial* t : in_round) {
          t->status = TrialStatus::kCompleted;
          log_locked(*t, "completed");
        }
        return;
      }
      const auto value_of = [&](const Trial* t) {
        for (const auto& [id, v] : rungs_[static_cast<std::size_t>(round_)])
          if (id == t->id) return v;
        return t->metric;
      };
      std::stable_sort(in_round.begin(), in_round.end(), [&](const Trial* a, const Trial* b) {
        const double va = value_of(a), vb = value_of(b);
        if (std::isnan(va) || std::isnan(vb)) return !std::isnan(va) && std::isnan(vb);
        return maximize() ? va > vb : va < vb;
      });
      const std::size_t keep =
          std::max<std::size_t>(1, in_round.size() / static_cast<std::size_t>(options_.eta));
      for (std::size_t i = 0; i < in_round.size(); ++i) {
        if (i < keep) {
          in_round[i]->round = round_ + 1;
          in_round[i]->status = TrialStatus::kPending;
        } else {
          in_round[i]->status = TrialStatus::kStopped;
          log_locked(*in_round[i], "stopped after round " + std::to_string(round_) + " (budget " +
                                       std::to_string(round_budget(round_)) + ")");
        }
      }
      ++round_;
      if (options_.print) {
        std::printf("search: round %d: %zu trial(s) continue to budget %lld\n", round_, keep,
                    static_cast<long long>(round_budget(round_)));
        std::fflush(stdout);
      }
    }
  }

  void log_locked(const Trial& t, const std::string& what) const {
    if (!options_.print) return;
    std::printf("search: trial %d %s (%s %s)\n", t.id, what.c_str(), options_.metric.c_str(),
                StateDict::number_to_string(t.metric).c_str());
    std::fflush(stdout);
  }

  // ---- thread trials ------------------------------------------------------------------------

  void worker(const Objective& objective) {
    while (true) {
      std::optional<int> id;
      Params params;
      std::optional<TrialContext> ctx;
      {
        std::unique_lock<std::mutex> lock(mutex_);
        while (true) {
          if (stopping()) {
            if (detail::search_stop_signal().load() != 0) interrupted_ = true;
            return;
          }
          id = next_locked();
          if (id) break;
          if (all_finished_locked()) return;
          // Nothing can unblock the wait (defensive): no trial running, and no objective still
          // returning (a trial paused at its round's budget ends its run after report(); the
          // next round starts when the last one has).
          if (!any_running_locked() &&
              std::none_of(active_.begin(), active_.end(), [](bool a) { return a; }))
            return;
          cv_.wait_for(lock, std::chrono::milliseconds(100));
        }
        const Trial& t = trials_[static_cast<std::size_t>(*id)];
        params = t.params;
        ctx.emplace(TrialContext(this, t, options_.max_budget));
      }
      double returned = std::numeric_limits<double>::quiet_NaN();
      std::string error;
      try {
        returned = objective(params, *ctx);
      } catch (const std::exception& e) {
        error = e.what();
        if (error.empty()) error = "an exception without a message";
      } catch (...) {
        error = "a non-standard exception";
      }
      std::lock_guard<std::mutex> lock(mutex_);
      end_locked(*id, returned, error);
    }
  }

  // ---- process trials -----------------------------------------------------------------------

  /// The placeholders every command has, besides one per dimension.
  static constexpr std::string_view kBuiltins[] = {"dir", "trial", "seed", "max_budget"};

  std::vector<std::string> placeholders() const {
    std::vector<std::string> names(std::begin(kBuiltins), std::end(kBuiltins));
    for (const Dimension& d : space_.dimensions()) names.push_back(d.name);
    return names;
  }

  void check_template(const std::vector<std::string>& command) const {
    for (const Dimension& d : space_.dimensions())
      TRAINKIT_CHECK(
          std::find(std::begin(kBuiltins), std::end(kBuiltins), d.name) == std::end(kBuiltins),
          "train::Search: hyper-parameter '", d.name,
          "' has the name of a built-in placeholder ({dir}, {trial}, {seed}, "
          "{max_budget}); rename it");
    const std::vector<std::string> known = placeholders();
    std::vector<std::string> used;
    for (const std::string& arg : command)
      for (const auto& [open, close] : detail::search_placeholders(arg)) {
        const std::string name = arg.substr(open + 1, close - open - 1);
        if (std::find(known.begin(), known.end(), name) == known.end()) {
          std::string list;
          for (const std::string& k : known) list += (list.empty() ? "{" : ", {") + k + "}";
          TRAINKIT_FAIL("train::Search: command argument '", arg, "' names {", name,
                        "}, which is not a placeholder (", list, ")");
        }
        used.push_back(name);
      }
    for (const Dimension& d : space_.dimensions())
      TRAINKIT_CHECK(std::find(used.begin(), used.end(), d.name) != used.end(),
                     "train::Search: the command does not pass hyper-parameter '", d.name,
                     "' (add an argument with {", d.name, "})");
    TRAINKIT_CHECK(std::find(used.begin(), used.end(), "dir") != used.end(),
                   "train::Search: the command does not pass the trial's directory (add an "
                   "argument with {dir}; its metrics.jsonl is read from there)");
  }

  std::vector<std::string> expand(const std::vector<std::string>& command, const Trial& t) const {
    std::map<std::string, std::string> values = {
        {"dir", t.dir.string()},
        {"trial", std::to_string(t.id)},
        {"seed", std::to_string(t.seed)},
        {"max_budget", std::to_string(options_.max_budget)}};
    for (const auto& [n, v] : t.params.items()) values[n] = v.text();
    std::vector<std::string> out;
    for (const std::string& arg : command) {
      std::string a;
      std::size_t pos = 0;
      for (const auto& [open, close] : detail::search_placeholders(arg)) {
        a += arg.substr(pos, open - pos) + values.at(arg.substr(open + 1, close - open - 1));
        pos = close + 1;
      }
      out.push_back(a + arg.substr(pos));
    }
    return out;
  }

  /// The program's path: as given when it holds a '/', else found on PATH.
  static std::string resolve_program(const std::string& name) {
    if (name.find('/') != std::string::npos) return name;
    const char* path = std::getenv("PATH");
    std::string_view dirs = path != nullptr ? path : "/usr/bin:/bin";
    while (true) {
      const std::size_t colon = dirs.find(':');
      const std::string dir(dirs.substr(0, colon));
      const std::string candidate = (dir.empty() ? "." : dir) + "/" + name;
      if (::access(candidate.c_str(), X_OK) == 0) return candidate;
      if (colon == std::string_view::npos) break;
      dirs.remove_prefix(colon + 1);
    }
    return name;  // exec fails and says so in the trial's stderr
  }

  struct Running {
    int id = 0;
    pid_t pid = -1;
    bool terminating = false;
    std::chrono::steady_clock::time_point term_sent{};
    std::optional<detail::SearchMetricsReader> metrics{};  // its metrics.jsonl, read as it grows
  };

  /// Sends `sig` to a trial's process group (everything it started), or to the trial alone
  /// when it has no group (it exited already).
  static void signal_trial(pid_t pid, int sig) noexcept {
    if (::kill(-pid, sig) != 0) ::kill(pid, sig);
  }

  /// Stops the trials still running (SIGTERM, then SIGKILL after `grace`) and reaps them; for a
  /// search that ends by an error.
  static void stop_and_reap(const std::vector<Running>& running, std::chrono::seconds grace) {
    for (const Running& r : running) signal_trial(r.pid, SIGTERM);
    const auto deadline = std::chrono::steady_clock::now() + grace;
    for (const Running& r : running) {
      int status = 0;
      while (::waitpid(r.pid, &status, WNOHANG) == 0) {
        if (std::chrono::steady_clock::now() > deadline) {
          signal_trial(r.pid, SIGKILL);
          ::waitpid(r.pid, &status, 0);
          break;
        }
        std::this_thread::sleep_for(std::chrono::milliseconds(20));
      }
    }
  }

  /// Thrown by lock_trial when the search is stopped while it waits.
  struct StoppedWaiting {};

  /// Takes <trial dir>/.trial.lock, waiting while an earlier process of the trial holds it.
  /// Returns the descriptor (inherited by the child, so the lock lives as long as it does).
  int lock_trial(const Trial& t) {
    const std::filesystem::path path = t.dir / ".trial.lock";
    const int fd = ::open(path.c_str(), O_RDWR | O_CREAT, 0644);
    TRAINKIT_CHECK(fd >= 0, "train::Search: cannot open ", path.string(), ": ",
                   std::strerror(errno));
    const auto began = std::chrono::steady_clock::now();
    bool said = false;
    while (::flock(fd, LOCK_EX | LOCK_NB) != 0) {
      if (stopping()) {
        ::close(fd);
        throw StoppedWaiting{};
      }
      if (!said && options_.print) {
        std::printf("search: trial %d: waiting for an earlier process of it to exit\n", t.id);
        std::fflush(stdout);
        said = true;
      }
      if (std::chrono::duration<double>(std::chrono::steady_clock::now() - began).count() >
          options_.lock_wait_seconds) {
        ::close(fd);
        TRAINKIT_FAIL("train::Search: trial ", t.id, "'s directory ", t.dir.string(),
                      " is still in use by another process after ", options_.lock_wait_seconds,
                      " s (its lock ", path.string(), " is held)");
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
    return fd;
  }

  pid_t spawn(const std::vector<std::string>& command, const Trial& t) {
    const std::vector<std::string> args = expand(command, t);
    const std::string program = resolve_program(args[0]);
    std::vector<char*> argv;
    for (const std::string& a : args) argv.push_back(const_cast<char*>(a.c_str()));
    argv.push_back(nullptr);
    const int lock_fd = lock_trial(t);
    const int out_fd =
        ::open((t.dir / "stdout.log").c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
    const int err_fd =
        ::open((t.dir / "stderr.log").c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
    if (out_fd < 0 || err_fd < 0) {
      const int err = errno;
      for (int fd : {lock_fd, out_fd, err_fd})
        if (fd >= 0) ::close(fd);
      TRAINKIT_FAIL("train::Search: cannot open the logs in ", t.dir.string(), ": ",
                    std::strerror(err));
    }
    const pid_t parent = ::getpid();
    std::fflush(stdout);
    std::fflush(stderr);
    const pid_t pid = ::fork();
    if (pid == 0) {  // the child: only async-signal-safe calls until exec
      // A process group of its own: stopping the trial reaches everything it started (a
      // wrapper script's trainer too).
      ::setpgid(0, 0);
#if defined(__linux__)
      ::prctl(PR_SET_PDEATHSIG, SIGTERM);
      if (::getppid() != parent) ::_exit(126);
#endif
      ::dup2(out_fd, 1);
      ::dup2(err_fd, 2);
      sigset_t none;
      sigemptyset(&none);
      ::sigprocmask(SIG_SETMASK, &none, nullptr);
      ::execv(program.c_str(), argv.data());
      const char* why = std::strerror(errno);
      const char prefix[] = "train::Search: cannot run ";
      (void)!::write(2, prefix, sizeof prefix - 1);
      (void)!::write(2, program.c_str(), program.size());
      (void)!::write(2, ": ", 2);
      (void)!::write(2, why, std::strlen(why));
      (void)!::write(2, "\n", 1);
      ::_exit(127);
    }
    const int fork_errno = errno;
    if (pid > 0) ::setpgid(pid, pid);  // also here: a signal may follow before the child runs
    ::close(out_fd);
    ::close(err_fd);
    ::close(lock_fd);  // the child's copy keeps the lock
    TRAINKIT_CHECK(pid > 0, "train::Search: fork failed for trial ", t.id, ": ",
                   std::strerror(fork_errno));
    return pid;
  }

  /// Reports what a running trial's metrics file holds beyond what is recorded (reading only
  /// what was appended since the last poll); false: stop it.
  bool poll_metrics_locked(Running& r) {
    const Trial& t = trials_[static_cast<std::size_t>(r.id)];
    if (!r.metrics) r.metrics.emplace(t.dir / "metrics.jsonl", options_.metric);
    r.metrics->poll();
    const std::vector<double>& values = r.metrics->values();
    bool go_on = true;
    for (std::size_t i = 0; i < values.size() && go_on; ++i) {
      const auto budget = static_cast<std::int64_t>(i + 1);
      if (budget <= t.budget()) continue;
      go_on = report_locked(r.id, budget, values[i]);
    }
    return go_on && t.status == TrialStatus::kRunning;
  }

  void process_loop(const std::vector<std::string>& command) {
    std::vector<Running> running;
    try {
      run_trials(command, running);
    } catch (...) {
      stop_and_reap(running, std::chrono::seconds(10));
      throw;
    }
  }

  /// process_loop's work: `running` holds the trials started and not yet reaped.
  void run_trials(const std::vector<std::string>& command, std::vector<Running>& running) {
    bool terminated_all = false;
    const auto poll = std::chrono::duration<double>(std::max(0.001, options_.poll_seconds));
    while (true) {
      std::unique_lock<std::mutex> lock(mutex_);
      if (stopping() && !terminated_all) {
        terminated_all = true;
        for (Running& r : running)
          if (!r.terminating) {
            signal_trial(r.pid, SIGTERM);
            r.terminating = true;
            r.term_sent = std::chrono::steady_clock::now();
          }
      }
      while (!stopping() && static_cast<int>(running.size()) < options_.parallel) {
        const std::optional<int> id = next_locked();
        if (!id) break;
        Running r;
        r.id = *id;
        try {
          r.pid = spawn(command, trials_[static_cast<std::size_t>(*id)]);
        } catch (const StoppedWaiting&) {
          // Stopped while waiting for a leftover process: the next run starts the trial.
          trials_[static_cast<std::size_t>(*id)].status = TrialStatus::kPending;
          active_[static_cast<std::size_t>(*id)] = false;
          break;
        } catch (const Error& e) {
          end_locked(*id, NAN, e.what());
          continue;
        }
        running.push_back(r);
      }
      if (running.empty() && (stopping() || all_finished_locked() || !next_available_locked()))
        break;
      lock.unlock();
      std::this_thread::sleep_for(poll);
      lock.lock();
      for (std::size_t i = 0; i < running.size();) {
        Running& r = running[i];
        Trial& t = trials_[static_cast<std::size_t>(r.id)];
        if (!r.terminating && !poll_metrics_locked(r)) {
          signal_trial(r.pid, SIGTERM);
          r.terminating = true;
          r.term_sent = std::chrono::steady_clock::now();
        }
        int status = 0;
        const pid_t done = ::waitpid(r.pid, &status, WNOHANG);
        if (done == 0) {
          if (r.terminating &&
              std::chrono::steady_clock::now() - r.term_sent > std::chrono::seconds(120))
            signal_trial(r.pid, SIGKILL);
          ++i;
          continue;
        }
        if (!r.terminating) poll_metrics_locked(r);  // what it wrote before exiting
        std::string error;
        if (t.status == TrialStatus::kRunning && !stopping()) {
          if (done < 0) {
            error = std::string("waitpid failed: ") + std::strerror(errno);
          } else if (WIFEXITED(status) && WEXITSTATUS(status) != 0) {
            error = "exited with status " + std::to_string(WEXITSTATUS(status));
          } else if (WIFSIGNALED(status)) {
            error = "killed by signal " + std::to_string(WTERMSIG(status));
          } else if (t.reports.empty()) {
            error = "exited without writing '" + options_.metric + "' to " +
                    (t.dir / "metrics.jsonl").string();
          }
          if (!error.empty()) {
            const std::string tail = detail::search_tail(
                detail::search_read_end(t.dir / "stderr.log", 64 << 10), 10, 2000);
            if (!tail.empty()) error += "; stderr ends with:\n" + tail;
          }
        }
        end_locked(r.id, NAN, error);
        running.erase(running.begin() + static_cast<std::ptrdiff_t>(i));
      }
    }
    std::lock_guard<std::mutex> lock(mutex_);
    if (stopping()) interrupted_ = true;
  }

  bool next_available_locked() const {
    return std::any_of(trials_.begin(), trials_.end(), [&](const Trial& t) {
      return t.status == TrialStatus::kPending &&
             (options_.strategy != SearchStrategy::kSyncHalving || t.round == round_);
    });
  }

  // ---- results ------------------------------------------------------------------------------

  std::vector<Trial> sorted_locked() const {
    std::vector<Trial> out = trials_;
    const auto rank = [](const Trial& t) {
      return t.status == TrialStatus::kFailed ? 2 : std::isnan(t.metric) ? 1 : 0;
    };
    std::stable_sort(out.begin(), out.end(), [&](const Trial& a, const Trial& b) {
      if (rank(a) != rank(b)) return rank(a) < rank(b);
      if (rank(a) != 0 || a.metric == b.metric) return a.id < b.id;
      return maximize() ? a.metric > b.metric : a.metric < b.metric;
    });
    return out;
  }

  std::string table_locked(const std::vector<Trial>& sorted) const {
    std::vector<std::vector<std::string>> rows;
    rows.push_back({"trial", options_.metric, "budget", "status"});
    for (const Dimension& d : space_.dimensions()) rows.back().push_back(d.name);
    for (const Trial& t : sorted) {
      char metric[32] = "-";
      if (!std::isnan(t.metric)) std::snprintf(metric, sizeof metric, "%.6g", t.metric);
      rows.push_back(
          {std::to_string(t.id), metric, std::to_string(t.budget()), trial_status_name(t.status)});
      for (const auto& [n, v] : t.params.items()) {
        std::string text = v.text();
        if (v.is_float()) {
          char buffer[32];
          std::snprintf(buffer, sizeof buffer, "%.4g", v.as_double());
          text = buffer;
        }
        rows.back().push_back(text);
      }
    }
    std::vector<std::size_t> width(rows.front().size(), 0);
    for (const auto& row : rows)
      for (std::size_t c = 0; c < row.size(); ++c) width[c] = std::max(width[c], row[c].size());
    std::string out;
    for (const auto& row : rows) {
      std::string line;
      for (std::size_t c = 0; c < row.size(); ++c) {
        line += row[c];
        if (c + 1 < row.size()) line += std::string(width[c] - row[c].size() + 2, ' ');
      }
      out += line + "\n";
    }
    for (const Trial& t : sorted)
      if (t.status == TrialStatus::kFailed)
        out += "trial " + std::to_string(t.id) + " failed: " + t.error + "\n";
    return out;
  }

  void write_results_locked(const std::vector<Trial>& sorted) const {
    io::Json root = io::Json::object();
    root.set("metric", options_.metric);
    root.set("mode", options_.mode == ckpt::MetricMode::kMax ? "max" : "min");
    root.set("strategy", strategy_name(options_.strategy));
    root.set("best", sorted.empty() || std::isnan(sorted.front().metric)
                         ? io::Json()
                         : io::Json(sorted.front().id));
    io::Json trials = io::Json::array();
    for (const Trial& t : sorted) {
      io::Json j = io::Json::object();
      j.set("trial", t.id);
      io::Json params = io::Json::object();
      for (const auto& [n, v] : t.params.items())
        params.set(n, v.is_string() ? io::Json(v.as_string())
                      : v.is_int()  ? io::Json(v.as_int())
                                    : detail::search_json_number(v.as_double()));
      j.set("params", std::move(params));
      j.set("metric", detail::search_json_number(t.metric));
      j.set("budget", t.budget());
      j.set("status", trial_status_name(t.status));
      j.set("starts", t.starts);
      j.set("dir", t.dir.string());
      if (!t.error.empty()) j.set("error", t.error);
      trials.push_back(std::move(j));
    }
    root.set("trials", std::move(trials));
    io::write_file_atomic(options_.dir / "results.json", std::string_view(root.dump(2) + "\n"),
                          {.durable = options_.durable});
  }

  /// <dir>/tb: the experiment (hparam names and types, the metric) in the top run and one run
  /// per trial (tb/trial_NNN) with its session start (values), the metric at each report's
  /// budget as a scalar, and the session end. Rewritten whole from the state each time.
  void write_tensorboard_locked() const {
    const std::filesystem::path tb = options_.dir / "tb";
    std::error_code ec;
    std::filesystem::remove_all(tb, ec);
    // A choice holding any word is a string column (every value as text); the rest are numbers.
    std::vector<bool> as_text;
    for (const Dimension& d : space_.dimensions())
      as_text.push_back(std::any_of(d.choices.begin(), d.choices.end(),
                                    [](const ParamValue& v) { return v.is_string(); }));
    const auto hparams_of = [&](const Params& p) {
      std::vector<io::HParam> hp;
      for (std::size_t i = 0; i < p.items().size(); ++i) {
        const auto& [n, v] = p.items()[i];
        if (as_text[i]) hp.emplace_back(n, v.text());
        else hp.emplace_back(n, v.as_double());
      }
      return hp;
    };
    const std::vector<std::string> tags = {options_.metric, "budget"};
    io::ProtoWriter event;
    const double now = io::unix_time_now();
    {
      monitor::TensorBoardWriter top(tb.string());
      io::encode_hparams_experiment_event(event, now, 0, hparams_of(trials_.front().params), tags);
      top.write_event(event.bytes());
      top.close();
    }
    for (const Trial& t : trials_) {
      monitor::TensorBoardWriter w((tb / trial_dir_name(t.id)).string());
      io::encode_hparams_session_start_event(event, now, 0, hparams_of(t.params));
      w.write_event(event.bytes());
      for (const TrialReport& r : t.reports)
        if (!std::isnan(r.value)) w.add_scalar(options_.metric, r.value, r.budget, now);
      if (t.reports.empty() && !std::isnan(t.metric))
        w.add_scalar(options_.metric, t.metric, 0, now);
      w.add_scalar("budget", static_cast<double>(t.budget()), t.budget(), now);
      io::encode_hparams_session_end_event(event, now, t.budget(),
                                           t.status == TrialStatus::kFailed ? 2 : 1);
      w.write_event(event.bytes());
      w.close();
    }
  }

  SearchSpace space_;
  SearchOptions options_;
  std::vector<std::int64_t> rung_budgets_;
  mutable std::mutex mutex_;
  std::condition_variable cv_;
  std::vector<Trial> trials_;
  std::vector<std::vector<std::pair<int, double>>> rungs_;  // (trial, value) in arrival order
  std::map<std::string, std::string> settings_;
  std::vector<bool> active_;  // a run of the trial is in flight (its end not processed yet)
  int round_ = 0;
  bool resumed_ = false;
  bool aborted_ = false;
  bool interrupted_ = false;
  int lock_fd_ = -1;
  void (*previous_int_)(int) = SIG_DFL;
  void (*previous_term_)(int) = SIG_DFL;
};

inline bool TrialContext::report(std::int64_t step, double value) {
  std::lock_guard<std::mutex> lock(search_->mutex_);
  return search_->report_locked(id_, step, value);
}

}  // namespace train
TRAINKIT_NAMESPACE_END
