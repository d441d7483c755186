// include/opreg/trace.h: records which implementation (fallback, a kernel, the fake, a backward, a
// vmap path) served each opreg call, so that tests and the demo can show it. Off by default; when
// off, a call pays one relaxed atomic load.
#pragma once

#include <atomic>
#include <string>
#include <vector>

namespace opreg {

struct TraceRecord {
  std::string op;      // "ns::name"
  std::string impl;    // "fallback", "kernel:<name>", "fake", "backward", "vmap:<how>", ...
  std::string device;  // "cpu", "cuda:0", "meta", ...
};

namespace detail {
extern std::atomic<bool> g_trace_enabled;
void record_trace(const std::string& op, std::string impl, std::string device);
}  // namespace detail

inline bool trace_enabled() { return detail::g_trace_enabled.load(std::memory_order_relaxed); }

// Starts recording (clearing earlier records) or stops it.
void set_trace_enabled(bool enabled);

// Records gathered since tracing was last enabled, oldest first.
std::vector<TraceRecord> trace_records();

// RAII: records while alive; `records()` reads what was gathered so far.
class TraceScope {
 public:
  TraceScope() { set_trace_enabled(true); }
  ~TraceScope() { set_trace_enabled(false); }
  TraceScope(const TraceScope&) = delete;
  TraceScope& operator=(const TraceScope&) = delete;
  std::vector<TraceRecord> records() const { return trace_records(); }
};

}  // namespace opreg
