// src/triton/aot_launch.cpp: the kernel an op gets from .aot_kernel(AotLaunch{...}) (see
// include/opreg/aot_launch.h): expressions parsed against the schema at define time, evaluated
// on the dispatcher's stack at call time, then one launch through opreg::triton::Kernel.
#include <cctype>
#include <memory>
#include <sstream>

#include <ATen/ATen.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <c10/util/Exception.h>
#include <torch/library.h>

#include "opreg/aot_launch.h"
#include "opreg/op.h"
#include "opreg/trace.h"
#include "opreg/triton.h"

namespace opreg::detail {
namespace {

struct Expr {
  enum class Kind { kArgument, kOutput, kNumel, kSize, kStride, kCdiv, kInt, kFloat } kind;
  int64_t index = 0;   // argument or output
  int64_t number = 0;  // dim, divisor or integer literal
  double real = 0;
  std::unique_ptr<Expr> inner;
};

std::string trim(const std::string& text) {
  auto begin = text.find_first_not_of(" \t");
  auto end = text.find_last_not_of(" \t");
  return begin == std::string::npos ? "" : text.substr(begin, end - begin + 1);
}

class Parser {
 public:
  Parser(const OpRuntime& runtime, size_t num_outputs, std::string what)
      : runtime_(runtime), num_outputs_(num_outputs), what_(std::move(what)) {}

  std::unique_ptr<Expr> parse(const std::string& raw) const {
    const std::string text = trim(raw);
    auto expr = std::make_unique<Expr>();
    auto call = [&](const char* name) { return text.rfind(name, 0) == 0 && text.back() == ')'; };
    if (call("numel(") || call("size(") || call("stride(") || call("cdiv(")) {
      const auto open = text.find('(');
      const std::string function = text.substr(0, open);
      const std::string inside = text.substr(open + 1, text.size() - open - 2);
      const auto comma = inside.rfind(',');
      if (function == "numel") {
        expr->kind = Expr::Kind::kNumel;
        expr->index = tensor_argument(inside, text);
        return expr;
      }
      fail(comma != std::string::npos, text, "expected two arguments");
      const std::string second = trim(inside.substr(comma + 1));
      expr->number = integer(second, text);
      if (function == "cdiv") {
        expr->kind = Expr::Kind::kCdiv;
        fail(expr->number > 0, text, "the divisor must be a positive integer");
        expr->inner = parse(inside.substr(0, comma));
      } else {
        expr->kind = function == "size" ? Expr::Kind::kSize : Expr::Kind::kStride;
        expr->index = tensor_argument(inside.substr(0, comma), text);
      }
      return expr;
    }
    if (text.size() > 3 && text.rfind("out", 0) == 0 &&
        std::isdigit(static_cast<unsigned char>(text[3]))) {
      expr->kind = Expr::Kind::kOutput;
      expr->index = integer(text.substr(3), text);
      fail(expr->index < static_cast<int64_t>(num_outputs_), text,
           "the op has " + std::to_string(num_outputs_) + " outputs");
      return expr;
    }
    if (!text.empty() && (std::isdigit(static_cast<unsigned char>(text[0])) || text[0] == '-')) {
      if (text.find_first_of(".eE") != std::string::npos) {
        expr->kind = Expr::Kind::kFloat;
        expr->real = std::stod(text);
      } else {
        expr->kind = Expr::Kind::kInt;
        expr->number = integer(text, text);
      }
      return expr;
    }
    expr->kind = Expr::Kind::kArgument;
    expr->index = argument(text, text);
    return expr;
  }

