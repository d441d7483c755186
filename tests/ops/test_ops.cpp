// tests/ops/test_ops.cpp: C++-defined ops that the Python tests load (opreg_test::*), each covering
// one piece of the builder: kernels on CPU with declines, mutation, a fallback that cannot run on
// meta, a kernel for an unknown device type, a kernel that follows the device-type registry.
#include <ATen/ATen.h>
#include <opreg/opreg.h>

namespace {

at::Tensor affine_reference(const at::Tensor& x, double scale, double shift) {
  return x * scale + shift;
}
at::Tensor affine_cpu(const at::Tensor& x, double scale, double shift) {
  return at::add(at::mul(x, scale), shift);
}

const auto affine =
    opreg::op("opreg_test::affine(Tensor x, float scale, float shift) -> Tensor")
        .fallback(affine_reference)
        .kernel(affine_cpu,
                opreg::on({"cpu"}).name("cpu").accepts(
                    [](const at::Tensor& x, double, double) { return x.is_contiguous(); }))
        .define();

void scale_(at::Tensor& x, double factor) { x.mul_(factor); }
const auto scale_inplace =
    opreg::op("opreg_test::scale_(Tensor(a!) x, float factor) -> ()").fallback(scale_).define();

at::Tensor normalize_by_max(const at::Tensor& x) { return x / x.abs().max().item<double>(); }
const auto needs_data = opreg::op("opreg_test::normalize_by_max(Tensor x) -> Tensor")
                            .fallback(normalize_by_max)
                            .define();

at::Tensor identity(const at::Tensor& x) { return x.clone(); }
const auto npu_only = opreg::op("opreg_test::npu_only(Tensor x) -> Tensor")
                          .fallback(identity)
                          .kernel(identity, opreg::on({"npu"}).name("npu"))
                          .define();

const auto follows_registry = opreg::op("opreg_test::follows_registry(Tensor x) -> Tensor")
                                  .fallback(identity)
                                  .kernel(identity, opreg::KernelOptions<>().name("accel"))
                                  .define();

}  // namespace
