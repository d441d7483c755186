// src/triton/aot_launch.cpp: the kernel opreg::triton::aot(AotLaunch{...}) makes (see
// include/opreg/aot_launch.h): expressions parsed against the schema at define time, evaluated
// on the dispatcher's stack at call time, then one launch through opreg::triton::Kernel.
#include <algorithm>
#include <atomic>
#include <cctype>
#include <charconv>
#include <cmath>
#include <cstring>
#include <memory>
#include <mutex>
#include <optional>
#include <sstream>

#include <ATen/ATen.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <c10/util/Exception.h>
#include <c10/util/StringUtil.h>
#include <torch/library.h>

#include "launch.h"
#include "opreg/aot_launch.h"
#include "opreg/definition.h"
#include "opreg/detail/text.h"
#include "opreg/trace.h"
#include "opreg/triton.h"

namespace opreg::detail {
namespace {

// The op's name and argument names, for messages.
struct OpRuntime {
  std::string name;
  std::vector<std::string> arg_names;
};

std::shared_ptr<const OpRuntime> runtime_of(const KernelContext& context) {
  auto runtime = std::make_shared<OpRuntime>(OpRuntime{context.op, {}});
  for (const auto& argument : context.schema.arguments()) {
    runtime->arg_names.push_back(argument.name());
  }
  return runtime;
}

// What an expression gives: checked when the op is defined (a grid needs an integer, numel a
// tensor), so a call never meets a value of the wrong kind.
enum class ValueType { kTensor, kInt, kFloat };

struct Expr {
  enum class Kind { kArgument, kOutput, kNumel, kSize, kStride, kCdiv, kInt, kFloat } kind;
  ValueType type = ValueType::kInt;
  int64_t index = 0;   // argument or output
  int64_t number = 0;  // dim, divisor or integer literal
  double real = 0;
  std::unique_ptr<Expr> inner;
  std::string text;  // as written, for errors at call time
};

const char* type_name(ValueType type) {
  switch (type) {
    case ValueType::kTensor:
      return "a tensor";
    case ValueType::kInt:
      return "an integer";
    case ValueType::kFloat:
      return "a float";
  }
  return "?";
}

// The kind of value a schema argument gives an expression; nullopt for kinds no expression takes.
std::optional<ValueType> argument_type(const c10::Argument& argument) {
  auto type = argument.type();
  if (type->kind() == c10::TypeKind::OptionalType) {
    type = type->castRaw<c10::OptionalType>()->getElementType();
  }
  switch (type->kind()) {
    case c10::TypeKind::TensorType:
      return ValueType::kTensor;
    case c10::TypeKind::IntType:
    case c10::TypeKind::SymIntType:
    case c10::TypeKind::BoolType:
      return ValueType::kInt;
    case c10::TypeKind::FloatType:
      return ValueType::kFloat;
    default:
      return std::nullopt;
  }
}

// ceil(a / b) for b > 0 without computing a + b - 1 (which overflows near INT64_MAX).
int64_t ceil_div(int64_t a, int64_t b) { return a / b + ((a % b != 0 && a > 0) ? 1 : 0); }

// Note [AotLaunch expression grammar]
//   expr    := number | out<i> | name | call
//   call    := numel(name) | size(name, int) | stride(name, int) | cdiv(expr, int)
// A recursive-descent reader over the whole text: anything left over, unbalanced parentheses,
// numbers out of range and names the schema lacks are ValueErrors naming the op, the expression
// and what was expected.
class Parser {
 public:
  Parser(const OpRuntime& runtime, const c10::FunctionSchema& schema, std::string what)
      : runtime_(runtime), schema_(schema), what_(std::move(what)) {}

  std::unique_ptr<Expr> parse(const std::string& text) const {
    Reader in{text, 0};
    skip_space(in);
    fail(in.pos < text.size(), text, "the expression is empty");
    auto expr = expression(in);
    skip_space(in);
    fail(in.pos == text.size(), text,
         "expected the end after '" + before(in) + "', found '" + text.substr(in.pos) + "'");
    return expr;
  }

  // An integer-valued expression (a grid dimension).
  std::unique_ptr<Expr> parse_integer(const std::string& text) const {
    auto expr = parse(text);
    fail(expr->type == ValueType::kInt, text,
         std::string("expected an integer expression, got ") + type_name(expr->type));
    const auto value = constant(*expr);
    fail(!value || (*value >= 0 && *value < (int64_t{1} << 31)), text,
         "a grid dimension is a count of programs, from 0 to 2^31 - 1");
    return expr;
  }

