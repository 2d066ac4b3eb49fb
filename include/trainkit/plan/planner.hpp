// SPDX-License-Identifier: MIT
// trainkit/plan/planner.hpp: the hardware and cost planner of a nn::Gpt run. For each device of
// a table (H200, H100 SXM, A100 80/40 GB, L40S, RTX 4090, the GPU found here, this CPU) it says
// whether one rank fits in memory with a headroom, the largest batch that does, the step time at
// a model FLOPs utilization (40% unless given, or the MFU a finished run measured, read from its
// metrics.jsonl), tokens per second and the time and cost of a token budget at a $/GPU-hour.
// FLOPs are monitor's transformer_flops_per_step; the H200/H100/A100 peaks are monitor's table.
// `plan::gpt(run, options)` builds the report, `to_text` / `to_json` print it. docs/planning.md.
#pragma once

#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "trainkit/config.hpp"
#include "trainkit/cuda/device.hpp"
#include "trainkit/error.hpp"
#include "trainkit/monitor/json_writer.hpp"
#include "trainkit/monitor/throughput.hpp"
#include "trainkit/plan/memory.hpp"

TRAINKIT_NAMESPACE_BEGIN
namespace plan {

/// One device of the table: its memory and dense peak FLOP/s per precision (fp16 = bf16).
struct Device {
  std::string id;     ///< what --price names it by, e.g. "H100" (case does not matter)
  std::string label;  ///< what the table prints, e.g. "H100 SXM 80GB"
  std::int64_t memory_bytes = 0;
  double fp32 = 0.0;  ///< FP32 on CUDA cores (or the CPU's measured FMA rate)
  double tf32 = 0.0;  ///< TF32 tensor cores
  double bf16 = 0.0;  ///< BF16 / FP16 tensor cores with f32 accumulation
  bool gpu = true;    ///< false for "this CPU" (no device-mode loader, host memory)