 private:
  void fail(bool ok, const std::string& text, const std::string& why) const {
    TORCH_CHECK_VALUE(ok, runtime_.name, ": aot_kernel ", what_, ": cannot read '", text,
                      "': ", why);
  }
  int64_t integer(const std::string& raw, const std::string& text) const {
    const std::string digits = trim(raw);
    bool ok = !digits.empty() && digits.find_first_not_of("-0123456789") == std::string::npos;
    fail(ok, text, "'" + digits + "' is not an integer");
    return std::stoll(digits);
  }
  int64_t argument(const std::string& raw, const std::string& text) const {
    const std::string name = trim(raw);
    const auto& names = runtime_.arg_names;
    for (size_t i = 0; i < names.size(); ++i) {
      if (names[i] == name) return static_cast<int64_t>(i);
    }
    std::ostringstream known;
    for (size_t i = 0; i < names.size(); ++i) known << (i ? ", " : "") << names[i];
    fail(false, text, "no argument named '" + name + "' (the op has: " + known.str() + ")");
    return -1;
  }
  int64_t tensor_argument(const std::string& raw, const std::string& text) const {
    return argument(raw, text);
  }

  const OpRuntime& runtime_;
  size_t num_outputs_;
  std::string what_;
};

struct Value {
  const at::Tensor* tensor = nullptr;
  int64_t integer = 0;
  double real = 0;
  bool is_real = false;
};

class AotLaunchKernel final : public c10::OperatorKernel {
 public:
  AotLaunchKernel(const KernelContext& context, const AotLaunch& launch, std::string label)
      : runtime_(context.runtime),
        fallback_(context.fallback),
        kernel_(std::make_unique<triton::Kernel>(launch.kernel)),
        label_(std::move(label)) {
    const auto& schema = context.schema;
    const size_t num_outputs = schema.returns().size();
    for (const auto& ret : schema.returns()) {
      TORCH_CHECK_VALUE(ret.type()->kind() == c10::TypeKind::TensorType, runtime_->name,
                        ": aot_kernel needs an op whose outputs are tensors");
    }
    TORCH_CHECK_VALUE(!launch.grid.empty() && launch.grid.size() <= 3, runtime_->name,
                      ": aot_kernel grid has 1 to 3 expressions, got ", launch.grid.size());
    Parser grid_parser(*runtime_, num_outputs, "grid");
    for (const auto& text : launch.grid) grid_.push_back(grid_parser.parse(text));
    Parser argument_parser(*runtime_, num_outputs, "arguments");
    for (const auto& text : launch.arguments) arguments_.push_back(argument_parser.parse(text));
    if (launch.outputs == "fake") {
      like_ = -1;
    } else {
      TORCH_CHECK_VALUE(launch.outputs.rfind("like:", 0) == 0, runtime_->name,
                        ": aot_kernel outputs must be 'fake' or 'like:<argument>', got '",
                        launch.outputs, "'");
      like_ = Parser(*runtime_, num_outputs, "outputs").parse(launch.outputs.substr(5))->index;
    }
  }

  void operator()(const c10::OperatorHandle& op, c10::DispatchKeySet keys,
                  torch::jit::Stack* stack) {
    const auto& schema = op.schema();
    const size_t num_args = schema.arguments().size();
    auto first = stack->end() - static_cast<std::ptrdiff_t>(num_args);
    check_boxed_arguments(*runtime_, stack->data() + (stack->size() - num_args), num_args);
    std::vector<at::Tensor> outputs = allocate(op, first, num_args, schema.returns().size());
    std::vector<Value> values;
    std::vector<triton::Arg> args;
    values.reserve(arguments_.size());
    for (const auto& expr : arguments_) values.push_back(evaluate(*expr, first, outputs));
    for (const auto& value : values) {
      if (value.tensor != nullptr) {
        args.emplace_back(*value.tensor);
      } else if (value.is_real) {
        args.emplace_back(value.real);
      } else {
        args.emplace_back(value.integer);
      }
    }
    std::string why;
    if (outputs.empty() && !schema.returns().empty()) why = "an input is not on a CUDA device";
    if (!why.empty() || !kernel_->can_launch(args, &why)) {
      if (trace_enabled())
        record_trace(runtime_->name, "fallback(declined by " + label_ + ")", "-");
      fallback_->callBoxed(op, keys, stack);
      return;
    }
    std::array<int64_t, 3> grid{1, 1, 1};
    for (size_t i = 0; i < grid_.size(); ++i) grid[i] = evaluate(*grid_[i], first, outputs).integer;
    if (trace_enabled()) {
      record_trace(runtime_->name, label_, outputs.empty() ? "-" : outputs[0].device().str());
    }
    kernel_->launch({grid[0], grid[1], grid[2]}, args);
    torch::jit::drop(*stack, num_args);
    for (auto& output : outputs) stack->emplace_back(std::move(output));
  }

