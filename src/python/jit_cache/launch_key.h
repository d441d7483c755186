// src/python/jit_cache/launch_key.h: the specialization key of a Triton JIT launch: bytes, at
// least as fine as what makes Triton compile another kernel (jit_cache.cpp builds one per launch).
#pragma once

#include <torch/csrc/utils/pybind.h>

#include <cstdint>
#include <string>
#include <vector>

namespace opreg::python {

// What a launch's key is built from besides its arguments.
struct LaunchKeyContext {
  int64_t device;
  const std::vector<bool>* constexpr_params;  // by position
  PyObject* constexpr_by_name;                // dict: parameter name -> bool
  bool debug;
  PyObject* instrumentation_mode;  // str
};

// Writes the key of a launch with these arguments into `key`; false when an argument is outside
// what the key covers. The device; each tensor's dtype and 16-byte alignment; each runtime
// integer's width, == 1 and divisibility by 16; the type of floats, bools and None; constexprs
// and options by type and value; the debug and instrumentation settings. `grid` and `warmup`,
// the launch's own keywords, are not part of it.
bool launch_key(const LaunchKeyContext& context, PyObject* args, PyObject* kwargs,
                std::string* key);

}  // namespace opreg::python