  /// The peak for `p` (FLOP/s; 0 when unknown).
  double peak(monitor::Precision p) const noexcept {
    switch (p) {
      case monitor::Precision::kFp32: return fp32;
      case monitor::Precision::kTf32: return tf32;
      case monitor::Precision::kBf16:
      case monitor::Precision::kFp16: return bf16;
    }
    return 0.0;
  }
};

inline constexpr std::int64_t kGiB = std::int64_t{1} << 30;

namespace detail {
/// A device whose peaks are monitor's table entry for `pattern`.
inline Device from_monitor(std::string id, std::string label, std::int64_t gib,
                           std::string_view pattern) {
  Device d{std::move(id), std::move(label), gib * kGiB};
  if (const monitor::DevicePeak* e = monitor::find_device_peak(pattern)) {
    d.fp32 = e->fp32;
    d.tf32 = e->tf32;
    d.bf16 = e->bf16;
  }
  return d;
}
inline std::string lower(std::string s) {
  for (char& c : s) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return s;
}
}  // namespace detail

/// The fixed table. Memory is the data-sheet capacity in GiB (CUDA reports a little less; the
/// headroom covers it). H200, H100 SXM and A100 peaks come from monitor::kDevicePeaks; L40S
/// and RTX 4090 are NVIDIA's dense (non-sparse) figures, RTX 4090 with f32 accumulation.
inline std::vector<Device> known_devices() {
  std::vector<Device> d;
  d.push_back(detail::from_monitor("H200", "H200 SXM 141GB", 141, "H200"));
  d.push_back(detail::from_monitor("H100", "H100 SXM 80GB", 80, "H100"));
  d.push_back(detail::from_monitor("A100-80GB", "A100 80GB", 80, "A100"));
  d.push_back(detail::from_monitor("A100-40GB", "A100 40GB", 40, "A100"));
  d.push_back({"L40S", "L40S 48GB", 48 * kGiB, 91.6e12, 183e12, 362.05e12});
  d.push_back({"RTX4090", "RTX 4090 24GB", 24 * kGiB, 82.6e12, 82.6e12, 165.2e12});
  return d;
}

/// The GPU of this machine (device 0: its name, memory and monitor's peaks for it, 0 when the
/// table does not know it), or nullopt without one (always in the CPU tier).
inline std::optional<Device> detected_gpu() {
#if TRAINKIT_WITH_CUDA
  if (cuda::device_count() > 0) {
    const cuda::DeviceProperties p = cuda::device_properties(0);
    Device d = detail::from_monitor("gpu", "this GPU: " + p.name, 0, p.name);
    d.memory_bytes = static_cast<std::int64_t>(p.total_memory);
    return d;
  }
#endif
  return std::nullopt;
}

/// Host memory (MemTotal of /proc/meminfo, bytes; 0 when it cannot be read).
inline std::int64_t host_memory_bytes() {
  std::ifstream in("/proc/meminfo");
  std::string key;
  std::int64_t kib = 0;
  while (in >> key) {
    if (key == "MemTotal:" && in >> kib) return kib * 1024;
    in.ignore(1 << 12, '\n');
  }
  return 0;
}

/// "this CPU": host memory and `peak_flops` (e.g. monitor::measure_cpu_peak_flops()) for every
/// precision (the host kernels compute in f32).
inline Device this_cpu(double peak_flops) {
  return {"cpu", "this CPU", host_memory_bytes(), peak_flops, peak_flops, peak_flops, false};
}

/// Parses "H100=2.5,H200=3.5" ($ per GPU-hour by device id, case-insensitive; "A100" prices both
/// A100s) against `devices`. Throws naming --price for an unknown device, a missing '=' or a
/// price that is not a finite number >= 0.
inline std::map<std::string, double> parse_prices(const std::string& text,
                                                  const std::vector<Device>& devices) {
  std::map<std::string, double> out;
  std::size_t at = 0;
  while (at <= text.size() && !text.empty()) {
    const std::size_t end = std::min(text.find(',', at), text.size());
    const std::string item = text.substr(at, end - at);
    at = end + 1;
    if (item.empty()) continue;
    const std::size_t eq = item.find('=');
    TRAINKIT_CHECK(eq != std::string::npos && eq > 0, "--price '", item,
                   "' is not DEVICE=DOLLARS_PER_GPU_HOUR (e.g. H100=2.5)");
    const std::string key = detail::lower(item.substr(0, eq));
    const std::string number = item.substr(eq + 1);
    char* stop = nullptr;
    const double price = std::strtod(number.c_str(), &stop);
    TRAINKIT_CHECK(!number.empty() && stop == number.c_str() + number.size() &&
                       std::isfinite(price) && price >= 0.0,
                   "--price '", item, "': '", number, "' is not a price >= 0");
    bool matched = false;
    std::string known;
    for (const Device& d : devices) {
      const std::string id = detail::lower(d.id);
      known += (known.empty() ? "" : ", ") + d.id;
      if (id == key || id.rfind(key + "-", 0) == 0) {
        out[d.id] = price;
        matched = true;
      }
    }
    TRAINKIT_CHECK(matched, "--price '", item, "': unknown device '", item.substr(0, eq),
                   "' (known: ", known, ")");
  }
  return out;
}

/// The MFU of a finished run: the last finite "mfu" of `run_dir`/metrics.jsonl (a fraction).
/// Throws naming --run-dir when the file cannot be read or has no MFU.
inline double read_run_mfu(const std::filesystem::path& run_dir) {
  const std::filesystem::path file = run_dir / "metrics.jsonl";
  std::ifstream in(file);
  TRAINKIT_CHECK(in.good(), "--run-dir: cannot read '", file.string(), "'");
  std::string line;
  double mfu = NAN;
  while (std::getline(in, line)) {
    const std::size_t k = line.find("\"mfu\":");
    if (k == std::string::npos) continue;
    const char* p = line.c_str() + k + 6;
    char* stop = nullptr;
    const double v = std::strtod(p, &stop);
    if (stop != p && std::isfinite(v) && v > 0.0) mfu = v;
  }
  TRAINKIT_CHECK(std::isfinite(mfu), "--run-dir: '", file.string(),
                 "' holds no measured MFU (a run with a known peak writes one per summary)");
  TRAINKIT_CHECK(mfu <= 1.0, "--run-dir: '", file.string(), "' says the run reached MFU ", mfu,
                 ", above 1: the peak it was measured against is too low (give --mfu instead)");
  return mfu;
}

/// Model FLOPs of one rank's step: monitor::transformer_flops_per_step over its B*T tokens.
inline double gpt_flops_per_step(const GptRun& run, std::int64_t matmul_params) {
  const std::int64_t T = run.seq > 0 ? run.seq : run.model.block_size;
  return monitor::transformer_flops_per_step(
      static_cast<double>(matmul_params), static_cast<int>(run.model.n_layer),
      static_cast<int>(run.model.n_head), static_cast<int>(run.model.n_embd / run.model.n_head),
      static_cast<int>(T), static_cast<double>(run.batch * T));
}

/// Time and cost of a run on one kind of device.
struct Compute {
  double flops_per_step = 0.0;   ///< per rank
  double step_seconds = NAN;     ///< flops_per_step / (peak * mfu); NaN without a peak
  double tokens_per_step = 0.0;  ///< over all ranks: ranks * batch * seq
  double tokens_per_s = NAN;     ///< over all ranks
  double steps = 0.0;            ///< steps for the token budget (rounded up; 0 without one)
  double seconds = NAN;          ///< for the token budget
  double cost = NAN;             ///< for the budget: hours * ranks * price; NaN without a price
};

/// The arithmetic of Compute: `peak` FLOP/s per device at utilization `mfu` (0, 1], `tokens` the
/// budget (0: none), `price` $ per GPU-hour (negative: none).
inline Compute compute(const GptRun& run, double flops_per_step, double peak, double mfu,
                       double tokens, double price) {
  Compute c;
  const std::int64_t T = run.seq > 0 ? run.seq : run.model.block_size;
  c.flops_per_step = flops_per_step;
  c.tokens_per_step = static_cast<double>(run.ranks) * static_cast<double>(run.batch * T);
  if (peak > 0.0 && mfu > 0.0) {
    c.step_seconds = flops_per_step / (peak * mfu);
    c.tokens_per_s = c.tokens_per_step / c.step_seconds;
  }
  if (tokens > 0.0) {
    c.steps = std::ceil(tokens / c.tokens_per_step);
    c.seconds = c.steps * c.step_seconds;
    if (price >= 0.0) c.cost = c.seconds / 3600.0 * static_cast<double>(run.ranks) * price;
  }
  return c;
}

/// What plan::gpt computes beyond the run itself.
struct PlanOptions {
  double mfu = 0.0;  ///< model FLOPs utilization in (0, 1]; 0: run_dir's, else kDefaultMfu
  std::filesystem::path run_dir{};  ///< a finished run whose metrics.jsonl MFU to use
  double headroom = 0.1;  ///< fraction of each device's memory kept free (fragmentation, context)
  double tokens = 0.0;    ///< token budget (0: no time or cost)
  std::map<std::string, double> prices{};  ///< $ per GPU-hour by Device::id (parse_prices)
  bool detect_gpu = true;                  ///< add this machine's GPU when there is one
  bool include_cpu = true;                 ///< add "this CPU"
  double cpu_peak_flops = 0.0;             ///< 0: measure it (monitor, about 0.2 s)
  std::vector<Device> devices = known_devices();
};

/// The MFU used when neither PlanOptions::mfu nor a run directory gives one.
inline constexpr double kDefaultMfu = 0.4;

/// One row of the device table.
struct DeviceRow {
  Device device;
  double peak = 0.0;           ///< FLOP/s for the run's precision
  std::int64_t need = 0;       ///< bytes one rank needs in this device's memory at run.batch
  std::int64_t usable = 0;     ///< memory_bytes * (1 - headroom)
  bool fits = false;           ///< need <= usable
  std::int64_t max_batch = 0;  ///< the largest batch per rank that fits (0: not even 1)
  Compute compute;
  std::optional<double> price;
};

/// The planner's report.
struct Report {
  GptRun run;
  MemoryPlan memory;  ///< per rank on a GPU (device-mode loader)
  double mfu = kDefaultMfu;
  std::string mfu_source;  ///< "default", "given" or the metrics file it came from
  double headroom = 0.1;
  double tokens = 0.0;
  std::vector<DeviceRow> rows;
};

/// The bytes one rank of `run` needs in the memory of `gpu` (a GPU: the device lines; the CPU:
/// every line of a host run).
inline std::int64_t needed_bytes(GptRun run, const GptSizes& sizes, bool gpu) {
  run.device = gpu;
  const MemoryPlan p = gpt_memory(run, sizes);
  return gpu ? p.device_bytes() : p.total_bytes();
}

/// The largest batch per rank whose memory fits in `usable` bytes (0 when batch 1 does not):
/// memory grows with the batch, so a doubling then a bisection finds it.
inline std::int64_t largest_batch(GptRun run, const GptSizes& sizes, std::int64_t usable,
                                  bool gpu) {
  const auto fits = [&](std::int64_t b) {
    run.batch = b;
    return needed_bytes(run, sizes, gpu) <= usable;
  };
  if (!fits(1)) return 0;
  std::int64_t lo = 1, hi = 2;
  constexpr std::int64_t kMaxBatch = std::int64_t{1} << 31;
  while (hi <= kMaxBatch && fits(hi)) {
    lo = hi;
    hi *= 2;
  }
  if (hi > kMaxBatch) return lo;
  while (hi - lo > 1) {  // fits(lo), !fits(hi)
    const std::int64_t mid = lo + (hi - lo) / 2;
    (fits(mid) ? lo : hi) = mid;
  }
  return lo;
}

/// The memory breakdown and the device table of `run`. Throws for an invalid run (check_run),
/// an MFU outside (0, 1], a headroom outside [0, 1), a negative token budget or an unreadable
/// run directory.
inline Report gpt(const GptRun& run, const PlanOptions& options = {}) {
  check_run(run);
  TRAINKIT_CHECK(options.mfu >= 0.0 && options.mfu <= 1.0, "--mfu ", options.mfu,
                 " must be in (0, 1] (a fraction, 0.4 = 40%)");
  TRAINKIT_CHECK(options.headroom >= 0.0 && options.headroom < 1.0, "--headroom ", options.headroom,
                 " must be in [0, 1)");
  TRAINKIT_CHECK(options.tokens >= 0.0 && std::isfinite(options.tokens), "--tokens ",
                 options.tokens, " must be >= 0");
  Report r;
  r.run = run;
  r.headroom = options.headroom;
  r.tokens = options.tokens;
  if (options.mfu > 0.0) {
    r.mfu = options.mfu;
    r.mfu_source = "given";
  } else if (!options.run_dir.empty()) {
    r.mfu = read_run_mfu(options.run_dir);
    r.mfu_source = (options.run_dir / "metrics.jsonl").string();
  } else {
    r.mfu_source = "default";
  }
  const GptSizes sizes = gpt_sizes(run.model);
  GptRun on_gpu = run;
  on_gpu.device = true;
  r.memory = gpt_memory(on_gpu, sizes);
  const double flops = gpt_flops_per_step(run, sizes.matmul_params);

  std::vector<Device> devices = options.devices;
  if (options.detect_gpu)
    if (std::optional<Device> g = detected_gpu()) devices.push_back(*g);
  if (options.include_cpu)
    devices.push_back(this_cpu(options.cpu_peak_flops > 0.0 ? options.cpu_peak_flops
                                                            : monitor::measure_cpu_peak_flops()));
  for (const Device& d : devices) {
    DeviceRow row;
    row.device = d;
    row.peak = d.peak(run.precision);
    row.need = needed_bytes(run, sizes, d.gpu);
    row.usable =
        static_cast<std::int64_t>(static_cast<double>(d.memory_bytes) * (1.0 - options.headroom));
    row.fits = row.need <= row.usable;
    row.max_batch = largest_batch(run, sizes, row.usable, d.gpu);
    const auto price = options.prices.find(d.id);
    if (price != options.prices.end()) row.price = price->second;
    row.compute = compute(run, flops, row.peak, r.mfu, options.tokens, row.price.value_or(-1.0));
    r.rows.push_back(std::move(row));
  }
  return r;
}

namespace detail {
inline std::string format(const char* fmt, double v) {
  char text[64];
  std::snprintf(text, sizeof text, fmt, v);
  return text;
}
/// 1.23 GiB, 456.0 MiB, 789 B.
inline std::string human_bytes(std::int64_t bytes) {
  const double b = static_cast<double>(bytes);
  if (b >= double(kGiB)) return format("%.2f GiB", b / double(kGiB));
  if (b >= double(1 << 20)) return format("%.1f MiB", b / double(1 << 20));
  if (b >= 1024.0) return format("%.1f KiB", b / 1024.0);
  return std::to_string(bytes) + " B";
}
/// 1.2 ms, 3.40 s, 5.6 h, 7.8 d; "-" for NaN.
inline std::string human_seconds(double s) {
  if (!std::isfinite(s)) return "-";
  if (s < 1.0) return format("%.1f ms", s * 1e3);
  if (s < 120.0) return format("%.2f s", s);
  if (s < 7200.0) return format("%.1f min", s / 60.0);
  if (s < 172800.0) return format("%.1f h", s / 3600.0);
  return format("%.1f d", s / 86400.0);
}
inline std::string pad(std::string s, std::size_t width, bool right = false) {
  if (s.size() >= width) return s;
  const std::string fill(width - s.size(), ' ');
  return right ? fill + s : s + fill;
}
}  // namespace detail

/// The report as aligned plain text: the run, the memory breakdown, the compute line and the
/// device table.
inline std::string to_text(const Report& r) {
  using detail::format;
  using detail::pad;
  const GptRun& run = r.run;
  const nn::GptOptions& m = run.model;
  const std::int64_t T = run.seq > 0 ? run.seq : m.block_size;
  std::string out;
  out += "plan: GPT " + std::to_string(m.n_layer) + " layers, dim " + std::to_string(m.n_embd) +
         ", " + std::to_string(m.n_head) + " heads, vocab " + std::to_string(m.vocab_size) +
         ", context " + std::to_string(T) + (m.tie_weights ? ", tied head" : "") + ": " +
         std::to_string(r.memory.parameters) + " parameters\n";
  out += "per rank: batch " + std::to_string(run.batch) + " x " + std::to_string(T) + " tokens, " +
         monitor::precision_name(run.precision) + ", " + std::to_string(run.ranks) +
         (run.ranks == 1 ? " rank" : " ranks") + "\n\n";
  out += pad("memory per rank (GPU)", 26) + pad("bytes", 16, true) + pad("", 12, true) + "  what\n";
  for (const MemoryLine& l : r.memory.lines)
    out += "  " + pad(l.name, 24) + pad(std::to_string(l.bytes), 16, true) +
           pad(detail::human_bytes(l.bytes), 12, true) + "  " + l.detail + "\n";
  out += "  " + pad("total on the device", 24) +
         pad(std::to_string(r.memory.device_bytes()), 16, true) +
         pad(detail::human_bytes(r.memory.device_bytes()), 12, true) + "\n\n";
  const double flops = r.rows.empty() ? 0.0 : r.rows.front().compute.flops_per_step;
  out += "compute: " + format("%.4g", 1e-12 * flops) + " TFLOP per step per rank (" +
         format("%.4g", flops / double(run.batch * T)) + " FLOP per token) at " +
         format("%.1f", 100.0 * r.mfu) + "% MFU (" + r.mfu_source + ")";
  if (r.tokens > 0.0) {
    const double steps = r.rows.empty() ? 0.0 : r.rows.front().compute.steps;
    out += "; budget " + format("%.4g", r.tokens) + " tokens = " + format("%.0f", steps) + " steps";
  }
  out += "\nheadroom " + format("%.0f", 100.0 * r.headroom) + "% of each device's memory\n\n";
  const std::size_t w[] = {26, 11, 6, 10, 11, 13, 10, 9, 12};
  const char* head[] = {"device",   "memory", "fits", "max batch", "step",
                        "tokens/s", "time",   "$/h",  "cost"};
  for (std::size_t i = 0; i < 9; ++i) out += pad(head[i], w[i], i > 0);
  out += "\n";
  for (const DeviceRow& row : r.rows) {
    const Compute& c = row.compute;
    std::string line = pad(row.device.label, w[0]);
    line += pad(detail::human_bytes(row.device.memory_bytes), w[1], true);
    line += pad(row.fits ? "yes" : "no", w[2], true);
    line += pad(std::to_string(row.max_batch), w[3], true);
    line += pad(detail::human_seconds(c.step_seconds), w[4], true);
    line += pad(std::isfinite(c.tokens_per_s) ? format("%.4g", c.tokens_per_s) : "-", w[5], true);
    line += pad(r.tokens > 0.0 ? detail::human_seconds(c.seconds) : "-", w[6], true);
    line += pad(row.price ? format("%.2f", *row.price) : "-", w[7], true);
    line += pad(std::isfinite(c.cost) ? "$" + format("%.0f", c.cost) : "-", w[8], true);
    out += line + "\n";
  }
  return out;
}

/// The report as one JSON object: run, mfu, memory lines, rows (NaN values are null).
inline std::string to_json(const Report& r) {
  monitor::JsonWriter w;
  const GptRun& run = r.run;
  w.begin_object().key("model").begin_object();
  w.key("layers").value(run.model.n_layer).key("dim").value(run.model.n_embd);
  w.key("heads").value(run.model.n_head).key("vocab").value(run.model.vocab_size);
  w.key("seq").value(run.seq > 0 ? run.seq : run.model.block_size);
  w.key("tie_weights").value(run.model.tie_weights).key("parameters").value(r.memory.parameters);
  w.end_object();
  w.key("batch").value(run.batch).key("precision").value(monitor::precision_name(run.precision));
  w.key("ranks").value(run.ranks).key("mfu").value(r.mfu).key("mfu_source").value(r.mfu_source);
  w.key("headroom").value(r.headroom).key("tokens").value(r.tokens);
  w.key("memory").begin_array();
  for (const MemoryLine& l : r.memory.lines) {
    w.begin_object().key("name").value(l.name).key("bytes").value(l.bytes);
    w.key("on_device").value(l.on_device).key("what").value(l.detail).end_object();
  }
  w.end_array().key("device_bytes").value(r.memory.device_bytes());
  w.key("devices").begin_array();
  for (const DeviceRow& row : r.rows) {
    const Compute& c = row.compute;
    w.begin_object().key("id").value(row.device.id).key("label").value(row.device.label);
    w.key("memory_bytes").value(row.device.memory_bytes).key("peak_flops").value(row.peak);
    w.key("need_bytes").value(row.need).key("usable_bytes").value(row.usable);
    w.key("fits").value(row.fits).key("max_batch").value(row.max_batch);
    w.key("flops_per_step").value(c.flops_per_step).key("step_s").value(c.step_seconds);
    w.key("tokens_per_s").value(c.tokens_per_s).key("steps").value(c.steps);
    w.key("seconds").value(c.seconds).key("price_per_gpu_hour").value(row.price.value_or(NAN));
    w.key("cost").value(c.cost).end_object();
  }
  w.end_array().end_object();
  return w.take();
}

/// The run train_gpt makes of its flags (a byte vocabulary unless --vocab, AdamW with f32 state,
/// a training and a validation loader of depth 4, evaluation on): for its --plan flag, e.g.
/// `std::fputs(plan::to_text(plan::gpt(plan::train_gpt_run(...), {})).c_str(), stdout);`.
inline GptRun train_gpt_run(std::int64_t layers, std::int64_t dim, std::int64_t heads,
                            std::int64_t seq, std::int64_t batch, bool tie_weights,
                            const std::string& precision, double dropout = 0.0, bool on_gpu = false,
                            std::int64_t vocab = 256, std::int64_t ranks = 1) {
  GptRun run;
  run.ranks = ranks;
  run.model = {.vocab_size = vocab,
               .block_size = seq,
               .n_layer = layers,
               .n_head = heads,
               .n_embd = dim,
               .bias = true,
               .tie_weights = tie_weights,
               .dropout = static_cast<float>(dropout)};
  run.seq = seq;
  run.batch = batch;
  run.precision = parse_precision(precision);
  run.device = on_gpu;
  run.evaluation = true;
  return run;
}

}  // namespace plan
TRAINKIT_NAMESPACE_END
