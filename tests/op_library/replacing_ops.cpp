// tests/op_library/replacing_ops.cpp: an op library that replaces an op of the same name defined
// earlier (from Python, in tests/python/test_reliability_sweep6.py), for the tests that what the
// Python definition left in Python (its fake, its decomposition under compile) goes with it.
#include <ATen/ATen.h>

#include <opreg/opreg.h>

namespace {

at::Tensor hundredfold(const at::Tensor& x) { return x * 100; }

const auto replacing =
    opreg::op("opreg_replacing::op(Tensor x) -> Tensor").fallback(hundredfold).replace().define();

}  // namespace
