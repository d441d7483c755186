// src/python/python_op.h: defining an op whose fallback, kernels, backward and vmap rule are
// Python callables, through the C++ core (see python_op.cpp).
#pragma once

#include <optional>
#include <string>
#include <utility>
#include <vector>

#include <c10/core/ScalarType.h>
#include <opreg/aot_launch.h>
#include <torch/csrc/utils/pybind.h>

namespace opreg::python {

struct PythonKernelDefinition {
  std::string name;
  std::optional<std::vector<std::string>> device_types;  // nullopt: the accelerated registry
  pybind11::object fn;
  pybind11::object accepts;  // None: accepts every call
};

struct PythonAotDefinition {
  std::string name = "triton_aot";
  std::optional<std::vector<std::string>> device_types;  // nullopt: the accelerated registry
  AotLaunch launch;
};

struct PythonOpDefinition {
  std::string schema;  // "ns::name(...) -> ..."
  pybind11::object fallback;
  std::string fallback_label = "fallback";  // the trace's name for it
  std::vector<PythonKernelDefinition> kernels;
  std::vector<PythonAotDefinition> aot_kernels;  // run in C++: no Python on their calls
  bool python_fake = false;  // a fake registered from Python; no Meta kernel then
  std::string python_module;
  std::vector<std::pair<std::string, std::vector<c10::ScalarType>>> dtype_rules;
  bool allow_mixed_devices = false;
  std::string autograd_policy = "fallback";
  pybind11::object backward, setup_context, make_context;
  pybind11::object vmap_rule;
  bool batch_polymorphic = false, vmap_per_example_loop = false, random = false;
  bool bitwise = false;
  bool replace = false;
  std::string origin;
};

// Defines the ops together (all, or on an error none); returns their qualified names.
std::vector<std::string> define_python_ops(const std::vector<PythonOpDefinition>& definitions);

}  // namespace opreg::python