  // The value of an expression that reads no argument (a literal, or cdiv of one).
  static std::optional<int64_t> constant(const Expr& expr) {
    if (expr.kind == Expr::Kind::kInt) return expr.number;
    if (expr.kind != Expr::Kind::kCdiv) return std::nullopt;
    const auto inner = constant(*expr.inner);
    if (!inner) return std::nullopt;
    return ceil_div(*inner, expr.number);
  }

  // The index of the tensor argument `text` names (outputs "like:<argument>").
  int64_t parse_tensor_argument(const std::string& text) const {
    Reader in{text, 0};
    skip_space(in);
    auto index = tensor_argument(in);
    skip_space(in);
    fail(in.pos == text.size(), text, "expected the name of a tensor argument");
    return index;
  }

 private:
  struct Reader {
    const std::string& text;
    size_t pos;
  };

  void fail(bool ok, const std::string& text, const std::string& why) const {
    TORCH_CHECK_VALUE(ok, runtime_.name, ": aot_kernel ", what_, ": cannot read '", text,
                      "': ", why);
  }
  static void skip_space(Reader& in) {
    while (in.pos < in.text.size() && (in.text[in.pos] == ' ' || in.text[in.pos] == '\t')) ++in.pos;
  }
  static bool word_char(char c) {
    return std::isalnum(static_cast<unsigned char>(c)) != 0 || c == '_';
  }
  // The text read so far, without trailing spaces.
  static std::string before(const Reader& in, size_t pos) {
    while (pos > 0 && (in.text[pos - 1] == ' ' || in.text[pos - 1] == '\t')) --pos;
    return in.text.substr(0, pos);
  }
  static std::string before(const Reader& in) { return before(in, in.pos); }
  std::string found(const Reader& in) const {
    return in.pos < in.text.size() ? "'" + in.text.substr(in.pos) + "'" : "the end";
  }
  void expect(Reader& in, char c) const {
    skip_space(in);
    fail(in.pos < in.text.size() && in.text[in.pos] == c, in.text,
         std::string("expected '") + c + "' after '" + before(in) + "', found " + found(in));
    ++in.pos;
  }
  std::string identifier(Reader& in) const {
    skip_space(in);
    const size_t begin = in.pos;
    if (in.pos < in.text.size() && !std::isdigit(static_cast<unsigned char>(in.text[in.pos]))) {
      while (in.pos < in.text.size() && word_char(in.text[in.pos])) ++in.pos;
    }
    fail(in.pos > begin, in.text,
         "expected a name after '" + before(in, begin) + "', found " + found(in));
    return in.text.substr(begin, in.pos - begin);
  }

  std::unique_ptr<Expr> expression(Reader& in) const {
    // The parser recurses once per nested call: a bound keeps a hostile text off the stack's end.
    struct Nesting {
      int& depth;
      explicit Nesting(int& d) : depth(++d) {}
      ~Nesting() { --depth; }
    } nesting(depth_);
    fail(depth_ <= kMaxNesting, in.text,
         "expressions nest at most " + std::to_string(kMaxNesting) + " calls deep");
    skip_space(in);
    fail(in.pos < in.text.size(), in.text,
         "expected an expression after '" + before(in) + "', found the end");
    const char c = in.text[in.pos];
    if (std::isdigit(static_cast<unsigned char>(c)) || c == '-' || c == '+' || c == '.') {
      return number(in);
    }
    const size_t begin = in.pos;
    const std::string name = identifier(in);
    skip_space(in);
    if (in.pos < in.text.size() && in.text[in.pos] == '(') return call(name, begin, in);
    auto expr = std::make_unique<Expr>();
    expr->text = name;
    const size_t num_outputs = schema_.returns().size();
    if (name.size() > 3 && name.rfind("out", 0) == 0 &&
        name.find_first_not_of("0123456789", 3) == std::string::npos) {
      expr->kind = Expr::Kind::kOutput;
      expr->type = ValueType::kTensor;
      const auto& arguments = schema_.arguments();
      fail(std::none_of(arguments.begin(), arguments.end(),
                        [&](const c10::Argument& argument) { return argument.name() == name; }),
           in.text,
           "'" + name +
               "' names an output here, and the op has an argument of that name too; "
               "rename the argument (out<i> names output i in a launch)");
      const auto digits = name.substr(3);
      const auto parsed =
          std::from_chars(digits.data(), digits.data() + digits.size(), expr->index);
      fail(
          parsed.ec == std::errc() && expr->index < static_cast<int64_t>(num_outputs), in.text,
          "'" + name + "' names no output: the op has " + std::to_string(num_outputs) + " outputs");
      return expr;
    }
    expr->kind = Expr::Kind::kArgument;
    expr->index = argument(name, in.text);
    auto type = argument_type(schema_.arguments()[expr->index]);
    fail(type.has_value(), in.text,
         "argument '" + name + "' is " + schema_.arguments()[expr->index].type()->str() +
             "; an expression takes tensor, int, float or bool arguments");
    expr->type = *type;
    return expr;
  }

