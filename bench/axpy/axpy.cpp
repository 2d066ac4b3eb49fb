// SPDX-License-Identifier: MIT
// bench/axpy worker: y = a*x + y over n f32 through trainkit::exec::launch on the default Host,
// and the two bandwidth probes on the same arrays with the same thread count: the same loop on
// plain std::threads, and a parallel memcpy. Driven by run.py (protocol: bench/common/bench.hpp).
#include <cstdint>
#include <cstdio>
#include <string>

#include "bench.hpp"
#include "trainkit/core/allocator.hpp"
#include "trainkit/exec/host.hpp"
#include "trainkit/exec/launch.hpp"

namespace tb = trainkit_bench;

namespace {

// Small integers, so every a*x + y below is exact in f32 and results are checked with ==.
float x_init(std::int64_t i) { return static_cast<float>(i % 1024); }
float y_init(std::int64_t i) { return static_cast<float>(i % 7); }

// Fails loudly unless y == y_init + a*x everywhere (y having been reset to y_init before).
bool check(const char* what, const float* y, std::size_t n, float a) {
  for (std::size_t i = 0; i < n; ++i) {
    const auto k = static_cast<std::int64_t>(i);
    if (y[i] != y_init(k) + a * x_init(k)) {
      std::fprintf(stderr, "axpy: %s is wrong at %zu: %g, expected %g\n", what, i, double(y[i]),
                   double(y_init(k) + a * x_init(k)));
      return false;
    }
  }
  return true;
}

}  // namespace

int main(int argc, char** argv) {
  const std::size_t n = std::stoull(tb::arg(argc, argv, "n", "67108864"));
  const float a = 0.5f;
  const auto& host = trainkit::exec::Host::default_instance();
  const auto threads = static_cast<unsigned>(host.num_threads());

  // Uninitialised 64-byte aligned memory: no page is touched before reset() below.
  const trainkit::Allocation xs(n * sizeof(float), trainkit::MemoryKind::kHost);
  const trainkit::Allocation ys(n * sizeof(float), trainkit::MemoryKind::kHost);
  float* x = static_cast<float*>(xs.get());
  float* y = static_cast<float*>(ys.get());
  const auto count = static_cast<std::int64_t>(n);
  // First touch by the pool's own threads (pages land where trainkit's work will run).
  auto reset = [&] {
    trainkit::exec::launch(host, count, [=](std::int64_t i) {
      x[i] = x_init(i);
      y[i] = y_init(i);
    });
  };
  auto axpy = [=](std::int64_t i) { y[i] = a * x[i] + y[i]; };

  reset();
  trainkit::exec::launch(host, count, axpy);
  if (!check("trainkit launch", y, n, a)) return 1;
  reset();
  tb::probe_axpy(threads, n, a, x, y);
  if (!check("probe loop", y, n, a)) return 1;

  // Values grow by a*x per repetition (memcpy resets y = x): they stay small exact floats.
  return tb::serve({{"threads", std::to_string(threads)}, {"n", std::to_string(n)}},
                   {{"trainkit", [&] { trainkit::exec::launch(host, count, axpy); }},
                    {"probe_axpy", [&] { tb::probe_axpy(threads, n, a, x, y); }},
                    {"probe_memcpy", [&] { tb::probe_memcpy(threads, n * sizeof(float), x, y); }}});
}
