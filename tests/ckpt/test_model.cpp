// Tests of ckpt/model.hpp: model weights under PyTorch names. A file PyTorch wrote
// (tests/fixtures/ckpt/make_torch_fixture.py) loads into a trainkit MLP that computes PyTorch's
// output; our files round-trip bit for bit; every mismatch (missing, unexpected, shape, dtype)
// is listed in one error before anything changes; strict = false, skip patterns, prefixes,
// dtype conversion, sharded sets and directories work; a corrupt file is refused.
#include <doctest/doctest.h>

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <string>
#include <vector>

#include <trainkit/ckpt/model.hpp>
#include <trainkit/core/tensor.hpp>
#include <trainkit/error.hpp>
#include <trainkit/exec/host.hpp>
#include <trainkit/io/json.hpp>
#include <trainkit/io/safetensors.hpp>
#include <trainkit/nn/activation.hpp>
#include <trainkit/nn/dropout.hpp>
#include <trainkit/nn/linear.hpp>
#include <trainkit/nn/param_arena.hpp>
#include <trainkit/nn/sequential.hpp>

#include "ckpt/ckpt_test_util.hpp"

namespace {
namespace tk = trainkit;
namespace ckpt = trainkit::ckpt;
namespace io = trainkit::io;
namespace nn = trainkit::nn;
namespace fs = std::filesystem;
using ckpt_test::TempDir;

const std::string kData = std::string(TRAINKIT_TEST_DATA_DIR) + "/ckpt/";

/// The architecture of make_torch_fixture.py: Linear(5,7) ReLU Dropout Linear(7,head).
struct TorchMlp {
  nn::ParamArena<> arena;
  nn::Sequential<nn::Linear<>, nn::ReLU, nn::Dropout, nn::Linear<>> net;
  explicit TorchMlp(std::int64_t head = 3)
      : net{nn::Linear(arena, "0", {.in_features = 5, .out_features = 7}), nn::ReLU{},
            nn::Dropout({.p = 0.1f}),
            nn::Linear(arena, "3", {.in_features = 7, .out_features = head})} {
    arena.finalize();
    arena.initialize(17);
    net.get<2>().eval();
  }
};

std::vector<float> floats(const io::Json& j) {
  std::vector<float> out;
  for (const io::Json& v : j.as_array()) out.push_back(static_cast<float>(v.as_double()));
  return out;
}

std::vector<float> params(const nn::ParamArena<>& a) {
  return std::vector<float>(a.params_data(), a.params_data() + a.buffer_numel());
}

}  // namespace

TEST_CASE("load_model: weights saved by PyTorch give PyTorch's output") {
  const io::Json ref =
      io::Json::parse(ckpt_test::read_file(kData + "torch_mlp.json"), "torch_mlp.json");
  TorchMlp m;
  const ckpt::ModelLoadReport r = ckpt::load_model(m.arena, kData + "torch_mlp.safetensors");
  CHECK(r.complete());
  CHECK(r.loaded.size() == 4);
  const std::vector<float> x = floats(ref.at("input"));
  const std::vector<float> y = floats(ref.at("output"));
  tk::exec::Host exec(1);
  tk::Tensor<float> in(tk::Shape{4, 5}), out(tk::Shape{4, 3});
  std::memcpy(in.data(), x.data(), x.size() * 4);
  decltype(m.net)::Context ctx;
  m.net.forward(exec, ctx, in.view<2>(), out.view<2>());
  for (std::size_t i = 0; i < y.size(); ++i)
    CHECK(out.data()[i] == doctest::Approx(y[i]).epsilon(1e-5));

  // The same weights in BF16: refused unless conversion is asked for.
  TorchMlp b;
  CHECK_THROWS_WITH_AS(ckpt::load_model(b.arena, kData + "torch_mlp_bf16.safetensors"),
                       doctest::Contains("'0.weight' is BF16 in the file but the model is F32 "
                                         "(pass convert_dtype = true"),
                       tk::Error);
  const auto rb =
      ckpt::load_model(b.arena, kData + "torch_mlp_bf16.safetensors", {.convert_dtype = true});
  CHECK(rb.converted == rb.loaded);
  CHECK(rb.loaded.size() == 4);
  CHECK(r.converted.empty());
  const io::SafetensorsFile f32(kData + "torch_mlp.safetensors");
  const auto w = f32.tensor("0.weight").as<float, 2>();
  const float* got = b.arena.params_data() + b.arena.info(b.arena.at("0.weight")).offset;
  for (std::int64_t i = 0; i < 35; ++i)
    CHECK(got[i] == static_cast<float>(tk::bf16(w.data()[i])));  // rounded like .to(bfloat16)
}

