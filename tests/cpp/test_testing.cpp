// tests/cpp/test_testing.cpp: opreg::testing::check from GoogleTest: a good op passes; a kernel
// that differs from the fallback (beyond the per-dtype tolerance, or at all for integers and
// bitwise ops), and a fake with the wrong shape, are each reported with the check, the op, the
// device and the sample.
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

// The same numbers as tests/python/test_opcheck.py and docs/opcheck.md.
TEST(Testing, ToleranceTable) {
  using opreg::testing::tolerance;
  EXPECT_EQ(tolerance(at::kHalf).atol, 1e-3);
  EXPECT_EQ(tolerance(at::kHalf).rtol, 1e-3);
  EXPECT_EQ(tolerance(at::kBFloat16).atol, 8e-3);
  EXPECT_EQ(tolerance(at::kBFloat16).rtol, 1.6e-2);
  EXPECT_EQ(tolerance(at::kFloat).atol, 1e-5);
  EXPECT_EQ(tolerance(at::kFloat).rtol, 1.3e-6);
  EXPECT_EQ(tolerance(at::kDouble).atol, 1e-7);
  EXPECT_EQ(tolerance(at::kComplexFloat).rtol, 1.3e-6);
  for (auto dtype : {at::kLong, at::kInt, at::kByte, at::kBool}) {
    EXPECT_EQ(tolerance(dtype).atol, 0) << dtype;
    EXPECT_EQ(tolerance(dtype).rtol, 0) << dtype;
  }
}

// Allowed for 200.0f: 1e-5 + 1.3e-6 * 200 = 2.7e-4.
TEST(Testing, KernelWithinTheToleranceOfItsDtypePasses) {
  opreg::op("opreg_check::offset(Tensor x, float offset) -> Tensor")
      .fallback([](const at::Tensor& x, double) { return x * 2; })
      .kernel([](const at::Tensor& x, double offset) { return x * 2 + offset; }, opreg::on({"cpu"}))
      .define();
  const auto x = at::full({5}, 100.0f);
  opreg::testing::check_or_throw("opreg_check::offset", {{x, 1e-4}});
  auto message =
      error_of([&] { opreg::testing::check_or_throw("opreg_check::offset", {{x, 5e-4}}); });
  EXPECT_CONTAINS(message, "output 0 differs from the fallback's by up to 0.0005");
  EXPECT_CONTAINS(message, "more than atol 1e-05 + rtol 1.3e-06 * |fallback| (Float)");
  auto nan =
      error_of([&] { opreg::testing::check_or_throw("opreg_check::offset", {{x, std::nan("")}}); });
  EXPECT_CONTAINS(nan, "output 0 has NaN at other positions than the fallback's");
}

TEST(Testing, IntegerOutputsMustBeEqual) {
  opreg::op("opreg_check::off_by_one_int(Tensor x) -> Tensor")
      .fallback([](const at::Tensor& x) { return x * 2; })
      .kernel([](const at::Tensor& x) { return x * 2 + 1; }, opreg::on({"cpu"}))
      .define();
  auto message = error_of([] {
    opreg::testing::check_or_throw("opreg_check::off_by_one_int",
                                   {{at::full({3}, int64_t{1} << 40)}});
  });
  EXPECT_CONTAINS(message, "output 0 (Long) is not equal to the fallback's (max |diff| 1)");
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
