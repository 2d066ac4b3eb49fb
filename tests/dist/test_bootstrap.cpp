// dist::detect_launch / dist::init: torchrun, Open MPI and Slurm variables (precedence, Slurm
// node lists, malformed values), the backend choice and its errors (TcpComm for host tensors
// under torchrun, at MASTER_PORT, MASTER_PORT + 1 under the agent store, or TRAINKIT_RDZV_PORT);
// tcp_broadcast over loopback (the NCCL unique-id rendezvous): delivery, timeout, mismatched
// peers and a foreign service; deadlines that hold while junk keeps arriving.
#include <doctest/doctest.h>

#include <array>
#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdlib>
#include <cstring>
#include <map>
#include <optional>
#include <random>
#include <regex>
#include <span>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <trainkit/dist/bootstrap.hpp>
#include <trainkit/dist/rendezvous.hpp>

#include "dist/free_port.hpp"

namespace {

namespace tk = trainkit;
namespace dist = trainkit::dist;
using disttest::free_port;

// Every variable detect_launch reads: cleared for each test, restored afterwards.
const char* const kLaunchVars[] = {"RANK",
                                   "WORLD_SIZE",
                                   "LOCAL_RANK",
                                   "LOCAL_WORLD_SIZE",
                                   "MASTER_ADDR",
                                   "MASTER_PORT",
                                   "TORCHELASTIC_USE_AGENT_STORE",
                                   "OMPI_COMM_WORLD_RANK",
                                   "OMPI_COMM_WORLD_SIZE",
                                   "OMPI_COMM_WORLD_LOCAL_RANK",
                                   "OMPI_COMM_WORLD_LOCAL_SIZE",
                                   "SLURM_PROCID",
                                   "SLURM_STEP_NUM_TASKS",
                                   "SLURM_NTASKS",
                                   "SLURM_LOCALID",
                                   "SLURM_STEP_TASKS_PER_NODE",
                                   "SLURM_TASKS_PER_NODE",
                                   "SLURM_STEP_NODELIST",
                                   "SLURM_JOB_NODELIST",
                                   "SLURM_NODELIST",
                                   "SLURM_JOB_ID",
                                   "SLURM_NODEID",
                                   "PMI_RANK",
                                   "PMI_SIZE",
                                   "MPI_LOCALRANKID",
                                   "MPI_LOCALNRANKS",
                                   "TRAINKIT_RDZV_PORT",
                                   "TRAINKIT_RDZV_KEY",
                                   "TORCHELASTIC_RUN_ID",
                                   "SLURM_STEP_ID",
                                   "TRAINKIT_DIST_TIMEOUT"};

class CleanEnv {
 public:
  CleanEnv() {
    for (const char* name : kLaunchVars) {
      if (const char* v = std::getenv(name)) saved_[name] = v;
      ::unsetenv(name);
    }
  }
  ~CleanEnv() {
    for (const char* name : kLaunchVars) ::unsetenv(name);
    for (const auto& [k, v] : saved_) ::setenv(k.c_str(), v.c_str(), 1);
  }
  void set(const char* name, const char* value) { ::setenv(name, value, 1); }

 private:
  std::map<std::string, std::string> saved_;
};

}  // namespace

TEST_CASE("detect_launch: no launcher is one process") {
  CleanEnv env;
  const auto info = dist::detect_launch();
  CHECK(info.launcher == dist::Launcher::kNone);
  CHECK(info.rank == 0);
  CHECK(info.world_size == 1);
  CHECK(info.local_rank == 0);
  CHECK(info.master_addr.empty());
}

TEST_CASE("detect_launch: torchrun") {
  CleanEnv env;
  env.set("RANK", "5");
  env.set("WORLD_SIZE", "8");
  env.set("LOCAL_RANK", "1");
  env.set("LOCAL_WORLD_SIZE", "4");
  env.set("MASTER_ADDR", "node7");
  env.set("MASTER_PORT", "29500");
  env.set("TORCHELASTIC_USE_AGENT_STORE", "True");
  env.set("OMPI_COMM_WORLD_RANK", "0");  // torchrun's variables win
  env.set("OMPI_COMM_WORLD_SIZE", "1");
  const auto info = dist::detect_launch();
  CHECK(info.launcher == dist::Launcher::kTorchrun);
  CHECK(info.rank == 5);
  CHECK(info.world_size == 8);
  CHECK(info.local_rank == 1);
  CHECK(info.local_world_size == 4);
  CHECK(info.master_addr == "node7");
  CHECK(info.master_port == 29500);
  CHECK(info.agent_store);
}

TEST_CASE("detect_launch: Open MPI") {
  CleanEnv env;
  env.set("OMPI_COMM_WORLD_RANK", "3");
  env.set("OMPI_COMM_WORLD_SIZE", "4");
  env.set("OMPI_COMM_WORLD_LOCAL_RANK", "1");
  env.set("OMPI_COMM_WORLD_LOCAL_SIZE", "2");
  const auto info = dist::detect_launch();
  CHECK(info.launcher == dist::Launcher::kOpenMpi);
  CHECK(info.rank == 3);
  CHECK(info.world_size == 4);
  CHECK(info.local_rank == 1);
  CHECK(info.local_world_size == 2);
  CHECK(info.master_port == 0);
}

TEST_CASE("detect_launch: Slurm (node list, tasks per node, derived port)") {
  CleanEnv env;
  env.set("SLURM_PROCID", "6");
  env.set("SLURM_NTASKS", "99");  // the step's count wins
  env.set("SLURM_STEP_NUM_TASKS", "8");
  env.set("SLURM_LOCALID", "2");
  env.set("SLURM_STEP_TASKS_PER_NODE", "4(x2)");
  env.set("SLURM_STEP_NODELIST", "gpu[003-006,9],cpu1");
  env.set("SLURM_JOB_ID", "123456");
  auto info = dist::detect_launch();
  CHECK(info.launcher == dist::Launcher::kSlurm);
  CHECK(info.rank == 6);
  CHECK(info.world_size == 8);
  CHECK(info.local_rank == 2);
  CHECK(info.local_world_size == 4);
  CHECK(info.master_addr == "gpu003");
  CHECK(info.master_port == 20000 + 123456 % 20000);
  env.set("MASTER_ADDR", "10.0.0.1");  // explicit values win
  env.set("MASTER_PORT", "1234");
  info = dist::detect_launch();
  CHECK(info.master_addr == "10.0.0.1");
  CHECK(info.master_port == 1234);
}