TEST_CASE("load_model: a new head - shape mismatch, strict = false and skip patterns") {
  TorchMlp m(/*head=*/10);
  const std::vector<float> before = params(m.arena);
  CHECK_THROWS_WITH_AS(ckpt::load_model(m.arena, kData + "torch_mlp.safetensors"),
                       doctest::Contains("'3.weight' has shape [3, 7] in the file but [10, 7] "
                                         "in the model"),
                       tk::Error);
  // A program's own remedy replaces the options' names.
  try {
    ckpt::load_model(m.arena, kData + "torch_mlp.safetensors", {.remedy = "check --head"});
    FAIL("no error");
  } catch (const tk::Error& e) {
    const std::string what = e.what();
    CHECK_MESSAGE(what.find("\n  (check --head)") != std::string::npos, what);
    CHECK_MESSAGE(what.find("strict") == std::string::npos, what);
  }
  // Shape mismatches are errors even when not strict (as in PyTorch).
  CHECK_THROWS_AS(ckpt::load_model(m.arena, kData + "torch_mlp.safetensors", {.strict = false}),
                  tk::Error);
  CHECK(params(m.arena) == before);  // nothing changed
  const auto r = ckpt::load_model(m.arena, kData + "torch_mlp.safetensors", {.skip = {"3.*"}});
  CHECK(r.loaded == std::vector<std::string>{"0.weight", "0.bias"});
  CHECK(r.skipped == std::vector<std::string>{"3.weight", "3.bias"});
  CHECK(r.complete());
  const auto head = m.arena.info(m.arena.at("3.weight"));
  CHECK(std::memcmp(m.arena.params_data() + head.offset, before.data() + head.offset,
                    std::size_t(head.numel) * 4) == 0);  // the new head keeps its init
}

