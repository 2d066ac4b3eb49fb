// SPDX-License-Identifier: MIT
// trainkit/error.hpp: the one exception type of the library and the check macros that throw it.
// Host APIs throw trainkit::Error carrying what failed and the backing library's code and
// message. The failed condition and the source file:line are added only in a debug build (no
// NDEBUG) or with TRAINKIT_VERBOSE_ERRORS=1 in the environment (=0 turns them off in a debug
// build too). Destructors use the *_NOTHROW variants, which log and return.
#pragma once

#include <cstdio>
#include <cstdlib>
#include <sstream>
#include <stdexcept>
#include <string>
#include <string_view>
#include <utility>

#include "trainkit/config.hpp"

#if TRAINKIT_WITH_CUDA
#include <cuda_runtime_api.h>
#endif
#if TRAINKIT_WITH_CUBLASLT
#include <cublasLt.h>
#endif
#if TRAINKIT_WITH_NCCL
#include <nccl.h>
#endif
#if TRAINKIT_WITH_MPI
#include <mpi.h>
#endif

TRAINKIT_NAMESPACE_BEGIN

/// The exception every trainkit host API throws. `library()` names the layer that failed
/// ("trainkit", "CUDA", "cuBLASLt", "NCCL", "MPI", "io", "os"); `code()` is that layer's status
/// code (an errno value for "os"; 0 when there is none).
class Error : public std::runtime_error {
 public:
  explicit Error(const std::string& message, std::string library = "trainkit", long long code = 0)
      : std::runtime_error(message), library_(std::move(library)), code_(code) {}

  const std::string& library() const noexcept { return library_; }
  long long code() const noexcept { return code_; }

 private:
  std::string library_;
  long long code_;
};

