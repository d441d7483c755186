// src/python/python_op.cpp: ops whose pieces are Python callables (the Python front:
// opreg.register_triton_op / register_vmap_op), registered through the same C++ core
// as C++ ops: one OpSpec, the same dispatcher keys, checks, autograd and vmap kernels. Each
// Python piece becomes a boxed kernel that converts the dispatcher's stack to Python and back.
#include "python_op.h"

#include <torch/csrc/autograd/python_variable.h>
#include <torch/csrc/jit/python/pybind_utils.h>

#include "jit_cache/jit_cache.h"
#include "opreg/op.h"
#include "opreg/trace.h"

namespace opreg::python {
namespace {

namespace py = pybind11;

// A Python object shared by kernels; its reference is dropped with the GIL held.
using PyRef = std::shared_ptr<py::object>;

PyRef ref(py::object object) {
  if (object.is_none()) return nullptr;
  return PyRef(new py::object(std::move(object)), [](py::object* pointer) {
    py::gil_scoped_acquire gil;
    delete pointer;
  });
}

struct PyArgs {
  py::tuple args;
  py::object kwargs;  // a dict; null when the schema has no keyword-only arguments
};

// fn(*args, **kwargs) without pybind's argument collector, which copies both on every call.
py::object call(const py::object& fn, const PyArgs& arguments) {
  PyObject* result = PyObject_Call(fn.ptr(), arguments.args.ptr(), arguments.kwargs.ptr());
  if (result == nullptr) throw py::error_already_set();
  return py::reinterpret_steal<py::object>(result);
}

// Pops the op's arguments from the stack as Python values; keyword-only ones as kwargs.
PyArgs pop_arguments(const c10::FunctionSchema& schema, torch::jit::Stack* stack) {
  const auto& arguments = schema.arguments();
  size_t positional = 0;
  for (const auto& argument : arguments) positional += argument.kwarg_only() ? 0 : 1;
  PyArgs result{py::tuple(positional), py::object()};
  if (positional < arguments.size()) result.kwargs = py::dict();
  auto first = stack->end() - arguments.size();
  for (size_t i = 0; i < arguments.size(); ++i) {
    auto value = torch::jit::toPyObject(std::move(first[i]));
    if (arguments[i].kwarg_only()) {
      if (PyDict_SetItemString(result.kwargs.ptr(), arguments[i].name().c_str(), value.ptr()) !=
          0) {
        throw py::error_already_set();
      }
    } else {
      result.args[i] = std::move(value);
    }
  }
  torch::jit::drop(*stack, arguments.size());
  return result;
}

void push_result(const c10::FunctionSchema& schema, const py::object& result,
                 torch::jit::Stack* stack) {
  const auto& returns = schema.returns();
  if (returns.empty()) return;
  if (returns.size() == 1) {
    stack->push_back(torch::jit::toIValue(result, returns[0].type()));
    return;
  }
  auto tuple = result.cast<py::sequence>();
  TORCH_CHECK(tuple.size() == returns.size(), schema.name(), ": the implementation returned ",
              tuple.size(), " values, expected ", returns.size());
  for (size_t i = 0; i < returns.size(); ++i) {
    stack->push_back(torch::jit::toIValue(tuple[i], returns[i].type()));
  }
}

std::string device_of(const torch::jit::Stack& stack, size_t num_args) {
  for (auto it = stack.end() - num_args; it != stack.end(); ++it) {
    if (it->isTensor() && it->toTensor().defined()) return it->toTensor().device().str();
  }
  return "-";
}

// A fallback, kernel or meta implementation written in Python.
class PythonKernel final : public c10::OperatorKernel {
 public:
  enum class Role { kFallback, kKernel, kMeta };

  PythonKernel(std::shared_ptr<const detail::OpRuntime> runtime, Role role, std::string label,
               PyRef fn, PyRef accepts, PyRef fallback)
      : runtime_(std::move(runtime)),
        role_(role),
        label_(std::move(label)),
        fn_(std::move(fn)),
        accepts_(std::move(accepts)),
        fallback_(std::move(fallback)) {}