  // A literal: the whole run of number-like characters must be one integer or one float.
  std::unique_ptr<Expr> number(Reader& in) const {
    const size_t begin = in.pos;
    while (in.pos < in.text.size() &&
           (word_char(in.text[in.pos]) || std::strchr("+-.", in.text[in.pos]) != nullptr)) {
      ++in.pos;
    }
    const std::string token = in.text.substr(begin, in.pos - begin);
    auto expr = std::make_unique<Expr>();
    expr->text = token;
    const char* first = token.data();
    const char* last = token.data() + token.size();
    if (token.find_first_of(".eE") != std::string::npos) {
      expr->kind = Expr::Kind::kFloat;
      expr->type = ValueType::kFloat;
      const auto parsed = std::from_chars(first, last, expr->real);
      fail(parsed.ec != std::errc::result_out_of_range, in.text,
           "'" + token + "' is out of the range of a float (double)");
      fail(parsed.ec == std::errc() && parsed.ptr == last && std::isfinite(expr->real), in.text,
           "'" + token + "' is not a number");
    } else {
      expr->kind = Expr::Kind::kInt;
      expr->number = integer(token, in.text);
    }
    return expr;
  }
  int64_t integer(const std::string& token, const std::string& text) const {
    int64_t value = 0;
    const char* last = token.data() + token.size();
    const auto parsed = std::from_chars(token.data(), last, value);
    fail(parsed.ec != std::errc::result_out_of_range, text,
         "'" + token + "' is out of the range of a 64-bit integer");
    fail(parsed.ec == std::errc() && parsed.ptr == last, text, "'" + token + "' is not an integer");
    return value;
  }
  // `what` ("the divisor of cdiv") is written out as a number: an argument cannot stand there.
  int64_t integer_literal(Reader& in, const std::string& what) const {
    skip_space(in);
    const size_t begin = in.pos;
    while (in.pos < in.text.size() && (word_char(in.text[in.pos]) || in.text[in.pos] == '-' ||
                                       in.text[in.pos] == '+' || in.text[in.pos] == '.')) {
      ++in.pos;
    }
    fail(in.pos > begin, in.text,
         "expected an integer after '" + before(in, begin) + "', found " + found(in));
    const std::string token = in.text.substr(begin, in.pos - begin);
    const bool name = std::isalpha(static_cast<unsigned char>(token[0])) || token[0] == '_';
    const auto& names = runtime_.arg_names;
    fail(!name, in.text,
         what + " must be an integer written out, not '" + token + "'" +
             (std::find(names.begin(), names.end(), token) != names.end()
                  ? " (an argument of the op cannot stand there)"
                  : ""));
    return integer(token, in.text);
  }

  std::unique_ptr<Expr> call(const std::string& function, size_t begin, Reader& in) const {
    auto expr = std::make_unique<Expr>();
    expect(in, '(');
    if (function == "numel") {
      expr->kind = Expr::Kind::kNumel;
      expr->index = tensor_argument(in);
    } else if (function == "size" || function == "stride") {
      expr->kind = function == "size" ? Expr::Kind::kSize : Expr::Kind::kStride;
      expr->index = tensor_argument(in);
      expect(in, ',');
      expr->number = integer_literal(in, "the dimension of " + function + "()");
    } else if (function == "cdiv") {
      expr->kind = Expr::Kind::kCdiv;
      expr->inner = expression(in);
      fail(expr->inner->type == ValueType::kInt, in.text,
           "cdiv needs an integer to divide, '" + expr->inner->text + "' is " +
               type_name(expr->inner->type));
      expect(in, ',');
      expr->number = integer_literal(in, "the divisor of cdiv");
      fail(expr->number > 0, in.text, "the divisor of cdiv must be a positive integer");
    } else {
      fail(false, in.text,
           "unknown function '" + function + "' (known: numel, size, stride, cdiv)");
    }
    expect(in, ')');
    expr->type = ValueType::kInt;
    expr->text = in.text.substr(begin, in.pos - begin);
    return expr;
  }