TEST_CASE("load_model: missing and unexpected names, prefixes") {
  TempDir dir;
  nn::ParamArena<> src;
  src.add("encoder.weight", tk::Shape{2, 2});
  src.add("encoder.bias", tk::Shape{2});
  src.add("extra.scale", tk::Shape{});
  src.finalize();
  src.initialize(5);
  ckpt::save_model(dir / "m.safetensors", src, {.durable = false});

  nn::ParamArena<> dst;
  dst.add("encoder.weight", tk::Shape{2, 2});
  dst.add("encoder.bias", tk::Shape{2});
  dst.add("decoder.weight", tk::Shape{3});
  dst.finalize();
  const std::vector<float> before = params(dst);
  CHECK_THROWS_WITH_AS(ckpt::load_model(dst, dir / "m.safetensors"),
                       doctest::Contains("1 missing: 'decoder.weight'"), tk::Error);
  CHECK_THROWS_WITH_AS(ckpt::load_model(dst, dir / "m.safetensors"),
                       doctest::Contains("1 unexpected (in the file, not in the model): "
                                         "'extra.scale'"),
                       tk::Error);
  CHECK(params(dst) == before);
  const auto r = ckpt::load_model(dst, dir / "m.safetensors", {.strict = false});
  CHECK(r.missing == std::vector<std::string>{"decoder.weight"});
  CHECK(r.unexpected == std::vector<std::string>{"extra.scale"});
  CHECK(r.loaded.size() == 2);
  CHECK(dst.params_data()[0] == src.params_data()[0]);
  // allow_unexpected: a pretrained file with more heads.
  CHECK_THROWS_AS(ckpt::load_model(dst, dir / "m.safetensors", {.allow_unexpected = true}),
                  tk::Error);  // still missing decoder.weight
  CHECK_NOTHROW(ckpt::load_model(dst, dir / "m.safetensors",
                                 {.allow_unexpected = true, .skip = {"decoder.*"}}));

  // A wrapped model: the file's names carry "model.", plus a tensor outside the prefix.
  const float* p = src.params_data();
  const auto at = [&](const char* n) { return p + src.info(src.at(n)).offset; };
  io::save_safetensors(
      dir / "wrapped.safetensors",
      {{"model.encoder.weight",
        tk::AnyTensorView(tk::DType::kF32, tk::Shape{2, 2}, at("encoder.weight"))},
       {"model.encoder.bias", tk::AnyTensorView(tk::DType::kF32, tk::Shape{2}, at("encoder.bias"))},
       {"lm_head.weight", tk::AnyTensorView(tk::DType::kF32, tk::Shape{1}, p)}},
      {}, {.durable = false});
  nn::ParamArena<> enc;
  enc.add("encoder.weight", tk::Shape{2, 2});
  enc.add("encoder.bias", tk::Shape{2});
  enc.finalize();
  CHECK_THROWS_WITH_AS(ckpt::load_model(enc, dir / "wrapped.safetensors"),
                       doctest::Contains("2 missing"), tk::Error);
  const auto w =
      ckpt::load_model(enc, dir / "wrapped.safetensors", {.strict = false, .prefix = "model."});
  CHECK(w.loaded.size() == 2);
  CHECK(w.unexpected == std::vector<std::string>{"lm_head.weight"});
  CHECK(std::memcmp(enc.params_data(), at("encoder.weight"), 16) == 0);
}

