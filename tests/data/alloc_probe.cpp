// SPDX-License-Identifier: MIT
// Replacement global operator new/delete backing alloc_probe.hpp (see there). Also compiled into
// test_io (tests/io/alloc_probe.cpp includes this file).
#include "alloc_probe.hpp"

#include <cstddef>
#include <cstdlib>
#include <new>

namespace alloc_probe {

State& state() noexcept {
  static State s;
  return s;
}

}  // namespace alloc_probe

namespace {

void* probed_alloc(std::size_t n, std::size_t align) {
  alloc_probe::State& s = alloc_probe::state();
  if (n > s.limit.load(std::memory_order_relaxed)) {
    s.refused.fetch_add(1);
    std::size_t prev = s.largest_refused.load();
    while (n > prev && !s.largest_refused.compare_exchange_weak(prev, n)) {
    }
    throw std::bad_alloc();
  }
  if (s.limit.load(std::memory_order_relaxed) != static_cast<std::size_t>(-1)) {
    std::size_t prev = s.largest.load();
    while (n > prev && !s.largest.compare_exchange_weak(prev, n)) {
    }
  }
  if (n == 0) n = 1;
  void* p = align <= alignof(std::max_align_t)
                ? std::malloc(n)
                : std::aligned_alloc(align, (n + align - 1) / align * align);
  if (p == nullptr) throw std::bad_alloc();
  return p;
}

}  // namespace

// Every replaceable form, so no sanitizer runtime's definitions are pulled in beside these.
void* operator new(std::size_t n) { return probed_alloc(n, 0); }
void* operator new[](std::size_t n) { return probed_alloc(n, 0); }
void* operator new(std::size_t n, std::align_val_t a) {
  return probed_alloc(n, static_cast<std::size_t>(a));
}
void* operator new[](std::size_t n, std::align_val_t a) {
  return probed_alloc(n, static_cast<std::size_t>(a));
}
void* operator new(std::size_t n, const std::nothrow_t&) noexcept {
  try {
    return probed_alloc(n, 0);
  } catch (...) {
    return nullptr;
  }
}
void* operator new[](std::size_t n, const std::nothrow_t&) noexcept {
  try {
    return probed_alloc(n, 0);
  } catch (...) {
    return nullptr;
  }
}
void* operator new(std::size_t n, std::align_val_t a, const std::nothrow_t&) noexcept {
  try {
    return probed_alloc(n, static_cast<std::size_t>(a));
  } catch (...) {
    return nullptr;
  }
}
void* operator new[](std::size_t n, std::align_val_t a, const std::nothrow_t&) noexcept {
  try {
    return probed_alloc(n, static_cast<std::size_t>(a));
  } catch (...) {
    return nullptr;
  }
}
void operator delete(void* p) noexcept { std::free(p); }
void operator delete[](void* p) noexcept { std::free(p); }
void operator delete(void* p, std::size_t) noexcept { std::free(p); }
void operator delete[](void* p, std::size_t) noexcept { std::free(p); }
void operator delete(void* p, std::align_val_t) noexcept { std::free(p); }
void operator delete[](void* p, std::align_val_t) noexcept { std::free(p); }
void operator delete(void* p, std::size_t, std::align_val_t) noexcept { std::free(p); }
void operator delete[](void* p, std::size_t, std::align_val_t) noexcept { std::free(p); }
void operator delete(void* p, const std::nothrow_t&) noexcept { std::free(p); }
void operator delete[](void* p, const std::nothrow_t&) noexcept { std::free(p); }
void operator delete(void* p, std::align_val_t, const std::nothrow_t&) noexcept { std::free(p); }
void operator delete[](void* p, std::align_val_t, const std::nothrow_t&) noexcept { std::free(p); }
