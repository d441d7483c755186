// include/opreg/trace.h: records which implementation (fallback, a kernel, the fake, a backward, a
// vmap path) served each opreg call, so that tests and the demo can show it. Tracing is per thread
// and nestable (Note [Trace scopes] in src/core/trace.cpp); when no scope is open anywhere, a call
// pays one relaxed atomic load.
#pragma once

#include <atomic>
#include <memory>
#include <string>
#include <vector>

#include "opreg/export.h"

namespace opreg {

struct TraceRecord {
  std::string op;      // "ns::name"
  std::string impl;    // "fallback", "kernel:<name>", "fake", "backward", "vmap:<how>", ...
  std::string device;  // "cpu", "cuda:0", "meta", ...
};

namespace detail {
// How many TraceScopes are open, on all threads together.
OPREG_API extern std::atomic<int> g_open_trace_scopes;
// Appends a record to every open TraceScope of the calling thread (none: does nothing).
OPREG_API void record_trace(const std::string& op, std::string impl, std::string device);
}  // namespace detail

// Whether any thread has a TraceScope open: the cheap test before building a record.
inline bool trace_enabled() {
  return detail::g_open_trace_scopes.load(std::memory_order_relaxed) != 0;
}

// RAII: while alive, records the opreg calls made by the thread that created it (and the work
// PyTorch runs on that thread's behalf, such as its backward passes), including those that a
// nested TraceScope records too. `records()` reads what was gathered so far, oldest first.
// Destroy it on the thread that created it.
class OPREG_API TraceScope {
 public:
  TraceScope();
  ~TraceScope();
  TraceScope(const TraceScope&) = delete;
  TraceScope& operator=(const TraceScope&) = delete;
  std::vector<TraceRecord> records() const;

 private:
  struct State;
  std::unique_ptr<State> state_;
};

}  // namespace opreg