  int64_t argument(const std::string& name, const std::string& text) const {
    const auto& names = runtime_.arg_names;
    for (size_t i = 0; i < names.size(); ++i) {
      if (names[i] == name) return static_cast<int64_t>(i);
    }
    std::ostringstream known;
    for (size_t i = 0; i < names.size(); ++i) known << (i ? ", " : "") << names[i];
    fail(false, text, "no argument named '" + name + "' (the op has: " + known.str() + ")");
    return -1;
  }
  int64_t tensor_argument(Reader& in) const {
    const std::string name = identifier(in);
    const int64_t index = argument(name, in.text);
    const auto& schema_argument = schema_.arguments()[index];
    fail(argument_type(schema_argument) == ValueType::kTensor, in.text,
         "argument '" + name + "' is " + schema_argument.type()->str() + ", not a tensor");
    return index;
  }

  static constexpr int kMaxNesting = 64;
  const OpRuntime& runtime_;
  const c10::FunctionSchema& schema_;
  std::string what_;
  mutable int depth_ = 0;
};

struct Value {
  const at::Tensor* tensor = nullptr;
  int64_t integer = 0;
  double real = 0;
  bool is_real = false;
};

class AotLaunchKernel final : public c10::OperatorKernel {
 public:
  AotLaunchKernel(const KernelContext& context, const AotLaunch& launch)
      : runtime_(runtime_of(context)),
        schema_(context.schema),
        fallback_(context.fallback),
        kernel_(std::make_unique<triton::Kernel>(launch.kernel)),
        label_(context.label) {
    const auto& schema = context.schema;
    for (const auto& ret : schema.returns()) {
      TORCH_CHECK_VALUE(ret.type()->kind() == c10::TypeKind::TensorType, runtime_->name,
                        ": aot_kernel needs an op whose outputs are tensors");
    }
    TORCH_CHECK_VALUE(!launch.grid.empty() && launch.grid.size() <= 3, runtime_->name,
                      ": aot_kernel grid has 1 to 3 expressions, got ", launch.grid.size());
    TORCH_CHECK_VALUE(!launch.kernel.empty(), runtime_->name,
                      ": aot_kernel names no kernel (an empty name); name the kernel its bundle "
                      "was compiled as");
    if (!triton::is_identifier(launch.kernel)) {
      TORCH_CHECK_VALUE(false, runtime_->name, ": aot_kernel names kernel '",
                        detail::escaped(launch.kernel), "'",
                        ", which no bundle can hold: kernel names are C identifiers (letters, "
                        "digits, _); name the kernel its bundle was compiled as");
    }
    Parser grid_parser(*runtime_, schema, "grid");
    for (const auto& text : launch.grid) grid_.push_back(grid_parser.parse_integer(text));
    for (size_t i = 1; i < grid_.size(); ++i) {  // CUDA's limit on y and z
      const auto value = Parser::constant(*grid_[i]);
      TORCH_CHECK_VALUE(!value || *value < 65536, runtime_->name, ": aot_kernel grid: '",
                        launch.grid[i], "' is ", *value, " programs along ", i == 1 ? "y" : "z",
                        ", and CUDA allows at most 65535 there");
    }
    Parser argument_parser(*runtime_, schema, "arguments");
    for (const auto& text : launch.arguments) arguments_.push_back(argument_parser.parse(text));
    if (launch.outputs == "fake") {
      like_ = -1;
    } else {
      TORCH_CHECK_VALUE(launch.outputs.rfind("like:", 0) == 0, runtime_->name,
                        ": aot_kernel outputs must be 'fake' or 'like:<argument>', got '",
                        launch.outputs, "'");
      like_ = Parser(*runtime_, schema, "outputs").parse_tensor_argument(launch.outputs.substr(5));
    }
    check_against_kernel();
  }

