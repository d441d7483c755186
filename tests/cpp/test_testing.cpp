// tests/cpp/test_testing.cpp: opreg::testing::check from GoogleTest: a good op passes; a kernel
// that differs from the fallback, and a fake with the wrong shape, are each reported with the
// check, the op, the device and the sample.
#include "test_util.h"

using opreg_test::error_of;

namespace {

at::Tensor twice(const at::Tensor& x) { return x * 2; }

std::vector<std::vector<c10::IValue>> samples() {
  return {{at::randn({5, 7})}, {at::randn({1})}, {at::randn({0})}};
}

TEST(Testing, GoodOpPasses) {
  opreg::op("opreg_check::good(Tensor x) -> Tensor")
      .fallback(twice)
      .kernel([](const at::Tensor& x) { return x + x; }, opreg::on({"cpu"}))
      .bitwise()
      .define();
  auto results = opreg::testing::check("opreg_check::good", samples());
  ASSERT_EQ(results.size(), 6u);
  for (const auto& result : results) EXPECT_TRUE(result.passed) << result.message;
  opreg::testing::check_or_throw("opreg_check::good", samples());
}

TEST(Testing, KernelThatDiffersIsReported) {
  opreg::op("opreg_check::off_by_one_ulp(Tensor x) -> Tensor")
      .fallback(twice)
      .kernel(
          [](const at::Tensor& x) {
            auto out = x * 2;
            return at::nextafter(out, at::full_like(out, INFINITY));
          },
          opreg::on({"cpu"}))
      .bitwise()
      .define();
  auto message =
      error_of([] { opreg::testing::check_or_throw("opreg_check::off_by_one_ulp", samples()); });
  EXPECT_CONTAINS(message,
                  "kernel_vs_fallback failed for opreg_check::off_by_one_ulp on cpu, "
                  "sample 0: output 0 is not bitwise equal to the fallback's");
}

TEST(Testing, WrongFakeIsReported) {
  opreg::op("opreg_check::bad_fake(Tensor x) -> Tensor")
      .fallback(twice)
      .fake([](const at::Tensor& x) { return at::empty({3}, x.options()); })
      .define();
  auto results = opreg::testing::check("opreg_check::bad_fake", samples());
  ASSERT_FALSE(results[1].passed);
  EXPECT_EQ(results[1].check, "fake_vs_real");
  EXPECT_EQ(results[1].device, "cpu");
  EXPECT_CONTAINS(results[1].message, "the fake's shape is [3], the real one [5, 7]");
}

}  // namespace
