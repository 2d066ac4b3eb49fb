// SPDX-License-Identifier: MIT
// bench/loader_overlap worker: `--steps` training steps, each taking a batch from the Prefetcher
// and then "computing" for `--compute_us` microseconds (a sleep: the host waits while a GPU
// would work, leaving the cores to the loader). Case "compute_only" is the same loop without a
// loader. Case "last_wait" reports the data-wait of the previous "trainkit" run (the time
// blocked in next(), from Prefetcher::stats()) through the protocol: it spins for that long.
#include <chrono>
#include <cstdint>
#include <string>
#include <thread>

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
  const std::size_t steps = std::stoul(tb::arg(argc, argv, "steps", "50"));
  const auto compute =
      std::chrono::microseconds(std::stol(tb::arg(argc, argv, "compute_us", "5000")));
  try {
    const tk::data::NpyDataset ds({{"x", x}, {"y", y}});
    tk::data::Prefetcher loader(
        ds, tk::data::RandomSampler(ds.size(), 0),
        {.batch_size = batch, .num_workers = workers, .depth = 2 * workers + 2});
    volatile float sink = 0;
    double last_wait = 0;
    auto train = [&] {
      loader.reset_stats();
      for (std::size_t s = 0; s < steps; ++s) {
        const tk::data::Batch b = loader.next();
        sink = sink + b.host<float, 2>("x")(0, 0);
        std::this_thread::sleep_for(compute);
      }
      last_wait = loader.stats().wait_seconds;
    };
    auto report = [&] {
      const double t0 = tb::now();
      while (tb::now() - t0 < last_wait) {
      }
    };
    auto compute_only = [&] {
      for (std::size_t s = 0; s < steps; ++s) std::this_thread::sleep_for(compute);
    };
    return tb::serve({{"workers", std::to_string(workers)}},
                     {{"trainkit", train}, {"last_wait", report}, {"compute_only", compute_only}});
  } catch (const std::exception& e) {
    std::fprintf(stderr, "overlap: %s\n", e.what());
    return 1;
  }
}