namespace detail {

/// Text from outside the program (a file, a peer, the environment) as an error message shows
/// it: printable ASCII as it is, every other byte and the backslash as \xNN, so the message
/// stays one line of plain text whatever the input holds (io::printable_bytes).
inline std::string printable_bytes(std::string_view text) {
  static constexpr char kHex[] = "0123456789abcdef";
  std::string out;
  for (const char ch : text) {
    const auto c = static_cast<unsigned char>(ch);
    if (c >= 0x20 && c < 0x7f && c != '\\') {
      out += ch;
    } else {
      out += "\\x";
      out += kHex[c >> 4];
      out += kHex[c & 15];
    }
  }
  return out;
}

/// printable_bytes of the first `max` bytes of `text`, then "..." when there was more: for text
/// from outside that may be arbitrarily long (a key of a file).
inline std::string printable_prefix(std::string_view text, std::size_t max = 200) {
  std::string out = printable_bytes(text.substr(0, max));
  if (text.size() > max) out += "...";
  return out;
}

template <class... Args>
std::string concat(const Args&... args) {
  std::ostringstream out;
  (out << ... << args);
  return out.str();
}

/// Whether messages carry the failed condition and the source location: TRAINKIT_VERBOSE_ERRORS
/// when set ("0", "false", "off", "no" = no, anything else = yes), else `debug_build`.
inline bool verbose_errors(bool debug_build) noexcept {
  const char* env = std::getenv("TRAINKIT_VERBOSE_ERRORS");
  if (env == nullptr || *env == '\0') return debug_build;
  const std::string v(env);
  return !(v == "0" || v == "false" || v == "FALSE" || v == "off" || v == "OFF" || v == "no" ||
           v == "NO");
}

/// " [<expr>] at <file>:<line>" when verbose (see verbose_errors), else "".
inline std::string error_location(const char* expr, const char* file, int line, bool debug_build) {
  if (!verbose_errors(debug_build)) return {};
  std::string where;
  if (expr != nullptr && *expr != '\0') where += concat(" [", expr, "]");
  if (file != nullptr) where += concat(" at ", file, ":", line);
  return where;
}

/// Builds "trainkit: <message>" (plus " [<expr>] at <file>:<line>" when verbose) and throws.
/// `debug_build` is the calling translation unit's (the macros pass it).
[[noreturn]] inline void throw_error(const std::string& message, const char* expr, const char* file,
                                     int line, const char* library = "trainkit", long long code = 0,
                                     bool debug_build = false) {
  throw Error("trainkit: " + message + error_location(expr, file, line, debug_build), library,
              code);
}

inline void log_error(const std::string& message, const char* expr, const char* file, int line,
                      bool debug_build = false) noexcept {
  try {
    std::fprintf(stderr, "trainkit: error ignored in a destructor: %s%s\n", message.c_str(),
                 error_location(expr, file, line, debug_build).c_str());
  } catch (...) {
    std::fprintf(stderr, "trainkit: error ignored in a destructor: %s\n", message.c_str());
  }
}

/// Logs message() (building it may throw; nothing escapes) and returns false: the failure path
/// of the *_check_nothrow functions below.
template <class Message>
inline bool log_failed_call(const Message& message, const char* expr, const char* file, int line,
                            bool debug_build) noexcept {
  try {
    log_error(message(), expr, file, line, debug_build);
  } catch (...) {
  }
  return false;
}

#if TRAINKIT_WITH_CUDA
inline std::string cuda_message(cudaError_t status) {
  return concat("CUDA error ", static_cast<int>(status), " ", cudaGetErrorName(status), ": ",
                cudaGetErrorString(status));
}

inline void cuda_check(cudaError_t status, const char* expr, const char* file, int line,
                       bool debug_build = false) {
  if (status == cudaSuccess) return;
  // Clear the sticky "last error" so one failure does not poison every later check.
  (void)cudaGetLastError();
  throw_error(cuda_message(status), expr, file, line, "CUDA", status, debug_build);
}

inline bool cuda_check_nothrow(cudaError_t status, const char* expr, const char* file, int line,
                               bool debug_build = false) noexcept {
  if (status == cudaSuccess) return true;
  (void)cudaGetLastError();
  return log_failed_call([&] { return cuda_message(status); }, expr, file, line, debug_build);
}
#endif

#if TRAINKIT_WITH_CUBLASLT
inline std::string cublas_message(cublasStatus_t status) {
  return concat("cuBLAS status ", static_cast<int>(status), " ", cublasLtGetStatusName(status),
                ": ", cublasLtGetStatusString(status));
}

inline void cublas_check(cublasStatus_t status, const char* expr, const char* file, int line,
                         bool debug_build = false) {
  if (status == CUBLAS_STATUS_SUCCESS) return;
  throw_error(cublas_message(status), expr, file, line, "cuBLASLt", status, debug_build);
}

inline bool cublas_check_nothrow(cublasStatus_t status, const char* expr, const char* file,
                                 int line, bool debug_build = false) noexcept {
  if (status == CUBLAS_STATUS_SUCCESS) return true;
  return log_failed_call([&] { return cublas_message(status); }, expr, file, line, debug_build);
}
#endif

#if TRAINKIT_WITH_NCCL
inline std::string nccl_message(ncclResult_t status) {
  return concat("NCCL error ", static_cast<int>(status), ": ", ncclGetErrorString(status));
}

inline void nccl_check(ncclResult_t status, const char* expr, const char* file, int line,
                       bool debug_build = false) {
  // ncclInProgress is the normal answer of a non-blocking communicator, not a failure.
  if (status == ncclSuccess || status == ncclInProgress) return;
  throw_error(nccl_message(status), expr, file, line, "NCCL", status, debug_build);
}

inline bool nccl_check_nothrow(ncclResult_t status, const char* expr, const char* file, int line,
                               bool debug_build = false) noexcept {
  if (status == ncclSuccess || status == ncclInProgress) return true;
  return log_failed_call([&] { return nccl_message(status); }, expr, file, line, debug_build);
}
#endif

#if TRAINKIT_WITH_MPI
inline std::string mpi_message(int status) {
  char text[MPI_MAX_ERROR_STRING] = {};
  int length = 0;
  if (MPI_Error_string(status, text, &length) != MPI_SUCCESS) length = 0;
  return concat("MPI error ", status, ": ", std::string(text, static_cast<std::size_t>(length)));
}

inline void mpi_check(int status, const char* expr, const char* file, int line,
                      bool debug_build = false) {
  if (status == MPI_SUCCESS) return;
  throw_error(mpi_message(status), expr, file, line, "MPI", status, debug_build);
}

inline bool mpi_check_nothrow(int status, const char* expr, const char* file, int line,
                              bool debug_build = false) noexcept {
  if (status == MPI_SUCCESS) return true;
  return log_failed_call([&] { return mpi_message(status); }, expr, file, line, debug_build);
}
#endif

}  // namespace detail

TRAINKIT_NAMESPACE_END

// Whether the including translation unit is a debug build (no NDEBUG): its errors then name the
// failed condition and the source location by default (see detail::verbose_errors). The macros
// below pass it, so the inline functions themselves are identical in every translation unit.
#ifdef NDEBUG
#define TRAINKIT_DETAIL_DEBUG_BUILD false
#else
#define TRAINKIT_DETAIL_DEBUG_BUILD true
#endif

