// tests/cpp/test_device_types.cpp: the registry of accelerated device types: unknown types are
// skipped with a reason, and types registered later reach ops defined earlier.
#include "test_util.h"

namespace {

at::Tensor identity(const at::Tensor& x) { return x.clone(); }

std::string served_by(const std::string& op, const std::string& device_type) {
  for (const auto& serving : opreg::describe_op(op).kernels) {
    if (serving.device_type == device_type) return opreg::describe(serving);
  }
  return "";
}

TEST(DeviceTypes, NamesAreNormalised) {
  EXPECT_EQ(opreg::normalize_device_type("  CUDA \n"), "cuda");
}

TEST(DeviceTypes, UnknownTypeIsSkippedWithAReason) {
  opreg::op("opreg_dev::npu_kernel(Tensor x) -> Tensor")
      .fallback(identity)
      .kernel(identity, opreg::on({"npu"}).name("npu_kernel"))
      .define();
  EXPECT_EQ(served_by("opreg_dev::npu_kernel", "npu"),
            "skipped: this PyTorch build does not know the device type 'npu'");
  // The op still works everywhere through its fallback.
  auto x = at::randn({3});
  EXPECT_TRUE(at::equal(opreg_test::call_boxed("opreg_dev::npu_kernel", {x})[0].toTensor(), x));
}

TEST(DeviceTypes, LaterRegistrationReachesEarlierOps) {
  opreg::op("opreg_dev::late(Tensor x) -> Tensor")
      .fallback(identity)
      .kernel(identity, opreg::KernelOptions<>().name("accel"))
      .define();
  EXPECT_EQ(served_by("opreg_dev::late", "xpu"), "");
  EXPECT_EQ(opreg::register_accelerated_device_type(" XPU "), "xpu");
  EXPECT_EQ(served_by("opreg_dev::late", "xpu"), "kernel:accel");
  auto types = opreg::accelerated_device_types();
  EXPECT_NE(std::find(types.begin(), types.end(), "xpu"), types.end());
  // Registering again changes nothing.
  opreg::register_accelerated_device_type("xpu");
  EXPECT_EQ(opreg::describe_op("opreg_dev::late").kernels.size(), 2u);
}

TEST(DeviceTypes, KernelWithExplicitDevicesIgnoresTheRegistry) {
  opreg::op("opreg_dev::cpu_only(Tensor x) -> Tensor")
      .fallback(identity)
      .kernel(identity, opreg::on({"cpu"}))
      .define();
  opreg::register_accelerated_device_type("privateuseone");
  auto kernels = opreg::describe_op("opreg_dev::cpu_only").kernels;
  ASSERT_EQ(kernels.size(), 1u);
  EXPECT_EQ(kernels[0].device_type, "cpu");
}

TEST(DeviceTypes, DispatchKeys) {
  std::string why;
  EXPECT_EQ(opreg::dispatch_key_for_device_type("cuda", &why), c10::DispatchKey::CUDA);
  EXPECT_EQ(opreg::dispatch_key_for_device_type("cpu", &why), c10::DispatchKey::CPU);
  EXPECT_FALSE(opreg::dispatch_key_for_device_type("cuda:0", &why).has_value());
  EXPECT_CONTAINS(why, "without an index");
}

// A kernel factory that registers a device type: opreg runs it while it builds an op (or while a
// registration rebuilds every op). Sweep 47 B-F1: the registration freed the device types the
// build was reading (ASan: heap-use-after-free); B-F4: run by another registration's rebuild,
// the type it registered was overwritten. Both are refused, and nothing changes.
opreg::KernelFactory registering(const std::string& device_type, int on_run) {
  auto runs = std::make_shared<int>(0);
  return opreg::KernelFactory{[device_type, on_run, runs](const opreg::KernelContext&) {
    if (++*runs == on_run) opreg::register_accelerated_device_type(device_type);
    return c10::KernelFunction::makeFromUnboxedLambda(
        [](const at::Tensor& x) { return x.clone(); });
  }};
}

TEST(DeviceTypes, AFactoryRegisteringADeviceTypeWhileItsOpIsBuiltIsRefused) {
  const auto before = opreg::accelerated_device_types();
  opreg::OpBuilder builder("opreg_dev::registers_when_built(Tensor x) -> Tensor");
  builder.fallback(registering("", /*on_run=*/0));  // never
  builder.kernel(registering("mtia", 1), "registers", std::nullopt);
  const std::string error = opreg_test::error_of([&] { std::move(builder).define(); });
  EXPECT_CONTAINS(error,
                  "register_accelerated_device_type('mtia'): called while opreg builds an op");
  EXPECT_CONTAINS(error, "opreg_dev::registers_when_built");
  EXPECT_FALSE(opreg::is_defined("opreg_dev::registers_when_built"));
  EXPECT_EQ(opreg::accelerated_device_types(), before);
}

TEST(DeviceTypes, AFactoryRegisteringADeviceTypeWhileARegistrationRebuildsIsRefused) {
  opreg::OpBuilder builder("opreg_dev::registers_when_rebuilt(Tensor x) -> Tensor");
  builder.fallback(registering("", /*on_run=*/0));  // never
  builder.kernel(registering("mtia", 2), "registers", std::nullopt);
  std::move(builder).define();
  const auto before = opreg::accelerated_device_types();
  const auto kernels = opreg::describe_op("opreg_dev::registers_when_rebuilt").kernels.size();
  const std::string error =
      opreg_test::error_of([] { opreg::register_accelerated_device_type("hpu"); });
  EXPECT_CONTAINS(error,
                  "register_accelerated_device_type('mtia'): called while opreg builds an op");
  EXPECT_EQ(opreg::accelerated_device_types(), before);
  EXPECT_EQ(opreg::describe_op("opreg_dev::registers_when_rebuilt").kernels.size(), kernels);
}

}  // namespace