TEST_CASE("detect_launch: Slurm nodes with different task counts, and 32-bit job ids") {
  CleanEnv env;
  env.set("SLURM_PROCID", "3");
  env.set("SLURM_NTASKS", "4");
  env.set("SLURM_LOCALID", "2");
  env.set("SLURM_NODEID", "1");
  env.set("SLURM_STEP_TASKS_PER_NODE", "1,3");  // node 1 runs three
  auto info = dist::detect_launch();
  CHECK(info.local_world_size == 3);
  env.set("SLURM_STEP_TASKS_PER_NODE", "2(x3),5,1");
  env.set("SLURM_NTASKS", "12");
  for (const auto& [node, count] :
       std::vector<std::pair<const char*, int>>{{"0", 2}, {"1", 2}, {"2", 2}, {"3", 5}, {"4", 1}}) {
    CAPTURE(node);
    env.set("SLURM_NODEID", node);
    env.set("SLURM_LOCALID", "0");
    CHECK(dist::detect_launch().local_world_size == count);
  }
  env.set("SLURM_JOB_ID", "2214592513");  // above 2^31: a federated cluster's id
  CHECK(dist::detect_launch().master_port == 20000 + int(2214592513ull % 20000));
  env.set("SLURM_JOB_ID", "junk");
  CHECK_THROWS_WITH_AS(dist::detect_launch(), doctest::Contains("SLURM_JOB_ID='junk'"), tk::Error);
  env.set("MASTER_PORT", "29500");  // an explicit port: the job id is not read
  CHECK(dist::detect_launch().master_port == 29500);
}

TEST_CASE("detect_launch: MPICH / Intel MPI (PMI)") {
  CleanEnv env;
  env.set("PMI_RANK", "1");
  env.set("PMI_SIZE", "2");
  env.set("MPI_LOCALRANKID", "1");
  env.set("MPI_LOCALNRANKS", "2");
  const auto info = dist::detect_launch();
  CHECK(info.launcher == dist::Launcher::kPmi);
  CHECK(info.rank == 1);
  CHECK(info.world_size == 2);
  CHECK(info.local_rank == 1);
  CHECK(info.local_world_size == 2);
}

TEST_CASE("default_timeout: TRAINKIT_DIST_TIMEOUT in seconds, at least a millisecond") {
  CleanEnv env;
  CHECK(dist::default_timeout() == std::chrono::milliseconds(300000));
  env.set("TRAINKIT_DIST_TIMEOUT", "2.5");
  CHECK(dist::default_timeout() == std::chrono::milliseconds(2500));
  for (const char* bad : {"0.0001", "0", "-1", "abc", "1e9"}) {
    CAPTURE(bad);
    env.set("TRAINKIT_DIST_TIMEOUT", bad);
    CHECK_THROWS_WITH_AS(dist::default_timeout(), doctest::Contains("TRAINKIT_DIST_TIMEOUT='"),
                         tk::Error);
  }
}

TEST_CASE("default_timeout: only plain decimal numbers, also among random strings") {
  CleanEnv env;
  // strtod takes hex ("0x10" is 16 s, "0x1p3" 8 s) and other forms nobody means as seconds.
  for (const char* bad :
       {"0x10", "0X10",     "0x1p3", "0x.8p1", "0x",  "1e",  "1e+", "e3",   ".",    "..5",  "1.2.3",
        "inf",  "infinity", "nan",   "nan(1)", "1,5", "1_0", "5s",  "1e3 ", "\xff", "1\x1b"}) {
    CAPTURE(bad);
    env.set("TRAINKIT_DIST_TIMEOUT", bad);
    CHECK_THROWS_WITH_AS(dist::default_timeout(), doctest::Contains("TRAINKIT_DIST_TIMEOUT='"),
                         tk::Error);
  }
  env.set("TRAINKIT_DIST_TIMEOUT", "0x10\x1b");
  CHECK_THROWS_WITH_AS(dist::default_timeout(), doctest::Contains("'0x10\\x1b'"), tk::Error);
  for (const auto& [good, ms] :
       std::vector<std::pair<const char*, long long>>{{"1e3", 1000000},
                                                      {"5.", 5000},
                                                      {"0.001", 1},
                                                      {"1E-3", 1},
                                                      {"2.5e+1", 25000},
                                                      {"007", 7000},
                                                      {"9999999", 9999999000LL}}) {
    CAPTURE(good);
    env.set("TRAINKIT_DIST_TIMEOUT", good);
    CHECK(dist::default_timeout().count() == ms);
  }
  // Random strings over digits and the characters of other forms: accepted exactly when they
  // match the decimal grammar and the range, with strtod's value (the test runs in the C locale).
  const std::regex decimal("([0-9]+\\.?[0-9]*|\\.[0-9]+)([eE][+-]?[0-9]+)?");
  const std::string alphabet = "0123456789012345.eExXpP+-afin ";
  std::mt19937 rng(20261207);
  int accepted = 0;
  for (int trial = 0; trial < 4000; ++trial) {
    std::string text(1 + rng() % 7, ' ');
    for (char& ch : text) ch = alphabet[rng() % alphabet.size()];
    if (trial % 5 == 0) text = "0x" + text;
    CAPTURE(text);
    env.set("TRAINKIT_DIST_TIMEOUT", text.c_str());
    const double value = std::strtod(text.c_str(), nullptr);
    const bool expect = std::regex_match(text, decimal) && value >= 0.001 && value < 1e7;
    if (expect) {
      ++accepted;
      CHECK(dist::default_timeout().count() == static_cast<long long>(value * 1000.0 + 0.5));
    } else {
      CHECK_THROWS_AS(dist::default_timeout(), tk::Error);
    }
  }
  CHECK(accepted > 100);
}

