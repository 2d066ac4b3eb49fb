// SPDX-License-Identifier: MIT
// trainkit/dist/bootstrap.hpp: `dist::init()`, which turns "whoever launched this process" into a
// communicator. trainkit has no launcher of its own: it reads the variables of torchrun (RANK,
// WORLD_SIZE, LOCAL_RANK, MASTER_ADDR, MASTER_PORT), Open MPI's mpirun (OMPI_COMM_WORLD_*) and
// Slurm's srun (SLURM_PROCID, ...), picks the GPU by local rank, and chooses the backend: NCCL
// for device tensors; for host tensors MPI under mpirun/srun (when built with it), else TcpComm.
#pragma once

#include <cerrno>
#include <chrono>
#include <climits>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <utility>

#include "trainkit/config.hpp"
#include "trainkit/core/shape.hpp"
#include "trainkit/cuda/device.hpp"
#include "trainkit/dist/comm.hpp"
#include "trainkit/dist/mpi_comm.hpp"
#include "trainkit/dist/nccl_comm.hpp"
#include "trainkit/dist/rendezvous.hpp"
#include "trainkit/dist/tcp_comm.hpp"
#include "trainkit/dist/thread_comm.hpp"
#include "trainkit/error.hpp"

TRAINKIT_NAMESPACE_BEGIN
namespace dist {

/// Who started this process.
enum class Launcher : std::uint8_t { kNone, kTorchrun, kOpenMpi, kSlurm, kPmi };

// A switch, not a table, like the other enum-name functions: -Wswitch flags a new enumerator.
inline constexpr std::string_view launcher_name(Launcher l) noexcept {
  switch (l) {
    case Launcher::kNone: return "none";
    case Launcher::kTorchrun: return "torchrun";
    case Launcher::kOpenMpi: return "Open MPI";
    case Launcher::kSlurm: return "Slurm";
    case Launcher::kPmi: return "mpiexec (PMI: MPICH, Intel MPI)";
  }
  return "?";
}

/// This process's place in the job, as the launcher described it.
struct LaunchInfo {
  Launcher launcher = Launcher::kNone;
  int rank = 0;              ///< global rank, in [0, world_size)
  int world_size = 1;        ///< number of processes
  int local_rank = 0;        ///< rank on this node: selects the GPU
  int local_world_size = 1;  ///< processes on this node
  std::string master_addr;   ///< host of rank 0 for the TCP rendezvous ("" when unknown)
  int master_port = 0;       ///< its port (0 when unknown)
  /// TORCHELASTIC_USE_AGENT_STORE=True: torchrun's agent already serves a TCPStore on
  /// MASTER_PORT, so the rendezvous uses MASTER_PORT + 1.
  bool agent_store = false;
};

namespace detail {

inline std::optional<std::string> env_var(const char* name) {
  const char* v = std::getenv(name);
  if (v == nullptr || *v == '\0') return std::nullopt;
  return std::string(v);
}

/// The integer in environment variable `name`, or nullopt when unset; throws trainkit::Error
/// naming the variable when it is not an integer in [lo, hi] written plainly: decimal digits,
/// nothing before or after them (strtol alone would take " 2" and "+2").
TRAINKIT_INLINE std::optional<int> env_int(const char* name, long lo = 0, long hi = INT_MAX);

/// The first host of a Slurm node list: "gpu[003-006,9],cpu1" -> "gpu003", "n1,n2" -> "n1",
/// "r[1-2]-n[07-09]" -> "r1-n07".
TRAINKIT_INLINE std::string first_slurm_host(std::string_view list);

/// The count of node `node` in a Slurm tasks-per-node list: "4(x2),3" -> 4, 4, 3 for nodes 0,
/// 1, 2; nullopt when the variable is unset, malformed or has no such node.
TRAINKIT_INLINE std::optional<int> slurm_node_count(const char* name, long node);

#if TRAINKIT_IMPL

TRAINKIT_INLINE std::optional<int> env_int(const char* name, long lo, long hi) {
  const auto v = env_var(name);
  if (!v) return std::nullopt;
  char* end = nullptr;
  errno = 0;
  const long x = std::strtol(v->c_str(), &end, 10);
  const char first = (*v)[0];
  const bool plain = (first >= '0' && first <= '9') || (first == '-' && lo < 0);
  TRAINKIT_CHECK(plain && end != v->c_str() && *end == '\0' && errno == 0 && x >= lo && x <= hi,
                 "dist: environment variable ", name, "='", ::trainkit::detail::printable_bytes(*v),
                 "' is not an integer in [", lo, ", ", hi, "]");
  return static_cast<int>(x);
}

TRAINKIT_INLINE std::string first_slurm_host(std::string_view list) {
  std::size_t depth = 0, end = 0;
  for (; end < list.size(); ++end) {
    if (list[end] == '[') ++depth;
    if (list[end] == ']' && depth > 0) --depth;
    if (list[end] == ',' && depth == 0) break;
  }
  // The first entry may hold several bracket groups ("rack[1-2]-node[07-09]"): each stands
  // for its first element.
  const std::string_view first = list.substr(0, end);
  std::string host;
  for (std::size_t at = 0; at < first.size();) {
    const std::size_t open = first.find('[', at);
    if (open == std::string_view::npos) {
      host += first.substr(at);
      break;
    }
    const std::size_t close = first.find(']', open);
    TRAINKIT_CHECK(
        close != std::string_view::npos && close > open + 1 && first.find('[', open + 1) > close,
        "dist: malformed Slurm node list '", list, "'");
    const std::string_view ranges = first.substr(open + 1, close - open - 1);
    std::size_t stop = 0;
    while (stop < ranges.size() && ranges[stop] != ',' && ranges[stop] != '-') ++stop;
    TRAINKIT_CHECK(stop > 0, "dist: malformed Slurm node list '", list, "'");
    host += first.substr(at, open - at);
    host += ranges.substr(0, stop);
    at = close + 1;
  }
  TRAINKIT_CHECK(!host.empty(), "dist: malformed Slurm node list '", list,
                 "' (its first entry is empty)");
  return host;
}

TRAINKIT_INLINE std::optional<int> slurm_node_count(const char* name, long node) {
  const auto v = env_var(name);
  if (!v || node < 0) return std::nullopt;
  const char* p = v->c_str();
  long first = 0;  // the first node of the current entry
  for (;;) {
    char* end = nullptr;
    errno = 0;
    const long count = std::strtol(p, &end, 10);
    if (end == p || errno != 0 || count < 1 || count > INT_MAX) return std::nullopt;
    long repeat = 1;
    p = end;
    if (*p == '(') {  // "(xK)": K nodes with this count
      if (p[1] != 'x') return std::nullopt;
      repeat = std::strtol(p + 2, &end, 10);
      if (end == p + 2 || *end != ')' || repeat < 1 || repeat > INT_MAX) return std::nullopt;
      p = end + 1;
    }
    if (node < first + repeat) return static_cast<int>(count);
    first += repeat;
    if (*p != ',') return std::nullopt;
    ++p;
  }
}

#endif  // TRAINKIT_IMPL

}  // namespace detail

/// Reads the launcher's environment variables, in this order of precedence:
///  - torchrun (and other torch.distributed launchers): RANK, WORLD_SIZE, LOCAL_RANK,
///    LOCAL_WORLD_SIZE, MASTER_ADDR, MASTER_PORT, TORCHELASTIC_USE_AGENT_STORE;
///  - Open MPI's mpirun: OMPI_COMM_WORLD_RANK/_SIZE/_LOCAL_RANK/_LOCAL_SIZE;
///  - Slurm's srun: SLURM_PROCID, SLURM_STEP_NUM_TASKS (else SLURM_NTASKS), SLURM_LOCALID,
///    this node's (SLURM_NODEID) entry of SLURM_STEP_TASKS_PER_NODE; rendezvous at MASTER_ADDR
///    (else the step's first node) and MASTER_PORT (else 20000 + SLURM_JOB_ID % 20000);
///  - MPICH's or Intel MPI's mpiexec (Hydra, PMI): PMI_RANK, PMI_SIZE, MPI_LOCALRANKID,
///    MPI_LOCALNRANKS;
///  - none of them: a single process (rank 0 of 1). Half of a launcher's rank/size pair (RANK
///    without WORLD_SIZE, ...) is an error, not a single process.
/// MASTER_ADDR/MASTER_PORT are honoured under every launcher. Throws trainkit::Error naming the
/// variable when a value is malformed or inconsistent (e.g. RANK >= WORLD_SIZE).
TRAINKIT_INLINE LaunchInfo detect_launch();

/// The communicator backends dist::init can create.
enum class Backend : std::uint8_t { kAuto, kThread, kMpi, kNccl, kTcp };

// A switch, not a table, like the other enum-name functions: -Wswitch flags a new enumerator.
inline constexpr std::string_view backend_name(Backend b) noexcept {
  switch (b) {
    case Backend::kAuto: return "auto";
    case Backend::kThread: return "thread";
    case Backend::kMpi: return "mpi";
    case Backend::kNccl: return "nccl";
    case Backend::kTcp: return "tcp";
  }
  return "?";
}

/// Options of dist::init.
struct InitOptions {
  /// kAuto: NCCL for device tensors. For host tensors: a one-rank ThreadComm for a single
  /// process; MPI when launched by mpirun or srun and trainkit is built with MPI; otherwise
  /// (torchrun, or no MPI) TcpComm, which meets at MASTER_ADDR and the rendezvous port.
  Backend backend = Backend::kAuto;
  /// Where the tensors to reduce live (the ParamArena's space).
  Space space = Space::kHost;
  /// Bootstrap and collective timeout (see each backend).
  std::chrono::milliseconds timeout = default_timeout();
  /// NCCL: make device local_rank % device_count current (one GPU per process, torchrun style).
  bool select_device = true;
  /// The TCP rendezvous port (rank 0 listens on it: NCCL's unique-id exchange, TcpComm's
  /// bootstrap); 0: $TRAINKIT_RDZV_PORT, else MASTER_PORT (MASTER_PORT + 1 when torchrun's agent
  /// store already listens on MASTER_PORT).
  int rendezvous_port = 0;
};

/// What dist::init set up: the communicator, and where this process runs. Move-only.
class Context {
 public:
  Context(Context&&) noexcept = default;
  Context& operator=(Context&&) noexcept = default;

