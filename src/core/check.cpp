// src/core/check.cpp: argument checks shared by every opreg op (see include/opreg/check.h).
#include "opreg/check.h"

#include "opreg/op.h"

#include <sstream>

#include <c10/util/Exception.h>

namespace opreg::detail {

std::string ArgChecker::arg_name(size_t index) const {
  return index < arg_names_.size() ? arg_names_[index] : "#" + std::to_string(index);
}

void ArgChecker::visit(size_t index, const at::Tensor& tensor) {
  if (!tensor.defined()) return;
  for (const auto& [rule_index, allowed] : dtype_rules_) {
    if (rule_index != index) continue;
    bool ok = false;
    for (auto dtype : allowed) ok = ok || tensor.scalar_type() == dtype;
    if (!ok) {
      std::ostringstream expected;
      for (size_t i = 0; i < allowed.size(); ++i) expected << (i ? ", " : "") << allowed[i];
      TORCH_CHECK_TYPE(false, op_, ": argument '", arg_name(index), "' has dtype ",
                       tensor.scalar_type(), ", expected one of: ", expected.str());
    }
  }
  if (!same_device_) return;
  // 0-dim CPU tensors mix with tensors on any device, as in ATen.
  bool is_cpu_scalar = tensor.dim() == 0 && tensor.device().is_cpu();
  if (is_cpu_scalar) return;
  if (first_ == nullptr) {
    first_ = &tensor;
    first_index_ = index;
    return;
  }
  TORCH_CHECK(tensor.device() == first_->device(), op_, ": argument '", arg_name(index), "' is on ",
              tensor.device(), ", expected ", first_->device(), " like argument '",
              arg_name(first_index_), "' (all tensor arguments must be on one device)");
}

void check_boxed_arguments(const OpRuntime& runtime, const c10::IValue* first, size_t count) {
  ArgChecker checker(runtime.name, runtime.arg_names, runtime.dtype_rules, runtime.same_device);
  for (size_t i = 0; i < count; ++i) {
    if (first[i].isTensor()) checker.visit(i, first[i].toTensor());
  }
}

}  // namespace opreg::detail