TEST_CASE("first_slurm_host") {
  CHECK(dist::detail::first_slurm_host("n1,n2") == "n1");
  CHECK(dist::detail::first_slurm_host("solo") == "solo");
  CHECK(dist::detail::first_slurm_host("a[1]") == "a1");
  CHECK(dist::detail::first_slurm_host("gpu[003-006,9],cpu1") == "gpu003");
  CHECK(dist::detail::first_slurm_host("rack1-[07-09]-ib,x") == "rack1-07-ib");
  CHECK(dist::detail::first_slurm_host("rack[1-2]-node[07-09],x") == "rack1-node07");
  CHECK(dist::detail::first_slurm_host("r[3,5]-n[2-4]-ib[0]") == "r3-n2-ib0");
  CHECK(dist::detail::first_slurm_host("r[3]n") == "r3n");
  for (const char* bad : {"bad[1-2", "a[]", "a[-1]", "a[1]-b[2", "a[[1]]", ",n2", "a[1-2]b[,3]"}) {
    CAPTURE(bad);
    CHECK_THROWS_WITH_AS(dist::detail::first_slurm_host(bad),
                         doctest::Contains("malformed Slurm node list"), tk::Error);
  }
}

TEST_CASE("detect_launch: malformed and inconsistent values name the variable") {
  CleanEnv env;
  env.set("RANK", "two");
  env.set("WORLD_SIZE", "4");
  CHECK_THROWS_WITH_AS(dist::detect_launch(), doctest::Contains("RANK='two'"), tk::Error);
  env.set("RANK", "4");
  CHECK_THROWS_WITH_AS(dist::detect_launch(), doctest::Contains("rank 4 of 4"), tk::Error);
  env.set("RANK", "1");
  env.set("MASTER_PORT", "70000");
  CHECK_THROWS_WITH_AS(dist::detect_launch(), doctest::Contains("MASTER_PORT='70000'"), tk::Error);
  env.set("MASTER_PORT", "29500");
  // Half a pair is a broken launch, not a single process.
  ::unsetenv("WORLD_SIZE");
  CHECK_THROWS_WITH_AS(dist::detect_launch(),
                       doctest::Contains("RANK is set but WORLD_SIZE is not"), tk::Error);
  ::unsetenv("RANK");
  env.set("OMPI_COMM_WORLD_SIZE", "2");
  CHECK_THROWS_WITH_AS(dist::detect_launch(),
                       doctest::Contains("OMPI_COMM_WORLD_SIZE is set but OMPI_COMM_WORLD_RANK"),
                       tk::Error);
  ::unsetenv("OMPI_COMM_WORLD_SIZE");
  // More processes on this node than in all.
  env.set("RANK", "0");
  env.set("WORLD_SIZE", "2");
  env.set("LOCAL_WORLD_SIZE", "8");
  env.set("LOCAL_RANK", "5");
  CHECK_THROWS_WITH_AS(dist::detect_launch(),
                       doctest::Contains("says 8 processes on this node but 2 in all"), tk::Error);
}

TEST_CASE("detect_launch: integers with blanks or signs are refused, naming the variable") {
  CleanEnv env;
  env.set("WORLD_SIZE", "4");
  for (const char* bad : {" 1", "+1", "1 ", "\t1", "-0", "0x1"}) {
    CAPTURE(bad);
    env.set("RANK", bad);
    CHECK_THROWS_WITH_AS(dist::detect_launch(), doctest::Contains("environment variable RANK='"),
                         tk::Error);
  }
  // Control bytes from the environment are shown escaped.
  env.set("RANK", "1\x1b[0m");
  CHECK_THROWS_WITH_AS(dist::detect_launch(), doctest::Contains("RANK='1\\x1b[0m'"), tk::Error);
  env.set("RANK", "1");
  CHECK(dist::detect_launch().rank == 1);
  for (const char* bad : {" 2", "+2", "-2", " -1"}) {
    CAPTURE(bad);
    env.set("TRAINKIT_DIST_TIMEOUT", bad);
    CHECK_THROWS_WITH_AS(dist::default_timeout(), doctest::Contains("TRAINKIT_DIST_TIMEOUT='"),
                         tk::Error);
  }
  env.set("TRAINKIT_DIST_TIMEOUT", ".5");
  CHECK(dist::default_timeout() == std::chrono::milliseconds(500));
  ::unsetenv("TRAINKIT_DIST_TIMEOUT");
  ::unsetenv("RANK");
  ::unsetenv("WORLD_SIZE");
  env.set("SLURM_PROCID", "0");
  env.set("SLURM_NTASKS", "2");
  env.set("SLURM_NODELIST", "n1");
  for (const char* bad : {" 42", "+42", " -42"}) {
    CAPTURE(bad);
    env.set("SLURM_JOB_ID", bad);
    CHECK_THROWS_WITH_AS(dist::detect_launch(), doctest::Contains("SLURM_JOB_ID='"), tk::Error);
  }
}

TEST_CASE("detect_launch: an inconsistent rank or local rank names the launcher's variables") {
  CleanEnv env;
  env.set("RANK", "4");
  env.set("WORLD_SIZE", "4");
  CHECK_THROWS_WITH_AS(dist::detect_launch(),
                       doctest::Contains("RANK=4 must be below WORLD_SIZE=4"), tk::Error);
  env.set("RANK", "1");
  env.set("LOCAL_RANK", "2");
  env.set("LOCAL_WORLD_SIZE", "2");
  CHECK_THROWS_WITH_AS(dist::detect_launch(),
                       doctest::Contains("LOCAL_RANK=2 must be below LOCAL_WORLD_SIZE=2"),
                       tk::Error);
  ::unsetenv("LOCAL_WORLD_SIZE");
  env.set("LOCAL_RANK", "4");
  CHECK_THROWS_WITH_AS(
      dist::detect_launch(),
      doctest::Contains("LOCAL_RANK=4 must be below WORLD_SIZE (LOCAL_WORLD_SIZE is unset)=4"),
      tk::Error);
  ::unsetenv("RANK");
  ::unsetenv("WORLD_SIZE");
  ::unsetenv("LOCAL_RANK");
  env.set("OMPI_COMM_WORLD_RANK", "3");
  env.set("OMPI_COMM_WORLD_SIZE", "2");
  CHECK_THROWS_WITH_AS(dist::detect_launch(),
                       doctest::Contains("OMPI_COMM_WORLD_RANK=3 must be below "
                                         "OMPI_COMM_WORLD_SIZE=2"),
                       tk::Error);
  env.set("OMPI_COMM_WORLD_RANK", "1");
  env.set("OMPI_COMM_WORLD_LOCAL_SIZE", "3");
  CHECK_THROWS_WITH_AS(dist::detect_launch(),
                       doctest::Contains("OMPI_COMM_WORLD_LOCAL_SIZE=3 must not exceed "
                                         "OMPI_COMM_WORLD_SIZE=2"),
                       tk::Error);
  ::unsetenv("OMPI_COMM_WORLD_RANK");
  ::unsetenv("OMPI_COMM_WORLD_SIZE");
  ::unsetenv("OMPI_COMM_WORLD_LOCAL_SIZE");
  env.set("PMI_RANK", "0");
  env.set("PMI_SIZE", "2");
  env.set("MPI_LOCALRANKID", "1");
  env.set("MPI_LOCALNRANKS", "1");
  CHECK_THROWS_WITH_AS(dist::detect_launch(),
                       doctest::Contains("MPI_LOCALRANKID=1 must be below MPI_LOCALNRANKS=1"),
                       tk::Error);
}

