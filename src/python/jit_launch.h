// src/python/jit_launch.h: opreg._C's side of cached Triton JIT launches (jit_launch.cpp) and the
// scope that marks Python code running as part of an opreg op (only there are launches cached).
#pragma once

#include <torch/csrc/utils/pybind.h>

namespace opreg::python {

// While alive, this thread runs a Python piece of an opreg op (kernel, fallback, vmap rule,
// backward): Triton JIT kernels it launches may take the cached path.
class InsideOp {
 public:
  InsideOp();
  ~InsideOp();
  InsideOp(const InsideOp&) = delete;
  InsideOp& operator=(const InsideOp&) = delete;
};

bool inside_op();

void bind_jit_launch(pybind11::module& m);

}  // namespace opreg::python
