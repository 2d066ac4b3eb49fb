// ThreadComm: every collective x dtype x size against float64 references and bitwise against the
// documented summation order, 10^7 elements, determinism under random timing, argument errors,
// and faults (a stalled rank, a rank that leaves mid-collective or early, mismatched calls), each
// of which must fail every other rank with an error naming the culprit within the timeout.
#include <doctest/doctest.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <mutex>
#include <span>
#include <string>
#include <thread>
#include <vector>

#include <trainkit/dist/thread_comm.hpp>

#include "dist/dist_test_util.hpp"

namespace {

namespace tk = trainkit;
namespace dist = trainkit::dist;
using Clock = std::chrono::steady_clock;

// Collects per-rank messages from rank threads; checked on the test thread (doctest asserts are
// kept off the rank threads).
struct Messages {
  std::mutex mutex;
  std::vector<std::string> items;
  void add(std::string s) {
    std::lock_guard<std::mutex> lock(mutex);
    items.push_back(std::move(s));
  }
};

double seconds_since(Clock::time_point t0) {
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

}  // namespace

TEST_CASE("ThreadComm: every op, dtype and size, worlds 1-4 (float64 reference, fixed order)") {
  for (int world_size = 1; world_size <= 4; ++world_size) {
    CAPTURE(world_size);
    const auto cases = disttest::all_cases(world_size);
    Messages errors;
    // Tiny chunks: the sizes above span many pipelined chunks per ring step.
    dist::ThreadCommOptions options;
    options.chunk_bytes = 96;
    options.timeout = std::chrono::milliseconds(20000);
    dist::ThreadComm::run(
        world_size,
        [&](dist::ThreadComm& comm) {
          for (const auto& c : cases) {
            const std::string e = disttest::run_case(comm, c, true);
            if (!e.empty()) {
              errors.add(e);
              break;
            }
          }
        },
        options);
    CHECK(cases.size() > 300);
    for (const auto& e : errors.items) FAIL_CHECK(e);
  }
}

TEST_CASE("ThreadComm: default chunking on a prime size larger than a chunk") {
  Messages errors;
  dist::ThreadComm::run(3, [&](dist::ThreadComm& comm) {
    for (dist::ReduceOp op : {dist::ReduceOp::kSum, dist::ReduceOp::kAvg}) {
      const disttest::Case c{disttest::Kind::kAllReduce, op, tk::DType::kF32, 300007, 0, false, 77};
      if (auto e = disttest::run_case(comm, c, true); !e.empty()) errors.add(e);
    }
    const disttest::Case rs{disttest::Kind::kReduceScatter,
                            dist::ReduceOp::kSum,
                            tk::DType::kBF16,
                            100003,
                            0,
                            false,
                            78};
    if (auto e = disttest::run_case(comm, rs, true); !e.empty()) errors.add(e);
  });
  for (const auto& e : errors.items) FAIL_CHECK(e);
}

TEST_CASE("ThreadComm: 10^7-element all_reduce (avg, 3 ranks), bitwise in the fixed order") {
  constexpr std::int64_t n = 10'000'000;
  const disttest::Case c{
      disttest::Kind::kAllReduce, dist::ReduceOp::kAvg, tk::DType::kF32, n, 0, false, 4242};
  std::atomic<std::int64_t> wrong{0}, checked{0};
  dist::ThreadComm::run(3, [&](dist::ThreadComm& comm) {
    std::vector<float> buf = disttest::values<float>(c.seed, comm.rank(), n);
    comm.all_reduce(std::span<float>(buf), c.op).wait();
    // Each rank checks every third element (the same result is on every rank).
    int segment = 0;
    std::int64_t bad = 0, count = 0;
    for (std::int64_t i = 0; i < n; ++i) {
      while ((segment + 1) * n / 3 <= i) ++segment;
      if (i % 3 != comm.rank()) continue;
      const float want = disttest::chain_reference<float>(c, 3, segment, i);
      const double ref = disttest::reference<float>(c, 3, i);
      const float got = buf[static_cast<std::size_t>(i)];
      bad += !disttest::same_bits(got, want) || std::fabs(got - ref) > 1e-6;
      ++count;
    }
    wrong += bad;
    checked += count;
  });
  CHECK(checked.load() == n);
  CHECK(wrong.load() == 0);
}

TEST_CASE("ThreadComm: results do not depend on timing (random stalls, repeated runs)") {
  constexpr std::int64_t n = 20011;
  std::vector<std::vector<float>> results;
  for (int trial = 0; trial < 3; ++trial) {
    dist::ThreadCommOptions options;
    options.chunk_bytes = 1024;
    options.fault_injection = [trial](int rank, std::uint64_t, std::int64_t unit) {
      if (disttest::mix(static_cast<std::uint64_t>(trial * 1000 + rank * 100 + unit)) % 7 == 0)
        std::this_thread::sleep_for(std::chrono::microseconds(200));
    };
    std::vector<float> out;
    std::mutex m;
    dist::ThreadComm::run(
        4,
        [&](dist::ThreadComm& comm) {
          std::vector<float> buf = disttest::values<float>(5, comm.rank(), n);
          comm.all_reduce(std::span<float>(buf), dist::ReduceOp::kSum).wait();
          if (comm.rank() == 2) {
            std::lock_guard<std::mutex> lock(m);
            out = buf;
          }
        },
        options);
    results.push_back(out);
  }
  REQUIRE(results[0].size() == static_cast<std::size_t>(n));
  CHECK(std::memcmp(results[0].data(), results[1].data(), n * sizeof(float)) == 0);
  CHECK(std::memcmp(results[0].data(), results[2].data(), n * sizeof(float)) == 0);
}

TEST_CASE("ThreadComm: collectives are asynchronous and complete in call order") {
  Messages errors;
  dist::ThreadComm::run(2, [&](dist::ThreadComm& comm) {
    std::vector<std::vector<std::int32_t>> bufs(8, std::vector<std::int32_t>(1000));
    std::vector<dist::Work> works;
    for (std::size_t k = 0; k < bufs.size(); ++k) {
      for (auto& x : bufs[k]) x = static_cast<std::int32_t>(k) + comm.rank();
      works.push_back(comm.all_reduce(std::span<std::int32_t>(bufs[k]), dist::ReduceOp::kSum));
    }
    works.push_back(comm.barrier());
    // The last one finished implies all earlier ones did (one progress thread, FIFO).
    works.back().wait();
    for (std::size_t k = 0; k < bufs.size(); ++k) {
      if (!works[k].test()) errors.add("work " + std::to_string(k) + " not complete");
      if (bufs[k][999] != static_cast<std::int32_t>(2 * k + 1))
        errors.add("wrong value in buffer " + std::to_string(k));
    }
    dist::Work empty;
    empty.wait();
    if (!empty.test() || empty.valid()) errors.add("an empty Work must be complete and invalid");
  });
  for (const auto& e : errors.items) FAIL_CHECK(e);
}

TEST_CASE("ThreadComm: argument errors throw at the call") {
  auto group = std::make_shared<dist::ThreadGroup>(2);
  dist::ThreadComm comm(group, 0);
  std::vector<float> a(10), b(15);
  std::vector<std::uint8_t> bytes(4);
  CHECK_THROWS_WITH_AS(comm.all_reduce(std::span<std::uint8_t>(bytes), dist::ReduceOp::kSum),
                       doctest::Contains("cannot reduce U8"), tk::Error);
  CHECK_THROWS_WITH_AS(comm.all_gather(std::span<float>(a), std::span<float>(b)),
                       doctest::Contains("recv must hold world_size * send.count = 2 * 10"),
                       tk::Error);
  CHECK_THROWS_WITH_AS(
      comm.reduce_scatter(std::span<float>(b), std::span<float>(a), dist::ReduceOp::kSum),
      doctest::Contains("send must hold world_size * recv.count"), tk::Error);
  CHECK_THROWS_WITH_AS(comm.broadcast(std::span<float>(a), 2), doctest::Contains("root 2"),
                       tk::Error);
  CHECK_THROWS_WITH_AS(comm.all_reduce(dist::device_buffer(a.data(), 10), dist::ReduceOp::kSum),
                       doctest::Contains("device memory"), tk::Error);
  CHECK_THROWS_WITH_AS(dist::ThreadComm(group, 0), doctest::Contains("already has a ThreadComm"),
                       tk::Error);
  CHECK_THROWS_WITH_AS(dist::ThreadComm(group, 2), doctest::Contains("not in [0, 2)"), tk::Error);
  // Broadcast and all_gather move any dtype.
  CHECK_NOTHROW(dist::ThreadGroup(1));
}

TEST_CASE("ThreadComm: counts whose world_size multiple wraps round are refused at the call") {
  // 4 * 2^62 wraps to 0 in 64 bits: a check that multiplies took a send of 2^62 elements with an
  // empty recv (and then copied 2^64 bytes), or an empty send with a recv of 2^62.
  auto group = std::make_shared<dist::ThreadGroup>(4);
  dist::ThreadComm comm(group, 0);
  float x = 0.0f, y = 0.0f;
  const std::int64_t huge = std::int64_t{1} << 62;
  for (const std::int64_t big : {huge, huge + 1, huge + 1000}) {
    CAPTURE(big);
    const std::int64_t wrapped = static_cast<std::int64_t>(static_cast<std::uint64_t>(big) * 4);
    CHECK_THROWS_WITH_AS(comm.all_gather(dist::Buffer(&x, big, tk::DType::kF32),
                                         dist::Buffer(&y, wrapped, tk::DType::kF32)),
                         doctest::Contains("all_gather: recv must hold world_size * send.count"),
                         tk::Error);
    CHECK_THROWS_WITH_AS(
        comm.reduce_scatter(dist::Buffer(&x, wrapped, tk::DType::kF32),
                            dist::Buffer(&y, big, tk::DType::kF32), dist::ReduceOp::kSum),
        doctest::Contains("reduce_scatter: send must hold world_size * recv.count"), tk::Error);
  }
  // A count that is not a multiple of world_size either.
  std::vector<float> a(3), b(13);
  CHECK_THROWS_AS(comm.all_gather(std::span<float>(a), std::span<float>(b)), tk::Error);
  CHECK_THROWS_AS(
      comm.reduce_scatter(std::span<float>(b), std::span<float>(a), dist::ReduceOp::kSum),
      tk::Error);
}

TEST_CASE("ThreadGroup: a timeout whose deadline would overflow the clock is refused") {
  // milliseconds::max() ("never") made every deadline wrap into the past: the first wait failed
  // at once, "made no progress for 9.22337e+15 s".
  dist::ThreadCommOptions o;
  for (const auto t : {std::chrono::milliseconds::max(),
                       std::chrono::milliseconds(std::int64_t{10000000} * 1000 + 1),
                       std::chrono::milliseconds(0), std::chrono::milliseconds(-5)}) {
    CAPTURE(t.count());
    o.timeout = t;
    CHECK_THROWS_WITH_AS(dist::ThreadGroup(2, o),
                         doctest::Contains("ThreadGroup: the timeout must be positive and at "
                                           "most 10^7 s"),
                         tk::Error);
  }
  // The longest accepted timeout works: a collective completes (and does not fail at once).
  o.timeout = std::chrono::milliseconds(std::int64_t{10000000} * 1000);
  std::vector<float> sums(2);
  dist::ThreadComm::run(
      2,
      [&](dist::ThreadComm& comm) {
        if (comm.rank() == 1) std::this_thread::sleep_for(std::chrono::milliseconds(50));
        std::vector<float> v{static_cast<float>(comm.rank()) + 1.0f};
        comm.all_reduce(std::span<float>(v), dist::ReduceOp::kSum).wait();
        sums[static_cast<std::size_t>(comm.rank())] = v[0];
      },
      o);
  CHECK(sums[0] == 3.0f);
  CHECK(sums[1] == 3.0f);
}

TEST_CASE("ThreadComm: a stalled rank fails every other rank within the timeout, naming it") {
  constexpr int world_size = 4;
  const auto timeout = std::chrono::milliseconds(400);
  dist::ThreadCommOptions options;
  options.timeout = timeout;
  options.chunk_bytes = 64;
  // Rank 2 stalls inside its second collective for far longer than the timeout.
  options.fault_injection = [](int rank, std::uint64_t op, std::int64_t unit) {
    if (rank == 2 && op == 2 && unit == 1) std::this_thread::sleep_for(std::chrono::seconds(2));
  };
  Messages errors;
  std::vector<double> elapsed(world_size, -1.0);
  const auto t0 = Clock::now();
  CHECK_THROWS_AS(dist::ThreadComm::run(
                      world_size,
                      [&](dist::ThreadComm& comm) {
                        std::vector<float> buf(1000, 1.0f);
                        comm.all_reduce(std::span<float>(buf), dist::ReduceOp::kSum).wait();
                        const auto start = Clock::now();
                        try {
                          comm.all_reduce(std::span<float>(buf), dist::ReduceOp::kSum).wait();
                        } catch (const tk::Error& e) {
                          elapsed[static_cast<std::size_t>(comm.rank())] = seconds_since(start);
                          if (comm.rank() != 2)
                            errors.add(std::to_string(comm.rank()) + "|" + e.what());
                          throw;
                        }
                      },
                      options),
                  tk::Error);
  (void)t0;
  REQUIRE(errors.items.size() == world_size - 1);
  for (const auto& e : errors.items) {
    CAPTURE(e);
    CHECK(e.find("rank 2 is stuck inside collective #2") != std::string::npos);
  }
  for (int r = 0; r < world_size; ++r) {
    if (r == 2) continue;
    CAPTURE(r);
    CHECK(elapsed[static_cast<std::size_t>(r)] > 0.0);
    // Well before the stall ends (2 s): the timeout plus scheduling slack on a busy machine.
    CHECK(elapsed[static_cast<std::size_t>(r)] < 1.5);
  }
}

TEST_CASE("ThreadComm: a rank that never arrives is named ('has not entered')") {
  dist::ThreadCommOptions options;
  options.timeout = std::chrono::milliseconds(300);
  Messages errors;
  auto group = std::make_shared<dist::ThreadGroup>(3, options);
  std::atomic<bool> release{false};
  std::vector<std::thread> threads;
  for (int r = 0; r < 3; ++r) {
    threads.emplace_back([&, r] {
      dist::ThreadComm comm(group, r);
      if (r == 1) {  // alive, holding its ThreadComm, but never calls the collective
        while (!release.load()) std::this_thread::sleep_for(std::chrono::milliseconds(5));
        return;
      }
      std::vector<double> buf(10, 1.0);
      try {
        comm.all_reduce(std::span<double>(buf), dist::ReduceOp::kMax).wait();
        errors.add("rank " + std::to_string(r) + " did not fail");
      } catch (const tk::Error& e) {
        errors.add(e.what());
      }
    });
  }
  std::this_thread::sleep_for(std::chrono::milliseconds(50));
  // Ranks 0 and 2 fail on their own; only then may rank 1 leave.
  while (true) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
    if (group->aborted()) break;
  }
  release = true;
  for (auto& t : threads) t.join();
  REQUIRE(errors.items.size() == 2);
  bool named = false;
  for (const auto& e : errors.items) {
    CAPTURE(e);
    CHECK(e.find("rank 1") != std::string::npos);
    named = named || e.find("rank 1 has not entered collective #1") != std::string::npos;
  }
  CHECK(named);
}

