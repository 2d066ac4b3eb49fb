// Tests for exec/host.hpp: the thread pool runs every task exactly once, on several threads,
// propagates the first exception, survives nesting, concurrent callers, tiny jobs in a tight
// loop and repeated construction/destruction.
#include <doctest/doctest.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <mutex>
#include <set>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include <trainkit/exec/host.hpp>

namespace {

using trainkit::exec::Host;

// Sets an environment variable for the scope of a test and restores the old value.
class ScopedEnv {
 public:
  ScopedEnv(const char* name, const char* value) : name_(name) {
    if (const char* old = std::getenv(name)) {
      had_ = true;
      old_ = old;
    }
    if (value != nullptr) ::setenv(name, value, 1);
    else ::unsetenv(name);
  }
  ~ScopedEnv() {
    if (had_) ::setenv(name_, old_.c_str(), 1);
    else ::unsetenv(name_);
  }

 private:
  const char* name_;
  bool had_ = false;
  std::string old_;
};

// Runs parallel_for and checks that each task ran exactly once.
void check_each_task_once(const Host& host, std::int64_t num_tasks) {
  std::vector<std::atomic<int>> hits(static_cast<std::size_t>(num_tasks));
  host.parallel_for(num_tasks, [&](std::int64_t task) {
    hits[static_cast<std::size_t>(task)].fetch_add(1, std::memory_order_relaxed);
  });
  int wrong = 0;
  for (const auto& hit : hits) wrong += hit.load() != 1;
  CHECK_MESSAGE(wrong == 0, num_tasks, " tasks on ", host.num_threads(), " threads");
}

}  // namespace

TEST_CASE("Host: thread counts from the constructor and TRAINKIT_NUM_THREADS") {
  CHECK(Host(1).num_threads() == 1);
  CHECK(Host(3).num_threads() == 3);
  CHECK_THROWS_AS(Host(0), trainkit::Error);
  CHECK_THROWS_AS(Host(-2), trainkit::Error);
  CHECK_THROWS_WITH_AS(Host(4097), doctest::Contains("num_threads must be in 1..4096, got 4097"),
                       trainkit::Error);  // INT_MAX reserved 16 GiB and threw bad_alloc
  {
    ScopedEnv env("TRAINKIT_NUM_THREADS", "5");
    CHECK(Host().num_threads() == 5);
  }
  for (const char* bad : {"0", "-1", "abc", "3x", "99999", " 4", "+4", "\t2", "4\n"}) {
    CAPTURE(bad);
    ScopedEnv env("TRAINKIT_NUM_THREADS", bad);
    CHECK_THROWS_AS(Host(), trainkit::Error);
  }
  {
    ScopedEnv env("TRAINKIT_NUM_THREADS", "\x1b[2J7");  // shown escaped
    CHECK_THROWS_WITH_AS(
        Host(),
        "trainkit: TRAINKIT_NUM_THREADS='\\x1b[2J7' is not a thread count (expected 1..4096)",
        trainkit::Error);
  }
  {
    ScopedEnv env("TRAINKIT_NUM_THREADS", nullptr);
    const unsigned hardware = std::thread::hardware_concurrency();
    CHECK(Host().num_threads() == (hardware == 0 ? 1 : static_cast<int>(hardware)));
  }
  Host& a = Host::default_instance();
  Host& b = Host::default_instance();
  CHECK(&a == &b);
  CHECK(a.num_threads() >= 1);
}

TEST_CASE("Host: the default thread count takes every hardware thread, within 1..4096") {
  namespace d = trainkit::exec::detail;
  static_assert(d::threads_for_hardware(0) == 1);  // unknown
  CHECK(d::threads_for_hardware(1) == 1);
  CHECK(d::threads_for_hardware(2) == 2);
  CHECK(d::threads_for_hardware(4096) == 4096);
  CHECK(d::threads_for_hardware(4097) == 4096);  // Host() used to throw on such a machine
  CHECK(d::threads_for_hardware(~0u) == 4096);
  CHECK(d::threads_for_hardware(std::thread::hardware_concurrency()) >= 1);
}