TEST_CASE("load_model: a tied parameter stored under either name, or under both when equal") {
  TempDir dir;
  std::uint64_t state = 0x7ed;
  const auto next = [&] {
    return (state = state * 6364136223846793005ull + 1442695040888963407ull) >> 33;
  };
  for (int trial = 0; trial < 12; ++trial) {
    const std::int64_t V = 1 + std::int64_t(next() % 40), C = 1 + std::int64_t(next() % 24);
    const std::string prefix = trial % 3 == 2 ? "model." : "";
    std::vector<float> wte(static_cast<std::size_t>(V * C)), ln(static_cast<std::size_t>(C));
    for (float& v : wte) v = float(int(next() % 2001) - 1000) / 997.0f;
    for (float& v : ln) v = float(int(next() % 2001) - 1000) / 991.0f;
    const tk::AnyTensorView wte_view(tk::DType::kF32, tk::Shape{V, C}, wte.data());
    const tk::AnyTensorView ln_view(tk::DType::kF32, tk::Shape{C}, ln.data());
    std::vector<float> other = wte;  // an untied head: one element one ulp away
    float& changed = other[next() % other.size()];
    changed = std::nextafter(changed, 2.0f);
    const tk::AnyTensorView other_view(tk::DType::kF32, tk::Shape{V, C}, other.data());
    const std::string head = prefix + "lm_head.weight", emb = prefix + "transformer.wte.weight";
    io::save_safetensors(dir / "head_only.safetensors",  // as safetensors.torch.save_model keeps it
                         {{head, wte_view}, {prefix + "ln_f.weight", ln_view}}, {},
                         {.durable = false});
    io::save_safetensors(dir / "both.safetensors",
                         {{emb, wte_view}, {head, wte_view}, {prefix + "ln_f.weight", ln_view}}, {},
                         {.durable = false});
    io::save_safetensors(dir / "untied.safetensors",
                         {{emb, wte_view}, {head, other_view}, {prefix + "ln_f.weight", ln_view}},
                         {}, {.durable = false});
    io::save_safetensors(dir / "neither.safetensors", {{prefix + "ln_f.weight", ln_view}}, {},
                         {.durable = false});

    nn::ParamArena<> arena;
    arena.add("transformer.wte.weight", tk::Shape{V, C});
    arena.add("ln_f.weight", tk::Shape{C});
    arena.finalize();
    const ckpt::ModelLoadOptions tied{.prefix = prefix,
                                      .tied = {{"lm_head.weight", "transformer.wte.weight"}}};
    const float* ln_param = arena.params_data() + arena.info(arena.at("ln_f.weight")).offset;
    for (const std::string file : {"head_only.safetensors", "both.safetensors"}) {
      CAPTURE(file);
      arena.initialize(std::uint64_t(trial));
      const auto r = ckpt::load_model(arena, dir / file, tied);
      CHECK(r.loaded.size() == 2);
      CHECK(r.complete());
      CHECK(std::memcmp(arena.params_data(), wte.data(), wte.size() * sizeof(float)) == 0);
      CHECK(std::memcmp(ln_param, ln.data(), ln.size() * sizeof(float)) == 0);
    }
    // Without `tied`, the head-only file misses the embedding and has an unexpected head.
    CHECK_THROWS_WITH_AS(ckpt::load_model(arena, dir / "head_only.safetensors", {.prefix = prefix}),
                         doctest::Contains("1 missing: 'transformer.wte.weight'"), tk::Error);
    arena.initialize(99);
    const std::vector<float> before = params(arena);
    const std::string differ =
        "'" + head + "' and '" + emb + "' differ in the file, but the model ties them";
    CHECK_THROWS_WITH_AS(ckpt::load_model(arena, dir / "untied.safetensors", tied),
                         doctest::Contains(differ.c_str()), tk::Error);
    CHECK_THROWS_WITH_AS(ckpt::load_model(arena, dir / "neither.safetensors", tied),
                         doctest::Contains("1 missing: 'transformer.wte.weight'"), tk::Error);
    CHECK(params(arena) == before);
  }
  // A head of another shape is named in the error under the name the file uses.
  std::vector<float> w(6, 0.5f);
  io::save_safetensors(
      dir / "wide.safetensors",
      {{"lm_head.weight", tk::AnyTensorView(tk::DType::kF32, tk::Shape{2, 3}, w.data())}}, {},
      {.durable = false});
  nn::ParamArena<> small;
  small.add("transformer.wte.weight", tk::Shape{3, 2});
  small.finalize();
  CHECK_THROWS_WITH_AS(
      ckpt::load_model(small, dir / "wide.safetensors",
                       {.tied = {{"lm_head.weight", "transformer.wte.weight"}}}),
      doctest::Contains("'lm_head.weight' has shape [2, 3] in the file but [3, 2] in the model"),
      tk::Error);
  // `tied` names one parameter and one name that is not a parameter.
  CHECK_THROWS_WITH_AS(ckpt::load_model(small, dir / "wide.safetensors",
                                        {.tied = {{"lm_head.weight", "wte.weight"}}}),
                       doctest::Contains("the model has no parameter 'wte.weight'"), tk::Error);
  CHECK_THROWS_WITH_AS(
      ckpt::load_model(small, dir / "wide.safetensors",
                       {.tied = {{"transformer.wte.weight", "transformer.wte.weight"}}}),
      doctest::Contains("is a parameter of its own"), tk::Error);
}