TEST_CASE("ThreadComm: a rank that throws mid-collective fails the others at once") {
  dist::ThreadCommOptions options;
  options.timeout = std::chrono::milliseconds(30000);  // must not be what ends the test
  Messages errors;
  const auto t0 = Clock::now();
  // The buffers outlive the ranks' threads: a rank's buffer must stay valid until its collective
  // completed, even when its thread throws (the others read it until they see the failure).
  std::vector<std::vector<float>> bufs(3, std::vector<float>(100000, 1.0f));
  try {
    dist::ThreadComm::run(
        3,
        [&](dist::ThreadComm& comm) {
          std::vector<float>& buf = bufs[static_cast<std::size_t>(comm.rank())];
          if (comm.rank() == 1) {
            // Starts its part, then its thread dies without waiting: ~ThreadComm aborts the group.
            comm.all_reduce(std::span<float>(buf), dist::ReduceOp::kSum);
            throw std::runtime_error("rank 1 crashed");
          }
          try {
            comm.all_reduce(std::span<float>(buf), dist::ReduceOp::kSum).wait();
            std::this_thread::sleep_for(std::chrono::milliseconds(20));
            comm.all_reduce(std::span<float>(buf), dist::ReduceOp::kSum).wait();
            errors.add("rank " + std::to_string(comm.rank()) + " did not fail");
          } catch (const tk::Error& e) {
            errors.add(e.what());
          }
        },
        options);
    FAIL("run() should rethrow rank 1's exception");
  } catch (const std::runtime_error& e) {
    CHECK(std::string(e.what()).find("crashed") != std::string::npos);
  }
  CHECK(seconds_since(t0) < 10.0);
  REQUIRE(errors.items.size() == 2);
  for (const auto& e : errors.items) {
    CAPTURE(e);
    CHECK(e.find("rank 1 left the group") != std::string::npos);
  }
}