TEST_CASE("Host: parallel_for runs every task exactly once") {
  for (int threads = 1; threads <= 8; ++threads) {
    const Host host(threads);
    for (std::int64_t tasks : {0, 1, 2, 3, 7, 8, 9, 17, 1000}) check_each_task_once(host, tasks);
  }
  int calls = 0;
  Host(4).parallel_for(-5, [&](std::int64_t) { ++calls; });
  CHECK(calls == 0);
}

TEST_CASE("Host: tasks really run on several threads") {
  const Host host(4);
  std::mutex mutex;
  std::set<std::thread::id> ids;
  // Each task sleeps, so one thread cannot run them all before the others wake up.
  host.parallel_for(16, [&](std::int64_t) {
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
    const std::lock_guard<std::mutex> lock(mutex);
    ids.insert(std::this_thread::get_id());
  });
  CHECK(ids.size() >= 2);
  CHECK(ids.size() <= 4);
  CHECK(ids.count(std::this_thread::get_id()) == 1);  // the caller takes part
}

TEST_CASE("Host: the first exception of a task reaches the caller") {
  for (int threads : {1, 2, 4}) {
    const Host host(threads);
    std::atomic<int> ran{0};
    try {
      host.parallel_for(100, [&](std::int64_t task) {
        ran.fetch_add(1);
        if (task == 37) throw std::runtime_error("task 37 failed");
      });
      FAIL("no exception");
    } catch (const std::runtime_error& e) {
      CHECK(std::string(e.what()) == "task 37 failed");
    }
    CHECK(ran.load() >= 1);
    CHECK(ran.load() <= 100);
    // Several failing tasks: exactly one exception, of the thrown type; the pool still works.
    CHECK_THROWS_AS(host.parallel_for(64,
                                      [](std::int64_t task) {
                                        if (task % 3 == 0) TRAINKIT_FAIL("task ", task);
                                      }),
                    trainkit::Error);
    check_each_task_once(host, 50);
  }
}

TEST_CASE("Host: nested parallel_for runs inline and does not deadlock") {
  const Host host(4);
  std::atomic<int> count{0};
  host.parallel_for(8, [&](std::int64_t) {
    host.parallel_for(8, [&](std::int64_t) {
      Host::default_instance().parallel_for(3, [&](std::int64_t) { count.fetch_add(1); });
    });
  });
  CHECK(count.load() == 8 * 8 * 3);
}

TEST_CASE("Host: concurrent callers from several threads") {
  const Host host(3);
  std::atomic<std::int64_t> sum{0};
  std::vector<std::thread> callers;
  for (int c = 0; c < 4; ++c)
    callers.emplace_back([&] {
      for (int rep = 0; rep < 200; ++rep)
        host.parallel_for(5, [&](std::int64_t task) { sum.fetch_add(task + 1); });
    });
  for (auto& caller : callers) caller.join();
  CHECK(sum.load() == 4 * 200 * 15);
}

TEST_CASE("Host: many tiny jobs in a row (fork/join stress)") {
  const Host host(4);
  std::int64_t expected = 0;
  std::atomic<std::int64_t> sum{0};
  for (int rep = 0; rep < 20000; ++rep) {
    const std::int64_t tasks = 2 + rep % 7;
    host.parallel_for(tasks, [&](std::int64_t task) { sum.fetch_add(task); });
    expected += tasks * (tasks - 1) / 2;
  }
  CHECK(sum.load() == expected);
}

TEST_CASE("Host: construction, idle sleep, move and destruction") {
  for (int rep = 0; rep < 30; ++rep) {
    Host host(1 + rep % 5);
    if (rep % 2 == 0) check_each_task_once(host, 10);
  }
  {
    Host host(3);
    check_each_task_once(host, 20);
    // Longer than the spin phase: the workers go to sleep and must wake up for the next job.
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
    check_each_task_once(host, 20);
    Host moved(std::move(host));
    CHECK(moved.num_threads() == 3);
    CHECK(host.num_threads() == 1);  // NOLINT(bugprone-use-after-move): documented state
    check_each_task_once(moved, 20);
    check_each_task_once(host, 20);  // runs inline
  }
}