  void operator()(const c10::OperatorHandle& op, c10::DispatchKeySet keys,
                  torch::jit::Stack* stack) {
    const size_t num_args = schema_.arguments().size();
    auto first = stack->end() - static_cast<std::ptrdiff_t>(num_args);
    // 1. Check the arguments against the kernel's parameters once it is loaded (never launch
    // unchecked); decline calls off CUDA before evaluating anything: out<i> has no tensor yet.
    check_against_kernel();
    const at::Tensor* device_tensor = nullptr;
    for (size_t i = 0; i < num_args && device_tensor == nullptr; ++i) {
      if (first[i].isTensor() && first[i].toTensor().defined()) {
        device_tensor = &first[i].toTensor();
      }
    }
    if (!checked_.load(std::memory_order_acquire) || device_tensor == nullptr ||
        !device_tensor->is_cuda()) {
      decline(op, keys, stack);
      return;
    }
    // 2. Outputs, then the kernel's arguments; decline what the kernel cannot take.
    std::vector<at::Tensor> outputs =
        allocate(op, first, num_args, schema_.returns().size(), device_tensor->device());
    std::vector<Value> values;
    std::vector<triton::Arg> args;
    values.reserve(arguments_.size());
    for (const auto& expr : arguments_) values.push_back(evaluate(*expr, first, outputs));
    for (size_t i = 0; i < values.size(); ++i) {
      const auto& value = values[i];
      if (value.tensor != nullptr) {
        args.emplace_back(*value.tensor);
      } else if (value.is_real) {
        args.emplace_back(value.real);
      } else if (float_params_[i]) {
        args.emplace_back(static_cast<double>(value.integer));
      } else {
        args.emplace_back(value.integer);
      }
    }
    if (!kernel_->can_launch(args)) {
      decline(op, keys, stack);
      return;
    }
    // 3. Grid and launch.
    std::array<int64_t, 3> grid{1, 1, 1};
    for (size_t i = 0; i < grid_.size(); ++i) grid[i] = evaluate(*grid_[i], first, outputs).integer;
    if (trace_enabled()) {
      record_trace(runtime_->name, label_, device_tensor->device().str());
    }
    kernel_->launch({grid[0], grid[1], grid[2]}, args);
    torch::jit::drop(*stack, num_args);
    for (auto& output : outputs) stack->emplace_back(std::move(output));
  }

 private:
  using Iterator = torch::jit::Stack::iterator;

  // Note [AotLaunch argument kinds]
  // A tensor expression feeds a pointer parameter, a float expression a float parameter, an
  // integer one an integer or (converted) a float parameter. Checked when the op is defined if
  // the kernel is loaded then, else on the first call that finds it loaded; until it passes, the
  // kernel never launches.
  void check_against_kernel() {
    if (checked_.load(std::memory_order_acquire)) return;
    auto params = kernel_->parameters();
    if (!params) return;
    std::lock_guard<std::mutex> lock(check_mutex_);
    if (checked_.load(std::memory_order_relaxed)) return;
    const auto& kernel = kernel_->name();
    if (params->size() != arguments_.size()) {
      std::ostringstream names;
      for (size_t i = 0; i < params->size(); ++i) {
        names << (i ? ", " : "") << (*params)[i].name << ": " << (*params)[i].type;
      }
      TORCH_CHECK_VALUE(false, runtime_->name, ": aot_kernel '", kernel, "' takes ", params->size(),
                        " arguments (", names.str(), "), the launch gives ", arguments_.size());
    }
    std::vector<bool> float_params;
    for (size_t i = 0; i < params->size(); ++i) {
      const auto& param = (*params)[i];
      const bool is_float = param.type == "fp16" || param.type == "bf16" || param.type == "fp32" ||
                            param.type == "fp64";
      const auto type = arguments_[i]->type;
      const bool fits = param.is_pointer()
                            ? type == ValueType::kTensor
                            : type == ValueType::kInt || (type == ValueType::kFloat && is_float);
      TORCH_CHECK_VALUE(fits, runtime_->name, ": aot_kernel '", kernel, "': argument ", i, " ('",
                        arguments_[i]->text, "') is ", type_name(type),
                        ", the kernel's parameter '", param.name, "' is ",
                        param.is_pointer() ? "a pointer ("
                        : is_float         ? "a float ("
                                           : "an integer (",
                        param.type, ")");
      float_params.push_back(is_float);
    }
    float_params_ = std::move(float_params);
    checked_.store(true, std::memory_order_release);
  }