TEST_CASE("ThreadComm: a rank that left between collectives is named by the next one") {
  dist::ThreadCommOptions options;
  options.timeout = std::chrono::milliseconds(30000);
  Messages errors;
  dist::ThreadComm::run(
      2,
      [&](dist::ThreadComm& comm) {
        std::vector<std::int64_t> buf(10, 1);
        comm.all_reduce(std::span<std::int64_t>(buf), dist::ReduceOp::kSum).wait();
        if (comm.rank() == 0) return;  // leaves cleanly, nothing in flight
        try {
          comm.all_reduce(std::span<std::int64_t>(buf), dist::ReduceOp::kSum).wait();
          errors.add("rank 1 did not fail");
        } catch (const tk::Error& e) {
          errors.add(e.what());
        }
        // The group is aborted now: every later collective fails at once.
        try {
          comm.barrier().wait();
          errors.add("barrier after the abort did not fail");
        } catch (const tk::Error& e) {
          errors.add(e.what());
        }
      },
      options);
  REQUIRE(errors.items.size() == 2);
  CHECK(errors.items[0].find("rank 0 left the group") != std::string::npos);
  CHECK(errors.items[1].find("refused: the group was aborted earlier") != std::string::npos);
}

TEST_CASE("ThreadComm: mismatched collectives are detected") {
  Messages errors;
  try {
    dist::ThreadComm::run(2, [&](dist::ThreadComm& comm) {
      std::vector<float> buf(comm.rank() == 0 ? 10 : 11, 1.0f);
      try {
        comm.all_reduce(std::span<float>(buf), dist::ReduceOp::kSum).wait();
      } catch (const tk::Error& e) {
        errors.add(e.what());
        throw;
      }
    });
  } catch (const tk::Error&) {
  }
  REQUIRE(errors.items.size() == 2);
  bool described = false;
  for (const auto& e : errors.items)
    described = described || (e.find("does not match") != std::string::npos &&
                              e.find("all_reduce(10 x F32, sum)") != std::string::npos &&
                              e.find("all_reduce(11 x F32, sum)") != std::string::npos);
  CHECK(described);
}
