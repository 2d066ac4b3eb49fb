// SPDX-License-Identifier: MIT
// Interop with the reference safetensors implementation (pip: numpy, safetensors), through
// tests/io/safetensors_interop.py: Python reads and re-serializes files we write (byte-identical),
// and we read files Python writes; every dtype, random shapes including 0-d and empty tensors.
// Python is $TRAINKIT_PYTHON (default python3). Without numpy/safetensors the script exits 77
// and the test only warns, unless TRAINKIT_REQUIRE_PYTHON_INTEROP=1 (CI) makes that a failure.
#include <doctest/doctest.h>

#include <sys/wait.h>

#include <cstdint>
#include <cstdlib>
#include <random>
#include <string>
#include <vector>

#include "io/io_test_util.hpp"
#include "trainkit/core/any_tensor.hpp"
#include "trainkit/io/json.hpp"
#include "trainkit/io/safetensors.hpp"

namespace io = trainkit::io;
using io::Json;
using io_test::TempDir;
using trainkit::AnyTensor;
using trainkit::AnyTensorView;
using trainkit::DType;

namespace {

const char* python() {
  const char* p = std::getenv("TRAINKIT_PYTHON");
  return p != nullptr && *p != '\0' ? p : "python3";
}

bool interop_required() {
  const char* r = std::getenv("TRAINKIT_REQUIRE_PYTHON_INTEROP");
  return r != nullptr && std::string(r) == "1";
}

/// Runs the interop script; returns its exit status (-1 when it did not exit normally).
int run_script(const std::string& args) {
  const std::string cmd = std::string("'") + python() + "' '" + TRAINKIT_SOURCE_DIR +
                          "/tests/io/safetensors_interop.py' " + args;
  const int status = std::system(cmd.c_str());
  return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}

std::string to_hex(const std::byte* p, std::size_t n) {
  static constexpr char kHex[] = "0123456789abcdef";
  std::string s;
  s.reserve(2 * n);
  for (std::size_t i = 0; i < n; ++i) {
    const auto b = static_cast<unsigned>(p[i]);
    s += kHex[b >> 4];
    s += kHex[b & 15];
  }
  return s;
}

std::vector<std::byte> from_hex(const std::string& hex) {
  std::vector<std::byte> out(hex.size() / 2);
  for (std::size_t i = 0; i < out.size(); ++i)
    out[i] = std::byte(std::stoi(hex.substr(2 * i, 2), nullptr, 16));
  return out;
}

const char* const kNamePool[] = {"embed.weight",
                                 "blocks.0.attn.qkv.weight",
                                 "h.1.mlp.c_fc.bias",
                                 "caf\xc3\xa9.\xc3\xbc"
                                 "ber",
                                 "quote\"and\\slash",
                                 "tab\tnew\nline",
                                 "emoji\xf0\x9f\x98\x80",
                                 "ctrl\x01\x1f",
                                 "lm_head.weight"};

}  // namespace

