// SPDX-License-Identifier: MIT
// NVTX ranges (trainkit/monitor/nvtx.hpp). With CUDA the test links a static NVTX injection (the
// mechanism Nsight's own injection uses) that records every push/pop/start/end, so it checks what
// a profiler would be told: NvtxSpans that end out of order (A opens, B opens, A ends, B ends)
// still close the range each one opened, while the push/pop stack closes the innermost range. In
// the CPU tier every call is a no-op and the test checks the types' behaviour only.
#include <cstdint>

// The build defines TRAINKIT_WITH_CUDA for a host TU; it is tested before any trainkit header is
// included (in single-header test mode every header pulls in NVTX).
#if defined(TRAINKIT_WITH_CUDA) && TRAINKIT_WITH_CUDA && defined(__GNUC__) && !defined(_WIN32)
// This file defines the injection's entry point (below), so NVTX must not define its weak one.
#define NVTX_STATIC_INJECTION_IMPL
extern "C" int (*InitializeInjectionNvtx2_fnptr)(const void* (*)(std::uint32_t));
#endif

#include <doctest/doctest.h>

#include <cstdlib>
#include <mutex>
#include <string>
#include <thread>
#include <type_traits>
#include <utility>
#include <vector>

#include "trainkit/monitor/nvtx.hpp"

namespace mon = trainkit::monitor;

static_assert(std::is_nothrow_move_constructible_v<mon::NvtxSpan>);
static_assert(std::is_nothrow_move_assignable_v<mon::NvtxSpan>);
static_assert(!std::is_copy_constructible_v<mon::NvtxSpan>);
static_assert(!std::is_move_constructible_v<mon::NvtxRange>);

#if TRAINKIT_WITH_CUDA && defined(NVTX_STATIC_INJECTION_IMPL)
namespace {

// What the injection saw: one entry per call, in order.
struct Call {
  std::string what;  // "push", "pop", "start", "end"
  std::string name;  // push/start: the message
  std::uint64_t id = 0;
};
std::mutex g_mutex;
std::vector<Call> g_calls;
std::uint64_t g_next_id = 1;

void record(Call c) {
  std::lock_guard<std::mutex> lock(g_mutex);
  g_calls.push_back(std::move(c));
}
int NVTX_API push(const char* m) {
  record({"push", m, 0});
  return 0;
}
int NVTX_API pop() {
  record({"pop", "", 0});
  return 0;
}
nvtxRangeId_t NVTX_API start(const char* m) {
  std::lock_guard<std::mutex> lock(g_mutex);
  const std::uint64_t id = g_next_id++;
  g_calls.push_back({"start", m, id});
  return id;
}
void NVTX_API end(nvtxRangeId_t id) { record({"end", "", id}); }

int NVTX_API initialize_injection(NvtxGetExportTableFunc_t get_table) {
  const auto* callbacks =
      static_cast<const NvtxExportTableCallbacks*>(get_table(NVTX_ETID_CALLBACKS));
  NvtxFunctionTable table = nullptr;
  unsigned int size = 0;
  if (callbacks == nullptr ||
      !callbacks->GetModuleFunctionTable(NVTX_CB_MODULE_CORE, &table, &size) ||
      size <= NVTX_CBID_CORE_RangePop)
    return 0;
  *table[NVTX_CBID_CORE_RangePushA] = reinterpret_cast<NvtxFunctionPointer>(&push);
  *table[NVTX_CBID_CORE_RangePop] = reinterpret_cast<NvtxFunctionPointer>(&pop);
  *table[NVTX_CBID_CORE_RangeStartA] = reinterpret_cast<NvtxFunctionPointer>(&start);
  *table[NVTX_CBID_CORE_RangeEnd] = reinterpret_cast<NvtxFunctionPointer>(&end);
  return 1;
}

// Replays the calls the way a profiler does and returns "name:open_index-close_index" per range
// in closing order (indices count this test's calls).
std::vector<std::string> ranges(const std::vector<Call>& calls) {
  std::vector<std::string> out;
  std::vector<std::pair<std::string, std::size_t>> stack;
  std::vector<std::pair<std::uint64_t, std::pair<std::string, std::size_t>>> open;
  for (std::size_t i = 0; i < calls.size(); ++i) {
    const Call& c = calls[i];
    if (c.what == "push") stack.push_back({c.name, i});
    if (c.what == "pop" && !stack.empty()) {
      out.push_back(stack.back().first + ":" + std::to_string(stack.back().second) + "-" +
                    std::to_string(i));
      stack.pop_back();
    }
    if (c.what == "start") open.push_back({c.id, {c.name, i}});
    if (c.what == "end")
      for (auto it = open.begin(); it != open.end(); ++it)
        if (it->first == c.id) {
          out.push_back(it->second.first + ":" + std::to_string(it->second.second) + "-" +
                        std::to_string(i));
          open.erase(it);
          break;
        }
  }
  return out;
}

std::vector<Call> take_calls() {
  std::lock_guard<std::mutex> lock(g_mutex);
  return std::exchange(g_calls, {});
}

}  // namespace

NvtxInitializeInjectionNvtxFunc_t InitializeInjectionNvtx2_fnptr = &initialize_injection;

TEST_CASE("nvtx: interleaved NvtxSpans close their own ranges; the push/pop stack nests") {
  if (std::getenv("NVTX_INJECTION64_PATH") != nullptr) {
    MESSAGE("skipped: a profiler's NVTX injection is attached");
    return;
  }
  mon::nvtx_mark("warm-up");  // NVTX initializes (and calls the injection) on its first call
  take_calls();

  {  // A opens, B opens, A ends, B ends: not nested.
    mon::NvtxSpan a("A");
    mon::NvtxSpan b("B");
    a.end();
    mon::NvtxSpan moved = std::move(b);  // moving does not end the range
    CHECK(!b.open());
    CHECK(moved.open());
  }
  CHECK(ranges(take_calls()) == std::vector<std::string>{"A:0-2", "B:1-3"});

  {  // A span may end on another thread.
    mon::NvtxSpan c("C");
    std::thread([s = std::move(c)]() mutable { s.end(); }).join();
  }
  CHECK(ranges(take_calls()) == std::vector<std::string>{"C:0-1"});

  {  // Scoped NvtxRanges nest on the thread's stack.
    mon::NvtxRange outer("outer");
    mon::NvtxRange inner("inner");
  }
  CHECK(ranges(take_calls()) == std::vector<std::string>{"inner:1-2", "outer:0-3"});
}
#endif

TEST_CASE("nvtx: NvtxSpan moves and ends once") {
  mon::NvtxSpan none;
  CHECK(!none.open());
  mon::NvtxSpan a("a");
  CHECK(a.open());
  mon::NvtxSpan b(std::move(a));
  CHECK(!a.open());
  CHECK(b.open());
  a = std::move(b);
  CHECK(a.open());
  a.end();
  a.end();
  CHECK(!a.open());
  mon::nvtx_range_end(mon::nvtx_range_start("free"));
#if !TRAINKIT_WITH_CUDA
  CHECK(mon::nvtx_range_start("cpu tier") == 0);
#endif
}