TEST_CASE("dist::init: a rendezvous port out of range is an error naming where it came from") {
  CleanEnv env;
  env.set("RANK", "1");
  env.set("WORLD_SIZE", "2");
  env.set("MASTER_ADDR", "127.0.0.1");
  env.set("MASTER_PORT", "65535");
  env.set("TORCHELASTIC_USE_AGENT_STORE", "True");
  const dist::InitOptions quick{.timeout = std::chrono::milliseconds(200)};
  // MASTER_PORT + 1 does not exist: said so, not "needs MASTER_ADDR and MASTER_PORT".
  for (const dist::Backend b : {dist::Backend::kAuto, dist::Backend::kTcp}) {
    CAPTURE(dist::backend_name(b));
    dist::InitOptions o = quick;
    o.backend = b;
    CHECK_THROWS_WITH_AS(dist::init(o), doctest::Contains("MASTER_PORT=65535 is held by torchrun"),
                         tk::Error);
  }
  ::unsetenv("TORCHELASTIC_USE_AGENT_STORE");
  for (const int bad : {-1, 65536, 70000}) {
    CAPTURE(bad);
    dist::InitOptions o = quick;
    o.rendezvous_port = bad;
    const std::string want = "InitOptions::rendezvous_port " + std::to_string(bad) + " is not";
    CHECK_THROWS_WITH_AS(dist::init(o), doctest::Contains(want.c_str()), tk::Error);
    o.backend = dist::Backend::kTcp;
    CHECK_THROWS_WITH_AS(dist::init(o), doctest::Contains(want.c_str()), tk::Error);
  }
}

TEST_CASE("dist::init: a single process gets a one-rank ThreadComm") {
  CleanEnv env;
  auto ctx = dist::init();
  CHECK(ctx.backend() == dist::Backend::kThread);
  CHECK(ctx.rank() == 0);
  CHECK(ctx.world_size() == 1);
  CHECK(ctx.device() == -1);
  CHECK(ctx.host_comm() == nullptr);
  std::vector<double> v{1.5, -2.0};
  ctx.comm().all_reduce(std::span<double>(v), dist::ReduceOp::kAvg).wait();
  CHECK(v[0] == 1.5);
  CHECK(v[1] == -2.0);
}

TEST_CASE("dist::init: errors say what is missing") {
  CleanEnv env;
  env.set("RANK", "0");
  env.set("WORLD_SIZE", "2");
  CHECK_THROWS_WITH_AS(dist::init(),
                       doctest::Contains("host tensors need a rendezvous for TcpComm: set "
                                         "MASTER_ADDR and MASTER_PORT"),
                       tk::Error);
  CHECK_THROWS_WITH_AS(dist::init({.backend = dist::Backend::kThread}),
                       doctest::Contains("threads of one process"), tk::Error);
#if TRAINKIT_WITH_NCCL
  if (tk::cuda::device_count() == 0) {
    CHECK_THROWS_WITH_AS(dist::init({.space = tk::Space::kDevice}),
                         doctest::Contains("needs a CUDA device"), tk::Error);
  }
#else
  CHECK_THROWS_WITH_AS(dist::init({.space = tk::Space::kDevice}),
                       doctest::Contains("build trainkit with NCCL"), tk::Error);
#endif
}

TEST_CASE("dist::init: torchrun with host tensors meets over TcpComm at the rendezvous port") {
  // Rank 1 of 2 with nobody at rank 0's address: the error shows the backend and the port.
  CleanEnv env;
  const int port = free_port();
  env.set("RANK", "1");
  env.set("WORLD_SIZE", "2");
  env.set("MASTER_ADDR", "127.0.0.1");
  env.set("MASTER_PORT", std::to_string(port).c_str());
  const dist::InitOptions quick{.timeout = std::chrono::milliseconds(200)};
  auto expect_port = [&](const dist::InitOptions& o, int want) {
    const std::string text =
        "TcpComm rank 1: could not reach rank 0 at 127.0.0.1:" + std::to_string(want) +
        " within 0.2 s";
    CHECK_THROWS_WITH_AS(dist::init(o), doctest::Contains(text.c_str()), tk::Error);
  };
  expect_port(quick, port);
  dist::InitOptions tcp = quick;
  tcp.backend = dist::Backend::kTcp;
  expect_port(tcp, port);
  env.set("TORCHELASTIC_USE_AGENT_STORE", "True");  // the agent's store holds MASTER_PORT
  expect_port(quick, port + 1);
  env.set("TRAINKIT_RDZV_PORT", std::to_string(port + 7).c_str());
  expect_port(quick, port + 7);
  dist::InitOptions explicit_port = quick;
  explicit_port.rendezvous_port = port + 9;
  expect_port(explicit_port, port + 9);
  env.set("TRAINKIT_RDZV_PORT", "0");
  CHECK_THROWS_WITH_AS(dist::init(quick), doctest::Contains("TRAINKIT_RDZV_PORT='0'"), tk::Error);
  ::unsetenv("TRAINKIT_RDZV_PORT");
  ::unsetenv("MASTER_ADDR");
  CHECK_THROWS_WITH_AS(dist::init(tcp), doctest::Contains("needs MASTER_ADDR and MASTER_PORT"),
                       tk::Error);
  CHECK_THROWS_WITH_AS(dist::init({.backend = dist::Backend::kTcp, .space = tk::Space::kDevice}),
                       doctest::Contains("TcpComm moves host memory"), tk::Error);
}

