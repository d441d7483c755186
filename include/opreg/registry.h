// include/opreg/registry.h: what opreg knows about the ops it defined: per device type, what
// serves calls (a kernel, the fallback, or a skipped registration and why), and which fake,
// autograd and vmap support each op has. `python -m opreg info` prints this.
#pragma once

#include <string>
#include <utility>
#include <vector>

namespace opreg {

struct DeviceServing {
  std::string device_type;  // "cuda", "cpu", "xpu", ...
  std::string served_by;    // "kernel:<name>" or "skipped: <reason>"
};

struct OpReport {
  std::string name;                    // "ns::name"
  std::string schema;                  // the full schema
  std::string origin;                  // the library or file that defined it
  std::vector<DeviceServing> kernels;  // device types with a kernel; all others run the fallback
  std::string fake;                    // "explicit" or "fallback on meta"
  std::string autograd;                // "backward", "fallback", "error", "none"
  std::string vmap;      // "rule", "batch-polymorphic", "fallback", "per-example loop"
  bool bitwise = false;  // kernels promise bitwise equality with the fallback
  bool random = false;   // draws random numbers: values differ from call to call
  std::vector<std::pair<std::string, std::vector<std::string>>> dtypes;  // declared, per argument
};

std::vector<OpReport> describe_ops();
OpReport describe_op(const std::string& name);
bool is_defined(const std::string& name);

// Undefines an opreg op: calls then raise an error naming it, and it can be defined again (with
// any schema). PyTorch keeps the name, so handles taken earlier stay safe to call.
void undefine(const std::string& name);

// Opens a library whose static initializers define opreg ops. If any definition fails, every op
// the library defined is rolled back and one exception (a ValueError in Python) names the library
// and each failure; the process survives. See Note [Loading op libraries] in src/core/load.cpp.
void load_library(const std::string& path);

}  // namespace opreg