  const LaunchInfo& launch() const noexcept { return launch_; }
  int rank() const noexcept { return comm_->rank(); }
  int world_size() const noexcept { return comm_->world_size(); }
  int local_rank() const noexcept { return launch_.local_rank; }
  /// The CUDA device selected for this rank; -1 for host backends.
  int device() const noexcept { return device_; }
  Backend backend() const noexcept { return backend_; }
  /// The communicator for tensors in InitOptions::space.
  Comm& comm() noexcept { return *comm_; }
  /// A host communicator next to an NCCL one (the MpiComm that bootstrapped it under mpirun),
  /// or null.
  Comm* host_comm() noexcept { return host_comm_.get(); }

 private:
  friend Context init(InitOptions);
  Context() = default;

  LaunchInfo launch_;
  Backend backend_ = Backend::kThread;
  int device_ = -1;
  std::unique_ptr<Comm> host_comm_;  // declared first: destroyed after comm_
  std::unique_ptr<Comm> comm_;
};

/// Creates this process's communicator from the launcher's environment (see detect_launch and
/// InitOptions). NCCL under mpirun gets its unique id over MPI, otherwise over tcp_broadcast at
/// MASTER_ADDR and the rendezvous port; TcpComm's rank 0 listens at that port. Throws
/// trainkit::Error saying what is missing (a backend not compiled in, MASTER_ADDR unset, no GPU,
/// a world_size that disagrees with MPI's, a rank that never joined, ...).
TRAINKIT_INLINE Context init(InitOptions options = {});

namespace detail {

/// The job key dist::init passes to tcp_broadcast and TcpComm, so that ranks of another job (or
/// another launch of this one) that reach the same rendezvous port are refused: $TRAINKIT_RDZV_KEY
/// when set (at most 256 bytes), else "torchrun:" + $TORCHELASTIC_RUN_ID under torchrun (its
/// --rdzv-id, a fresh id with --standalone), else "slurm:" + $SLURM_JOB_ID + "." +
/// $SLURM_STEP_ID under Slurm, else "" (no key: only the world size and payload are compared).
/// Every rank of a job sees the same variables, so they agree. Throws trainkit::Error for a
/// TRAINKIT_RDZV_KEY longer than 256 bytes; a longer launcher id is shortened to a hash.
TRAINKIT_INLINE std::string rendezvous_job_key(const LaunchInfo& launch);

/// The TCP rendezvous port of InitOptions::rendezvous_port (0 when none is known). Throws
/// trainkit::Error for an option outside [0, 65535], and for MASTER_PORT 65535 under the agent
/// store (its rendezvous port would be 65536).
TRAINKIT_INLINE int rendezvous_port(const InitOptions& options, const LaunchInfo& launch);

}  // namespace detail

#if TRAINKIT_IMPL

TRAINKIT_INLINE std::string detail::rendezvous_job_key(const LaunchInfo& launch) {
  if (auto key = env_var("TRAINKIT_RDZV_KEY")) {
    TRAINKIT_CHECK(key->size() <= kRendezvousMaxKey,
                   "dist: environment variable TRAINKIT_RDZV_KEY='",
                   ::trainkit::detail::printable_bytes(key->substr(0, 64)), "...' has ",
                   key->size(), " bytes, at most ", kRendezvousMaxKey, " are allowed");
    return *key;
  }
  std::string key;
  if (launch.launcher == Launcher::kTorchrun) {
    if (auto id = env_var("TORCHELASTIC_RUN_ID")) key = "torchrun:" + *id;
  } else if (launch.launcher == Launcher::kSlurm) {
    if (auto id = env_var("SLURM_JOB_ID"))
      key = "slurm:" + *id + "." + env_var("SLURM_STEP_ID").value_or("");
  }
  if (key.size() > kRendezvousMaxKey) {  // FNV-1a: the same long id gives the same key
    std::uint64_t h = 14695981039346656037ULL;
    for (const char ch : key) h = (h ^ static_cast<unsigned char>(ch)) * 1099511628211ULL;
    const std::string prefix = key.substr(0, key.find(':') + 1);
    key = prefix + "#";
    for (int i = 15; i >= 0; --i) key += "0123456789abcdef"[(h >> (4 * i)) & 15];
  }
  return key;
}

TRAINKIT_INLINE int detail::rendezvous_port(const InitOptions& options, const LaunchInfo& launch) {
  int port = options.rendezvous_port;
  TRAINKIT_CHECK(port >= 0 && port <= 65535, "dist::init: InitOptions::rendezvous_port ", port,
                 " is not a port in [1, 65535] (or 0: from the environment)");
  if (port == 0) port = detail::env_int("TRAINKIT_RDZV_PORT", 1, 65535).value_or(0);
  if (port == 0 && launch.master_port > 0) {
    port = launch.master_port + (launch.agent_store ? 1 : 0);
    TRAINKIT_CHECK(port <= 65535, "dist::init: MASTER_PORT=", launch.master_port,
                   " is held by torchrun's agent store (TORCHELASTIC_USE_AGENT_STORE=True) and "
                   "the rendezvous would use the next port, ",
                   port, ", which does not exist: set TRAINKIT_RDZV_PORT or a lower MASTER_PORT");
  }
  return port;
}

TRAINKIT_INLINE LaunchInfo detect_launch() {
  using detail::env_int;
  using detail::env_var;
  LaunchInfo info;
  // The variables this launch was read from, for the consistency errors below.
  std::string rank_var = "RANK", size_var = "WORLD_SIZE", local_rank_var = "LOCAL_RANK",
              local_size_var = "LOCAL_WORLD_SIZE";
  // A launcher's pair of variables comes whole: half of one is a broken launch, not a single
  // process (each of N processes would otherwise train alone as rank 0).
  const auto pair = [&](const char* rank, const char* size) {
    const bool r = env_var(rank).has_value(), w = env_var(size).has_value();
    TRAINKIT_CHECK(r == w, "dist: ", r ? rank : size, " is set but ", r ? size : rank,
                   " is not; launch with both (or neither, for a single process)");
    return r && w;
  };
  if (pair("RANK", "WORLD_SIZE")) {
    info.launcher = Launcher::kTorchrun;
    if (!env_var("LOCAL_WORLD_SIZE")) local_size_var = "WORLD_SIZE (LOCAL_WORLD_SIZE is unset)";
    info.world_size = *env_int("WORLD_SIZE", 1);
    info.rank = *env_int("RANK", 0);
    info.local_rank = env_int("LOCAL_RANK", 0).value_or(0);
    info.local_world_size = env_int("LOCAL_WORLD_SIZE", 1).value_or(info.world_size);
    info.agent_store = env_var("TORCHELASTIC_USE_AGENT_STORE").value_or("") == "True";
  } else if (pair("OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE")) {
    info.launcher = Launcher::kOpenMpi;
    rank_var = "OMPI_COMM_WORLD_RANK";
    size_var = "OMPI_COMM_WORLD_SIZE";
    local_rank_var = "OMPI_COMM_WORLD_LOCAL_RANK";
    local_size_var = "OMPI_COMM_WORLD_LOCAL_SIZE";
    info.world_size = *env_int("OMPI_COMM_WORLD_SIZE", 1);
    info.rank = *env_int("OMPI_COMM_WORLD_RANK", 0);
    info.local_rank = env_int("OMPI_COMM_WORLD_LOCAL_RANK", 0).value_or(0);
    info.local_world_size = env_int("OMPI_COMM_WORLD_LOCAL_SIZE", 1).value_or(info.world_size);
  } else if (env_var("SLURM_PROCID") &&
             (env_var("SLURM_STEP_NUM_TASKS") || env_var("SLURM_NTASKS"))) {
    info.launcher = Launcher::kSlurm;
    rank_var = "SLURM_PROCID";
    size_var = env_var("SLURM_STEP_NUM_TASKS") ? "SLURM_STEP_NUM_TASKS" : "SLURM_NTASKS";
    local_rank_var = "SLURM_LOCALID";
    local_size_var = "this node's entry of SLURM_STEP_TASKS_PER_NODE";
    info.world_size = env_var("SLURM_STEP_NUM_TASKS") ? *env_int("SLURM_STEP_NUM_TASKS", 1)
                                                      : *env_int("SLURM_NTASKS", 1);
    info.rank = *env_int("SLURM_PROCID", 0);
    info.local_rank = env_int("SLURM_LOCALID", 0).value_or(0);
    // This node's entry of the tasks-per-node list (nodes may run different counts).
    const long node = env_int("SLURM_NODEID", 0).value_or(0);
    info.local_world_size =
        detail::slurm_node_count("SLURM_STEP_TASKS_PER_NODE", node)
            .value_or(
                detail::slurm_node_count("SLURM_TASKS_PER_NODE", node).value_or(info.world_size));
    for (const char* list : {"SLURM_STEP_NODELIST", "SLURM_JOB_NODELIST", "SLURM_NODELIST"}) {
      if (auto v = env_var(list)) {
        info.master_addr = detail::first_slurm_host(*v);
        break;
      }
    }
    if (!env_var("MASTER_PORT")) {  // job ids are 32-bit unsigned (federations use the top bits)
      if (auto job = env_var("SLURM_JOB_ID")) {
        char* end = nullptr;
        errno = 0;
        const unsigned long long id = std::strtoull(job->c_str(), &end, 10);
        TRAINKIT_CHECK(end != job->c_str() && *end == '\0' && errno == 0 && (*job)[0] >= '0' &&
                           (*job)[0] <= '9',
                       "dist: environment variable SLURM_JOB_ID='",
                       ::trainkit::detail::printable_bytes(*job), "' is not a job number");
        info.master_port = 20000 + static_cast<int>(id % 20000);
      }
    }
  } else if (pair("PMI_RANK", "PMI_SIZE")) {  // MPICH's and Intel MPI's Hydra
    info.launcher = Launcher::kPmi;
    rank_var = "PMI_RANK";
    size_var = "PMI_SIZE";
    local_rank_var = "MPI_LOCALRANKID";
    local_size_var = "MPI_LOCALNRANKS";
    info.world_size = *env_int("PMI_SIZE", 1);
    info.rank = *env_int("PMI_RANK", 0);
    info.local_rank = env_int("MPI_LOCALRANKID", 0).value_or(0);
    info.local_world_size = env_int("MPI_LOCALNRANKS", 1).value_or(info.world_size);
  }
  if (auto addr = env_var("MASTER_ADDR")) info.master_addr = *addr;
  if (auto port = env_int("MASTER_PORT", 1, 65535)) info.master_port = *port;
  TRAINKIT_CHECK(info.rank < info.world_size, "dist: ", launcher_name(info.launcher), " says rank ",
                 info.rank, " of ", info.world_size, " processes: ", rank_var, "=", info.rank,
                 " must be below ", size_var, "=", info.world_size);
  TRAINKIT_CHECK(info.local_rank < info.local_world_size, "dist: ", launcher_name(info.launcher),
                 " says local rank ", info.local_rank, " of ", info.local_world_size,
                 " processes on this node: ", local_rank_var, "=", info.local_rank,
                 " must be below ", local_size_var, "=", info.local_world_size);
  TRAINKIT_CHECK(info.local_world_size <= info.world_size, "dist: ", launcher_name(info.launcher),
                 " says ", info.local_world_size, " processes on this node but ", info.world_size,
                 " in all: ", local_size_var, "=", info.local_world_size, " must not exceed ",
                 size_var, "=", info.world_size);
  return info;
}

TRAINKIT_INLINE Context init(InitOptions options) {
  Context ctx;
  ctx.launch_ = detect_launch();
  const LaunchInfo& L = ctx.launch_;
  Backend backend = options.backend;
  if (backend == Backend::kAuto) {
    if (options.space == Space::kDevice) {
      backend = Backend::kNccl;
    } else if (L.world_size == 1) {
      backend = Backend::kThread;
    } else if ((L.launcher == Launcher::kOpenMpi || L.launcher == Launcher::kSlurm ||
                L.launcher == Launcher::kPmi) &&
               TRAINKIT_WITH_MPI) {
      backend = Backend::kMpi;
    } else if (!L.master_addr.empty() && detail::rendezvous_port(options, L) > 0) {
      backend = Backend::kTcp;
    } else {
      TRAINKIT_FAIL("dist::init: ", L.world_size, " processes launched by ",
                    launcher_name(L.launcher),
                    " with host tensors need a rendezvous for TcpComm: "
                    "set MASTER_ADDR and MASTER_PORT (torchrun does), "
                    "or launch with mpirun or srun --mpi=pmix and build with MPI "
                    "(TRAINKIT_WITH_MPI=1); "
                    "for threads of one process use ThreadComm::run");
    }
  }
  ctx.backend_ = backend;

  switch (backend) {
    case Backend::kThread: {
      TRAINKIT_CHECK(L.world_size == 1,
                     "dist::init: ThreadComm runs ranks as threads of one process, but ",
                     launcher_name(L.launcher), " started ", L.world_size,
                     " processes (use MPI, or ThreadComm::run inside one process)");
      ThreadCommOptions o;
      o.timeout = options.timeout;
      ctx.comm_ = std::make_unique<ThreadComm>(std::make_shared<ThreadGroup>(1, std::move(o)), 0);
      return ctx;
    }
    case Backend::kMpi: {
#if TRAINKIT_WITH_MPI
      MpiOptions o;
      o.timeout = options.timeout;
      auto mpi = std::make_unique<MpiComm>(o);
      TRAINKIT_CHECK(L.launcher == Launcher::kNone || mpi->world_size() == L.world_size,
                     "dist::init: ", launcher_name(L.launcher), " started ", L.world_size,
                     " processes but MPI sees ", mpi->world_size(),
                     " (srun needs --mpi=pmix or similar for MPI to see the whole job)");
      ctx.comm_ = std::move(mpi);
      return ctx;
#else
      TRAINKIT_FAIL(
          "dist::init: the MPI backend needs trainkit built with MPI "
          "(TRAINKIT_WITH_MPI=1, CMake TRAINKIT_ENABLE_MPI)");
#endif
    }
    case Backend::kNccl: {
#if TRAINKIT_WITH_NCCL
      if (options.select_device) {
        const int count = cuda::device_count();
        TRAINKIT_CHECK(count > 0,
                       "dist::init: the NCCL backend needs a CUDA device, none is visible to rank ",
                       L.rank);
        ctx.device_ = L.local_rank % count;
        cuda::set_device(ctx.device_);
      } else {
        ctx.device_ = cuda::current_device();
      }
      ncclUniqueId id{};
      if (L.rank == 0) id = NcclComm::make_unique_id();
      std::span<std::byte> bytes(reinterpret_cast<std::byte*>(&id), sizeof id);
      if (L.world_size > 1) {
#if TRAINKIT_WITH_MPI
        if (L.launcher == Launcher::kOpenMpi) {
          MpiOptions o;
          o.timeout = options.timeout;
          auto mpi = std::make_unique<MpiComm>(o);
          TRAINKIT_CHECK(mpi->world_size() == L.world_size, "dist::init: mpirun started ",
                         L.world_size, " processes but MPI sees ", mpi->world_size());
          mpi->broadcast(Buffer(bytes.data(), static_cast<std::int64_t>(bytes.size()), DType::kU8),
                         0)
              .wait();
          ctx.host_comm_ = std::move(mpi);
        }
#endif
        if (!ctx.host_comm_) {
          const int port = detail::rendezvous_port(options, L);
          TRAINKIT_CHECK(!L.master_addr.empty() && port > 0, "dist::init: NCCL over ", L.world_size,
                         " processes needs MASTER_ADDR and MASTER_PORT "
                         "(or TRAINKIT_RDZV_PORT) to exchange its unique id; launcher: ",
                         launcher_name(L.launcher));
          tcp_broadcast(L.master_addr, port, L.rank, L.world_size, bytes, options.timeout,
                        detail::rendezvous_job_key(L));
        }
      }
      NcclOptions o;
      o.timeout = options.timeout;
      ctx.comm_ = std::make_unique<NcclComm>(L.rank, L.world_size, id, o);
      return ctx;
#else
      TRAINKIT_FAIL(
          "dist::init: device tensors need the NCCL backend: build trainkit with NCCL "
          "(TRAINKIT_WITH_NCCL=1, CMake TRAINKIT_ENABLE_NCCL)");
#endif
    }
    case Backend::kTcp: {
#if TRAINKIT_DETAIL_HAS_SOCKETS
      TRAINKIT_CHECK(options.space == Space::kHost,
                     "dist::init: TcpComm moves host memory; device tensors need the NCCL backend");
      TcpCommOptions o;
      o.timeout = options.timeout;
      if (L.world_size == 1) {
        ctx.comm_ = std::make_unique<TcpComm>(std::string(), 0, 0, 1, std::move(o));
        return ctx;
      }
      o.job_key = detail::rendezvous_job_key(L);
      const int port = detail::rendezvous_port(options, L);
      TRAINKIT_CHECK(!L.master_addr.empty() && port > 0, "dist::init: TcpComm over ", L.world_size,
                     " processes needs MASTER_ADDR and MASTER_PORT (or TRAINKIT_RDZV_PORT) "
                     "to meet rank 0; launcher: ",
                     launcher_name(L.launcher));
      ctx.comm_ =
          std::make_unique<TcpComm>(L.master_addr, port, L.rank, L.world_size, std::move(o));
      return ctx;
#else
      TRAINKIT_FAIL("dist::init: TcpComm needs POSIX sockets, which this platform lacks");
#endif
    }
    case Backend::kAuto: break;
  }
  TRAINKIT_FAIL("dist::init: no backend");
}

#endif  // TRAINKIT_IMPL

}  // namespace dist
TRAINKIT_NAMESPACE_END