TEST_CASE("dist::init: Backend::kTcp for a single process is a one-rank TcpComm") {
  CleanEnv env;
  CHECK(dist::backend_name(dist::Backend::kTcp) == "tcp");
  auto ctx = dist::init({.backend = dist::Backend::kTcp});
  CHECK(ctx.backend() == dist::Backend::kTcp);
  CHECK(ctx.comm().backend() == "TcpComm");
  CHECK(ctx.world_size() == 1);
  std::vector<float> v{2.5f, -1.0f, 0.0f}, g(3);
  ctx.comm().all_reduce(std::span<float>(v), dist::ReduceOp::kAvg).wait();
  ctx.comm().all_gather(std::span<float>(v), std::span<float>(g)).wait();
  CHECK(g == std::vector<float>{2.5f, -1.0f, 0.0f});
}

TEST_CASE("rendezvous_job_key: TRAINKIT_RDZV_KEY, torchrun's run id, or Slurm's job and step") {
  CleanEnv env;
  CHECK(dist::detail::rendezvous_job_key(dist::detect_launch()).empty());
  env.set("RANK", "1");
  env.set("WORLD_SIZE", "2");
  CHECK(dist::detail::rendezvous_job_key(dist::detect_launch()).empty());
  env.set("TORCHELASTIC_RUN_ID", "3f2a-run");
  CHECK(dist::detail::rendezvous_job_key(dist::detect_launch()) == "torchrun:3f2a-run");
  // A long id becomes a hash: the same for every rank, different for another id.
  const std::string long_id(300, 'r');
  env.set("TORCHELASTIC_RUN_ID", long_id.c_str());
  const std::string hashed = dist::detail::rendezvous_job_key(dist::detect_launch());
  CHECK(hashed.size() == 26);
  CHECK(hashed.rfind("torchrun:#", 0) == 0);
  CHECK(hashed == dist::detail::rendezvous_job_key(dist::detect_launch()));
  env.set("TORCHELASTIC_RUN_ID", (long_id + "s").c_str());
  CHECK(dist::detail::rendezvous_job_key(dist::detect_launch()) != hashed);
  env.set("TRAINKIT_RDZV_KEY", "mine");
  CHECK(dist::detail::rendezvous_job_key(dist::detect_launch()) == "mine");
  env.set("TRAINKIT_RDZV_KEY", std::string(257, 'k').c_str());
  CHECK_THROWS_WITH_AS(dist::detail::rendezvous_job_key(dist::detect_launch()),
                       doctest::Contains("TRAINKIT_RDZV_KEY='kkk"), tk::Error);
  ::unsetenv("TRAINKIT_RDZV_KEY");
  ::unsetenv("RANK");
  ::unsetenv("WORLD_SIZE");
  env.set("SLURM_PROCID", "0");
  env.set("SLURM_NTASKS", "2");
  env.set("SLURM_JOB_ID", "4242");
  CHECK(dist::detail::rendezvous_job_key(dist::detect_launch()) == "slurm:4242.");
  env.set("SLURM_STEP_ID", "3");
  CHECK(dist::detail::rendezvous_job_key(dist::detect_launch()) == "slurm:4242.3");
}

