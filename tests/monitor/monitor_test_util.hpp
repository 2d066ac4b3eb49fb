// Helpers shared by the monitor tests: scratch directories, hex decoding, file reading, and
// running the Python checks (tensorboard reader, json) when a suitable Python exists.
#pragma once

#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

namespace monitor_test {

/// Everything written to `f` so far (a tmpfile standing in for the console).
inline std::string read_stream(std::FILE* f) {
  std::fflush(f);
  std::rewind(f);
  std::string out;
  char buffer[4096];
  std::size_t n = 0;
  while ((n = std::fread(buffer, 1, sizeof buffer, f)) > 0) out.append(buffer, n);
  return out;
}

/// A fresh directory under the system temp dir, removed when the object dies.
class ScratchDir {
 public:
  explicit ScratchDir(const std::string& tag) {
    static std::atomic<int> counter{0};
    path_ = std::filesystem::temp_directory_path() /
            ("trainkit_monitor_" + tag + "_" + std::to_string(::getpid()) + "_" +
             std::to_string(counter.fetch_add(1)));
    std::filesystem::remove_all(path_);
    std::filesystem::create_directories(path_);
  }
  ~ScratchDir() {
    std::error_code ec;
    if (std::getenv("TRAINKIT_KEEP_TEST_FILES") == nullptr) std::filesystem::remove_all(path_, ec);
  }
  ScratchDir(const ScratchDir&) = delete;
  ScratchDir& operator=(const ScratchDir&) = delete;
  const std::filesystem::path& path() const { return path_; }
  std::string str() const { return path_.string(); }
  std::string operator/(const std::string& name) const { return (path_ / name).string(); }

 private:
  std::filesystem::path path_;
};

inline std::string from_hex(const std::string& hex) {
  std::string out;
  int high = -1;
  for (const char c : hex) {
    int v = -1;
    if (c >= '0' && c <= '9') v = c - '0';
    if (c >= 'a' && c <= 'f') v = c - 'a' + 10;
    if (c >= 'A' && c <= 'F') v = c - 'A' + 10;
    if (v < 0) continue;  // spaces and separators
    if (high < 0) {
      high = v;
    } else {
      out.push_back(static_cast<char>(high * 16 + v));
      high = -1;
    }
  }
  return out;
}

inline std::string read_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
}

inline void write_file(const std::string& path, const std::string& bytes) {
  std::ofstream out(path, std::ios::binary);
  out << bytes;
}

/// Regular files in `dir` whose name contains `infix`.
inline std::vector<std::string> files_with(const std::string& dir, const std::string& infix) {
  std::vector<std::string> out;
  if (!std::filesystem::exists(dir)) return out;
  for (const auto& e : std::filesystem::directory_iterator(dir)) {
    if (e.is_regular_file() && e.path().filename().string().find(infix) != std::string::npos) {
      out.push_back(e.path().string());
    }
  }
  return out;
}

/// The Python used by the checks: $TRAINKIT_PYTHON, else python3.
inline std::string python() {
  const char* env = std::getenv("TRAINKIT_PYTHON");
  return env != nullptr && *env != '\0' ? env : "python3";
}

/// python() in double quotes, to start a shell command line.
inline std::string python_command() {
  std::string quoted(1, '"');
  quoted += python();
  quoted += '"';
  return quoted;
}

/// True when `python -c "import <module>"` works.
inline bool python_has(const std::string& module) {
  const std::string cmd = python_command() + " -c \"import " + module + "\" >/dev/null 2>&1";
  return std::system(cmd.c_str()) == 0;
}

/// CI (GitHub Actions sets CI=true) or TRAINKIT_REQUIRE_TENSORBOARD=1: a missing module fails.
inline bool python_checks_required() {
  return std::getenv("CI") != nullptr || std::getenv("TRAINKIT_REQUIRE_TENSORBOARD") != nullptr;
}

/// Runs a shell command, returns its exit status and puts stdout+stderr into `output`.
inline int run_command(const std::string& cmd, std::string& output) {
  output.clear();
  std::FILE* pipe = ::popen((cmd + " 2>&1").c_str(), "r");
  if (pipe == nullptr) return -1;
  char buffer[4096];
  std::size_t n = 0;
  while ((n = std::fread(buffer, 1, sizeof buffer, pipe)) > 0) output.append(buffer, n);
  const int status = ::pclose(pipe);
  return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}

}  // namespace monitor_test
