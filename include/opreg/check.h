// include/opreg/check.h: the argument checks every opreg op runs before its fallback or kernel:
// one device for all tensor arguments, and declared dtypes. Messages name the op, the argument,
// what was expected and what came.
#pragma once

#include <optional>
#include <string>
#include <utility>
#include <vector>

#include <ATen/core/Tensor.h>

namespace opreg::detail {

class ArgChecker {
 public:
  ArgChecker(const std::string& op, const std::vector<std::string>& arg_names,
             const std::vector<std::pair<size_t, std::vector<c10::ScalarType>>>& dtype_rules,
             bool same_device)
      : op_(op), arg_names_(arg_names), dtype_rules_(dtype_rules), same_device_(same_device) {}

  void visit(size_t index, const at::Tensor& tensor);
  void visit(size_t index, const std::optional<at::Tensor>& tensor) {
    if (tensor.has_value()) visit(index, *tensor);
  }
  template <class NotATensor>
  void visit(size_t /*index*/, const NotATensor& /*value*/) {}

 private:
  std::string arg_name(size_t index) const;

  const std::string& op_;
  const std::vector<std::string>& arg_names_;
  const std::vector<std::pair<size_t, std::vector<c10::ScalarType>>>& dtype_rules_;
  bool same_device_;
  const at::Tensor* first_ = nullptr;
  size_t first_index_ = 0;
};

}  // namespace opreg::detail
