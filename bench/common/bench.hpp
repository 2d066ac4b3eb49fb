// SPDX-License-Identifier: MIT
// bench/common/bench.hpp: the C++ side of trainkit's benchmark harness (not part of the library).
// A benchmark binary is a "worker": it sets up its data once, then answers timing requests from
// the Python driver (bench/common/harness.py) over stdin/stdout, so the driver can alternate
// trainkit, its peers and the bandwidth probe sample by sample in one run. Also provides the
// bandwidth probes (a hand-written std::thread loop, parallel memcpy) every benchmark can reuse.
#pragma once

#include <algorithm>
#include <chrono>
#include <cstddef>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <functional>
#include <iostream>
#include <sstream>
#include <string>
#include <thread>
#include <utility>
#include <vector>

namespace trainkit_bench {

/// Seconds on the steady clock.
inline double now() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

/// Runs body(begin, end) on `threads` contiguous, equal chunks of [0, n): the calling thread does
/// chunk 0, std::threads the rest. This is the probe's "plain C++" baseline, deliberately naive;
/// spawning costs ~20-50 us per call, negligible against the >= 10 ms passes benchmarked here.
template <class Body>
void split_threads(unsigned threads, std::size_t n, const Body& body) {
  threads = std::max(1u, threads);
  const std::size_t chunk = (n + threads - 1) / threads;
  std::vector<std::thread> pool;
  pool.reserve(threads - 1);
  for (unsigned t = 1; t < threads; ++t) {
    const std::size_t b = std::min(n, t * chunk), e = std::min(n, b + chunk);
    pool.emplace_back([&body, b, e] { body(b, e); });
  }
  body(std::size_t{0}, std::min(n, chunk));
  for (auto& th : pool) th.join();
}

/// Bandwidth probe: y = a*x + y with `threads` std::threads, a loop g++ -O3 vectorises.
/// Moves 12 bytes per element (read x, read y, write y).
inline void probe_axpy(unsigned threads, std::size_t n, float a, const float* x, float* y) {
  split_threads(threads, n, [=](std::size_t b, std::size_t e) {
    for (std::size_t i = b; i < e; ++i) y[i] = a * x[i] + y[i];
  });
}

/// Bandwidth probe: parallel memcpy of `bytes` from src to dst (2 bytes moved per byte copied).
inline void probe_memcpy(unsigned threads, std::size_t bytes, const void* src, void* dst) {
  split_threads(threads, bytes, [=](std::size_t b, std::size_t e) {
    std::memcpy(static_cast<char*>(dst) + b, static_cast<const char*>(src) + b, e - b);
  });
}

/// One timed case of a worker: `run()` performs one repetition.
struct Case {
  std::string name;
  std::function<void()> run;
};

/// The worker protocol (bench/common/harness.py speaks the other side; one line per message):
///   worker -> driver, once:  "ready key=value ..." (info, e.g. threads=2) and "cases a,b,c"
///   driver -> worker:        "time <case> <reps>"  -> "ok <seconds> <seconds> ..."
///                            "quit" (or EOF)       -> exits 0
///   any failure:             "error <message>"; setup failures exit non-zero.
/// Anything a case prints must go to stderr: stdout carries the protocol.
inline int serve(const std::vector<std::pair<std::string, std::string>>& info,
                 const std::vector<Case>& cases) {
  std::ostringstream ready;
  ready << "ready";
  for (const auto& [k, v] : info) {  // one token per value: spaces become underscores
    std::string value = v;
    for (char& c : value)
      if (c == ' ') c = '_';
    ready << ' ' << k << '=' << value;
  }
  std::cout << ready.str() << "\ncases ";
  for (std::size_t i = 0; i < cases.size(); ++i) std::cout << (i ? "," : "") << cases[i].name;
  std::cout << std::endl;

  std::string line;
  while (std::getline(std::cin, line)) {
    std::istringstream in(line);
    std::string cmd, name;
    long reps = 0;
    in >> cmd;
    if (cmd == "quit") return 0;
    if (cmd != "time" || !(in >> name >> reps) || reps <= 0) {
      std::cout << "error bad request '" << line << "'" << std::endl;
      continue;
    }
    const auto it =
        std::find_if(cases.begin(), cases.end(), [&](const Case& c) { return c.name == name; });
    if (it == cases.end()) {
      std::cout << "error unknown case '" << name << "'" << std::endl;
      continue;
    }
    std::ostringstream out;
    out << "ok";
    try {
      for (long r = 0; r < reps; ++r) {
        const double t0 = now();
        it->run();
        out << ' ' << (now() - t0);
      }
    } catch (const std::exception& e) {
      std::cout << "error case " << name << " threw: " << e.what() << std::endl;
      continue;
    }
    std::cout << out.str() << std::endl;
  }
  return 0;
}

/// Value of `--key=value` in argv, or `fallback`.
inline std::string arg(int argc, char** argv, const std::string& key, std::string fallback) {
  const std::string prefix = "--" + key + "=";
  for (int i = 1; i < argc; ++i)
    if (std::strncmp(argv[i], prefix.c_str(), prefix.size()) == 0) return argv[i] + prefix.size();
  return fallback;
}

}  // namespace trainkit_bench
