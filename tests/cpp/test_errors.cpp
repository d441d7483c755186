// tests/cpp/test_errors.cpp: every user mistake gets a message naming the op, the argument, what
// was expected and what came; none crashes the process.
#include <torch/library.h>

#include "test_util.h"

using opreg_test::error_of;

namespace {

at::Tensor identity(const at::Tensor& x) { return x.clone(); }
at::Tensor add(const at::Tensor& x, const at::Tensor& y) { return x + y; }

TEST(Errors, BadSchemaNamesTheOpAndThePosition) {
  auto message = error_of(
      [] { opreg::op("opreg_err::bad(Tensor x, Tensr y) -> Tensor").fallback(add).define(); });
  EXPECT_CONTAINS(message, "opreg_err::bad");
  EXPECT_CONTAINS(message, "cannot parse schema");
  EXPECT_CONTAINS(message, "Tensr");
  EXPECT_CONTAINS(message, "HERE");  // the parser marks the position
}

TEST(Errors, NameWithoutNamespace) {
  auto message =
      error_of([] { opreg::op("lonely(Tensor x) -> Tensor").fallback(identity).define(); });
  EXPECT_CONTAINS(message, "'lonely' has no namespace");
}

TEST(Errors, FallbackSignatureDoesNotMatchTheSchema) {
  auto message = error_of([] {
    opreg::op("opreg_err::arity(Tensor x, Tensor y) -> Tensor").fallback(identity).define();
  });
  EXPECT_CONTAINS(message, "opreg_err::arity");
  EXPECT_CONTAINS(message, "fallback");
  EXPECT_FALSE(opreg::is_defined("opreg_err::arity"));
  EXPECT_FALSE(c10::Dispatcher::singleton().findSchema({"opreg_err::arity", ""}).has_value());
}

TEST(Errors, DefiningTwiceNamesTheEarlierOrigin) {
  opreg::op("opreg_err::twice(Tensor x) -> Tensor").fallback(identity).define();
  auto message = error_of(
      [] { opreg::op("opreg_err::twice(Tensor x) -> Tensor").fallback(identity).define(); });
  EXPECT_CONTAINS(message, "opreg_err::twice: an op of this name is already defined (by ");
  EXPECT_CONTAINS(message, "opreg_cpp_tests");
  EXPECT_CONTAINS(message, "replace");
}

TEST(Errors, AnOpDefinedOutsideOpregCannotBeReplaced) {
  static torch::Library outside(torch::Library::FRAGMENT, "opreg_outside", std::nullopt, __FILE__,
                                __LINE__);
  outside.def("op(Tensor x) -> Tensor");
  auto message = error_of([] {
    opreg::op("opreg_outside::op(Tensor x) -> Tensor").fallback(identity).replace().define();
  });
  EXPECT_CONTAINS(message,
                  "opreg_outside::op: an op of this name is already defined outside opreg");
}

TEST(Errors, PyTorchsNamespacesAreRefused) {
  auto message = error_of([] {
    opreg::op("aten::add.Tensor(Tensor self, Tensor other, *, Scalar alpha=1) -> Tensor")
        .fallback([](const at::Tensor& a, const at::Tensor& b, const c10::Scalar&) { return a; })
        .replace()
        .define();
  });
  EXPECT_CONTAINS(message, "the namespace 'aten' belongs to PyTorch");
}

TEST(Errors, WrongDtypeNamesTheArgument) {
  auto op = opreg::op("opreg_err::float_only(Tensor x, Tensor y) -> Tensor")
                .fallback(add)
                .dtypes("y", {at::kFloat, at::kDouble})
                .define();
  auto message = error_of([&] { op(at::ones({2}), at::ones({2}, at::kInt)); });
  EXPECT_CONTAINS(
      message, "opreg_err::float_only: argument 'y' has dtype Int, expected one of: Float, Double");
}

TEST(Errors, DtypesForAnUnknownArgument) {
  auto message = error_of([] {
    opreg::op("opreg_err::unknown_arg(Tensor x) -> Tensor")
        .fallback(identity)
        .dtypes("z", {at::kFloat})
        .define();
  });
  EXPECT_CONTAINS(message, "dtypes() names argument 'z', which the schema");
}

TEST(Errors, ZeroDimCpuTensorsMixWithOtherDevices) {
  auto op = opreg::op("opreg_err::scalar_mix(Tensor x, Tensor y) -> Tensor").fallback(add).define();
  auto out = op(at::empty({2}, at::device(at::kMeta)), at::scalar_tensor(1.0));
  EXPECT_TRUE(out.is_meta());
}

TEST(Errors, FallbackThatCannotRunOnMetaAsksForAFake) {
  auto op = opreg::op("opreg_err::needs_data(Tensor x) -> Tensor")
                .fallback([](const at::Tensor& x) { return x * x.sum().item<double>(); })
                .define();
  auto message = error_of([&] { op(at::empty({3}, at::device(at::kMeta))); });
  EXPECT_CONTAINS(message, "opreg_err::needs_data: has no fake, and its fallback failed on meta");
  EXPECT_CONTAINS(message, ".fake(fn)");
}

TEST(Errors, KernelForMetaIsRefused) {
  auto message = error_of([] {
    opreg::op("opreg_err::meta_kernel(Tensor x) -> Tensor")
        .fallback(identity)
        .kernel(identity, opreg::on({"meta"}))
        .define();
  });
  EXPECT_CONTAINS(message, "lists device type 'meta'");
}

TEST(Errors, TwoKernelsForOneDeviceType) {
  auto message = error_of([] {
    opreg::op("opreg_err::two_kernels(Tensor x) -> Tensor")
        .fallback(identity)
        .kernel(identity, opreg::on({"cpu"}).name("first"))
        .kernel(identity, opreg::on({"cpu"}).name("second"))
        .define();
  });
  EXPECT_CONTAINS(message, "kernels 'first' and 'second' both serve device type 'cpu'");
  EXPECT_FALSE(opreg::is_defined("opreg_err::two_kernels"));
}

TEST(Errors, DescribingAnUnknownOp) {
  auto message = error_of([] { opreg::describe_op("opreg_err::never_defined"); });
  EXPECT_CONTAINS(message, "no op named 'opreg_err::never_defined'");
}

}  // namespace
