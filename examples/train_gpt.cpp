// SPDX-License-Identifier: MIT
// train_gpt: trainkit's flagship example. It trains a small character-level (byte-level) GPT on
// real text on the CPU, using the library end to end: nn/ layers over a ParamArena, AdamW with a
// no-decay parameter group, warmup + cosine LR and global-norm clipping, an llm.c token shard read
// back by TokenShardDataset through a shuffling Prefetcher, a Monitor (progress, TensorBoard,
// metrics.jsonl, MFU) and a Checkpointer (every N steps, keep the last K, exact --resume).
//
//   train_gpt [--steps 300] [--batch 16] [--seq 64] [--layers 4] [--dim 128] [--heads 4]
//             [--lr 3e-3] [--seed 1337] [--out runs/train_gpt] [--resume] [--threads N]
//             [--data FILE_OR_DIR] [--help for the rest]
//
// Build: the `train_gpt` target of examples/CMakeLists.txt, or in the CPU tier simply
//   g++ -std=c++20 -O2 -I single_include examples/train_gpt.cpp -pthread -o train_gpt
// Output in --out: data/{train,val}.bin (the token shards), ckpt/step_*/ (safetensors
// checkpoints; model.safetensors loads into nanoGPT's GPT with the same sizes), tb/ (TensorBoard),
// metrics.jsonl and trace.json (Chrome trace).
//
// Step numbers: "step N" everywhere (console, progress, TensorBoard, metrics.jsonl, ckpt/step_N)
// is the number of optimizer steps completed, so the first step is step 1 and step 0 is the
// initial validation loss; --resume from the checkpoint of step N continues at step N + 1, and
// metrics.jsonl and TensorBoard then show each step once (what a run logged past N is dropped).

#include <algorithm>
#include <array>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <exception>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <span>
#include <string>
#include <string_view>
#include <thread>
#include <utility>
#include <vector>

#include <trainkit/trainkit.hpp>

