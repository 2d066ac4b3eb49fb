// SPDX-License-Identifier: MIT
// bench/loader worker: data::Prefetcher over an NpyDataset (features + labels written by numpy),
// shuffled with RandomSampler, batch 256, 2 workers. Case "trainkit" takes --batches batches;
// "probe_gather" copies the same number of random rows with one plain loop (the memory roofline
// of the gather a loader must do).
#include <cstdint>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include <trainkit/data/npy_dataset.hpp>
#include <trainkit/data/prefetcher.hpp>
#include <trainkit/data/sampler.hpp>

#include "bench.hpp"

namespace tk = trainkit;
namespace tb = trainkit_bench;

int main(int argc, char** argv) {
  const std::string x = tb::arg(argc, argv, "x", "");
  const std::string y = tb::arg(argc, argv, "y", "");
  const std::size_t batch = std::stoul(tb::arg(argc, argv, "batch", "256"));
  const std::size_t workers = std::stoul(tb::arg(argc, argv, "workers", "2"));
  const std::size_t batches = std::stoul(tb::arg(argc, argv, "batches", "40"));
  try {
    const tk::data::NpyDataset ds({{"x", x}, {"y", y}});
    tk::data::Prefetcher loader(
        ds, tk::data::RandomSampler(ds.size(), 0),
        {.batch_size = batch, .num_workers = workers, .depth = 2 * workers + 2});
    volatile double sink = 0;
    auto take = [&] {
      for (std::size_t k = 0; k < batches; ++k) {
        const tk::data::Batch b = loader.next();
        const auto xv = b.host<float, 2>("x");
        const auto yv = b.host<std::int64_t, 1>("y");
        sink = sink + xv(0, 0) + xv(xv.size(0) - 1, 783) + static_cast<double>(yv(0));
      }
    };
    const std::size_t row = ds.fields()[0].bytes();
    std::vector<std::byte> out(batch * row);
    std::uint64_t epoch = 0;
    std::vector<std::int64_t> perm = tk::data::torch_randperm(std::int64_t(ds.size()), 0);
    std::size_t pos = 0;
    auto gather = [&] {
      for (std::size_t k = 0; k < batches; ++k) {
        for (std::size_t r = 0; r < batch; ++r) {
          if (pos == perm.size()) {
            perm = tk::data::torch_randperm(std::int64_t(ds.size()), ++epoch);
            pos = 0;
          }
          std::memcpy(out.data() + r * row, ds.file(0).data() + std::size_t(perm[pos++]) * row,
                      row);
        }
        sink = sink + static_cast<double>(out[0] == std::byte{1});
      }
    };
    return tb::serve({{"n", std::to_string(ds.size())},
                      {"workers", std::to_string(workers)},
                      {"pinned", loader.pinned() ? "1" : "0"},
                      {"hw_threads", std::to_string(std::thread::hardware_concurrency())}},
                     {{"trainkit", take}, {"probe_gather", gather}});
  } catch (const std::exception& e) {
    std::fprintf(stderr, "loader: %s\n", e.what());
    return 1;
  }
}
