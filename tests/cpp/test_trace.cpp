// tests/cpp/test_trace.cpp: TraceScope is per thread and nestable: an outer scope sees what an
// inner one saw, another thread's calls reach neither, and work PyTorch runs for the thread
// (at::launch, as the autograd engine's device threads do) is recorded in its scope.
#include <future>
#include <thread>

#include <ATen/Parallel.h>

#include "test_util.h"

using opreg_test::impls_of;

namespace {

at::Tensor negate(const at::Tensor& x) { return -x; }

const auto& negate_op() {
  static const auto op = opreg::op("opreg_cpp_trace::negate(Tensor x) -> Tensor")
                             .fallback(negate)
                             .kernel(negate, opreg::on({"cpu"}).name("cpu").accepts(
                                                 [](const at::Tensor& x) { return x.dim() == 1; }))
                             .define();
  return op;
}

TEST(Trace, NestedScopesEachSeeTheirCallsAndTheOuterSeesAll) {
  const auto& op = negate_op();
  auto vector = at::randn({3});
  auto matrix = at::randn({2, 3});
  EXPECT_FALSE(opreg::trace_enabled());
  opreg::TraceScope outer;
  op(vector);
  {
    opreg::TraceScope inner;
    op(matrix);
    EXPECT_EQ(impls_of(inner.records()),
              (std::vector<std::string>{"fallback(declined by kernel:cpu)"}));
  }
  op(vector);
  EXPECT_TRUE(opreg::trace_enabled());
  EXPECT_EQ(
      impls_of(outer.records()),
      (std::vector<std::string>{"kernel:cpu", "fallback(declined by kernel:cpu)", "kernel:cpu"}));
}

TEST(Trace, NothingIsRecordedWithoutAScopeAndTraceEnabledFollowsTheScopes) {
  const auto& op = negate_op();
  EXPECT_FALSE(opreg::trace_enabled());
  op(at::randn({3}));  // no scope: nothing to record into, nothing breaks
  {
    opreg::TraceScope scope;
    EXPECT_TRUE(opreg::trace_enabled());
    EXPECT_TRUE(scope.records().empty());
  }
  EXPECT_FALSE(opreg::trace_enabled());
}

TEST(Trace, AnotherThreadsCallsAreNotRecorded) {
  const auto& op = negate_op();
  opreg::TraceScope mine;
  std::vector<std::string> theirs;
  std::thread other([&] {
    opreg::TraceScope scope;
    op(at::randn({2, 2}));
    theirs = impls_of(scope.records());
  });
  op(at::randn({4}));
  other.join();
  std::thread unscoped([&] { op(at::randn({2, 2})); });
  unscoped.join();
  EXPECT_EQ(impls_of(mine.records()), (std::vector<std::string>{"kernel:cpu"}));
  EXPECT_EQ(theirs, (std::vector<std::string>{"fallback(declined by kernel:cpu)"}));
}

TEST(Trace, WorkLaunchedForTheThreadIsRecordedInItsScope) {
  const auto& op = negate_op();
  opreg::TraceScope scope;
  std::promise<void> done;
  at::launch([&] {
    op(at::randn({5}));
    done.set_value();
  });
  done.get_future().wait();
  EXPECT_EQ(impls_of(scope.records()), (std::vector<std::string>{"kernel:cpu"}));
}

}  // namespace
