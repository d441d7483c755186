// src/python/python_op.h: the Python front's OpBuilder (opreg._C.OpBuilder, see python_op.cpp):
// ops whose fallback, kernels, backward and vmap rule are Python callables, defined through the
// same builder as C++ ops.
#pragma once

#include <torch/csrc/utils/pybind.h>

namespace opreg::python {

void bind_op_builder(pybind11::module& m);

// While alive, replaces made on this thread come from a Python front (define_all,
// load_library), which drops torch.compile's code itself: the C++ replace listener leaves it.
class FrontDropsCompiledCode {
 public:
  FrontDropsCompiledCode();
  ~FrontDropsCompiledCode();
  FrontDropsCompiledCode(const FrontDropsCompiledCode&) = delete;
  FrontDropsCompiledCode& operator=(const FrontDropsCompiledCode&) = delete;

 private:
  bool outer_;
};

// Waits, the GIL released, until no Python backward's error is in flight through the autograd
// engine, for at most `seconds`; false if some still are. Run at exit, before finalization.
bool wait_for_backward_errors(double seconds);

}  // namespace opreg::python