TEST_CASE("load_model: names from the file reach the error message escaped") {
  TempDir dir;
  // A safetensors file by hand: "w" plus one unexpected tensor whose name is `name`.
  const auto write = [&](const std::string& file, const std::string& name_json) {
    std::string h = R"({"w":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},")" + name_json +
                    R"(":{"dtype":"F32","shape":[1],"data_offsets":[8,12]}})";
    while (h.size() % 8) h += ' ';
    std::string out(8, '\0');
    for (std::size_t i = 0; i < 8; ++i) out[i] = char((std::uint64_t(h.size()) >> (8 * i)) & 0xff);
    ckpt_test::write_file(dir / file, out + h + std::string(12, '\0'));
  };
  write("nul.safetensors", R"(evil\u0000hidden)");
  write("nl.safetensors", R"(x\n  0 problem(s): everything loaded fine)");
  nn::ParamArena<> arena;
  arena.add("w", tk::Shape{2});
  arena.finalize();
  try {
    ckpt::load_model(arena, dir / "nul.safetensors");
    FAIL("load_model accepted an unexpected tensor");
  } catch (const tk::Error& e) {
    const std::string what = e.what();
    CHECK(what.find("'evil?hidden'") != std::string::npos);
    CHECK(what.find("(strict = false") != std::string::npos);
  }
  try {
    ckpt::load_model(arena, dir / "nl.safetensors");
    FAIL("load_model accepted an unexpected tensor");
  } catch (const tk::Error& e) {
    const std::string what = e.what();
    CHECK(what.find("'x?  0 problem(s): everything loaded fine'") != std::string::npos);
    CHECK(what.find("\n  0 problem(s)") == std::string::npos);
  }
}

TEST_CASE("save_model / load_model: bit-exact round trip, format metadata, sharded sets") {
  TempDir dir;
  nn::ParamArena<> a;
  a.add("blocks.0.attn.weight", tk::Shape{8, 4});
  a.add("blocks.0.attn.bias", tk::Shape{8});
  a.add("empty", tk::Shape{0, 3});
  a.add("scale", tk::Shape{});
  a.finalize();
  a.initialize(11);
  a.params_data()[a.info(a.at("scale")).offset] = -0.0f;
  const ckpt::FileDigest d = ckpt::save_model(dir / "model.safetensors", a, {.durable = false});
  const io::SafetensorsFile f(dir / "model.safetensors");
  CHECK(f.metadata().at("format") == "pt");
  CHECK(f.metadata().at("trainkit.xxh64") == ckpt::hex64(d.xxh64));
  CHECK(f.tensor("empty").shape() == tk::Shape{0, 3});
  CHECK(f.tensor("scale").shape().rank() == 0);
  // 64-byte data alignment for mappers.
  CHECK(f.header().data_offset() % 64 == 0);

  nn::ParamArena<> b;
  b.add("blocks.0.attn.weight", tk::Shape{8, 4});
  b.add("blocks.0.attn.bias", tk::Shape{8});
  b.add("empty", tk::Shape{0, 3});
  b.add("scale", tk::Shape{});
  b.finalize();
  ckpt::load_model(b, dir.path());  // a directory holding model.safetensors
  CHECK(std::memcmp(a.params_data(), b.params_data(), std::size_t(a.buffer_numel()) * 4) == 0);
  CHECK(std::signbit(b.params_data()[b.info(b.at("scale")).offset]));

  // A sharded set written by hand (as huggingface_hub does) through its index.
  const float* p = a.params_data();
  const auto view = [&](const char* n) {
    const auto& i = a.info(a.at(n));
    return tk::AnyTensorView(tk::DType::kF32, i.shape, p + i.offset);
  };
  std::filesystem::create_directories(dir / "hf");
  io::save_safetensors(dir / "hf/model-00001-of-00002.safetensors",
                       {{"blocks.0.attn.weight", view("blocks.0.attn.weight")}}, {},
                       {.durable = false});
  io::save_safetensors(dir / "hf/model-00002-of-00002.safetensors",
                       {{"blocks.0.attn.bias", view("blocks.0.attn.bias")},
                        {"empty", view("empty")},
                        {"scale", view("scale")}},
                       {}, {.durable = false});
  io::SafetensorsIndex index;
  index.weight_map = {{"blocks.0.attn.weight", "model-00001-of-00002.safetensors"},
                      {"blocks.0.attn.bias", "model-00002-of-00002.safetensors"},
                      {"empty", "model-00002-of-00002.safetensors"},
                      {"scale", "model-00002-of-00002.safetensors"}};
  io::save_safetensors_index(dir / "hf" / io::kSafetensorsIndexName, index, {.durable = false});
  nn::ParamArena<> c;
  c.add("blocks.0.attn.weight", tk::Shape{8, 4});
  c.add("blocks.0.attn.bias", tk::Shape{8});
  c.add("empty", tk::Shape{0, 3});
  c.add("scale", tk::Shape{});
  c.finalize();
  ckpt::load_model(c, dir / "hf");
  CHECK(std::memcmp(a.params_data(), c.params_data(), std::size_t(a.buffer_numel()) * 4) == 0);

  // A corrupt file is refused before anything is loaded (and names the file).
  std::string bytes = ckpt_test::read_file(dir / "model.safetensors");
  bytes[bytes.size() - 5] = static_cast<char>(bytes[bytes.size() - 5] ^ 1);
  ckpt_test::write_file(dir / "model.safetensors", bytes);
  nn::ParamArena<> e;
  e.add("blocks.0.attn.weight", tk::Shape{8, 4});
  e.add("blocks.0.attn.bias", tk::Shape{8});
  e.add("empty", tk::Shape{0, 3});
  e.add("scale", tk::Shape{});
  e.finalize();
  CHECK_THROWS_WITH_AS(ckpt::load_model(e, dir / "model.safetensors"),
                       doctest::Contains("model.safetensors' is corrupt"), tk::Error);
  CHECK(e.params_data()[0] == 0.0f);
  CHECK_NOTHROW(ckpt::load_model(e, dir / "model.safetensors", {.verify_checksum = false}));
  CHECK_THROWS_WITH_AS(ckpt::load_model(e, dir / "nothing"), doctest::Contains("nothing"),
                       tk::Error);
}

