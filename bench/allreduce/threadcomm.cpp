// SPDX-License-Identifier: MIT
// bench/allreduce worker: a ThreadComm group of 2 ranks in this process, each rank a thread that
// does what a data-parallel rank does: issue an all-reduce and wait for it. Case "tc_<bytes>"
// runs <iters> in-place f32 sum all-reduces of <bytes> per rank back to back on both rank
// threads and reports the time of the whole loop; the driver divides by the iteration count
// (the same formula as the MPI peer's).
#include <bench.hpp>

#include <condition_variable>
#include <cstdint>
#include <memory>
#include <mutex>
#include <span>
#include <string>
#include <thread>
#include <vector>

#include <trainkit/dist/thread_comm.hpp>

namespace dist = trainkit::dist;

namespace {

struct Job {
  std::mutex mutex;
  std::condition_variable cv;
  std::uint64_t generation = 0;
  std::int64_t n = 0, iters = 0;  // n < 0: quit
  int done = 0;
};

void rank_loop(dist::ThreadComm& comm, Job& job, std::vector<float>& buf) {
  std::uint64_t seen = 0;
  for (;;) {
    std::int64_t n = 0, iters = 0;
    {
      std::unique_lock<std::mutex> lock(job.mutex);
      job.cv.wait(lock, [&] { return job.generation != seen; });
      seen = job.generation;
      n = job.n;
      iters = job.iters;
    }
    if (n < 0) return;
    for (std::int64_t i = 0; i < iters; ++i)
      comm.all_reduce(std::span<float>(buf.data(), static_cast<std::size_t>(n)),
                      dist::ReduceOp::kSum)
          .wait();
    {
      std::lock_guard<std::mutex> lock(job.mutex);
      ++job.done;
    }
    job.cv.notify_all();
  }
}

}  // namespace

int main(int argc, char** argv) {
  const std::int64_t max_bytes =
      std::stoll(trainkit_bench::arg(argc, argv, "max-bytes", "268435456"));
  const std::int64_t min_bytes = std::stoll(trainkit_bench::arg(argc, argv, "min-bytes", "1024"));
  const std::int64_t target =
      std::stoll(trainkit_bench::arg(argc, argv, "target-bytes", "33554432"));
  auto group = std::make_shared<dist::ThreadGroup>(2);
  std::vector<std::vector<float>> bufs(2);
  bufs[0].assign(static_cast<std::size_t>(max_bytes / 4), 1.0f);
  bufs[1].assign(static_cast<std::size_t>(max_bytes / 4), 2.0f);
  Job job;
  std::vector<std::thread> ranks;
  for (int r = 0; r < 2; ++r)
    ranks.emplace_back([&, r] {
      dist::ThreadComm comm(group, r);
      rank_loop(comm, job, bufs[static_cast<std::size_t>(r)]);
    });
  auto run = [&](std::int64_t n, std::int64_t iters) {
    std::unique_lock<std::mutex> lock(job.mutex);
    job.n = n;
    job.iters = iters;
    job.done = 0;
    ++job.generation;
    job.cv.notify_all();
    job.cv.wait(lock, [&] { return job.done == 2 || n < 0; });
  };
  std::vector<trainkit_bench::Case> cases;
  for (std::int64_t bytes = min_bytes; bytes <= max_bytes; bytes *= 4) {
    const std::int64_t iters =
        std::max<std::int64_t>(1, std::min<std::int64_t>(2000, target / bytes));
    cases.push_back(
        {"tc_" + std::to_string(bytes), [&run, bytes, iters] { run(bytes / 4, iters); }});
  }
  const int rc = trainkit_bench::serve({{"ranks", "2"}, {"impl", "ThreadComm"}}, cases);
  run(-1, 0);
  for (auto& t : ranks) t.join();
  return rc;
}
