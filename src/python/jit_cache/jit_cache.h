// src/python/jit_cache/jit_cache.h: opreg._C's side of the JIT launch cache (jit_cache.cpp; the
// Python side is python/opreg/_jit_cache.py), and the scope that marks Python code running as
// part of an opreg op (only there are launches cached).
#pragma once

#include <torch/csrc/utils/pybind.h>

#include <string>

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

// "module.QualifiedName" of an object's type.
std::string python_type_name(const pybind11::handle& object);

void bind_jit_cache(pybind11::module& m);

}  // namespace opreg::python