TEST_CASE("load_model: a file truncated in place after it was opened loads what was read") {
  // Another process truncating the file (a cleanup job, a half-started rewrite) while a source
  // is open must not fault: the source holds the bytes it read and verified at open.
  TempDir dir;
  nn::ParamArena<> a;
  a.add("w", tk::Shape{256, 64});  // 64 KiB: the tensor lies on pages past the header's
  a.add("b", tk::Shape{64});
  a.finalize();
  a.initialize(5);
  ckpt::save_model(dir / "model.safetensors", a, {.durable = false});
  // The same 64 KiB as a set of two shards.
  const io::NamedTensor parts[] = {
      {"w0", tk::AnyTensorView(tk::DType::kF32, tk::Shape{128, 64}, a.params_data())},
      {"w1", tk::AnyTensorView(tk::DType::kF32, tk::Shape{128, 64}, a.params_data() + 128 * 64)}};
  fs::create_directories(dir / "sharded");
  io::save_safetensors(dir / "sharded" / "model-00001-of-00002.safetensors", {parts[0]}, {},
                       {.durable = false});
  io::save_safetensors(dir / "sharded" / "model-00002-of-00002.safetensors", {parts[1]}, {},
                       {.durable = false});
  io::SafetensorsIndex index;
  index.weight_map = {{"w0", "model-00001-of-00002.safetensors"},
                      {"w1", "model-00002-of-00002.safetensors"}};
  io::save_safetensors_index(dir / "sharded" / io::kSafetensorsIndexName, index,
                             {.durable = false});

  for (const bool verify : {true, false}) {
    CAPTURE(verify);
    ckpt::save_model(dir / "model.safetensors", a, {.durable = false});
    const ckpt::TensorSource src = ckpt::TensorSource::open(dir / "model.safetensors", verify);
    fs::resize_file(dir / "model.safetensors", 0);
    nn::ParamArena<> b;
    b.add("w", tk::Shape{256, 64});
    b.add("b", tk::Shape{64});
    b.finalize();
    const ckpt::ModelLoadReport r = ckpt::load_model(b, src);
    CHECK(r.complete());
    CHECK(std::memcmp(a.params_data(), b.params_data(), std::size_t(a.buffer_numel()) * 4) == 0);
  }

  const ckpt::TensorSource shards = ckpt::TensorSource::open(dir / "sharded");
  fs::resize_file(dir / "sharded" / "model-00002-of-00002.safetensors", 0);
  nn::ParamArena<> c;
  c.add("w0", tk::Shape{128, 64});
  c.add("w1", tk::Shape{128, 64});
  c.finalize();
  CHECK(ckpt::load_model(c, shards).complete());
  CHECK(std::memcmp(a.params_data(), c.params_data(), 256 * 64 * 4) == 0);
}