  void operator()(const c10::OperatorHandle& op, c10::DispatchKeySet, torch::jit::Stack* stack) {
    const auto& schema = op.schema();
    const size_t num_args = schema.arguments().size();
    detail::check_boxed_arguments(*runtime_, stack->data() + (stack->size() - num_args), num_args);
    const std::string device = trace_enabled() ? device_of(*stack, num_args) : "";
    py::gil_scoped_acquire gil;
    InsideOp inside;
    auto arguments = pop_arguments(schema, stack);
    const py::object* fn = fn_.get();
    std::string impl = label_;
    if (accepts_ && !call(*accepts_, arguments).cast<bool>()) {
      fn = fallback_.get();
      impl = "fallback(declined by " + label_ + ")";
    }
    if (trace_enabled()) detail::record_trace(runtime_->name, impl, device);
    if (role_ != Role::kMeta) {
      push_result(schema, call(*fn, arguments), stack);
      return;
    }
    try {
      push_result(schema, call(*fn, arguments), stack);
    } catch (py::error_already_set& error) {
      std::string what = error.what();
      detail::throw_no_fake(runtime_->name, what);
    }
  }

 private:
  std::shared_ptr<const detail::OpRuntime> runtime_;
  Role role_;
  std::string label_;
  PyRef fn_, accepts_, fallback_;
};

template <class... Args>
c10::KernelFunction boxed(Args&&... args) {
  return c10::KernelFunction::makeFromBoxedFunctor(
      std::make_unique<PythonKernel>(std::forward<Args>(args)...));
}

AutogradPolicy parse_policy(const std::string& policy) {
  if (policy == "fallback") return AutogradPolicy::kFallback;
  if (policy == "error") return AutogradPolicy::kError;
  if (policy == "none") return AutogradPolicy::kNone;
  TORCH_CHECK_VALUE(false, "opreg: autograd policy must be 'fallback', 'error' or 'none', got '",
                    policy, "'");
}

py::object to_python(const std::vector<c10::IValue>& values, bool single_as_value) {
  if (single_as_value && values.size() == 1) return torch::jit::toPyObject(values[0]);
  py::tuple tuple(values.size());
  for (size_t i = 0; i < values.size(); ++i) tuple[i] = torch::jit::toPyObject(values[i]);
  return std::move(tuple);
}

constexpr const char* kPythonContext = "__opreg_python_ctx";

void add_autograd(detail::OpSpec& spec, PyRef backward, PyRef setup_context, PyRef make_context) {
  if (!backward) return;
  spec.autograd.setup_context = [setup_context, make_context](
                                    AutogradContext& ctx, const std::vector<c10::IValue>& inputs,
                                    const std::vector<c10::IValue>& outputs) {
    py::gil_scoped_acquire gil;
    InsideOp inside;
    py::object py_ctx = (*make_context)(py::cast(&ctx, py::return_value_policy::reference));
    if (setup_context) (*setup_context)(py_ctx, to_python(inputs, false), to_python(outputs, true));
    ctx.saved_data[kPythonContext] = torch::jit::toIValue(py_ctx, c10::PyObjectType::get());
  };
  auto name = spec.name_or_schema;
  spec.autograd.backward = [backward, name](AutogradContext& ctx,
                                            const std::vector<at::Tensor>& grads) {
    py::gil_scoped_acquire gil;
    InsideOp inside;
    py::object py_ctx = torch::jit::toPyObject(ctx.saved_data.at(kPythonContext));
    py::tuple py_grads(grads.size());
    for (size_t i = 0; i < grads.size(); ++i) py_grads[i] = py::cast(grads[i]);
    py::object result = (*backward)(py_ctx, *py_grads);
    std::vector<at::Tensor> gradients;
    auto append = [&](const py::handle& value) {
      if (value.is_none()) {
        gradients.emplace_back();
      } else {
        TORCH_CHECK_TYPE(THPVariable_Check(value.ptr()), name,
                         ": backward must return tensors or None, got ",
                         py::str(value.get_type()).cast<std::string>());
        gradients.push_back(THPVariable_Unpack(value.ptr()));
      }
    };
    if (py::isinstance<py::tuple>(result) || py::isinstance<py::list>(result)) {
      for (const auto& value : result) append(value);
    } else {
      append(result);
    }
    return gradients;
  };
}

c10::IValue output_to_ivalue(const py::handle& value) {
  if (value.is_none()) return c10::IValue();
  if (THPVariable_Check(value.ptr())) return THPVariable_Unpack(value.ptr());
  if (py::isinstance<py::bool_>(value)) return value.cast<bool>();
  if (py::isinstance<py::int_>(value)) return value.cast<int64_t>();
  if (py::isinstance<py::float_>(value)) return value.cast<double>();
  TORCH_CHECK_TYPE(false, "opreg: a vmap rule returned a ",
                   py::str(value.get_type()).cast<std::string>(),
                   "; expected tensors, numbers or None");
}

void add_vmap_rule(detail::OpSpec& spec, PyRef rule) {
  if (!rule) return;
  spec.vmap.rule = [rule](const VmapInfo& info, const std::vector<std::optional<int64_t>>& in_dims,
                          const std::vector<c10::IValue>& args) {
    py::gil_scoped_acquire gil;
    InsideOp inside;
    static const char* kRandomness[] = {"error", "same", "different"};
    py::list dims;
    for (const auto& dim : in_dims) dims.append(dim ? py::cast(*dim) : py::none());
    py::object result = (*rule)(info.batch_size, kRandomness[static_cast<int>(info.randomness)],
                                dims, to_python(args, false));
    auto pair = result.cast<py::tuple>();
    TORCH_CHECK(pair.size() == 2, "opreg: a vmap rule returns (outputs, out_dims)");
    VmapResult converted;
    for (const auto& value : pair[0].cast<py::tuple>()) {
      converted.outputs.push_back(output_to_ivalue(value));
    }
    for (const auto& dim : pair[1].cast<py::tuple>()) {
      converted.out_dims.push_back(dim.is_none() ? std::nullopt
                                                 : std::optional<int64_t>(dim.cast<int64_t>()));
    }
    return converted;
  };
}

detail::OpSpec spec_of(const PythonOpDefinition& d) {
  detail::OpSpec spec;
  spec.name_or_schema = d.schema;
  spec.runtime = std::make_shared<detail::OpRuntime>();
  spec.runtime->same_device = !d.allow_mixed_devices;
  std::shared_ptr<const detail::OpRuntime> runtime = spec.runtime;
  auto fallback = ref(d.fallback);
  TORCH_CHECK_VALUE(fallback != nullptr, "opreg: op '", d.schema, "' needs a fallback function");
  using Role = PythonKernel::Role;
  spec.fallback = std::make_shared<const c10::KernelFunction>(
      boxed(runtime, Role::kFallback, d.fallback_label, fallback, nullptr, nullptr));
  if (d.python_fake) {
    spec.explicit_fake = true;  // registered from Python (torch.library): no Meta kernel here
    spec.python_module = d.python_module;
  } else {
    spec.meta = std::make_shared<const c10::KernelFunction>(
        boxed(runtime, Role::kMeta, "fallback(meta)", fallback, nullptr, nullptr));
  }
  for (const auto& kernel : d.kernels) {
    auto fn = ref(kernel.fn);
    auto accepts = ref(kernel.accepts);
    std::string label = "kernel:" + kernel.name;
    spec.kernels.push_back(
        {kernel.name, kernel.device_types, [=](const detail::KernelContext& context) {
           return boxed(context.runtime, Role::kKernel, label, fn, accepts, fallback);
         }});
  }
  for (const auto& aot : d.aot_kernels) {
    std::string label = "kernel:" + aot.name;
    spec.kernels.push_back({aot.name, aot.device_types,
                            [launch = aot.launch, label](const detail::KernelContext& context) {
                              return detail::make_aot_launch_kernel(context, launch, label);
                            }});
  }
  for (const auto& [argument, dtypes] : d.dtype_rules)
    spec.dtype_rules.emplace_back(argument, dtypes);
  spec.autograd.policy = parse_policy(d.autograd_policy);
  add_autograd(spec, ref(d.backward), ref(d.setup_context), ref(d.make_context));
  add_vmap_rule(spec, ref(d.vmap_rule));
  spec.vmap.batch_polymorphic = d.batch_polymorphic;
  spec.vmap.per_example_loop = d.vmap_per_example_loop;
  spec.vmap.random = d.random;
  spec.bitwise = d.bitwise;
  spec.replace = d.replace;
  spec.origin = d.origin;
  return spec;
}

}  // namespace

std::vector<std::string> define_python_ops(const std::vector<PythonOpDefinition>& definitions) {
  std::vector<detail::OpSpec> specs;
  for (const auto& definition : definitions) specs.push_back(spec_of(definition));
  return detail::define_all(std::move(specs));
}

}  // namespace opreg::python
