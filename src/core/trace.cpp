// src/core/trace.cpp: the record of which implementation served each call (include/opreg/trace.h).
#include "opreg/trace.h"

#include <mutex>
#include <string_view>
#include <thread>
#include <type_traits>

#include <c10/util/ThreadLocalDebugInfo.h>

// Note [Trace scopes]
// Each thread has a stack of open scopes, and a record goes to every open scope of the thread
// that makes it. The stack lives in PyTorch's ThreadLocalDebugInfo under opreg's own kind rather
// than in a plain thread_local: PyTorch propagates that state to the threads that work on a
// thread's behalf (the autograd engine's device threads run a CUDA backward, at::launch tasks),
// so a backward run there is recorded in the scope that called backward(). Each frame on the
// stack lists every sink open at that depth, so that recording is one lookup and a loop. Scopes
// closed out of order (two interleaved generators on one thread) are tolerated: a closed sink
// takes no records, and a frame is popped only while it is on top.

namespace opreg {
namespace detail {

std::atomic<int> g_open_trace_scopes{0};

namespace {

constexpr std::string_view kTraceInfoName = "opreg.trace";

// PyTorch 2.13 names a slot by the address of a string; earlier releases have a fixed enum (of
// uint8_t), where a value far past PyTorch's own kinds serves as opreg's.
template <class Kind>
Kind trace_info_kind() {
  if constexpr (std::is_enum_v<Kind>) {
    return static_cast<Kind>(0xb7);
  } else {
    return Kind(&kTraceInfoName);
  }
}
const c10::DebugInfoKind kTraceInfo = trace_info_kind<c10::DebugInfoKind>();

// The records of one scope; other threads (autograd's) may append while its owner reads.
struct TraceSink {
  std::mutex mutex;
  std::vector<TraceRecord> records;
  bool open = true;
};

struct TraceFrame : c10::DebugInfoBase {
  std::vector<std::shared_ptr<TraceSink>> sinks;  // outermost first
};

}  // namespace

void record_trace(const std::string& op, std::string impl, std::string device) {
  const auto* frame = static_cast<const TraceFrame*>(c10::ThreadLocalDebugInfo::get(kTraceInfo));
  if (frame == nullptr) return;
  for (const auto& sink : frame->sinks) {
    std::lock_guard<std::mutex> lock(sink->mutex);
    if (sink->open) sink->records.push_back({op, impl, device});
  }
}

}  // namespace detail

struct TraceScope::State {
  std::shared_ptr<detail::TraceSink> sink = std::make_shared<detail::TraceSink>();
  std::shared_ptr<c10::ThreadLocalDebugInfo> before;  // the thread's state when the scope opened
  std::shared_ptr<c10::ThreadLocalDebugInfo> mine;    // with this scope's frame on top
  std::thread::id thread = std::this_thread::get_id();
};

TraceScope::TraceScope() : state_(std::make_unique<State>()) {
  auto frame = std::make_shared<detail::TraceFrame>();
  const auto* outer =
      static_cast<const detail::TraceFrame*>(c10::ThreadLocalDebugInfo::get(detail::kTraceInfo));
  if (outer != nullptr) {
    for (const auto& sink : outer->sinks) {
      std::lock_guard<std::mutex> lock(sink->mutex);
      if (sink->open) frame->sinks.push_back(sink);
    }
  }
  frame->sinks.push_back(state_->sink);
  state_->before = c10::ThreadLocalDebugInfo::current();
  c10::ThreadLocalDebugInfo::_push(detail::kTraceInfo, std::move(frame));
  state_->mine = c10::ThreadLocalDebugInfo::current();
  detail::g_open_trace_scopes.fetch_add(1, std::memory_order_relaxed);
}

TraceScope::~TraceScope() {
  {
    std::lock_guard<std::mutex> lock(state_->sink->mutex);
    state_->sink->open = false;
  }
  detail::g_open_trace_scopes.fetch_sub(1, std::memory_order_relaxed);
  // Pop the frame only from its own thread and only while it is on top (Note [Trace scopes]).
  if (state_->thread == std::this_thread::get_id() &&
      c10::ThreadLocalDebugInfo::current() == state_->mine) {
    c10::ThreadLocalDebugInfo::_forceCurrentDebugInfo(state_->before);
  }
}

std::vector<TraceRecord> TraceScope::records() const {
  std::lock_guard<std::mutex> lock(state_->sink->mutex);
  return state_->sink->records;
}

}  // namespace opreg