namespace {

/// A field of /proc/self/status in KiB ("VmRSS", "VmHWM"), or -1.
long status_kib(const std::string& field) {
  const std::string text = ckpt_test::read_file("/proc/self/status");
  const std::size_t at = text.find(field + ":");
  return at == std::string::npos ? -1 : std::atol(text.c_str() + at + field.size() + 1);
}

/// ThreadSanitizer maps shadow memory for every byte a load writes or hashes, so resident memory
/// says nothing about copies there.
#if defined(__SANITIZE_THREAD__)
constexpr bool kThreadSanitizer = true;
#elif defined(__has_feature)
#if __has_feature(thread_sanitizer)
constexpr bool kThreadSanitizer = true;
#else
constexpr bool kThreadSanitizer = false;
#endif
#else
constexpr bool kThreadSanitizer = false;
#endif

/// Resets VmHWM to the current VmRSS (Linux); false where that is not possible.
bool reset_peak_rss() {
  std::FILE* f = std::fopen("/proc/self/clear_refs", "w");
  if (f == nullptr) return false;
  const bool ok = std::fputs("5", f) >= 0;
  return std::fclose(f) == 0 && ok;
}

}  // namespace

TEST_CASE("load_model from a path reads the tensors into the parameters, not into a copy") {
  // A model's file must not be held whole in memory beside the model while it loads: the peak
  // resident memory of a load stays far below the file's size (verified or not, converted or
  // not).
  if (kThreadSanitizer || status_kib("VmHWM") < 0 || !reset_peak_rss()) {
    MESSAGE("peak resident memory cannot be measured here; skipped");
    return;
  }
  TempDir dir;
  nn::ParamArena<> a;
  for (int i = 0; i < 8; ++i) a.add("w" + std::to_string(i), tk::Shape{1024, 1024});  // 32 MiB
  a.finalize();
  a.initialize(3);
  ckpt::save_model(dir / "model.safetensors", a, {.durable = false});
  std::vector<tk::AnyTensor> halves;
  std::vector<io::NamedTensor> views;
  for (const nn::ParamInfo& p : a.infos()) {
    tk::AnyTensor t(tk::DType::kBF16, p.shape);
    auto* d = reinterpret_cast<tk::bf16*>(t.data());
    for (std::int64_t j = 0; j < p.numel; ++j) d[j] = tk::bf16(a.params_data()[p.offset + j]);
    halves.push_back(std::move(t));
  }
  for (std::size_t i = 0; i < halves.size(); ++i) views.push_back({a.infos()[i].name, halves[i]});
  ckpt::save_checksummed_safetensors(dir / "bf16.safetensors", views, {}, {.durable = false});

  nn::ParamArena<> b;
  for (int i = 0; i < 8; ++i) b.add("w" + std::to_string(i), tk::Shape{1024, 1024});
  b.finalize();
  b.initialize(4);  // the parameters' pages are resident before the load
  for (const char* file : {"model.safetensors", "bf16.safetensors"}) {
    for (const bool verify : {true, false}) {
      CAPTURE(file);
      CAPTURE(verify);
      REQUIRE(reset_peak_rss());
      const long before = status_kib("VmRSS");
      const ckpt::ModelLoadReport r =
          ckpt::load_model(b, dir / file, {.convert_dtype = true, .verify_checksum = verify});
      const long peak = status_kib("VmHWM");
      CHECK(r.complete());
      // The F32 file is 32 MiB; the reads need a few MiB of buffers (more under sanitizers).
      CHECK(peak - before < 16 * 1024);
    }
  }
  ckpt::load_model(b, dir / "model.safetensors");
  CHECK(std::memcmp(a.params_data(), b.params_data(), std::size_t(a.buffer_numel()) * 4) == 0);
}

