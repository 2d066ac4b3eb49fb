// SPDX-License-Identifier: MIT
// bench/ckpt worker: ~1 GiB of f32 + bf16 tensors (half each, plus small f32 biases) saved with
// io::save_safetensors (crash-safe: temp file, fsync, rename, directory fsync) and loaded with
// io::load_safetensors (owning copies via pread, like load_file(backend="pread")) and opened as
// a zero-copy SafetensorsFile (mapped, like load_file's default; once more reading every byte).
// Also times `dd ... conv=fsync` copying the same bytes: the disk's fsynced write bandwidth, into
// a new file renamed over the old one (what a crash-safe save does) and in place.
#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <iostream>
#include <stdexcept>
#include <string>
#include <vector>

#include "bench.hpp"
#include "trainkit/core/any_tensor.hpp"
#include "trainkit/io/safetensors.hpp"

namespace io = trainkit::io;
namespace tb = trainkit_bench;
using trainkit::AnyTensor;
using trainkit::DType;

int main(int argc, char** argv) {
  const std::filesystem::path dir = tb::arg(argc, argv, "dir", "");
  const long mib = std::stol(tb::arg(argc, argv, "mib", "1024"));
  if (dir.empty() || mib < 64) {
    std::cerr << "usage: ckpt --dir=DIR [--mib=1024]\n";
    return 2;
  }
  // Half the bytes in 2048x2048 f32 matrices, half in 2048x4096 bf16 ones (16 MiB each).
  const long per_kind = mib / 2 / 16;
  std::vector<AnyTensor> storage;
  std::vector<io::NamedTensor> tensors;
  std::uint32_t state = 2024;
  for (long i = 0; i < per_kind; ++i) {
    for (DType t : {DType::kF32, DType::kBF16}) {
      AnyTensor a(t, t == DType::kF32 ? trainkit::Shape{2048, 2048} : trainkit::Shape{2048, 4096});
      auto* words = reinterpret_cast<std::uint32_t*>(a.data());
      for (std::size_t j = 0; j < a.bytes() / 4; ++j) {
        state = state * 1664525u + 1013904223u;
        words[j] = 0x3c000000u | (state >> 8);  // finite f32 / bf16 pairs
      }
      const std::string kind = t == DType::kF32 ? "mlp.weight" : "attn.weight_bf16";
      tensors.push_back({"layers." + std::to_string(i) + "." + kind, {}});
      storage.push_back(std::move(a));
      AnyTensor bias(DType::kF32, {2048});
      std::fill_n(reinterpret_cast<float*>(bias.data()), 2048, 0.5f);
      tensors.push_back({"layers." + std::to_string(i) + "." + kind + ".bias", {}});
      storage.push_back(std::move(bias));
    }
  }
  for (std::size_t i = 0; i < tensors.size(); ++i) tensors[i].tensor = storage[i];
  std::uint64_t total = 0;
  for (const auto& t : tensors) total += t.tensor.bytes();

  const auto file = dir / "tk.safetensors";
  const auto init = dir / "init.safetensors";
  io::save_safetensors(init, tensors);  // the data the Python peer loads: same bytes everywhere
  io::save_safetensors(file, tensors);
  const std::uint64_t file_bytes = std::filesystem::file_size(file);
  // dd copies the same bytes (from the page cache: init was just written), not /dev/zero, which
  // virtual disks may store as holes. `dd_new` writes a new file and renames it over the old one,
  // the pattern every crash-safe save needs (the old file must survive until the rename);
  // `dd_inplace` overwrites one file, which on thin-provisioned virtual disks reuses blocks the
  // host already backs and can be several times faster than writing fresh ones.
  const std::string dd_args = "dd if='" + init.string() + "' bs=4M conv=fsync status=none of=";
  const std::string tmp = (dir / ".dd.tmp").string(), ddfile = (dir / "dd.bin").string();
  const std::string dd_new = dd_args + "'" + tmp + "' && mv -f '" + tmp + "' '" + ddfile + "'";
  const std::string dd_inplace = dd_args + "'" + (dir / "dd_inplace.bin").string() + "'";
  const auto shell = [](const std::string& cmd) {
    if (std::system(cmd.c_str()) != 0) throw std::runtime_error("failed: " + cmd);
  };

  std::vector<tb::Case> cases = {
      {"save", [&] { io::save_safetensors(file, tensors); }},
      {"load",
       [&] {
         const auto loaded = io::load_safetensors(file);
         if (loaded.size() != tensors.size()) throw std::runtime_error("load: wrong count");
       }},
      {"open",
       [&] {
         const io::SafetensorsFile f(file);
         std::size_t n = 0;
         for (std::size_t i = 0; i < f.size(); ++i) n += f.tensor_at(i).numel() > 0;
         if (n != tensors.size()) throw std::runtime_error("open: wrong count");
       }},
      {"load_mmap",
       [&] {
         const io::SafetensorsFile f(file);
         std::uint64_t sum = 0;
         for (std::size_t i = 0; i < f.size(); ++i) {
           const auto v = f.tensor_at(i);
           const auto* w = reinterpret_cast<const std::uint64_t*>(v.data());
           for (std::size_t j = 0; j < v.bytes() / 8; ++j) sum += w[j];
         }
         if (sum == 42) std::cerr << "unlikely\n";  // keeps the reads
       }},
      {"dd_new", [&] { shell(dd_new); }},
      {"dd_inplace", [&] { shell(dd_inplace); }},
  };
  return tb::serve({{"bytes", std::to_string(file_bytes)},
                    {"tensors", std::to_string(tensors.size())},
                    {"data_bytes", std::to_string(total)},
                    {"init", init.string()}},
                   cases);
}
