// tests/cpp/test_testing.cpp: opreg::testing::check from GoogleTest: a good op passes; a kernel
// that differs from the fallback (beyond the per-dtype tolerance, or at all for integers and
// bitwise ops), and a fake with the wrong shape, are each reported with the check, the op, the
// device and the sample.
#include <atomic>
#include <thread>

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

// Sweep 21: a bitwise op's NaN number output failed against the fallback's NaN (B-F3), and a
// kernel giving -0.0 where the fallback gives +0.0 passed as bitwise equal (B-F10).
TEST(Testing, BitwiseMeansNaNEqualsNaNAndZerosKeepTheirSign) {
  opreg::op("opreg_check::nan_number(Tensor x) -> (Tensor, float, float[])")
      .fallback([](const at::Tensor& x) {
        return std::make_tuple(x * 2, std::nan(""), std::vector<double>{std::nan(""), -0.0});
      })
      .kernel(
          [](const at::Tensor& x) {
            return std::make_tuple(x + x, std::nan(""), std::vector<double>{std::nan(""), -0.0});
          },
          opreg::on({"cpu"}))
      .bitwise()
      .define();
  opreg::testing::check_or_throw("opreg_check::nan_number", samples());

  opreg::op("opreg_check::negative_zero(Tensor x) -> Tensor")
      .fallback([](const at::Tensor& x) { return x * 0; })
      .kernel([](const at::Tensor& x) { return -(x * 0); }, opreg::on({"cpu"}))
      .bitwise()
      .define();
  EXPECT_CONTAINS(
      error_of([] { opreg::testing::check_or_throw("opreg_check::negative_zero", samples()); }),
      "output 0 has -0.0 where the fallback's has +0.0, or the reverse; the op declares its "
      "kernels bitwise");
  opreg::op("opreg_check::negative_zero_number(Tensor x) -> float")
      .fallback([](const at::Tensor&) { return 0.0; })
      .kernel([](const at::Tensor&) { return -0.0; }, opreg::on({"cpu"}))
      .bitwise()
      .define();
  EXPECT_CONTAINS(error_of([] {
                    opreg::testing::check_or_throw("opreg_check::negative_zero_number", samples());
                  }),
                  "output 0 is -0.0, the fallback's +0.0; the op declares its kernels bitwise");
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

// Nineteenth sweep B-F6: a Tensor[] output threw "Boolean value of Tensor with more than one value
// is ambiguous", one-element tensors in a list were compared exactly, and a list's fake was never
// compared.
TEST(Testing, TensorListOutputsAreComparedElementByElement) {
  auto pair = [](const at::Tensor& x) { return std::vector<at::Tensor>{x + 1, x.sum() * 3}; };
  opreg::op("opreg_check::list_out(Tensor x) -> Tensor[]")
      .fallback(pair)
      .kernel(
          [](const at::Tensor& x) {  // within float32's tolerance of the fallback's
            return std::vector<at::Tensor>{x + 1, x.sum() * 3 * (1 + 1e-7)};
          },
          opreg::on({"cpu"}))
      .define();
  opreg::testing::check_or_throw("opreg_check::list_out", samples());

  opreg::op("opreg_check::list_out_differs(Tensor x) -> Tensor[]")
      .fallback(pair)
      .kernel([](const at::Tensor& x) { return std::vector<at::Tensor>{x + 1, x.sum() * 4}; },
              opreg::on({"cpu"}))
      .define();
  auto results = opreg::testing::check("opreg_check::list_out_differs", {{at::ones({4})}});
  ASSERT_FALSE(results[0].passed);
  EXPECT_CONTAINS(results[0].message, "output 0[1] differs from the fallback's by up to 4");

  opreg::op("opreg_check::list_out_short(Tensor x) -> Tensor[]")
      .fallback(pair)
      .kernel([](const at::Tensor& x) { return std::vector<at::Tensor>{x + 1}; },
              opreg::on({"cpu"}))
      .define();
  results = opreg::testing::check("opreg_check::list_out_short", {{at::ones({4})}});
  ASSERT_FALSE(results[0].passed);
  EXPECT_CONTAINS(results[0].message, "output 0 has 1 elements, the fallback's 2");

  opreg::op("opreg_check::list_fake(Tensor x) -> Tensor[]")
      .fallback(pair)
      .fake([](const at::Tensor& x) {
        return std::vector<at::Tensor>{at::empty_like(x), at::empty({2}, x.options())};
      })
      .define();
  results = opreg::testing::check("opreg_check::list_fake", {{at::ones({4})}});
  ASSERT_FALSE(results[1].passed);
  EXPECT_CONTAINS(results[1].message, "output 0[1]: the fake's shape is [2], the real one []");
}

// Nineteenth sweep B-F6: the caller's Tensor(a!)[] sample was written by every run of one check,
// and an in-place kernel that writes nothing passed (it returns nothing to compare).
TEST(Testing, WhatTheOpWritesIsComparedAndTheSamplesStayAsTheyWere) {
  opreg::op("opreg_check::add_one_each(Tensor(a!)[] xs) -> ()")
      .fallback([](const std::vector<at::Tensor>& xs) {
        for (const auto& x : xs) x.add_(1);
      })
      .define();
  const std::vector<at::Tensor> xs{at::zeros({3}), at::zeros({2})};
  opreg::testing::check_or_throw("opreg_check::add_one_each", {{c10::List<at::Tensor>(xs)}});
  EXPECT_TRUE(at::equal(xs[0], at::zeros({3})));
  EXPECT_TRUE(at::equal(xs[1], at::zeros({2})));

  opreg::op("opreg_check::lazy_add_one(Tensor(a!) x) -> ()")
      .fallback([](const at::Tensor& x) { x.add_(1); })
      .kernel([](const at::Tensor&) {}, opreg::on({"cpu"}))
      .define();
  const auto x = at::zeros({3});
  auto message =
      error_of([&] { opreg::testing::check_or_throw("opreg_check::lazy_add_one", {{x}}); });
  EXPECT_CONTAINS(message, "the written argument 'x' differs from the fallback's by up to 1");
  EXPECT_TRUE(at::equal(x, at::zeros({3})));
}

// Nineteenth sweep B-F5: a check racing a replace compared one definition's kernel with the next
// one's fallback and reported differences that no definition has.
TEST(Testing, ACheckRacingAReplaceComparesOneDefinition) {
  auto define = [](double c, bool replace) {
    opreg::op("opreg_check::raced(Tensor x) -> Tensor")
        .fallback([c](const at::Tensor& x) { return x + c; })
        .kernel([c](const at::Tensor& x) { return x + c; }, opreg::on({"cpu"}))
        .replace(replace)
        .define();
  };
  define(0, false);
  std::atomic<bool> stop{false};
  std::thread replacer([&] {
    for (int i = 1; !stop; ++i) define(i, true);
  });
  int checked = 0, refused = 0;
  for (int i = 0; i < 300; ++i) {
    try {
      for (const auto& result : opreg::testing::check("opreg_check::raced", {{at::ones({3})}})) {
        EXPECT_TRUE(result.passed) << result.message;
      }
      ++checked;
    } catch (const c10::Error& error) {
      EXPECT_CONTAINS(error.what(), "opreg_check::raced was replaced while sample 0 ran");
      ++refused;
    }
  }
  stop = true;
  replacer.join();
  EXPECT_EQ(checked + refused, 300);
}

// Twentieth sweep B-F5: more values than the op has arguments ran the fallback on the last ones
// and handed the extra values back as outputs.
TEST(Testing, ASampleWithMoreValuesThanArgumentsIsRefused) {
  opreg::op("opreg_check::one_argument(Tensor x) -> Tensor").fallback(twice).define();
  auto message = error_of([] {
    opreg::testing::call_fallback("opreg_check::one_argument", {at::ones({1}), at::ones({1})});
  });
  EXPECT_CONTAINS(message, "opreg_check::one_argument: called with 2 arguments, expected 1");
  message = error_of(
      [] { opreg::testing::check("opreg_check::one_argument", {{at::ones({1}), at::ones({1})}}); });
  EXPECT_CONTAINS(message, "opreg_check::one_argument: called with 2 arguments, expected 1");
}

// Sweep 22 B-F7: a meta sample got PyTorch's "no fake impl or Meta kernel" from the comparison,
// naming neither the op nor the check; a sparse one, PyTorch's message about its layout.
TEST(Testing, ASampleWithoutValuesIsRefused) {
  opreg::op("opreg_check::no_values(Tensor x) -> Tensor")
      .fallback(twice)
      .kernel([](const at::Tensor& x) { return x + x; }, opreg::on({"cpu"}))
      .define();
  EXPECT_CONTAINS(error_of([] {
                    opreg::testing::check("opreg_check::no_values", {{at::ones({2}, at::kMeta)}});
                  }),
                  "opreg::testing::check: opreg_check::no_values: sample 0 has a tensor on the "
                  "meta device");
  EXPECT_CONTAINS(error_of([] {
                    opreg::testing::check("opreg_check::no_values",
                                          {{at::ones({2})}, {at::eye(2).to_sparse()}});
                  }),
                  "opreg_check::no_values: sample 1 has a tensor of layout Sparse");
}

// Sweep 23 B-F4: no samples checked nothing and passed (opreg.opcheck refuses that).
TEST(Testing, NoSamplesIsRefused) {
  opreg::op("opreg_check::no_samples(Tensor x) -> Tensor").fallback(twice).define();
  const std::string expected =
      "opreg::testing::check: opreg_check::no_samples: 'samples' is empty, so nothing would be "
      "checked";
  EXPECT_CONTAINS(error_of([] { opreg::testing::check("opreg_check::no_samples", {}); }), expected);
  EXPECT_CONTAINS(error_of([] { opreg::testing::check_or_throw("opreg_check::no_samples", {}); }),
                  expected);
}

// Sweep 28 B-F4: an op declared random, without a kernel, failed kernel_vs_fallback: the check
// compared two independent draws. A random op's runs are compared by shapes and dtypes alone, as
// opreg.opcheck compares them, and what it writes too; other shapes still fail.
TEST(Testing, ARandomOpsRunsAreComparedByShapesAndDtypes) {
  opreg::op("opreg_check::rand(Tensor x) -> Tensor")
      .fallback([](const at::Tensor& x) { return at::rand_like(x); })
      .random()
      .define();
  auto results = opreg::testing::check("opreg_check::rand", samples());
  ASSERT_EQ(results.size(), 6u);
  for (const auto& result : results) EXPECT_TRUE(result.passed) << result.message;

  opreg::op("opreg_check::fill_random(Tensor(a!) x) -> ()")
      .fallback([](const at::Tensor& x) { x.copy_(at::rand_like(x)); })
      .random()
      .define();
  opreg::testing::check_or_throw("opreg_check::fill_random", samples());

  opreg::op("opreg_check::rand_other_shape(Tensor x) -> Tensor")
      .fallback([](const at::Tensor& x) { return at::rand_like(x); })
      .kernel([](const at::Tensor& x) { return at::rand({x.numel() + 1}); }, opreg::on({"cpu"}))
      .random()
      .define();
  EXPECT_CONTAINS(
      error_of([] { opreg::testing::check_or_throw("opreg_check::rand_other_shape", samples()); }),
      "kernel_vs_fallback failed for opreg_check::rand_other_shape on cpu, sample 0: "
      "output 0 is Float[36], the fallback's Float[5, 7]");
}

// Sweep 31 B-F1: a sample that requires grad sent the kernel's call to the fallback (the default
// autograd policy), so a wrong kernel passed: it was compared with the fallback itself.
TEST(Testing, ASampleThatRequiresGradChecksTheKernel) {
  opreg::op("opreg_check::plus_five(Tensor x) -> Tensor")
      .fallback([](const at::Tensor& x) { return x + 1; })
      .kernel([](const at::Tensor& x) { return x + 5; }, opreg::on({"cpu"}))
      .define();
  EXPECT_CONTAINS(error_of([] {
                    opreg::testing::check_or_throw("opreg_check::plus_five",
                                                   {{at::zeros({2}).requires_grad_()}});
                  }),
                  "kernel_vs_fallback failed for opreg_check::plus_five on cpu, sample 0: output 0 "
                  "differs from the fallback's by up to 4");
}

// Sweep 31 B-F2: a float output was compared as |kernel - fallback| <= atol + rtol * |fallback|,
// which any value meets against an infinity, and two equal infinities failed.
TEST(Testing, AnInfiniteNumberOutputEqualsItselfOnly) {
  for (const double kernel : {5.0, -double(INFINITY), 1e308}) {
    opreg::op("opreg_check::infinite(Tensor x) -> float[]")
        .fallback([](const at::Tensor&) { return std::vector<double>{INFINITY, 1.0}; })
        .kernel([kernel](const at::Tensor&) { return std::vector<double>{kernel, 1.0}; },
                opreg::on({"cpu"}))
        .replace()
        .define();
    EXPECT_CONTAINS(error_of([] {
                      opreg::testing::check_or_throw("opreg_check::infinite", {{at::zeros({2})}});
                    }),
                    "output 0[0] is ");
  }
  opreg::op("opreg_check::infinite(Tensor x) -> float[]")
      .fallback([](const at::Tensor&) { return std::vector<double>{INFINITY, -INFINITY}; })
      .kernel([](const at::Tensor&) { return std::vector<double>{INFINITY, -INFINITY}; },
              opreg::on({"cpu"}))
      .replace()
      .define();
  opreg::testing::check_or_throw("opreg_check::infinite", {{at::zeros({2})}});
}

// Sweep 32 A-F8: a complex tensor output of inf+1j against inf+0j was said to differ "by up to 0"
// (the difference is NaN there); the first element apart where a value is infinite is shown.
TEST(Testing, AnInfiniteElementApartIsShown) {
  const c10::complex<double> infinite(INFINITY, 0);
  opreg::op("opreg_check::infinite_complex(Tensor x) -> Tensor")
      .fallback([=](const at::Tensor& x) { return at::full({2, 2}, infinite, x.options()); })
      .kernel(
          [=](const at::Tensor& x) {
            auto out = at::full({2, 2}, infinite, x.options());
            out.index_put_({1, 0}, c10::complex<double>(INFINITY, 1));
            return out;
          },
          opreg::on({"cpu"}))
      .define();
  EXPECT_CONTAINS(error_of([] {
                    opreg::testing::check_or_throw("opreg_check::infinite_complex",
                                                   {{at::zeros({1}, at::kComplexDouble)}});
                  }),
                  "output 0 at index [1, 0] is (inf,1), the fallback's (inf,0) (a difference "
                  "where a value is infinite)");
}

// Sweep 32 B-F1: the checks ran the kernel on contiguous copies of the samples, so a kernel that
// reads strides wrongly, or one that an aliased argument breaks, passed.
TEST(Testing, TheKernelRunsOnTheSamplesOwnLayout) {
  opreg::op("opreg_check::dense_only(Tensor x) -> Tensor")
      .fallback([](const at::Tensor& x) { return x * 2; })
      .kernel([](const at::Tensor& x) { return x.as_strided(x.sizes(), {1}) * 2; },
              opreg::on({"cpu"}))
      .define();
  opreg::testing::check_or_throw("opreg_check::dense_only", {{at::arange(4.0)}});
  EXPECT_CONTAINS(error_of([] {
                    opreg::testing::check_or_throw("opreg_check::dense_only",
                                                   {{at::arange(8.0).slice(0, 0, 8, 2)}});
                  }),
                  "kernel_vs_fallback failed for opreg_check::dense_only on cpu, sample 0");
  opreg::op("opreg_check::add_into(Tensor(a!) x, Tensor y) -> ()")
      .fallback([](const at::Tensor& x, const at::Tensor& y) { x.add_(y.clone()); })
      .kernel([](const at::Tensor& x, const at::Tensor& y) { x.add_(1).add_(y).sub_(1); },
              opreg::on({"cpu"}))
      .define();
  const auto both = at::ones({2});
  opreg::testing::check_or_throw("opreg_check::add_into", {{at::ones({2}), at::ones({2})}});
  EXPECT_CONTAINS(
      error_of([&] { opreg::testing::check_or_throw("opreg_check::add_into", {{both, both}}); }),
      "the written argument 'x' differs from the fallback's");
  EXPECT_TRUE(at::equal(both, at::ones({2})));  // the sample stays as it was
}

// Sweep 32 B-F9: quantized outputs met "Creation of quantized tensor requires quantized dtype".
TEST(Testing, QuantizedOutputsAreComparedByValue) {
  auto quantized = [](double shift) {
    return [shift](const at::Tensor& x) {
      return at::quantize_per_tensor(x + shift, 0.1, 0, at::kQUInt8);
    };
  };
  opreg::op("opreg_check::quantized(Tensor x) -> Tensor")
      .fallback(quantized(0))
      .kernel(quantized(1), opreg::on({"cpu"}))
      .fake([](const at::Tensor& x) { return at::empty_like(x); })
      .define();
  const auto results = opreg::testing::check("opreg_check::quantized", {{at::ones({2})}});
  ASSERT_EQ(results.at(0).check, "kernel_vs_fallback");
  EXPECT_CONTAINS(results.at(0).message, "output 0 differs from the fallback's by up to 1");
}

// Sweep 32: nested outputs were named, not compared; they are compared component by component.
TEST(Testing, NestedOutputsAreComparedComponentByComponent) {
  auto nested = [](double shift) {
    return [shift](const at::Tensor& x) {
      return at::_nested_tensor_from_tensor_list({x, x.slice(0, 0, 1) + shift});
    };
  };
  opreg::op("opreg_check::nested(Tensor x) -> Tensor")
      .fallback(nested(0))
      .kernel(nested(0), opreg::on({"cpu"}))
      .fake([](const at::Tensor& x) { return at::empty_like(x); })
      .define();
  const auto same = opreg::testing::check("opreg_check::nested", {{at::ones({3})}});
  ASSERT_EQ(same.at(0).check, "kernel_vs_fallback");
  EXPECT_EQ(same.at(0).message, "");
  ASSERT_EQ(same.at(1).check, "fake_vs_real");
  EXPECT_CONTAINS(same.at(1).message,
                  "output 0: the real one is a nested tensor, the fake's not (PyTorch has no "
                  "nested tensors on the meta device");
  opreg::op("opreg_check::nested(Tensor x) -> Tensor")
      .fallback(nested(0))
      .kernel(nested(1), opreg::on({"cpu"}))
      .fake([](const at::Tensor& x) { return at::empty_like(x); })
      .replace()
      .define();
  const auto results = opreg::testing::check("opreg_check::nested", {{at::ones({3})}});
  ASSERT_EQ(results.at(0).check, "kernel_vs_fallback");
  EXPECT_CONTAINS(results.at(0).message,
                  "output 0 component 1 differs from the fallback's by up to 1");
}

// Sweep 32 B-F5: two complex NaN outputs were compared with ==, and differed.
TEST(Testing, AComplexNaNOutputEqualsAComplexNaN) {
  opreg::op("opreg_check::complex_nan(Tensor x) -> complex")
      .fallback([](const at::Tensor&) { return c10::complex<double>(NAN, 0); })
      .kernel([](const at::Tensor&) { return c10::complex<double>(NAN, 0); }, opreg::on({"cpu"}))
      .define();
  opreg::testing::check_or_throw("opreg_check::complex_nan", {{at::zeros({2})}});
  opreg::op("opreg_check::complex_nan(Tensor x) -> complex")
      .fallback([](const at::Tensor&) { return c10::complex<double>(NAN, 0); })
      .kernel([](const at::Tensor&) { return c10::complex<double>(NAN, 1); }, opreg::on({"cpu"}))
      .replace()
      .define();
  EXPECT_CONTAINS(error_of([] {
                    opreg::testing::check_or_throw("opreg_check::complex_nan", {{at::zeros({2})}});
                  }),
                  "output 0 is nan+1.j, the fallback's nan+0.j");
}

// Sweep 31 B-F4: a fake differing only in the stride of a dim of size 1 failed fake_vs_real.
TEST(Testing, TheStrideOfADimOfSizeOneIsNotCompared) {
  opreg::op("opreg_check::column(Tensor x) -> Tensor")
      .fallback([](const at::Tensor& x) { return x.reshape({1, -1}).t().clone().t().t(); })
      .fake([](const at::Tensor& x) { return at::empty({x.numel(), 1}, x.options()); })
      .define();
  const auto real = opreg::testing::call_fallback("opreg_check::column", {at::zeros({3})});
  ASSERT_NE(real.at(0).toTensor().stride(1), 1);  // the layout this test is about
  opreg::testing::check_or_throw("opreg_check::column", {{at::zeros({3})}});
  opreg::op("opreg_check::column(Tensor x) -> Tensor")
      .fallback([](const at::Tensor& x) { return at::zeros({1}, x.options()).expand({2, 3}); })
      .fake([](const at::Tensor& x) { return at::empty({2, x.numel()}, x.options()); })
      .replace()
      .define();
  EXPECT_CONTAINS(
      error_of([] { opreg::testing::check_or_throw("opreg_check::column", {{at::zeros({3})}}); }),
      "output 0: the fake's strides are [3, 1], the real ones [0, 0]");
}

// Sweep 31 B-F5: a sparse output met aten::max's "Could not run ... SparseCPU".
TEST(Testing, SparseOutputsAreComparedByValue) {
  opreg::op("opreg_check::sparse(Tensor x) -> Tensor")
      .fallback([](const at::Tensor& x) { return x.to_sparse(); })
      .kernel([](const at::Tensor& x) { return (x + 1).to_sparse(); }, opreg::on({"cpu"}))
      .fake(
          [](const at::Tensor& x) { return at::empty(x.sizes(), x.options().layout(at::kSparse)); })
      .define();
  EXPECT_CONTAINS(error_of([] {
                    opreg::testing::check_or_throw("opreg_check::sparse",
                                                   {{at::tensor({0.0, 1.0, 0.0})}});
                  }),
                  "output 0 differs from the fallback's by up to 1");
}

}  // namespace