TEST_CASE("safetensors interop with the Python reference implementation") {
  TempDir dir;
  for (std::uint64_t seed : {1u, 2u, 3u}) {
    CAPTURE(seed);
    // ---- trainkit writes, the reference reads (and reproduces the bytes) ----
    std::mt19937_64 rng(seed);
    std::vector<AnyTensor> storage;
    std::vector<io::NamedTensor> tensors;
    int serial = 0;
    for (int round = 0; round < 2; ++round) {
      for (DType t : trainkit::kAllDTypes) {
        const int rank = int(rng() % 5);
        std::vector<std::int64_t> dims;
        for (int d = 0; d < rank; ++d) dims.push_back(rng() % 7 == 0 ? 0 : 1 + int(rng() % 5));
        if (round == 0 && t == DType::kF32) dims.clear();   // a 0-d tensor every time
        if (round == 1 && t == DType::kI16) dims = {3, 0};  // and an empty one
        AnyTensor a(t, trainkit::Shape(std::span<const std::int64_t>(dims)));
        for (std::size_t j = 0; j < a.bytes(); ++j)
          a.data()[j] = std::byte(t == DType::kBool ? rng() % 2 : rng() % 256);
        storage.push_back(std::move(a));
        std::string name = kNamePool[rng() % std::size(kNamePool)];
        name += '#';
        name += std::to_string(serial++);
        tensors.push_back({name, AnyTensorView()});
      }
    }
    for (std::size_t i = 0; i < tensors.size(); ++i) tensors[i].tensor = storage[i];
    const io::SafetensorsMetadata metadata = {{"format", "pt \xc3\xa9 \"q\"\n"}};
    const auto ours = dir / ("ours_" + std::to_string(seed) + ".safetensors");
    io::save_safetensors(ours, tensors, metadata);

    Json manifest = Json::object();
    Json meta = Json::object();
    for (const auto& [k, v] : metadata) meta.set(k, v);
    manifest.set("metadata", std::move(meta));
    Json list = Json::array();
    for (const auto& t : tensors) {
      Json e = Json::object();
      e.set("name", t.name);
      e.set("dtype", std::string(trainkit::dtype_name(t.tensor.dtype())));
      Json shape = Json::array();
      for (std::int64_t d : t.tensor.shape()) shape.push_back(d);
      e.set("shape", std::move(shape));
      e.set("hex", to_hex(t.tensor.data(), t.tensor.bytes()));
      list.push_back(std::move(e));
    }
    manifest.set("tensors", std::move(list));
    const auto ours_manifest = dir / ("ours_" + std::to_string(seed) + ".json");
    io::write_file_atomic(ours_manifest, std::string_view(manifest.dump()));

    const int rc = run_script("check '" + ours.string() + "' '" + ours_manifest.string() + "'");
    if (rc == 77) {
      if (interop_required())
        FAIL("TRAINKIT_REQUIRE_PYTHON_INTEROP=1 but ", std::string(python()),
             " cannot import numpy and safetensors");
      WARN_MESSAGE(false, "skipped: ", std::string(python()),
                   " has no numpy/safetensors (set TRAINKIT_PYTHON to one that has)");
      return;
    }
    REQUIRE_MESSAGE(rc == 0, "the reference rejected or misread our file (see stderr)");

    // ---- the reference writes, trainkit reads ----
    const auto theirs = dir / ("theirs_" + std::to_string(seed) + ".safetensors");
    const auto theirs_manifest = dir / ("theirs_" + std::to_string(seed) + ".json");
    REQUIRE(run_script("write '" + theirs.string() + "' '" + theirs_manifest.string() + "' " +
                       std::to_string(seed)) == 0);
    const Json expected = Json::parse(io_test::read_file(theirs_manifest), "python manifest");
    const io::SafetensorsFile file(theirs);
    const auto loaded = io::load_safetensors(theirs);
    REQUIRE(file.size() == expected.at("tensors").size());
    io::SafetensorsMetadata expected_meta;
    for (const auto& m : expected.at("metadata").as_object())
      expected_meta.emplace(m.key, m.value.as_string());
    CHECK(file.metadata() == expected_meta);

    std::vector<AnyTensor> their_storage;
    std::vector<io::NamedTensor> their_tensors;
    int zero_d = 0, empty = 0;
    for (const Json& e : expected.at("tensors").as_array()) {
      const std::string& name = e.at("name").as_string();
      CAPTURE(name);
      REQUIRE(file.contains(name));
      const AnyTensorView v = file.tensor(name);
      CHECK(trainkit::dtype_name(v.dtype()) == e.at("dtype").as_string());
      std::vector<std::int64_t> dims;
      for (const Json& d : e.at("shape").as_array()) dims.push_back(d.as_int());
      const trainkit::Shape shape{std::span<const std::int64_t>(dims)};
      CHECK(v.shape() == shape);
      const std::vector<std::byte> bytes = from_hex(e.at("hex").as_string());
      REQUIRE(v.bytes() == bytes.size());
      CHECK((bytes.empty() || std::memcmp(v.data(), bytes.data(), bytes.size()) == 0));
      const AnyTensor& l = loaded.at(name);
      CHECK((bytes.empty() || std::memcmp(l.data(), bytes.data(), bytes.size()) == 0));
      zero_d += shape.rank() == 0;
      empty += v.numel() == 0;
      AnyTensor copy(v.dtype(), shape);
      if (!bytes.empty()) std::memcpy(copy.data(), bytes.data(), bytes.size());
      their_storage.push_back(std::move(copy));
      their_tensors.push_back({name, AnyTensorView()});
    }
    CHECK(zero_d >= 1);
    CHECK(empty >= 1);
    // Our writer, given the same tensors, reproduces the reference's file byte for byte.
    for (std::size_t i = 0; i < their_tensors.size(); ++i)
      their_tensors[i].tensor = their_storage[i];
    CHECK(io_test::to_string(io::safetensors_bytes(their_tensors, expected_meta)) ==
          io_test::read_file(theirs));
  }
}
