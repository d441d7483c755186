// src/python/jit_launch.h: opreg._C's functions for cached Triton JIT launches (jit_launch.cpp).
#pragma once

#include <torch/csrc/utils/pybind.h>

namespace opreg::python {

void bind_jit_launch(pybind11::module& m);

}  // namespace opreg::python