TEST_CASE("load_model: converted tensors larger than the read buffer round element by element") {
  // F16, BF16 and F64 tensors of several MiB load in pieces; every element must round exactly as
  // one static_cast does, whichever way the file is read, and a tensor that fills two tied
  // parameters fills both.
  TempDir dir;
  constexpr std::int64_t kN = 700001;  // > 1 MiB in every dtype, and not a multiple of a piece
  std::vector<float> values(static_cast<std::size_t>(kN));
  std::uint32_t x = 12345;
  for (float& v : values) {
    x = x * 1664525u + 1013904223u;
    std::uint32_t bits = x;
    if ((bits & 0x7f800000u) == 0x7f800000u) bits &= ~0x00800000u;  // no NaN or infinity
    std::memcpy(&v, &bits, 4);
  }
  values[0] = -0.0f;
  values[1] = 1e-40f;  // subnormal
  for (const tk::DType dtype : {tk::DType::kF16, tk::DType::kBF16, tk::DType::kF64}) {
    CAPTURE(tk::dtype_name(dtype));
    tk::AnyTensor stored(dtype, tk::Shape{kN});
    std::vector<float> expected(values.size());
    for (std::size_t i = 0; i < values.size(); ++i) {
      if (dtype == tk::DType::kF16) {
        const tk::f16 h(values[i]);
        std::memcpy(stored.data() + i * 2, &h, 2);
        expected[i] = static_cast<float>(h);
      } else if (dtype == tk::DType::kBF16) {
        const tk::bf16 h(values[i]);
        std::memcpy(stored.data() + i * 2, &h, 2);
        expected[i] = static_cast<float>(h);
      } else {
        const double d = double(values[i]) * 1.000000119;
        std::memcpy(stored.data() + i * 8, &d, 8);
        expected[i] = static_cast<float>(d);
      }
    }
    tk::AnyTensor small(tk::DType::kF32, tk::Shape{3});
    std::memcpy(small.data(), values.data(), 12);
    const auto path = dir / "converted.safetensors";
    const std::vector<io::NamedTensor> tensors = {{"x", stored}, {"y", small}};
    ckpt::save_checksummed_safetensors(path, tensors, {}, {.durable = false});
    for (const int way : {0, 1, 2}) {
      CAPTURE(way);  // 0: path, verified; 1: path, not verified; 2: a TensorSource
      nn::ParamArena<> arena;
      arena.add("a", tk::Shape{kN});
      arena.add("b", tk::Shape{kN});
      arena.add("y", tk::Shape{3});
      arena.finalize();
      const ckpt::ModelLoadOptions options{
          .tied = {{"x", "a"}, {"x", "b"}}, .convert_dtype = true, .verify_checksum = way == 0};
      const ckpt::ModelLoadReport r =
          way == 2 ? ckpt::load_model(arena, ckpt::TensorSource::open(path), options)
                   : ckpt::load_model(arena, path, options);
      CHECK(r.complete());
      CHECK(r.converted == std::vector<std::string>{"a", "b"});
      CHECK(r.loaded == std::vector<std::string>{"a", "b", "y"});
      const float* p = arena.params_data();
      CHECK(std::memcmp(p + arena.info(arena.at("a")).offset, expected.data(), kN * 4) == 0);
      CHECK(std::memcmp(p + arena.info(arena.at("b")).offset, expected.data(), kN * 4) == 0);
      CHECK(std::memcmp(p + arena.info(arena.at("y")).offset, values.data(), 12) == 0);
    }
  }
}