/// Throws trainkit::Error with the streamed message when `cond` is false:
/// `TRAINKIT_CHECK(n > 0, "tensor '", name, "' is empty")`.
#define TRAINKIT_CHECK(cond, ...)                                                               \
  do {                                                                                          \
    if (!(cond))                                                                                \
      ::trainkit::detail::throw_error(::trainkit::detail::concat(__VA_ARGS__), #cond, __FILE__, \
                                      __LINE__, "trainkit", 0, TRAINKIT_DETAIL_DEBUG_BUILD);    \
  } while (0)

/// Throws trainkit::Error with the streamed message, unconditionally.
#define TRAINKIT_FAIL(...)                                                                         \
  ::trainkit::detail::throw_error(::trainkit::detail::concat(__VA_ARGS__), "", __FILE__, __LINE__, \
                                  "trainkit", 0, TRAINKIT_DETAIL_DEBUG_BUILD)

/// Throws trainkit::Error with library() "os" and code() `err` (an errno value): the operating
/// system refused (no memory, too many open files, no permission), which says nothing about the
/// data being read.
#define TRAINKIT_FAIL_OS(err, ...)                                                                 \
  ::trainkit::detail::throw_error(::trainkit::detail::concat(__VA_ARGS__), "", __FILE__, __LINE__, \
                                  "os", (err), TRAINKIT_DETAIL_DEBUG_BUILD)

/// Throws the one error every device-memory path gives in a build without CUDA; the parts name
/// what was attempted: `TRAINKIT_FAIL_WITHOUT_CUDA("ParamArena: a device arena")`.
#define TRAINKIT_FAIL_WITHOUT_CUDA(...)                                          \
  TRAINKIT_FAIL(__VA_ARGS__,                                                     \
                ", but trainkit was built without CUDA (TRAINKIT_WITH_CUDA=0); " \
                "build with CUDA enabled to use device memory")

/// Calls ::trainkit::detail::<check>(value, text, file, line, debug): the one shape of the
/// library check macros below (`text` is the call as written, stringized by the outer macro).
#define TRAINKIT_DETAIL_LIBRARY_CHECK(check, value, text) \
  ::trainkit::detail::check((value), text, __FILE__, __LINE__, TRAINKIT_DETAIL_DEBUG_BUILD)

// One public name per library and mode; each is a one-line use of the helper above.
/// Throws trainkit::Error when a CUDA runtime call fails (and clears the sticky error).
#define TRAINKIT_CUDA_CHECK(expr) TRAINKIT_DETAIL_LIBRARY_CHECK(cuda_check, expr, #expr)
/// Logs instead of throwing; returns true on success. For destructors.
#define TRAINKIT_CUDA_CHECK_NOTHROW(expr) \
  TRAINKIT_DETAIL_LIBRARY_CHECK(cuda_check_nothrow, expr, #expr)
#define TRAINKIT_CUBLAS_CHECK(expr) TRAINKIT_DETAIL_LIBRARY_CHECK(cublas_check, expr, #expr)
#define TRAINKIT_CUBLAS_CHECK_NOTHROW(expr) \
  TRAINKIT_DETAIL_LIBRARY_CHECK(cublas_check_nothrow, expr, #expr)
#define TRAINKIT_NCCL_CHECK(expr) TRAINKIT_DETAIL_LIBRARY_CHECK(nccl_check, expr, #expr)
#define TRAINKIT_NCCL_CHECK_NOTHROW(expr) \
  TRAINKIT_DETAIL_LIBRARY_CHECK(nccl_check_nothrow, expr, #expr)
#define TRAINKIT_MPI_CHECK(expr) TRAINKIT_DETAIL_LIBRARY_CHECK(mpi_check, expr, #expr)
#define TRAINKIT_MPI_CHECK_NOTHROW(expr) \
  TRAINKIT_DETAIL_LIBRARY_CHECK(mpi_check_nothrow, expr, #expr)

/// Device-side assertion: traps the kernel (the host sees a launch failure); on the host the
/// same functor aborts. Never throws, so it is usable in TRAINKIT_HOST_DEVICE code.
#if defined(__CUDA_ARCH__)
#define TRAINKIT_DEVICE_ASSERT(cond) \
  do {                               \
    if (!(cond)) __trap();           \
  } while (0)
#else
#define TRAINKIT_DEVICE_ASSERT(cond) \
  do {                               \
    if (!(cond)) ::std::abort();     \
  } while (0)
#endif