TEST_CASE("tcp_broadcast: rank 0's bytes reach every rank over loopback") {
  constexpr int world_size = 4;
  const int port = free_port();
  std::vector<std::array<std::byte, 128>> payloads(world_size);
  for (std::size_t i = 0; i < 128; ++i) payloads[0][i] = static_cast<std::byte>(i * 7 + 3);
  std::vector<std::string> errors(world_size);
  std::vector<std::thread> threads;
  for (int r = world_size - 1; r >= 0; --r) {  // clients first: they must retry until rank 0 is up
    threads.emplace_back([&, r] {
      try {
        dist::tcp_broadcast("127.0.0.1", port, r, world_size, payloads[static_cast<std::size_t>(r)],
                            std::chrono::milliseconds(10000));
      } catch (const std::exception& e) {
        errors[static_cast<std::size_t>(r)] = e.what();
      }
    });
    if (r == world_size - 1) std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  for (auto& t : threads) t.join();
  for (int r = 0; r < world_size; ++r) {
    CAPTURE(r);
    CHECK(errors[static_cast<std::size_t>(r)].empty());
    CHECK(payloads[static_cast<std::size_t>(r)] == payloads[0]);
  }
  CHECK(payloads[3][5] == static_cast<std::byte>(38));
}

TEST_CASE("tcp_broadcast: nobody at the address is a timeout naming it") {
  const int port = free_port();
  std::array<std::byte, 16> payload{};
  const auto t0 = std::chrono::steady_clock::now();
  const std::string where = "could not reach rank 0 at 127.0.0.1:" + std::to_string(port);
  CHECK_THROWS_WITH_AS(
      dist::tcp_broadcast("127.0.0.1", port, 1, 2, payload, std::chrono::milliseconds(300)),
      doctest::Contains(where.c_str()), tk::Error);
  CHECK(std::chrono::steady_clock::now() - t0 < std::chrono::seconds(5));
  // Rank 0 alone waits for the others, also bounded.
  CHECK_THROWS_WITH_AS(
      dist::tcp_broadcast("127.0.0.1", port, 0, 3, payload, std::chrono::milliseconds(200)),
      doctest::Contains("only 0 of the other 2 ranks connected"), tk::Error);
}

TEST_CASE("tcp_broadcast: a peer with another payload size is an error on rank 0") {
  const int port = free_port();
  std::array<std::byte, 16> big{};
  std::array<std::byte, 8> small{};
  std::string error0;
  std::thread root([&] {
    try {
      dist::tcp_broadcast("127.0.0.1", port, 0, 2, big, std::chrono::milliseconds(5000));
    } catch (const std::exception& e) {
      error0 = e.what();
    }
  });
  std::this_thread::sleep_for(std::chrono::milliseconds(50));
  CHECK_THROWS_AS(
      dist::tcp_broadcast("127.0.0.1", port, 1, 2, small, std::chrono::milliseconds(1000)),
      tk::Error);
  root.join();
  CHECK(error0.find("rank 1 expects 2 ranks and 8 bytes, rank 0 has 2 ranks and 16 bytes") !=
        std::string::npos);
}

TEST_CASE("tcp_broadcast: a foreign service on the port is recognised") {
  std::string error;
  dist::detail::Socket listener = dist::detail::listen_on(0, error);
  REQUIRE(listener.valid());
  const int port = dist::detail::bound_port(listener.fd());
  REQUIRE(port > 0);
  std::thread server([&] {
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(5);
    if (!dist::detail::wait_fd(listener.fd(), POLLIN, deadline)) return;
    dist::detail::Socket s(::accept(listener.fd(), nullptr, nullptr));
    char header[dist::detail::kRendezvousHeader];
    (void)dist::detail::recv_all(s.fd(), header, sizeof header, deadline);
    (void)dist::detail::send_all(s.fd(), "HTTP/1.1", 8, deadline);
  });
  std::array<std::byte, 16> payload{};
  CHECK_THROWS_WITH_AS(
      dist::tcp_broadcast("localhost", port, 1, 2, payload, std::chrono::milliseconds(3000)),
      doctest::Contains("is not a trainkit rendezvous"), tk::Error);
  server.join();
}

TEST_CASE("tcp_broadcast: a peer that stops reading cannot hold rank 0 past the timeout") {
  // A peer says hello and never reads: rank 0's send of a payload larger than the socket buffers
  // blocked in send() (the accepted socket was blocking), past its deadline, until the peer
  // closed. The peer here holds on until rank 0 gave up, or 8 s.
  const int port = free_port();
  std::vector<std::byte> payload(std::size_t{32} << 20, std::byte{7});
  std::atomic<bool> root_done{false};
  std::thread peer([&] {
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(8);
    std::string error;
    dist::detail::Socket s;
    while (!s.valid() && std::chrono::steady_clock::now() < deadline) {
      dist::detail::Socket attempt(::socket(AF_INET, SOCK_STREAM, 0));
      const int small = 4096;  // a small receive window: the payload cannot be absorbed
      (void)::setsockopt(attempt.fd(), SOL_SOCKET, SO_RCVBUF, &small, sizeof small);
      sockaddr_in to{};
      to.sin_family = AF_INET;
      to.sin_port = htons(static_cast<std::uint16_t>(port));
      to.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
      if (::connect(attempt.fd(), reinterpret_cast<sockaddr*>(&to), sizeof to) == 0) {
        s = std::move(attempt);
      } else {
        std::this_thread::sleep_for(std::chrono::milliseconds(10));  // rank 0 is not up yet
      }
    }
    if (!s.valid()) return;
    unsigned char header[dist::detail::kRendezvousHeader];
    std::memcpy(header, dist::detail::kRendezvousMagic, 8);
    dist::detail::put_u32(header + 8, 1);
    dist::detail::put_u32(header + 12, 2);
    dist::detail::put_u64(header + 16, payload.size());
    dist::detail::put_u32(header + 24, 0);  // no job key
    (void)dist::detail::send_all(s.fd(), header, sizeof header, deadline);
    while (!root_done.load() && std::chrono::steady_clock::now() < deadline)
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
  });
  const auto t0 = std::chrono::steady_clock::now();
  std::string error;
  try {
    dist::tcp_broadcast("127.0.0.1", port, 0, 2, payload, std::chrono::milliseconds(500));
  } catch (const tk::Error& e) {
    error = e.what();
  }
  const double took = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  root_done.store(true);
  peer.join();
  CHECK(error.find("rank 0 could not send to rank 1") != std::string::npos);
  CHECK(took < 4.0);
}

TEST_CASE("tcp_broadcast: a timeout that is not positive or would overflow the clock") {
  std::array<std::byte, 4> payload{};
  for (const auto t : {std::chrono::milliseconds::max(), std::chrono::milliseconds(0),
                       std::chrono::milliseconds(-1)}) {
    CAPTURE(t.count());
    CHECK_THROWS_WITH_AS(dist::tcp_broadcast("127.0.0.1", 29500, 1, 2, payload, t),
                         doctest::Contains("tcp_broadcast: the timeout must be positive"),
                         tk::Error);
  }
}

TEST_CASE("tcp_broadcast: rank 0 refuses ranks of another job, and they hear why") {
  // Two jobs (or an earlier group) meeting at one port with the same world size and payload size:
  // without a job key the other job's ranks were handed this job's bytes.
  std::mt19937 rng(7);
  const std::vector<std::pair<std::string, std::string>> keys = {
      {"torchrun:job-a", "torchrun:job-b"},
      {"", "slurm:42.0"},
      {"slurm:42.0", ""},
      {"k", "k\x1b[31m"},
      {std::string(256, 'x'), std::string(255, 'x')}};
  for (const auto& [key0, key1] : keys) {
    const int world_size = 2 + static_cast<int>(rng() % 3);
    const int intruder = 1 + static_cast<int>(rng() % static_cast<unsigned>(world_size - 1));
    CAPTURE(world_size);
    CAPTURE(intruder);
    const int port = free_port();
    std::vector<std::array<std::byte, 32>> payloads(static_cast<std::size_t>(world_size));
    payloads[0].fill(std::byte{0x5a});
    std::vector<std::string> errors(static_cast<std::size_t>(world_size));
    std::atomic<int> started{0};
    const auto t0 = std::chrono::steady_clock::now();
    std::vector<std::thread> threads;
    for (int r = 0; r < world_size; ++r) {
      threads.emplace_back([&, r] {
        // The ranks of rank 0's job join first (a rank that came after rank 0 gave up would wait
        // for its timeout), then the intruder: the other job's rank.
        if (r == intruder) {
          while (started.load() < world_size - 1)
            std::this_thread::sleep_for(std::chrono::milliseconds(5));
          std::this_thread::sleep_for(std::chrono::milliseconds(300));
        }
        const std::string& key = r == intruder ? key1 : key0;
        try {
          if (r != intruder) started.fetch_add(1);
          dist::tcp_broadcast("127.0.0.1", port, r, world_size,
                              payloads[static_cast<std::size_t>(r)],
                              std::chrono::milliseconds(8000), key);
        } catch (const std::exception& e) {
          errors[static_cast<std::size_t>(r)] = e.what();
        }
      });
    }
    for (auto& t : threads) t.join();
    const double took =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    CHECK(took < 6.0);  // no rank waits for the timeout
    const std::string expect0 = "rank " + std::to_string(intruder) + " of " +
                                std::to_string(world_size) + " belongs to job '" +
                                tk::detail::printable_bytes(key1) + "', rank 0 expects job '" +
                                tk::detail::printable_bytes(key0) + "'";
    CHECK(errors[0].find(expect0) != std::string::npos);
    CHECK(errors[0].find('\x1b') == std::string::npos);
    for (int r = 1; r < world_size; ++r) {
      CAPTURE(r);
      const std::string& e = errors[static_cast<std::size_t>(r)];
      CHECK(payloads[static_cast<std::size_t>(r)][0] == std::byte{0});  // nothing handed over
      // The intruder, and the ranks that joined before it, throw with rank 0's reason (text from
      // a peer, escaped once more).
      if (r == intruder || !e.empty()) {
        CHECK(e.find("rank 0 at 127.0.0.1:" + std::to_string(port) + " refused the group") !=
              std::string::npos);
        CHECK(e.find(tk::detail::printable_bytes(expect0)) != std::string::npos);
      }
    }
    CHECK(!errors[static_cast<std::size_t>(intruder)].empty());
  }
}

TEST_CASE("tcp_broadcast: the same job key meets; a key over 256 bytes is refused at the call") {
  const int port = free_port();
  std::array<std::array<std::byte, 8>, 3> payloads{};
  payloads[0].fill(std::byte{3});
  const std::string key = "torchrun:\x01\xff id";
  std::vector<std::thread> threads;
  std::array<std::string, 3> errors;
  for (int r = 0; r < 3; ++r)
    threads.emplace_back([&, r] {
      try {
        dist::tcp_broadcast("127.0.0.1", port, r, 3, payloads[static_cast<std::size_t>(r)],
                            std::chrono::milliseconds(8000), key);
      } catch (const std::exception& e) {
        errors[static_cast<std::size_t>(r)] = e.what();
      }
    });
  for (auto& t : threads) t.join();
  for (int r = 0; r < 3; ++r) {
    CHECK(errors[static_cast<std::size_t>(r)].empty());
    CHECK(payloads[static_cast<std::size_t>(r)] == payloads[0]);
  }
  std::array<std::byte, 8> payload{};
  CHECK_THROWS_WITH_AS(dist::tcp_broadcast("127.0.0.1", port, 1, 2, payload,
                                           std::chrono::milliseconds(100), std::string(257, 'k')),
                       doctest::Contains("the job key has 257 bytes, at most 256"), tk::Error);
}

TEST_CASE("tcp_broadcast: a refused world size reaches the peer as rank 0's reason") {
  // Before, rank 0 closed the connection and the peer said "got no answer within 5 s".
  const int port = free_port();
  std::array<std::byte, 16> payload{};
  std::string error0;
  std::thread root([&] {
    try {
      dist::tcp_broadcast("127.0.0.1", port, 0, 3, payload, std::chrono::milliseconds(5000));
    } catch (const std::exception& e) {
      error0 = e.what();
    }
  });
  const std::string expect = "refused the group: tcp_broadcast on port " + std::to_string(port) +
                             ": rank 1 expects 2 ranks and 16 bytes, rank 0 has 3 ranks";
  CHECK_THROWS_WITH_AS(
      dist::tcp_broadcast("127.0.0.1", port, 1, 2, payload, std::chrono::milliseconds(5000)),
      doctest::Contains(expect.c_str()), tk::Error);
  root.join();
  CHECK(error0.find("rank 1 expects 2 ranks and 16 bytes, rank 0 has 3 ranks") !=
        std::string::npos);
}

TEST_CASE("tcp_broadcast: rank 0 out of file descriptors fails at once, naming the port") {
  // accept() failing with EMFILE leaves the connection queued: the loop spun at full CPU until
  // the timeout. Rank 0 runs in a child with no descriptor left after its listener.
  for (int trial = 0; trial < 2; ++trial) {
    const int port = free_port();
    const int world_size = 2 + trial * 3;
    const disttest::ChildReport child = disttest::run_out_of_fds(port, 1, [&] {
      std::array<std::byte, 8> payload{};
      dist::tcp_broadcast("127.0.0.1", port, 0, world_size, payload,
                          std::chrono::milliseconds(4000));
    });
    CAPTURE(child.message);
    CHECK(child.message.find("cannot accept connections on port " + std::to_string(port)) !=
          std::string::npos);
    CHECK(child.message.find("ulimit -n") != std::string::npos);
    CHECK(child.wall_s >= 0);
    CHECK(child.wall_s < 2.0);
    CHECK(child.cpu_s < 1.0);
  }
}

TEST_CASE("tcp_broadcast: ranks that joined hear why rank 0 gave up waiting") {
  // Before, rank 0 closed their connections and they said "got no answer" without a reason.
  const int port = free_port();
  std::array<std::byte, 8> payload0{}, payload1{};
  std::string error0;
  std::thread root([&] {
    try {
      dist::tcp_broadcast("127.0.0.1", port, 0, 3, payload0, std::chrono::milliseconds(1500));
    } catch (const std::exception& e) {
      error0 = e.what();
    }
  });
  const std::string expect = "refused the group: tcp_broadcast on port " + std::to_string(port) +
                             ": rank 0 waited 1.5 s but only 1 of the other 2 ranks connected";
  CHECK_THROWS_WITH_AS(
      dist::tcp_broadcast("127.0.0.1", port, 1, 3, payload1, std::chrono::milliseconds(8000)),
      doctest::Contains(expect.c_str()), tk::Error);
  root.join();
  CHECK(error0.find("rank 0 waited 1.5 s but only 1 of the other 2 ranks connected") !=
        std::string::npos);
}

TEST_CASE("tcp_broadcast: a rank that started before rank 0 still hears why it gave up") {
  // Both wait 1.5 s, the peer from 300 ms earlier: its wait for the answer ended before rank 0's
  // verdict came ("got no answer"), so it never learnt which rank was missing.
  const int port = free_port();
  std::array<std::byte, 8> payload0{}, payload1{};
  std::string error1;
  std::thread peer([&] {
    try {
      dist::tcp_broadcast("127.0.0.1", port, 1, 3, payload1, std::chrono::milliseconds(1500));
    } catch (const std::exception& e) {
      error1 = e.what();
    }
  });
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  CHECK_THROWS_WITH_AS(
      dist::tcp_broadcast("127.0.0.1", port, 0, 3, payload0, std::chrono::milliseconds(1500)),
      doctest::Contains("only 1 of the other 2 ranks connected"), tk::Error);
  peer.join();
  CAPTURE(error1);
  CHECK(error1.find("refused the group: tcp_broadcast on port " + std::to_string(port) +
                    ": rank 0 waited 1.5 s but only 1 of the other 2 ranks connected") !=
        std::string::npos);
}

TEST_CASE("tcp_broadcast: a duplicate rank is refused, and both ranks 1 hear why") {
  const int port = free_port();
  std::array<std::array<std::byte, 8>, 3> payloads{};
  std::array<std::string, 3> errors;
  std::atomic<int> started{0};
  std::vector<std::thread> threads;
  for (int i = 0; i < 3; ++i)
    threads.emplace_back([&, i] {
      if (i == 2) {  // the second rank 1 comes last
        while (started.load() < 2) std::this_thread::sleep_for(std::chrono::milliseconds(5));
        std::this_thread::sleep_for(std::chrono::milliseconds(300));
      }
      try {
        if (i < 2) started.fetch_add(1);
        dist::tcp_broadcast("127.0.0.1", port, i == 2 ? 1 : i, 3,
                            payloads[static_cast<std::size_t>(i)], std::chrono::milliseconds(8000));
      } catch (const std::exception& e) {
        errors[static_cast<std::size_t>(i)] = e.what();
      }
    });
  for (auto& t : threads) t.join();
  for (const auto& e : errors) {
    CAPTURE(e);
    CHECK(e.find("rank 1 connected twice") != std::string::npos);
  }
  CHECK(errors[1].find("rank 0 at 127.0.0.1:" + std::to_string(port) + " refused the group") !=
        std::string::npos);
  CHECK(errors[2].find("rank 0 at 127.0.0.1:" + std::to_string(port) + " refused the group") !=
        std::string::npos);
}

namespace {

// Connects to 127.0.0.1:`port` again and again, sending junk (neither protocol's magic) and
// waiting for the other end to drop the connection before the next one, so that a listener
// keeps finding junk to accept without its queue overflowing; until `stop`, or 8 s.
void send_junk(int port, const std::atomic<bool>& stop) {
  const auto end = std::chrono::steady_clock::now() + std::chrono::seconds(8);
  while (!stop.load() && std::chrono::steady_clock::now() < end) {
    dist::detail::Socket s(::socket(AF_INET, SOCK_STREAM, 0));
    sockaddr_in to{};
    to.sin_family = AF_INET;
    to.sin_port = htons(static_cast<std::uint16_t>(port));
    to.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    if (::connect(s.fd(), reinterpret_cast<sockaddr*>(&to), sizeof to) != 0) {
      std::this_thread::sleep_for(std::chrono::milliseconds(1));  // not listening yet
      continue;
    }
    char junk[64];
    std::memset(junk, 'J', sizeof junk);
    (void)::send(s.fd(), junk, sizeof junk, MSG_NOSIGNAL);
    pollfd p{s.fd(), POLLIN, 0};
    while (!stop.load() && ::poll(&p, 1, 10) == 0) {
    }
  }
}

}  // namespace

TEST_CASE("rendezvous: a deadline that passed ends every wait, also on a socket that is ready") {
  // wait_fd returned as soon as poll reported readiness, without looking at the clock: past the
  // deadline a socket that kept being ready (a stream of junk connections or bytes) kept the
  // accept and read loops going.
  namespace d = dist::detail;
  int fds[2];
  REQUIRE(::socketpair(AF_UNIX, SOCK_STREAM, 0, fds) == 0);
  d::Socket a(fds[0]), b(fds[1]);
  d::set_nonblocking(a.fd());
  d::set_nonblocking(b.fd());
  const auto later = d::RdvClock::now() + std::chrono::seconds(5);
  REQUIRE(d::send_all(b.fd(), "0123456789abcdef", 16, later));
  const auto past = d::RdvClock::now() - std::chrono::milliseconds(1);
  char got[8] = {};
  CHECK(!d::wait_fd(a.fd(), POLLIN, past));
  CHECK(!d::wait_fd(a.fd(), POLLOUT, past));
  CHECK(!d::recv_all(a.fd(), got, sizeof got, past));
  CHECK(!d::send_all(a.fd(), "x", 1, past));
  // Before the deadline the same calls go through.
  CHECK(d::wait_fd(a.fd(), POLLIN, later));
  CHECK(d::recv_all(a.fd(), got, sizeof got, later));
  CHECK(std::string(got, sizeof got) == "01234567");
  CHECK(d::send_all(a.fd(), "x", 1, later));

  // Rank 0 of tcp_broadcast and of TcpComm waits for a rank that never comes while junk keeps
  // arriving at its port: it fails within its timeout (and a little slack), naming what it
  // waited for.
  for (int which = 0; which < 2; ++which) {
    CAPTURE(which);
    const int port = free_port();
    std::atomic<bool> stop{false};
    std::vector<std::thread> junk;
    for (int i = 0; i < 2; ++i) junk.emplace_back([&] { send_junk(port, stop); });
    const auto t0 = std::chrono::steady_clock::now();
    std::string error;
    try {
      if (which == 0) {
        std::array<std::byte, 8> payload{};
        dist::tcp_broadcast("127.0.0.1", port, 0, 2, payload, std::chrono::milliseconds(500));
      } else {
        dist::TcpCommOptions o;
        o.timeout = std::chrono::milliseconds(500);
        dist::TcpComm c("127.0.0.1", port, 0, 2, o);
      }
    } catch (const tk::Error& e) {
      error = e.what();
    }
    const double took =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    stop.store(true);
    for (auto& t : junk) t.join();
    CAPTURE(error);
    CHECK(took < 2.0);
    CHECK(error.find(which == 0 ? "rank 0 waited 0.5 s but only 0 of the other 1 ranks connected"
                                : "1 of the 1 other ranks never connected (missing: rank 1)") !=
          std::string::npos);
  }
}