namespace {

namespace tk = trainkit;
namespace fs = std::filesystem;
namespace nn = tk::nn;
namespace optim = tk::optim;
namespace data = tk::data;
namespace mon = tk::monitor;
namespace ckpt = tk::ckpt;

// ---- command line ------------------------------------------------------------------------------

struct Config {
  // Run.
  std::int64_t steps = 300;
  std::string out = "runs/train_gpt";
  std::string data_path = "/usr/share/common-licenses";
  bool resume = false;
  // --resume may start from scratch when only damaged checkpoints remain.
  bool allow_fresh_start = false;
  int threads = 0;  // 0: $TRAINKIT_NUM_THREADS or every core
  std::int64_t log_every = 25;
  std::int64_t eval_every = 50;
  std::int64_t eval_batches = 8;
  std::int64_t ckpt_every = 100;
  int keep_last = 3;
  std::int64_t sample_chars = 240;
  float temperature = 0.8f;
  std::string prompt = "The ";
  bool check = false;
  double peak_tflops = 0.0;  // 0: measure (the rate of a large f32 gemm on these threads)
  // Model, data and optimizer (a resumed run takes these from the checkpoint).
  std::int64_t batch = 16;
  std::int64_t seq = 64;
  std::int64_t layers = 4;
  std::int64_t dim = 128;
  std::int64_t heads = 4;
  double dropout = 0.0;
  double lr = 3e-3;
  double min_lr_ratio = 0.1;
  double weight_decay = 0.1;
  double grad_clip = 1.0;
  std::int64_t warmup = 0;       // 0: steps / 10 (at least 1)
  std::int64_t decay_steps = 0;  // 0: steps
  std::uint64_t seed = 1337;
};

constexpr std::int64_t kVocab = 256;  // byte-level: every file is valid input

void print_usage() {
  std::printf(
      "usage: train_gpt [options]\n"
      "  --steps N          train until step N (default 300)\n"
      "  --batch B          sequences per step (16)\n"
      "  --seq T            tokens per sequence, the context length (64)\n"
      "  --layers L         transformer blocks (4)\n"
      "  --dim C            embedding width (128)\n"
      "  --heads H          attention heads, C %% H == 0 (4)\n"
      "  --lr X             peak learning rate of AdamW (3e-3)\n"
      "  --seed S           seed of initialisation, data order, dropout and sampling (1337)\n"
      "  --out DIR          run directory (runs/train_gpt)\n"
      "  --resume           continue from the newest checkpoint in DIR/ckpt that verifies\n"
      "                     (damaged ones are moved aside as DIR/ckpt/.step_*.corrupt; exit 1\n"
      "                     when only damaged ones remain)\n"
      "  --allow-fresh-start  with --resume: start from scratch when no usable checkpoint remains\n"
      "  --threads N        CPU threads (default: $TRAINKIT_NUM_THREADS or all cores)\n"
      "  --data PATH        a text file or a directory of them (/usr/share/common-licenses)\n"
      "  --dropout P        dropout after the embeddings (0)\n"
      "  --weight-decay X   AdamW weight decay of the matrices (0.1)\n"
      "  --grad-clip X      clip the global gradient norm to X, 0 = off (1.0)\n"
      "  --warmup N         linear warmup steps (steps / 10)\n"
      "  --decay-steps N    length of the warmup + cosine schedule, held at its minimum after\n"
      "                     it (steps; --resume keeps the checkpoint's unless --steps is larger:\n"
      "                     then the schedule becomes that of a --steps run)\n"
      "  --log-every N      steps per monitor summary (25)\n"
      "  --eval-every N     steps between validation losses (50)\n"
      "  --eval-batches N   validation batches per evaluation (8)\n"
      "  --ckpt-every N     steps between checkpoints (100); one is also written at the end\n"
      "  --keep N           checkpoints to keep (3)\n"
      "  --sample-chars N   bytes to generate at the end (240)\n"
      "  --temperature X    sampling temperature, 0 = greedy (0.8)\n"
      "  --prompt TEXT      start of the generated text (\"The \")\n"
      "  --peak-tflops X    peak for MFU (default: measured, the best of short 512^3 f32 gemms)\n"
      "  --check            exit 3 unless the final train and val losses are below the initial\n");
}

/// Parses argv into `c`; returns false for --help. Throws trainkit::Error for a bad flag.
bool parse_args(int argc, char** argv, Config& c, std::set<std::string>& given) {
  const std::vector<std::string> args(argv + 1, argv + argc);
  for (std::size_t i = 0; i < args.size(); ++i) {
    const std::string& a = args[i];
    if (a == "--help" || a == "-h") return false;
    if (a == "--resume") {
      c.resume = true;
      continue;
    }
    if (a == "--allow-fresh-start") {
      c.allow_fresh_start = true;
      continue;
    }
    if (a == "--check") {
      c.check = true;
      continue;
    }
    TRAINKIT_CHECK(i + 1 < args.size(), "train_gpt: ", a, " needs a value (see --help)");
    const std::string& v = args[++i];
    given.insert(a);
    const auto to_i = [&] {
      std::size_t end = 0;
      long long x = 0;
      try {
        x = std::stoll(v, &end);
      } catch (const std::exception&) {
        end = 0;
      }
      TRAINKIT_CHECK(end == v.size(), "train_gpt: ", a, " expects an integer, got '", v, "'");
      return static_cast<std::int64_t>(x);
    };
    const auto to_f = [&] {
      std::size_t end = 0;
      double x = 0;
      try {
        x = std::stod(v, &end);
      } catch (const std::exception&) {
        end = 0;
      }
      TRAINKIT_CHECK(end == v.size(), "train_gpt: ", a, " expects a number, got '", v, "'");
      return x;
    };
    if (a == "--steps") c.steps = to_i();
    else if (a == "--batch") c.batch = to_i();
    else if (a == "--seq") c.seq = to_i();
    else if (a == "--layers") c.layers = to_i();
    else if (a == "--dim") c.dim = to_i();
    else if (a == "--heads") c.heads = to_i();
    else if (a == "--lr") c.lr = to_f();
    else if (a == "--seed") c.seed = static_cast<std::uint64_t>(to_i());
    else if (a == "--out") c.out = v;
    else if (a == "--threads") c.threads = static_cast<int>(to_i());
    else if (a == "--data") c.data_path = v;
    else if (a == "--dropout") c.dropout = to_f();
    else if (a == "--weight-decay") c.weight_decay = to_f();
    else if (a == "--grad-clip") c.grad_clip = to_f();
    else if (a == "--warmup") c.warmup = to_i();
    else if (a == "--decay-steps") c.decay_steps = to_i();
    else if (a == "--log-every") c.log_every = to_i();
    else if (a == "--eval-every") c.eval_every = to_i();
    else if (a == "--eval-batches") c.eval_batches = to_i();
    else if (a == "--ckpt-every") c.ckpt_every = to_i();
    else if (a == "--keep") c.keep_last = static_cast<int>(to_i());
    else if (a == "--sample-chars") c.sample_chars = to_i();
    else if (a == "--temperature") c.temperature = static_cast<float>(to_f());
    else if (a == "--prompt") c.prompt = v;
    else if (a == "--peak-tflops") c.peak_tflops = to_f();
    else TRAINKIT_FAIL("train_gpt: unknown option '", a, "' (see --help)");
  }
  return true;
}

/// Checks every flag's value on its own, before anything touches the disk: a bad value names its
/// flag and what it got. (check_config checks the combination again once a checkpoint's settings
/// are in.)
void check_flags(const Config& c, const std::set<std::string>& given) {
  const auto at_least = [](const char* flag, std::int64_t v, std::int64_t least) {
    TRAINKIT_CHECK(v >= least, "train_gpt: ", flag, " must be >= ", least, ", got ", v);
  };
  at_least("--steps", c.steps, 1);
  at_least("--batch", c.batch, 1);
  at_least("--seq", c.seq, 2);
  at_least("--layers", c.layers, 1);
  at_least("--dim", c.dim, 1);
  at_least("--heads", c.heads, 1);
  at_least("--threads", c.threads, 0);
  at_least("--warmup", c.warmup, 0);
  at_least("--log-every", c.log_every, 1);
  at_least("--eval-every", c.eval_every, 1);
  at_least("--eval-batches", c.eval_batches, 1);
  at_least("--ckpt-every", c.ckpt_every, 1);
  at_least("--keep", c.keep_last, 0);
  at_least("--sample-chars", c.sample_chars, 0);
  TRAINKIT_CHECK(c.decay_steps == 0 || c.decay_steps >= 2,
                 "train_gpt: --decay-steps must be >= 2 (or 0 for --steps), got ", c.decay_steps);
  TRAINKIT_CHECK(!given.count("--seed") || static_cast<std::int64_t>(c.seed) >= 0,
                 "train_gpt: --seed must be >= 0, got ", static_cast<std::int64_t>(c.seed));
  TRAINKIT_CHECK(c.dim % c.heads == 0, "train_gpt: --dim ", c.dim, " is not a multiple of --heads ",
                 c.heads);
  TRAINKIT_CHECK(std::isfinite(c.lr) && c.lr > 0.0, "train_gpt: --lr must be > 0, got ", c.lr);
  TRAINKIT_CHECK(c.dropout >= 0.0 && c.dropout < 1.0,
                 "train_gpt: --dropout must be in [0, 1), got ", c.dropout);
  TRAINKIT_CHECK(std::isfinite(c.weight_decay) && c.weight_decay >= 0.0,
                 "train_gpt: --weight-decay must be >= 0, got ", c.weight_decay);
  TRAINKIT_CHECK(std::isfinite(c.grad_clip) && c.grad_clip >= 0.0,
                 "train_gpt: --grad-clip must be >= 0 (0 = off), got ", c.grad_clip);
  TRAINKIT_CHECK(std::isfinite(c.temperature) && c.temperature >= 0.0f,
                 "train_gpt: --temperature must be >= 0 (0 = greedy), got ", c.temperature);
  TRAINKIT_CHECK(std::isfinite(c.peak_tflops) && c.peak_tflops >= 0.0,
                 "train_gpt: --peak-tflops must be >= 0 (0 = measure), got ", c.peak_tflops);
  std::error_code ec;
  TRAINKIT_CHECK(fs::exists(c.data_path, ec), "train_gpt: --data '", c.data_path,
                 "' does not exist");
  TRAINKIT_CHECK(!c.out.empty(), "train_gpt: --out must name a directory");
  // The schedule as a fresh run resolves it (a resumed run takes the checkpoint's instead, and
  // load_config rejects a flag that disagrees with it).
  if (!c.resume || (given.count("--warmup") && given.count("--decay-steps"))) {
    const std::int64_t decay =
        c.decay_steps > 0 ? c.decay_steps : std::max<std::int64_t>(c.steps, 2);
    const std::int64_t warmup = c.warmup > 0 ? c.warmup : std::max<std::int64_t>(1, decay / 10);
    TRAINKIT_CHECK(warmup<decay, "train_gpt: --warmup ", warmup, " must be below --decay-steps ",
                          decay, c.decay_steps> 0
                       ? ""
                       : " (= --steps)");
  }
}

/// The settings as they will be used (a resumed run's from its checkpoint, defaults resolved).
void check_config(const Config& c) {
  check_flags(c, {});
  TRAINKIT_CHECK(c.decay_steps >= 2 && c.warmup >= 1 && c.warmup < c.decay_steps,
                 "train_gpt: need 1 <= --warmup < --decay-steps, got ", c.warmup, " and ",
                 c.decay_steps);
}

// The settings a checkpoint fixes: saved as metadata, taken back on --resume.
const char* const kSavedInt[] = {"--batch", "--seq",  "--layers",      "--dim",
                                 "--heads", "--seed", "--decay-steps", "--warmup"};
const char* const kSavedFloat[] = {"--dropout", "--lr", "--weight-decay", "--grad-clip"};

std::int64_t* int_field(Config& c, std::string_view flag) {
  if (flag == "--batch") return &c.batch;
  if (flag == "--seq") return &c.seq;
  if (flag == "--layers") return &c.layers;
  if (flag == "--dim") return &c.dim;
  if (flag == "--heads") return &c.heads;
  if (flag == "--decay-steps") return &c.decay_steps;
  if (flag == "--warmup") return &c.warmup;
  return nullptr;
}
double* float_field(Config& c, std::string_view flag) {
  if (flag == "--dropout") return &c.dropout;
  if (flag == "--lr") return &c.lr;
  if (flag == "--weight-decay") return &c.weight_decay;
  if (flag == "--grad-clip") return &c.grad_clip;
  return nullptr;
}

void save_config(const Config& c, std::map<std::string, std::string>& meta) {
  Config copy = c;
  for (const char* f : kSavedInt)
    meta[f + 2] =
        std::string(f) == "--seed" ? std::to_string(c.seed) : std::to_string(*int_field(copy, f));
  for (const char* f : kSavedFloat)
    meta[f + 2] = tk::StateDict::number_to_string(*float_field(copy, f));
}

/// Takes the saved settings of a checkpoint; an explicit flag that disagrees is an error.
void load_config(Config& c, const std::map<std::string, std::string>& meta,
                 const std::set<std::string>& given) {
  for (const char* f : kSavedInt) {
    const auto it = meta.find(f + 2);
    TRAINKIT_CHECK(it != meta.end(), "train_gpt: the checkpoint has no '", f + 2,
                   "' setting: it was not written by train_gpt");
    const std::int64_t saved = std::stoll(it->second);
    const std::int64_t mine =
        std::string(f) == "--seed" ? static_cast<std::int64_t>(c.seed) : *int_field(c, f);
    TRAINKIT_CHECK(!given.count(f) || saved == mine, "train_gpt: ", f, " ", mine,
                   " differs from the checkpoint's ", saved, "; drop it to resume");
    if (std::string(f) == "--seed") c.seed = static_cast<std::uint64_t>(saved);
    else *int_field(c, f) = saved;
  }
  for (const char* f : kSavedFloat) {
    const auto it = meta.find(f + 2);
    TRAINKIT_CHECK(it != meta.end(), "train_gpt: the checkpoint has no '", f + 2, "' setting");
    const double saved = std::stod(it->second);
    TRAINKIT_CHECK(!given.count(f) || saved == *float_field(c, f), "train_gpt: ", f, " ",
                   *float_field(c, f), " differs from the checkpoint's ", saved,
                   "; drop it to resume");
    *float_field(c, f) = saved;
  }
}

// ---- the corpus as llm.c token shards ----------------------------------------------------------

/// The bytes of `path`: a file, or every regular file under a directory (symbolic links skipped,
/// so /usr/share/common-licenses/GPL does not repeat GPL-3), in path order.
std::string read_corpus(const fs::path& path) {
  std::vector<fs::path> files;
  if (fs::is_directory(path)) {
    for (const auto& e : fs::recursive_directory_iterator(path))
      if (e.symlink_status().type() == fs::file_type::regular) files.push_back(e.path());
    std::sort(files.begin(), files.end());
  } else {
    files.push_back(path);
  }
  std::string text;
  for (const fs::path& f : files) {
    std::ifstream in(f, std::ios::binary);
    TRAINKIT_CHECK(in.good(), "train_gpt: cannot read '", f.string(), "'");
    text.append(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
  }
  TRAINKIT_CHECK(!files.empty() && !text.empty(), "train_gpt: no text found at '", path.string(),
                 "' (pass --data FILE_OR_DIR)");
  return text;
}

/// Writes bytes [begin, end) of `text` as an llm.c GPT-2 token shard (256 x int32 header: magic
/// 20240520, version 1, token count; then uint16 tokens), replacing `path` atomically.
void write_shard(const fs::path& path, std::string_view text) {
  std::array<std::int32_t, 256> header{};
  header[0] = data::kTokenShardMagicGpt2;
  header[1] = 1;
  header[2] = static_cast<std::int32_t>(text.size());
  std::vector<std::uint16_t> tokens(text.size());
  for (std::size_t i = 0; i < text.size(); ++i)
    tokens[i] = static_cast<std::uint16_t>(static_cast<unsigned char>(text[i]));
  const fs::path tmp = path.string() + ".tmp";
  {
    std::ofstream out(tmp, std::ios::binary | std::ios::trunc);
    out.write(reinterpret_cast<const char*>(header.data()), sizeof header);
    out.write(reinterpret_cast<const char*>(tokens.data()),
              static_cast<std::streamsize>(tokens.size() * sizeof(std::uint16_t)));
    TRAINKIT_CHECK(out.good(), "train_gpt: cannot write '", tmp.string(), "'");
  }
  fs::rename(tmp, path);
}

// ---- the model ---------------------------------------------------------------------------------

/// nanoGPT's GPT (untied lm_head), parameters under nanoGPT's state-dict names, with the
/// activations of one [B, T] batch kept for backward.
class Gpt {
 public:
  Gpt(nn::ParamArena<>& arena, const Config& c)
      : B_(c.batch),
        T_(c.seq),
        C_(c.dim),
        wte_(arena, "transformer.wte", {kVocab, c.dim, nn::Init::normal(0.0f, 0.02f)}),
        wpe_(arena, "transformer.wpe", {c.seq, c.dim, nn::Init::normal(0.0f, 0.02f)}),
        drop_({.p = static_cast<float>(c.dropout), .seed = c.seed, .site = 1}) {
    for (std::int64_t l = 0; l < c.layers; ++l)
      blocks_.push_back(std::make_unique<nn::TransformerBlock<>>(
          arena, "transformer.h." + std::to_string(l),
          nn::TransformerBlockOptions{.n_embd = c.dim, .n_head = c.heads, .n_layer = c.layers}));
    ln_f_.emplace(arena, "transformer.ln_f", nn::LayerNormOptions{.features = c.dim});
    lm_head_.emplace(arena, "lm_head",
                     nn::LinearOptions{.in_features = c.dim,
                                       .out_features = kVocab,
                                       .bias = false,
                                       .weight_init = nn::Init::normal(0.0f, 0.02f)});
    const std::int64_t N = B_ * T_;
    pos_ = tk::Tensor<std::int32_t>(tk::Shape{N});
    for (std::int64_t n = 0; n < N; ++n) pos_.data()[n] = static_cast<std::int32_t>(n % T_);
    emb_ = tk::Tensor<float>(tk::Shape{N, C_});
    for (std::int64_t l = 0; l <= c.layers; ++l) xs_.emplace_back(tk::Shape{N, C_});
    block_ctx_.resize(blocks_.size());
    h_ = tk::Tensor<float>(tk::Shape{N, C_});
    logits_ = tk::Tensor<float>(tk::Shape{N, kVocab});
    dlogits_ = tk::Tensor<float>(tk::Shape{N, kVocab});
    da_ = tk::Tensor<float>(tk::Shape{N, C_});
    db_ = tk::Tensor<float>(tk::Shape{N, C_});
  }

  nn::Dropout& dropout() noexcept { return drop_; }

  /// Logits [B*T, V] of token ids [B*T] (B <= batch, T <= seq); row b*T + t predicts token t+1.
  tk::HostView<float, 2> forward(const tk::exec::Host& exec, const std::int32_t* ids,
                                 std::int64_t B, std::int64_t T) {
    TRAINKIT_CHECK(B >= 1 && B <= B_ && T >= 1 && T <= T_, "Gpt::forward: [", B, ", ", T,
                   "] exceeds [", B_, ", ", T_, "]");
    B0_ = B;
    T0_ = T;
    ids_ = ids;
    const std::int64_t N = B * T;
    if (T != T_) {  // positions 0..T-1 per row, for this shape
      for (std::int64_t n = 0; n < N; ++n) pos_.data()[n] = static_cast<std::int32_t>(n % T);
    }
    wte_.forward(exec, ids_view(), mat(emb_, N, C_));
    wpe_.forward(exec, pos_view(), mat(emb_, N, C_), nn::Write::kAccumulate);
    drop_.forward(exec, mat(emb_, N, C_), mat(xs_[0], N, C_));
    for (std::size_t l = 0; l < blocks_.size(); ++l)
      blocks_[l]->forward(exec, block_ctx_[l], cube(xs_[l], B, T), cube(xs_[l + 1], B, T));
    ln_f_->forward(exec, ln_f_ctx_, mat(xs_.back(), N, C_), mat(h_, N, C_));
    lm_head_->forward(exec, mat(h_, N, C_), mat(logits_, N, kVocab));
    if (T != T_) {
      for (std::int64_t n = 0; n < B_ * T_; ++n) pos_.data()[n] = static_cast<std::int32_t>(n % T_);
    }
    return mat(logits_, N, kVocab);
  }

  /// The gradient buffer of the logits of the last forward.
  tk::HostView<float, 2> dlogits() { return mat(dlogits_, B0_ * T0_, kVocab); }

  /// Adds the gradients of the last forward (full-size batches only) to the arena, given dlogits.
  void backward(const tk::exec::Host& exec) {
    TRAINKIT_CHECK(B0_ == B_ && T0_ == T_, "Gpt::backward after a forward of another shape");
    const std::int64_t N = B_ * T_;
    lm_head_->backward(exec, mat(h_, N, C_), mat(dlogits_, N, kVocab), mat(da_, N, C_));
    ln_f_->backward(exec, ln_f_ctx_, mat(xs_.back(), N, C_), mat(da_, N, C_), mat(db_, N, C_));
    std::swap(da_, db_);
    for (std::size_t l = blocks_.size(); l-- > 0;) {
      blocks_[l]->backward(exec, block_ctx_[l], cube(xs_[l], B_, T_), cube(da_, B_, T_),
                           cube(db_, B_, T_));
      std::swap(da_, db_);
    }
    drop_.backward(exec, mat(emb_, N, C_), mat(da_, N, C_), mat(db_, N, C_));
    wte_.backward(exec, ids_view(), mat(db_, N, C_));
    wpe_.backward(exec, pos_view(), mat(db_, N, C_));
  }

 private:
  static tk::HostView<float, 2> mat(tk::Tensor<float>& t, std::int64_t r, std::int64_t c) {
    return tk::HostView<float, 2>(t.data(), tk::Extents<2>{{r, c}});
  }
  static tk::HostView<float, 3> cube(tk::Tensor<float>& t, std::int64_t b, std::int64_t n) {
    return tk::HostView<float, 3>(t.data(), tk::Extents<3>{{b, n, t.shape()[1]}});
  }
  tk::HostView<const std::int32_t, 1> ids_view() const {
    return tk::HostView<const std::int32_t, 1>(ids_, tk::Extents<1>{{B0_ * T0_}});
  }
  tk::HostView<const std::int32_t, 1> pos_view() const {
    return tk::HostView<const std::int32_t, 1>(pos_.data(), tk::Extents<1>{{B0_ * T0_}});
  }

  std::int64_t B_, T_, C_;
  std::int64_t B0_ = 0, T0_ = 0;  // shape of the last forward
  const std::int32_t* ids_ = nullptr;
  nn::Embedding<> wte_;
  nn::Embedding<> wpe_;
  nn::Dropout drop_;
  std::vector<std::unique_ptr<nn::TransformerBlock<>>> blocks_;
  std::optional<nn::LayerNorm<>> ln_f_;
  std::optional<nn::Linear<>> lm_head_;
  tk::Tensor<std::int32_t> pos_;
  tk::Tensor<float> emb_, h_, logits_, dlogits_, da_, db_;
  std::vector<tk::Tensor<float>> xs_;  // xs_[l]: input of block l; xs_[L]: input of ln_f
  // What the last forward saved for backward, per block and for ln_f.
  std::vector<nn::TransformerBlock<>::Context> block_ctx_;
  nn::LayerNorm<>::Context ln_f_ctx_;
};

// ---- evaluation and generation -----------------------------------------------------------------

/// Mean cross-entropy (nats per byte) over eval_batches * batch windows spread evenly over the
/// validation shard (dropout off). The same windows every time, so values are comparable.
double evaluate(Gpt& model, const tk::exec::Host& exec, const data::TokenShardDataset& val,
                const Config& c) {
  nn::SoftmaxCrossEntropy<> ce;
  nn::SoftmaxCrossEntropy<>::Context ce_ctx;
  const auto windows = static_cast<std::int64_t>(val.size());
  const std::int64_t want = std::min<std::int64_t>(c.eval_batches * c.batch, windows);
  const std::int64_t T = c.seq;
  std::vector<std::int32_t> inputs(static_cast<std::size_t>(c.batch * T));
  std::vector<std::int32_t> targets(inputs.size());
  model.dropout().eval();
  double sum = 0.0;
  for (std::int64_t k0 = 0; k0 < want; k0 += c.batch) {
    const std::int64_t rows = std::min(c.batch, want - k0);
    for (std::int64_t r = 0; r < rows; ++r) {
      const std::array<std::span<std::byte>, 2> fields{
          std::as_writable_bytes(std::span(inputs.data() + r * T, static_cast<std::size_t>(T))),
          std::as_writable_bytes(std::span(targets.data() + r * T, static_cast<std::size_t>(T)))};
      val.read(static_cast<std::size_t>((k0 + r) * windows / want), data::SampleRef(fields));
    }
    float loss = 0.0f;
    ce.forward(exec, ce_ctx, model.forward(exec, inputs.data(), rows, T),
               tk::HostView<const std::int32_t, 1>(targets.data(), tk::Extents<1>{{rows * T}}),
               tk::HostView<float, 1>(&loss, tk::Extents<1>{{1}}));
    sum += static_cast<double>(loss) * static_cast<double>(rows);
  }
  model.dropout().train();
  return sum / static_cast<double>(want);
}

/// Continues `prompt` by `count` bytes, one forward over the last `seq` bytes per new byte:
/// greedy at temperature 0, else sampled from softmax(logits / temperature) with a Philox stream
/// of the seed (deterministic).
std::string generate(Gpt& model, const tk::exec::Host& exec, const Config& c) {
  std::vector<std::int32_t> context;
  for (char ch : c.prompt) context.push_back(static_cast<unsigned char>(ch));
  if (context.empty()) context.push_back('\n');
  tk::PhiloxStream rng(c.seed, /*stream=*/0x5a3e);
  std::string out;
  std::vector<double> p(static_cast<std::size_t>(kVocab));
  model.dropout().eval();
  for (std::int64_t i = 0; i < c.sample_chars; ++i) {
    const std::int64_t T = std::min<std::int64_t>(static_cast<std::int64_t>(context.size()), c.seq);
    const tk::HostView<float, 2> logits =
        model.forward(exec, context.data() + context.size() - static_cast<std::size_t>(T), 1, T);
    const float* row = logits.data() + (T - 1) * kVocab;
    std::int32_t next = 0;
    if (c.temperature <= 0.0f) {
      next = static_cast<std::int32_t>(std::max_element(row, row + kVocab) - row);
    } else {
      const float top = *std::max_element(row, row + kVocab);
      double total = 0.0;
      for (std::int64_t v = 0; v < kVocab; ++v)
        total += p[static_cast<std::size_t>(v)] = std::exp((row[v] - top) / c.temperature);
      double u = static_cast<double>(rng.next_uniform()) * total;
      next = kVocab - 1;
      for (std::int64_t v = 0; v < kVocab; ++v) {
        u -= p[static_cast<std::size_t>(v)];
        if (u < 0.0) {
          next = static_cast<std::int32_t>(v);
          break;
        }
      }
    }
    context.push_back(next);
    // Control bytes other than newline and tab would garble the terminal.
    out.push_back(next == '\n' || next == '\t' || next >= 32 ? static_cast<char>(next) : '?');
  }
  model.dropout().train();
  return out;
}

constexpr int kPeakProbes = 16;

/// FLOP/s of a 512 x 512 x 512 f32 gemm on `exec`, the best of kPeakProbes short probes spread
/// over about a quarter second: the practical peak of these threads for MFU, since the model's
/// time goes into such gemms. One probe on a busy machine reads low (and MFU then above 100%);
/// the best of several catches a quiet moment.
double measure_gemm_peak(const tk::exec::Host& exec) {
  constexpr std::int64_t n = 512;
  tk::Tensor<float> a(tk::Shape{n, n}), b(tk::Shape{n, n}), out(tk::Shape{n, n});
  a.fill(0.5f);
  b.fill(0.25f);
  const auto gemm = [&] {
    tk::blas::gemm(exec, tk::blas::Op::kN, tk::blas::Op::kN, a.view<2>(), b.view<2>(),
                   out.view<2>());
  };
  gemm();  // warm-up: first-touch pages, thread start
  return mon::best_of_probes(kPeakProbes, [&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
    const auto t0 = std::chrono::steady_clock::now();
    gemm();
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    return s > 0.0 ? 2.0 * n * n * n / s : 0.0;
  });
}

// ---- training ----------------------------------------------------------------------------------

std::string fmt(const char* format, double a, double b = 0.0, double c = 0.0, double d = 0.0) {
  char text[256];
  std::snprintf(text, sizeof text, format, a, b, c, d);
  return text;
}

int train(Config c, const std::set<std::string>& given) {
  const fs::path out = c.out;
  // The corpus first: a missing or empty one must not leave an empty run directory behind.
  const std::string text = read_corpus(c.data_path);
  fs::create_directories(out / "data");

  // Checkpoints first: a resumed run takes its model and schedule settings from the newest one.
  ckpt::Checkpointer checkpointer((out / "ckpt").string(), {.every_steps = c.ckpt_every,
                                                            .keep_last = c.keep_last,
                                                            .best_metric = "val_loss",
                                                            .keep_best = 1,
                                                            .async = true});
  std::optional<ckpt::CheckpointInfo> latest;
  if (c.resume) {
    // Every byte is verified (the manifest holding the settings too); damaged checkpoints are
    // logged and moved aside; none usable but damaged ones present: an error (exit 1) unless
    // --allow-fresh-start.
    try {
      latest = checkpointer.newest_usable({.allow_fresh_start = c.allow_fresh_start});
    } catch (const tk::Error& e) {
      if (std::string_view(e.what()).find("no usable checkpoint") == std::string_view::npos) throw;
      throw tk::Error(std::string(e.what()) + " (here: --resume --allow-fresh-start)", e.library(),
                      e.code());
    }
    if (latest) load_config(c, latest->metadata, given);
    else std::printf("train_gpt: no usable checkpoint in %s/ckpt: starting fresh\n", c.out.c_str());
  } else {
    const auto existing = checkpointer.list();
    TRAINKIT_CHECK(existing.empty(), "train_gpt: ", (out / "ckpt").string(),
                   " holds checkpoints already (newest: step ",
                   existing.empty() ? 0 : existing.back().step,
                   "): pass --resume to continue that run, or --out DIR for a new one");
  }
  if (!latest) {
    if (c.decay_steps == 0) c.decay_steps = std::max<std::int64_t>(c.steps, 2);
    if (c.warmup == 0) c.warmup = std::max<std::int64_t>(1, c.decay_steps / 10);
  }
  // Resumed with a larger --steps than the saved schedule covers: the schedule would sit at its
  // minimum lr for the extra steps. Unless --decay-steps is given, it becomes the schedule of a
  // run started with --decay-steps = this --steps (the warmup unchanged), from the checkpoint's
  // step on.
  const bool extend_schedule = latest && c.steps > c.decay_steps && !given.count("--decay-steps");
  if (extend_schedule) {
    std::printf(
        "train_gpt: --steps %lld is past the checkpoint's schedule (--decay-steps %lld): the "
        "warmup + cosine schedule now decays until step %lld (pass --decay-steps %lld to keep "
        "it)\n",
        static_cast<long long>(c.steps), static_cast<long long>(c.decay_steps),
        static_cast<long long>(c.steps), static_cast<long long>(c.decay_steps));
    c.decay_steps = c.steps;
  }
  check_config(c);

  // The corpus, split 90/10 and written as llm.c token shards, read back as windows of T + 1.
  const std::size_t split = text.size() - text.size() / 10;
  TRAINKIT_CHECK(text.size() - split > static_cast<std::size_t>(c.seq) + 1,
                 "train_gpt: the corpus (", text.size(), " bytes) is too small for --seq ", c.seq);
  write_shard(out / "data" / "train.bin", std::string_view(text).substr(0, split));
  write_shard(out / "data" / "val.bin", std::string_view(text).substr(split));
  const auto T = static_cast<std::size_t>(c.seq);
  // Stride 1: every byte offset starts a window (nanoGPT's random offsets, as a dataset).
  const data::TokenShardDataset train_set(
      std::vector<fs::path>{out / "data" / "train.bin"},
      {.seq_len = T, .stride = 1, .token_dtype = tk::DType::kI32});
  const data::TokenShardDataset val_set(
      std::vector<fs::path>{out / "data" / "val.bin"},
      {.seq_len = T, .stride = T, .token_dtype = tk::DType::kI32});

  tk::exec::Host exec = c.threads > 0 ? tk::exec::Host(c.threads) : tk::exec::Host();
  nn::ParamArena<> arena;
  Gpt model(arena, c);
  arena.finalize();
  arena.initialize(c.seed);

  // AdamW (nanoGPT's betas); biases and LayerNorm parameters without weight decay.
  optim::AdamW<> opt(arena,
                     {.lr = c.lr, .beta1 = 0.9, .beta2 = 0.95, .weight_decay = c.weight_decay},
                     {optim::no_weight_decay({"*.bias", "*ln_*"})});
  auto schedule = optim::warmup_cosine(
      opt.lr_groups(),
      {.warmup_steps = c.warmup, .total_steps = c.decay_steps, .eta_min = c.lr * c.min_lr_ratio});
  data::RandomSampler sampler(train_set.size(), c.seed);
  data::Prefetcher loader(train_set, sampler,
                          {.batch_size = static_cast<std::size_t>(c.batch),
                           .num_workers = 1,
                           .drop_last = true,
                           .pin_memory = false,
                           .name = "train"});

  ckpt::TrainState state;
  state.model(arena)
      .add("optimizer", opt)
      .add("schedule", *schedule)
      .add("loader", loader)
      .add("sampler", sampler)
      .add("dropout", model.dropout());
  save_config(c, state.metadata);
  if (latest) {
    const auto info = checkpointer.resume(state, {.allow_fresh_start = c.allow_fresh_start});
    // The settings came from latest: the state must come from the same checkpoint.
    TRAINKIT_CHECK(info.has_value() && info->step == latest->step,
                   "train_gpt: the checkpoint of step ", latest->step,
                   " passed verification, then failed it while being restored (",
                   info ? "restored step " + std::to_string(info->step) : "nothing restored",
                   "; see the log above); run with --resume again");
    std::printf("train_gpt: resumed from %s (step %lld)\n", info->path.string().c_str(),
                static_cast<long long>(info->step));
    if (extend_schedule) {
      // The longer schedule at this step: replayed from step 0 on a copy of the groups, so the
      // lr equals a fresh --steps run's to the last bit.
      optim::LrGroups groups = opt.lr_groups();
      groups.lr = groups.initial_lr;
      auto replay = optim::warmup_cosine(groups, {.warmup_steps = c.warmup,
                                                  .total_steps = c.decay_steps,
                                                  .eta_min = c.lr * c.min_lr_ratio});
      for (std::int64_t s = 0; s < state.step; ++s) replay->step();
      schedule->load_state_dict(replay->state_dict());
      opt.lr_groups().lr = groups.lr;
      save_config(c, state.metadata);  // the next checkpoints hold the longer schedule
    }
  }

  const std::int64_t tokens = c.batch * c.seq;
  const auto embeddings = static_cast<double>((kVocab + c.seq) * c.dim);
  const double matmul_params = static_cast<double>(arena.num_parameters()) - embeddings;
  std::printf(
      "train_gpt: %lld parameters (%lld layers, dim %lld, %lld heads, context %lld, "
      "vocab %lld bytes) | corpus %zu bytes: %zu train windows, %zu val windows | "
      "%d threads\n",
      static_cast<long long>(arena.num_parameters()), static_cast<long long>(c.layers),
      static_cast<long long>(c.dim), static_cast<long long>(c.heads), static_cast<long long>(c.seq),
      static_cast<long long>(kVocab), text.size(), train_set.size(), val_set.size(),
      exec.num_threads());
  const double peak_flops = c.peak_tflops > 0.0 ? 1e12 * c.peak_tflops : measure_gemm_peak(exec);
  const std::string peak_label =
      c.peak_tflops > 0.0 ? std::string("configured: --peak-tflops")
                          : "measured: f32 gemm 512^3, best of " + std::to_string(kPeakProbes);
  std::printf("train_gpt: MFU against a peak of %.4g TFLOP/s (%s)\n", 1e-12 * peak_flops,
              peak_label.c_str());
  // A resumed run continues the earlier one's metrics.jsonl and TensorBoard run, superseding
  // what it logged past the checkpoint (a run that crashed before its next checkpoint).
  mon::Monitor monitor(
      {.total_steps = c.steps,
       .log_every = c.log_every,
       .resume_step = latest ? state.step : -1,
       .log_dir = (out / "tb").string(),
       .metrics_file = (out / "metrics.jsonl").string(),
       .chrome_trace = (out / "trace.json").string(),
       .samples_per_step = static_cast<double>(c.batch),
       .tokens_per_step = static_cast<double>(tokens),
       .flops_per_step = mon::transformer_flops_per_step(
           matmul_params, static_cast<int>(c.layers), static_cast<int>(c.heads),
           static_cast<int>(c.dim / c.heads), static_cast<int>(c.seq), static_cast<double>(tokens)),
       .peak_flops = peak_flops,
       .peak_label = peak_label,
       .gpu_monitor = false});

  if (!state.metadata.count("initial_val_loss")) {
    const double v = evaluate(model, exec, val_set, c);
    state.metadata["initial_val_loss"] = tk::StateDict::number_to_string(v);
    monitor.print(fmt("step 0: val loss %.4f", v));
    monitor.log_metrics(0, {{"val/loss", v}});
  }

  nn::SoftmaxCrossEntropy<> ce;
  nn::SoftmaxCrossEntropy<>::Context ce_ctx;
  float loss = NAN;
  double val_loss = NAN;
  std::vector<double> recent;  // train losses of the last steps of this process
  const std::int64_t first_step = state.step;
  const auto t0 = std::chrono::steady_clock::now();
  while (state.step < c.steps) {
    const std::int64_t step = state.step;
    monitor.begin_step(step);
    const data::Batch batch = [&] {
      auto span = monitor.span(mon::Phase::kDataWait);
      return loader.next();
    }();
    const auto inputs = batch.host<std::int32_t, 2>("input");
    const tk::HostView<const std::int32_t, 1> targets(batch.host<std::int32_t, 2>("target").data(),
                                                      tk::Extents<1>{{tokens}});
    tk::HostView<float, 2> logits;
    {
      auto span = monitor.span(mon::Phase::kForward);
      model.dropout().set_step(static_cast<std::uint32_t>(step));
      logits = model.forward(exec, inputs.data(), c.batch, c.seq);
      ce.forward(exec, ce_ctx, logits, targets, tk::HostView<float, 1>(&loss, tk::Extents<1>{{1}}));
    }
    {
      auto span = monitor.span(mon::Phase::kBackward);
      arena.zero_grad();
      ce.backward(exec, ce_ctx, logits, targets, model.dlogits());
      model.backward(exec);
    }
    double grad_norm = 0.0;
    const double lr = opt.lr();
    {
      auto span = monitor.span(mon::Phase::kOptimizer);
      grad_norm = c.grad_clip > 0.0 ? optim::clip_grad_norm_(exec, arena, c.grad_clip).get()
                                    : optim::grad_norm(exec, arena).get();
      opt.step(exec);
      schedule->step();  // past --decay-steps the lr stays at its minimum
    }
    if (!std::isfinite(loss) || !std::isfinite(grad_norm)) {
      monitor.close();
      std::fprintf(stderr,
                   "train_gpt: step %lld: loss %g, gradient norm %g: training diverged "
                   "(lower --lr)\n",
                   static_cast<long long>(step + 1), static_cast<double>(loss), grad_norm);
      return 2;
    }
    ++state.step;
    if (step == 0) state.metadata["initial_loss"] = tk::StateDict::number_to_string(loss);
    recent.push_back(loss);
    if (recent.size() > 10) recent.erase(recent.begin());
    monitor.log_scalar("train/lr", lr);
    monitor.log_scalar("train/grad_norm", grad_norm);

    ckpt::Metrics metrics{{"train_loss", static_cast<double>(loss)}};
    if (state.step % c.eval_every == 0 || state.step == c.steps) {
      val_loss = evaluate(model, exec, val_set, c);
      metrics["val_loss"] = val_loss;
      monitor.log_metrics(state.step, {{"val/loss", val_loss}});
      monitor.print(fmt("step %.0f: train loss %.4f | val loss %.4f | lr %.3g", double(state.step),
                        static_cast<double>(loss), val_loss, lr));
    }
    {
      auto span = monitor.span(mon::Phase::kCheckpoint);
      if (!checkpointer.maybe_save(state, metrics) && state.step == c.steps)
        checkpointer.save(state, metrics);
    }
    monitor.end_step({.loss = loss});
  }
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  checkpointer.wait();
  monitor.close();

  if (std::isnan(val_loss)) val_loss = evaluate(model, exec, val_set, c);
  const double initial_loss =
      state.metadata.count("initial_loss") ? std::stod(state.metadata.at("initial_loss")) : NAN;
  const double initial_val = std::stod(state.metadata.at("initial_val_loss"));
  double final_loss = NAN;
  if (!recent.empty()) {
    final_loss = 0.0;
    for (double l : recent) final_loss += l;
    final_loss /= static_cast<double>(recent.size());
  }
  const std::int64_t trained = state.step - first_step;
  std::uint32_t bits = 0;
  std::memcpy(&bits, &loss, sizeof bits);
  std::printf(
      "train_gpt: step %lld | train loss %.4f -> %.4f (mean of the last %zu steps; "
      "last 0x%08x) | val loss %.4f -> %.4f | %.1f ms/step over %lld steps\n",
      static_cast<long long>(state.step), initial_loss, final_loss, recent.size(),
      static_cast<unsigned>(bits), initial_val, val_loss,
      trained > 0 ? 1e3 * seconds / static_cast<double>(trained) : 0.0,
      static_cast<long long>(trained));
  std::printf("train_gpt: checkpoints in %s/ckpt, TensorBoard: tensorboard --logdir %s/tb\n",
              c.out.c_str(), c.out.c_str());

  const std::string sample = generate(model, exec, c);
  std::printf("---- sample (temperature %.2g, %lld bytes) ----\n%s%s\n----\n",
              static_cast<double>(c.temperature), static_cast<long long>(c.sample_chars),
              c.prompt.c_str(), sample.c_str());

  if (c.check) {
    const bool ok = std::isfinite(final_loss) && std::isfinite(val_loss) &&
                    final_loss < initial_loss && val_loss < initial_val;
    std::printf("train_gpt: --check %s\n", ok ? "passed" : "FAILED: the loss did not fall");
    if (!ok) return 3;
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  // Line-buffered even into a file or a pipe: a log of a killed run ends at its last line.
  std::setvbuf(stdout, nullptr, _IOLBF, 0);
  try {
    Config config;
    std::set<std::string> given;
    if (!parse_args(argc, argv, config, given)) {
      print_usage();
      return 0;
    }
    check_flags(config, given);
    return train(std::move(config), given);
  } catch (const std::exception& e) {
    // "trainkit: train_gpt: --steps must be >= 1, got -5" -> "train_gpt: error: --steps ...".
    std::string_view what = e.what();
    for (const std::string_view prefix : {"trainkit: ", "train_gpt: "})
      if (what.substr(0, prefix.size()) == prefix) what.remove_prefix(prefix.size());
    std::fprintf(stderr, "train_gpt: error: %.*s\n", static_cast<int>(what.size()), what.data());
    return 1;
  }
}