  void decline(const c10::OperatorHandle& op, c10::DispatchKeySet keys,
               torch::jit::Stack* stack) const {
    if (trace_enabled()) record_trace(runtime_->name, "fallback(declined by " + label_ + ")", "-");
    fallback_->callBoxed(op, keys, stack);
  }

  // Outputs on `device` (the inputs' CUDA device).
  std::vector<at::Tensor> allocate(const c10::OperatorHandle& op, Iterator first, size_t num_args,
                                   size_t num_outputs, c10::Device device) const {
    std::vector<at::Tensor> outputs;
    if (like_ >= 0) {
      TORCH_CHECK_VALUE(first[like_].isTensor() && first[like_].toTensor().defined(),
                        runtime_->name, ": aot_kernel outputs like:", runtime_->arg_names[like_],
                        ": the argument must be a tensor, got ", first[like_].tagKind());
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
      outputs.push_back(at::empty_strided(m.sizes(), m.strides(), m.options().device(device)));
    }
    return outputs;
  }

  Value evaluate(const Expr& expr, Iterator first, const std::vector<at::Tensor>& outputs) const {
    Value value;
    auto tensor_at = [&](int64_t index) -> const at::Tensor& {
      TORCH_CHECK_VALUE(first[index].isTensor() && first[index].toTensor().defined(),
                        runtime_->name, ": aot_kernel ", expr.text, ": argument '",
                        runtime_->arg_names[index], "' must be a tensor, got ",
                        first[index].tagKind());
      return first[index].toTensor();
    };
    auto dim_of = [&](const at::Tensor& tensor) {
      const int64_t dims = tensor.dim();
      TORCH_CHECK_VALUE(expr.number >= -dims && expr.number < dims, runtime_->name, ": aot_kernel ",
                        expr.text, ": dim ", expr.number, " is out of range for argument '",
                        runtime_->arg_names[expr.index], "' of ", dims, " dimensions (expected ",
                        -dims, " to ", dims - 1, ")");
      return expr.number < 0 ? expr.number + dims : expr.number;
    };
    switch (expr.kind) {
      case Expr::Kind::kArgument: {
        const auto& arg = first[expr.index];
        if (expr.type == ValueType::kTensor) {
          value.tensor = &tensor_at(expr.index);
        } else if (arg.isDouble()) {
          value.real = arg.toDouble();
          value.is_real = true;
        } else if (arg.isInt()) {
          value.integer = arg.toInt();
        } else if (arg.isBool()) {
          value.integer = arg.toBool() ? 1 : 0;
        } else if (arg.isSymInt()) {
          value.integer = arg.toSymInt().guard_int(__FILE__, __LINE__);
        } else {
          TORCH_CHECK_VALUE(false, runtime_->name, ": aot_kernel ", expr.text, ": argument '",
                            runtime_->arg_names[expr.index], "' must be a number, got ",
                            arg.tagKind());
        }
        return value;
      }
      case Expr::Kind::kOutput:
        TORCH_INTERNAL_ASSERT(expr.index < static_cast<int64_t>(outputs.size()));
        value.tensor = &outputs[expr.index];
        return value;
      case Expr::Kind::kNumel:
        value.integer = tensor_at(expr.index).numel();
        return value;
      case Expr::Kind::kSize: {
        const auto& tensor = tensor_at(expr.index);
        value.integer = tensor.size(dim_of(tensor));
        return value;
      }
      case Expr::Kind::kStride: {
        const auto& tensor = tensor_at(expr.index);
        value.integer = tensor.stride(dim_of(tensor));
        return value;
      }
      case Expr::Kind::kCdiv:
        value.integer = ceil_div(evaluate(*expr.inner, first, outputs).integer, expr.number);
        return value;
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
  c10::FunctionSchema schema_;
  std::shared_ptr<const c10::KernelFunction> fallback_;
  std::unique_ptr<triton::Kernel> kernel_;
  std::string label_;
  std::vector<std::unique_ptr<Expr>> grid_, arguments_;
  int64_t like_ = -1;
  std::atomic<bool> checked_{false};
  std::mutex check_mutex_;
  std::vector<bool> float_params_;  // per argument, written once before checked_
};

}  // namespace

}  // namespace opreg::detail

namespace opreg::triton {

KernelFactory aot(AotLaunch launch) {
  return {[launch = std::move(launch)](const KernelContext& context) {
    return c10::KernelFunction::makeFromBoxedFunctor(
        std::make_unique<detail::AotLaunchKernel>(context, launch));
  }};
}

}  // namespace opreg::triton
