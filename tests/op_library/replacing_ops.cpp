// tests/op_library/replacing_ops.cpp: an op library that replaces an op of the same name defined
// earlier (from Python, in tests/python/test_reliability_sweep6.py), for the tests that what the
// Python definition left in Python (its fake, its decomposition under compile) goes with it.
#include <ATen/ATen.h>

#include <opreg/opreg.h>

#include <functional>
#include <vector>

namespace {

at::Tensor hundredfold(const at::Tensor& x) { return x * 100; }

const auto replacing =
    opreg::op("opreg_replacing::op(Tensor x) -> Tensor").fallback(hundredfold).replace().define();

// The same through define_all and a raw OpBuilder, which name no caller: the definitions' origin
// is the library being loaded (it was "unknown", and the Python op's fake stayed).
const auto replacing_together = [] {
  std::vector<opreg::OpBuilder> builders;
  builders.emplace_back("opreg_replacing::together(Tensor x) -> Tensor");
  builders.back()
      .fallback(
          opreg::detail::typed_kernel(std::function<at::Tensor(const at::Tensor&)>(hundredfold)))
      .replace();
  return opreg::define_all(std::move(builders));
}();

}  // namespace
