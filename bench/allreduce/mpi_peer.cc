// SPDX-License-Identifier: MIT
// bench/allreduce peer: MPI_Allreduce between the processes of `mpirun -np 2` (built by run.py
// with mpicxx). Rank 0 speaks the worker protocol of bench/common/bench.hpp on stdin/stdout and
// forwards each request to the other ranks; case "mpi_<bytes>" runs <iters> in-place f32 sum
// MPI_Allreduce calls of <bytes> per rank (the same loop as the ThreadComm worker), timed on rank
// 0 after a barrier. Idle ranks wait for requests with a polling sleep, not MPI's busy wait, so
// they do not steal a core from the other benchmark.
#include <mpi.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <iostream>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

namespace {

double now() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

std::int64_t arg(int argc, char** argv, const char* key, std::int64_t fallback) {
  const std::string prefix = std::string("--") + key + "=";
  for (int i = 1; i < argc; ++i)
    if (std::strncmp(argv[i], prefix.c_str(), prefix.size()) == 0)
      return std::stoll(argv[i] + prefix.size());
  return fallback;
}

// Request to the other ranks: {bytes, iters, reps}; bytes < 0 means quit.
void share(std::int64_t req[3]) {
  MPI_Request r;
  MPI_Ibcast(req, 3, MPI_INT64_T, 0, MPI_COMM_WORLD, &r);
  int done = 0;
  for (int spins = 0;; ++spins) {
    MPI_Test(&r, &done, MPI_STATUS_IGNORE);
    if (done) return;
    if (spins > 100) std::this_thread::sleep_for(std::chrono::microseconds(200));
  }
}

}  // namespace

int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  int rank = 0, size = 1;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  const std::int64_t max_bytes = arg(argc, argv, "max-bytes", 268435456);
  const std::int64_t min_bytes = arg(argc, argv, "min-bytes", 1024);
  const std::int64_t target = arg(argc, argv, "target-bytes", 33554432);
  std::vector<float> buf(static_cast<std::size_t>(max_bytes / 4), 1.0f + rank);
  auto iters_of = [&](std::int64_t bytes) {
    return std::max<std::int64_t>(1, std::min<std::int64_t>(2000, target / bytes));
  };
  auto run = [&](std::int64_t bytes, std::int64_t iters) {
    MPI_Barrier(MPI_COMM_WORLD);
    const double t0 = now();
    for (std::int64_t i = 0; i < iters; ++i)
      MPI_Allreduce(MPI_IN_PLACE, buf.data(), static_cast<int>(bytes / 4), MPI_FLOAT, MPI_SUM,
                    MPI_COMM_WORLD);
    return now() - t0;
  };

  if (rank != 0) {
    for (;;) {
      std::int64_t req[3];
      share(req);
      if (req[0] < 0) break;
      for (std::int64_t r = 0; r < req[2]; ++r) run(req[0], req[1]);
    }
    MPI_Finalize();
    return 0;
  }

  std::string names;
  for (std::int64_t bytes = min_bytes; bytes <= max_bytes; bytes *= 4)
    names += (names.empty() ? "" : ",") + ("mpi_" + std::to_string(bytes));
  std::cout << "ready ranks=" << size << " impl=MPI_Allreduce\ncases " << names << std::endl;
  std::string line;
  while (std::getline(std::cin, line)) {
    std::istringstream in(line);
    std::string cmd, name;
    long reps = 0;
    in >> cmd;
    if (cmd == "quit") break;
    if (cmd != "time" || !(in >> name >> reps) || reps <= 0 || name.rfind("mpi_", 0) != 0) {
      std::cout << "error bad request '" << line << "'" << std::endl;
      continue;
    }
    const std::int64_t bytes = std::stoll(name.substr(4));
    if (bytes < min_bytes || bytes > max_bytes) {
      std::cout << "error unknown case '" << name << "'" << std::endl;
      continue;
    }
    std::int64_t req[3] = {bytes, iters_of(bytes), reps};
    share(req);
    std::ostringstream out;
    out << "ok";
    for (long r = 0; r < reps; ++r) out << ' ' << run(bytes, req[1]);
    std::cout << out.str() << std::endl;
  }
  std::int64_t quit[3] = {-1, 0, 0};
  share(quit);
  MPI_Finalize();
  return 0;
}
