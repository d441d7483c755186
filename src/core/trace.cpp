// src/core/trace.cpp: the record of which implementation served each call (include/opreg/trace.h).
#include "opreg/trace.h"

#include <mutex>

namespace opreg {
namespace detail {

std::atomic<bool> g_trace_enabled{false};

namespace {
std::mutex& trace_mutex() {
  static std::mutex mutex;
  return mutex;
}
std::vector<TraceRecord>& trace_storage() {
  static std::vector<TraceRecord> records;
  return records;
}
}  // namespace

void record_trace(const std::string& op, std::string impl, std::string device) {
  std::lock_guard<std::mutex> lock(trace_mutex());
  if (!g_trace_enabled.load(std::memory_order_relaxed)) return;
  trace_storage().push_back({op, std::move(impl), std::move(device)});
}

}  // namespace detail

void set_trace_enabled(bool enabled) {
  std::lock_guard<std::mutex> lock(detail::trace_mutex());
  if (enabled) detail::trace_storage().clear();
  detail::g_trace_enabled.store(enabled, std::memory_order_relaxed);
}

std::vector<TraceRecord> trace_records() {
  std::lock_guard<std::mutex> lock(detail::trace_mutex());
  return detail::trace_storage();
}

}  // namespace opreg