 private:
  using Iterator = torch::jit::Stack::iterator;

  // Outputs on the inputs' CUDA device; empty when the call is not on CUDA (then declined).
  std::vector<at::Tensor> allocate(const c10::OperatorHandle& op, Iterator first, size_t num_args,
                                   size_t num_outputs) const {
    const at::Tensor* device_tensor = nullptr;
    for (size_t i = 0; i < num_args && device_tensor == nullptr; ++i) {
      if (first[i].isTensor() && first[i].toTensor().defined())
        device_tensor = &first[i].toTensor();
    }
    if (device_tensor == nullptr || !device_tensor->is_cuda()) return {};
    std::vector<at::Tensor> outputs;
    if (like_ >= 0) {
      const auto& like = first[like_].toTensor();
      for (size_t i = 0; i < num_outputs; ++i)
        outputs.push_back(at::empty(like.sizes(), like.options()));
      return outputs;
    }
    torch::jit::Stack meta;
    for (size_t i = 0; i < num_args; ++i) {
      if (first[i].isTensor() && first[i].toTensor().defined()) {
        const auto& t = first[i].toTensor();
        meta.emplace_back(at::empty_strided(t.sizes(), t.strides(), t.options().device(at::kMeta)));
      } else {
        meta.push_back(first[i]);
      }
    }
    op.callBoxed(&meta);
    for (const auto& result : meta) {
      const auto& m = result.toTensor();
      outputs.push_back(
          at::empty_strided(m.sizes(), m.strides(), m.options().device(device_tensor->device())));
    }
    return outputs;
  }

  Value evaluate(const Expr& expr, Iterator first, const std::vector<at::Tensor>& outputs) const {
    Value value;
    auto tensor_at = [&](int64_t index) -> const at::Tensor& {
      TORCH_CHECK_VALUE(first[index].isTensor(), runtime_->name, ": aot_kernel uses argument '",
                        runtime_->arg_names[index], "' as a tensor, but it is not one");
      return first[index].toTensor();
    };
    switch (expr.kind) {
      case Expr::Kind::kArgument: {
        const auto& arg = first[expr.index];
        if (arg.isTensor()) {
          value.tensor = &arg.toTensor();
        } else if (arg.isDouble()) {
          value.real = arg.toDouble();
          value.is_real = true;
        } else {
          value.integer = arg.toInt();
        }
        return value;
      }
      case Expr::Kind::kOutput:
        value.tensor = &outputs[expr.index];
        return value;
      case Expr::Kind::kNumel:
        value.integer = tensor_at(expr.index).numel();
        return value;
      case Expr::Kind::kSize:
        value.integer = tensor_at(expr.index).size(expr.number);
        return value;
      case Expr::Kind::kStride:
        value.integer = tensor_at(expr.index).stride(expr.number);
        return value;
      case Expr::Kind::kCdiv: {
        auto inner = evaluate(*expr.inner, first, outputs).integer;
        value.integer = (inner + expr.number - 1) / expr.number;
        return value;
      }
      case Expr::Kind::kInt:
        value.integer = expr.number;
        return value;
      case Expr::Kind::kFloat:
        value.real = expr.real;
        value.is_real = true;
        return value;
    }
    return value;
  }

  std::shared_ptr<const OpRuntime> runtime_;
  std::shared_ptr<const c10::KernelFunction> fallback_;
  std::unique_ptr<triton::Kernel> kernel_;
  std::string label_;
  std::vector<std::unique_ptr<Expr>> grid_, arguments_;
  int64_t like_ = -1;
};

}  // namespace

c10::KernelFunction make_aot_launch_kernel(const KernelContext& context, const AotLaunch& launch,
                                           const std::string& label) {
  return c10::KernelFunction::makeFromBoxedFunctor(
      std::make_unique<AotLaunchKernel>(context, launch, label));
}

}  // namespace opreg::detail
