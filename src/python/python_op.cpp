// src/python/python_op.cpp: the Python front's OpBuilder (opreg._C.OpBuilder): the same builder
// as C++ ops use (include/opreg/definition.h), whose pieces are Python callables. Each becomes a
// boxed kernel that converts the dispatcher's stack to Python and back; checks, autograd and vmap
// kernels are the core's own.
#include "python_op.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <map>
#include <mutex>
#include <optional>
#include <thread>
#include <vector>

#include <pthread.h>

#include <torch/csrc/DynamicTypes.h>
#include <torch/csrc/Exceptions.h>
#include <torch/csrc/autograd/python_variable.h>
#include <torch/csrc/jit/frontend/function_schema_parser.h>
#include <torch/csrc/jit/python/pybind_utils.h>
#include <torch/csrc/utils/tensor_memoryformats.h>

#include "jit_cache/jit_cache.h"
#include "opreg/definition.h"
#include "opreg/detail/schema_types.h"
#include "opreg/detail/text.h"
#include "opreg/registry.h"
#include "opreg/trace.h"
#include "opreg/triton.h"

namespace opreg::detail {

struct PythonFront {
  static void python_fake(OpBuilder& builder, std::string python_module, KernelFactory meta) {
    builder.python_fake(std::move(python_module), std::move(meta));
  }
  static void fallback_words(OpBuilder& builder, std::string words) {
    builder.fallback_words(std::move(words));
  }
  static OpBuilder declared_in_python(std::string schema) {
    OpBuilder builder(std::move(schema));
    builder.declared_in_python();
    return builder;
  }
};

}  // namespace opreg::detail

namespace opreg::python {
namespace {

namespace py = pybind11;

bool interpreter_finalizing();

// A Python object shared by kernels; its reference is dropped with the GIL held. Once the
// interpreter is gone it is left: autograd nodes that a failed backward left pending are freed
// with the engine's thread-local queue after Python finalized, and taking the GIL then segfaults.
// A thread of C++'s own (no Python thread state), and any thread without the GIL that drops a
// replaced definition (detail::dropping_definitions), hands the reference to Python's main thread
// instead (Py_AddPendingCall): a thread that replaced a Python-defined op from C++ waited for the
// GIL forever while the Python thread holding it waited for that thread (sweep 38 B-F1: a C++
// thread; sweep 39 B-F2: a Python thread that had released the GIL, as ctypes.CDLL does). Other
// threads with a thread state (autograd's, a call's) take the GIL: handing every drop to the main
// thread would keep memory while it waits in a join.
using PyRef = std::shared_ptr<py::object>;

std::mutex& graveyard_mutex() {
  static auto* mutex = new std::mutex();  // never destroyed: a deleter may run at exit
  return *mutex;
}
std::vector<py::object*>& graveyard() {
  static auto* objects = new std::vector<py::object*>();
  return *objects;
}

int drop_graveyard(void* /*unused*/) {  // Python's main thread, holding the GIL
  std::vector<py::object*> objects;
  {
    const std::lock_guard<std::mutex> lock(graveyard_mutex());
    objects.swap(graveyard());
  }
  for (py::object* pointer : objects) {
    pointer->dec_ref();
    pointer->release();
    delete pointer;
  }
  return 0;
}

PyRef ref(py::object object) {
  if (object.is_none()) return nullptr;
  return PyRef(new py::object(std::move(object)), [](py::object* pointer) {
    if (!Py_IsInitialized() || interpreter_finalizing()) {
      pointer->release();  // the process is exiting: no reference count to keep right
    } else if (PyGILState_Check() == 0 &&
               (PyGILState_GetThisThreadState() == nullptr || detail::dropping_definitions())) {
      const std::lock_guard<std::mutex> lock(graveyard_mutex());
      graveyard().push_back(pointer);
      // A full queue of pending calls leaves it to the next one that gets in.
      (void)Py_AddPendingCall(drop_graveyard, nullptr);
      return;
    } else {
      py::gil_scoped_acquire gil;
      pointer->dec_ref();
      pointer->release();
    }
    delete pointer;
  });
}

// What a Python ctx (opreg.AutogradContext's _cpp) reaches its call's AutogradContext through.
// The autograd node that owns that context may be freed while Python keeps the ctx (in a list,
// a closure): then every use raises instead of reading freed memory. A use holds the mutex, under
// which the context cuts the link, and a reference to the node, taken only while the node has
// others: its last one may go on another thread meanwhile (seen: a ctx read while another thread
// freed the graph took a reference back from zero, and the node was freed twice).
struct ContextLink {
  std::mutex mutex;
  AutogradContext* ctx = nullptr;
  std::string op;

  ContextLink(AutogradContext* ctx, std::string op) : ctx(ctx), op(std::move(op)) {}

  template <typename Use>
  auto with(const Use& use) {
    std::shared_ptr<void> node;  // let go after the mutex: its going may free the graph, and cut
    std::unique_lock<std::mutex> lock(mutex);
    if (ctx != nullptr) node = ctx->keep_alive();
    TORCH_CHECK(node != nullptr, op,
                ": this ctx belongs to a call whose autograd graph was freed (its outputs are "
                "gone, or its backward ran); it holds nothing now");
    return use(*ctx);
  }

  void cut() {
    std::unique_lock<std::mutex> lock(mutex, std::try_to_lock);
    if (!lock.owns_lock()) {
      // A use in progress may need the GIL back (a saved-tensor hook written in Python): wait
      // without it.
      std::optional<py::gil_scoped_release> no_gil;
      if (Py_IsInitialized() && !interpreter_finalizing() && PyGILState_Check() != 0) {
        no_gil.emplace();
      }
      lock.lock();
    }
    ctx = nullptr;
  }
};

// The Python ctx of a call's backward, kept in the AutogradContext's saved_data: as a PyRef, not
// as PyTorch's IValue of a Python object, whose destructor takes the GIL whatever the
// interpreter's state. The context clears saved_data first when it goes, so the link is cut
// before anything the ctx could reach is freed.
struct PythonContext final : torch::CustomClassHolder {
  explicit PythonContext(std::shared_ptr<ContextLink> link) : link(std::move(link)) {}
  ~PythonContext() override { link->cut(); }
  std::shared_ptr<ContextLink> link;
  PyRef object;
};

// Python pieces do not run once the interpreter finalizes: a call from a __del__ of garbage
// collected at exit reached a fallback while PyTorch's Python objects were being torn down, and
// PyTorch aborted on an internal assert. (torch.library's ops are gone by then.)
bool interpreter_finalizing() {
#if PY_VERSION_HEX >= 0x030D0000
  return Py_IsFinalizing();
#else
  return _Py_IsFinalizing();
#endif
}

// Before a Python piece takes the GIL. A thread inside a definition (a kernel factory that calls
// an op, say) holds opreg's registry lock, which Python's threads take holding the GIL (a
// definition, describe_ops): waiting there for the GIL deadlocked (sweep 41 B-F1), and so did
// a thread that held it, since Python code lets it go now and then (sweep 42 B-F1). Such a call
// is refused.
void check_python_can_run(const std::string& op, const std::string& piece) {
  TORCH_CHECK(!interpreter_finalizing(), op, ": ", piece,
              ", written in Python, cannot run: the Python interpreter is exiting");
  TORCH_CHECK(!detail::inside_definition(), op, ": ", piece,
              ", written in Python, was called inside a definition (by a kernel factory), which "
              "holds opreg's lock: Python code there could deadlock with a Python thread that "
              "waits for that lock; call the op outside the kernel factory");
}

// PEP 678's note on a Python exception (Python 3.11 and later; nothing on older ones); once, for
// an exception object a piece raises again and again.
void add_note(py::error_already_set& error, const std::string& note) {
  const py::object& value = error.value();
  const py::str text("opreg: " + note);
  try {
    if (!value || !py::hasattr(value, "add_note")) return;
    if (py::hasattr(value, "__notes__")) {
      const py::object notes = value.attr("__notes__");
      if (py::isinstance<py::list>(notes) && notes.contains(text)) return;
    }
    value.attr("add_note")(text);
  } catch (py::error_already_set&) {  // __notes__ replaced by something else: the error goes on
  }
}

// Runs a call into a Python piece of `op`: an error it raises stays itself (its type, its
// message) and gets a note naming the op and the piece (`piece()`, built only then).
template <class Fn, class Piece>
auto noted(const std::string& op, const Piece& piece, Fn&& fn) -> decltype(fn()) {
  try {
    return fn();
  } catch (py::error_already_set& error) {
    add_note(error, "raised in " + std::string(piece()) + " of " + op);
    throw;
  }
}

// Holds the GIL on a thread of its own until the returned object goes; null when that thread did
// not get it within `wait`. The caller never waits for the GIL itself: it may hold the dynamic
// loader's lock (a library's static initializer, or a thread one waits for), which a Python thread
// holding the GIL may be waiting for (an import, ctypes.CDLL).
std::shared_ptr<void> hold_gil_by_proxy(std::chrono::milliseconds wait) {
  struct Proxy {
    std::mutex mutex;
    std::condition_variable changed;
    bool held = false, done = false;  // done: released by the caller, or given up
  };
  auto proxy = std::make_shared<Proxy>();
  std::thread([proxy] {
    const PyGILState_STATE gil = PyGILState_Ensure();
    {
      std::unique_lock<std::mutex> lock(proxy->mutex);
      if (!proxy->done) {
        proxy->held = true;
        proxy->changed.notify_all();
        proxy->changed.wait(lock, [&] { return proxy->done; });
      }
    }
    PyGILState_Release(gil);
  }).detach();
  std::unique_lock<std::mutex> lock(proxy->mutex);
  if (!proxy->changed.wait_for(lock, wait, [&] { return proxy->held; })) {
    proxy->done = true;  // the thread lets the GIL go as soon as it gets it
    return nullptr;
  }
  return std::shared_ptr<void>(nullptr, [proxy](void*) {
    std::lock_guard<std::mutex> released(proxy->mutex);
    proxy->done = true;
    proxy->changed.notify_all();
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

// An argument as Python sees it in torch.library's kernels: a ScalarType, Layout or MemoryFormat
// is on the stack as an int, and Python wants torch.float64, not 7.
py::object to_python_argument(c10::IValue value, const c10::Argument& argument,
                              const std::string& op) {
  // A C++ caller's str that is not UTF-8 raised a bare UnicodeDecodeError (sweep 45 B-N29).
  auto require_text = [&](const c10::IValue& text) {
    if (!text.isString()) return;
    const std::string readable = detail::valid_utf8(text.toStringRef());
    TORCH_CHECK_VALUE(readable == text.toStringRef(), op, ": argument '", argument.name(),
                      "' holds bytes that are not UTF-8 text ('", readable,
                      "'), which Python cannot read; pass text");
  };
  require_text(value);
  if (value.isList()) {
    for (const c10::IValue& element : value.toListRef()) require_text(element);
  }
  if (value.isInt()) {
    const c10::Type* type = argument.real_type().get();
    if (const auto* optional = type->castRaw<c10::OptionalType>()) {
      type = optional->getElementType().get();
    }
    const int64_t number = value.toInt();
    auto require_below = [&](int64_t end, const char* what, const char* example) {
      TORCH_CHECK_VALUE(number >= 0 && number < end, op, ": argument '", argument.name(), "' is ",
                        number, ", which is not a ", what, " (pass e.g. ", example, ")");
    };
    switch (type->kind()) {
      case c10::TypeKind::ScalarTypeType:
        require_below(static_cast<int64_t>(at::ScalarType::NumOptions), "ScalarType",
                      "torch.float32");
        break;
      case c10::TypeKind::LayoutType:
        require_below(static_cast<int64_t>(at::Layout::NumOptions), "Layout", "torch.strided");
        break;
      case c10::TypeKind::MemoryFormatType:
        require_below(static_cast<int64_t>(at::MemoryFormat::NumOptions), "MemoryFormat",
                      "torch.contiguous_format");
        break;
      default:
        break;
    }
    switch (type->kind()) {
      case c10::TypeKind::ScalarTypeType:
        return py::reinterpret_borrow<py::object>(reinterpret_cast<PyObject*>(
            torch::getTHPDtype(static_cast<at::ScalarType>(value.toInt()))));
      case c10::TypeKind::LayoutType:
        return py::reinterpret_borrow<py::object>(reinterpret_cast<PyObject*>(
            torch::getTHPLayout(static_cast<at::Layout>(value.toInt()))));
      case c10::TypeKind::MemoryFormatType:
        return py::reinterpret_borrow<py::object>(
            torch::utils::getTHPMemoryFormat(static_cast<at::MemoryFormat>(value.toInt())));
      default:
        break;
    }
  }
  return torch::jit::toPyObject(std::move(value));
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
    auto value = to_python_argument(std::move(first[i]), arguments[i], schema.name());
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

// Whether `value` is what a bool output may be: pybind11's bool caster takes None, 0.5 or 1j too
// (as False and True), which torch.library's ops pass on silently.
bool is_bool_like(const py::handle& value) {
  const std::string type = Py_TYPE(value.ptr())->tp_name;
  return PyBool_Check(value.ptr()) || type == "numpy.bool" || type == "numpy.bool_" ||
         THPVariable_Check(value.ptr());
}

// The first value of a bool, bool? or bool[] output that is no bool; none when all are.
std::optional<py::handle> not_a_bool(const py::handle& value, const c10::Type& type) {
  if (const auto* optional = type.castRaw<c10::OptionalType>()) {
    return value.is_none() ? std::nullopt : not_a_bool(value, *optional->getElementType());
  }
  if (type.kind() == c10::TypeKind::BoolType) {
    return is_bool_like(value) ? std::nullopt : std::optional<py::handle>(value);
  }
  const auto* list = type.castRaw<c10::ListType>();
  if (list == nullptr || list->getElementType()->kind() != c10::TypeKind::BoolType ||
      !(py::isinstance<py::list>(value) || py::isinstance<py::tuple>(value))) {
    return std::nullopt;
  }
  for (const auto& item : value.cast<py::sequence>()) {
    if (!is_bool_like(item)) return item;
  }
  return std::nullopt;
}

// Why a Python int does not fit `type` (or an optional of it), a type that takes ints: it is too
// large for the C++ value. Empty where that is not why.
std::string int_misfit(const py::handle& value, const c10::Type& type) {
  if (!PyLong_Check(value.ptr()) || PyBool_Check(value.ptr())) return "";
  const auto* optional = type.castRaw<c10::OptionalType>();
  const auto kind = (optional ? *optional->getElementType() : type).kind();
  if (kind == c10::TypeKind::IntType || kind == c10::TypeKind::NumberType) {
    int overflow = 0;
    PyLong_AsLongLongAndOverflow(value.ptr(), &overflow);
    if (overflow != 0) return "which a 64-bit int cannot hold";
  }
  if (kind == c10::TypeKind::FloatType || kind == c10::TypeKind::ComplexType) {
    if (PyLong_AsDouble(value.ptr()) == -1.0 && PyErr_Occurred() != nullptr) {
      PyErr_Clear();
      return "which a double cannot hold";
    }
  }
  return "";
}

c10::IValue to_output(const std::string& op, const std::string& impl, const py::handle& value,
                      const c10::Argument& ret, size_t index) {
  if (const auto wrong = not_a_bool(value, *ret.type())) {
    TORCH_CHECK_TYPE(false, op, ": ", impl, " returned ", py::repr(*wrong).cast<std::string>(),
                     " (", py::str(wrong->get_type()).cast<std::string>(), ")",
                     wrong->ptr() == value.ptr() ? " for" : " as an element of", " output ", index,
                     ", expected a bool (the schema's return type is ", detail::written_type(ret),
                     ")");
  }
  try {
    return torch::jit::toIValue(value, ret.type());
  } catch (const std::exception&) {
    // An int too large for the C++ value is of the right type, with the wrong value.
    const auto misfit = int_misfit(value, *ret.type());
    TORCH_CHECK_VALUE(misfit.empty(), op, ": ", impl, " returned ",
                      py::str(value).cast<std::string>(), " for output ", index, ", ", misfit);
    // A str holding a lone surrogate ('\ud800') has no UTF-8 form for a C++ string.
    auto is_a_str = [](const py::handle& item, const c10::Type& type) {
      const auto* optional = type.castRaw<c10::OptionalType>();
      return py::isinstance<py::str>(item) &&
             (optional ? *optional->getElementType() : type).kind() == c10::TypeKind::StringType;
    };
    TORCH_CHECK_VALUE(!is_a_str(value, *ret.type()), op, ": ", impl, " returned a str for output ",
                      index, " that is not UTF-8 (", py::repr(value).cast<std::string>(),
                      " holds a lone surrogate), which a C++ string cannot hold");
    // For a list, the first element that does not fit says more than "returned list".
    std::string element;
    const auto* optional = ret.type()->castRaw<c10::OptionalType>();
    const auto* list =
        (optional ? optional->getElementType() : ret.type())->castRaw<c10::ListType>();
    if (list != nullptr && (py::isinstance<py::list>(value) || py::isinstance<py::tuple>(value))) {
      size_t position = 0;
      for (const auto& item : value.cast<py::sequence>()) {
        const auto& type = list->getElementType();
        try {
          // toIValue takes None for a Tensor (an undefined one); a Tensor[] may not hold one.
          TORCH_CHECK(!item.is_none() || type->kind() == c10::TypeKind::OptionalType);
          torch::jit::toIValue(item, type);
        } catch (const std::exception&) {
          const auto too_large = int_misfit(item, *type);
          TORCH_CHECK_VALUE(too_large.empty(), op, ": ", impl, " returned ",
                            py::str(item).cast<std::string>(), " as element ", position,
                            " of output ", index, ", ", too_large);
          element = " (its element " + std::to_string(position) + " is " +
                    (is_a_str(item, *type)
                         ? "a str that is not UTF-8: " + py::repr(item).cast<std::string>() +
                               " holds a lone surrogate"
                         : py::str(item.get_type()).cast<std::string>()) +
                    ")";
          break;
        }
        ++position;
      }
    }
    TORCH_CHECK_TYPE(false, op, ": ", impl, " returned ",
                     py::str(value.get_type()).cast<std::string>(), " for output ", index, element,
                     ", expected ", detail::written_type(ret), " (the schema's return type)");
  }
}

void push_result(const std::string& op, const std::string& impl, const c10::FunctionSchema& schema,
                 const py::object& result, torch::jit::Stack* stack) {
  const auto& returns = schema.returns();
  if (returns.empty()) {
    TORCH_CHECK_TYPE(result.is_none(), op, ": ", impl, " returned ",
                     py::str(result.get_type()).cast<std::string>(),
                     ", expected None (the schema returns nothing: '", schema, "')");
    return;
  }
  if (returns.size() == 1) {
    stack->push_back(to_output(op, impl, result, returns[0], 0));
    return;
  }
  TORCH_CHECK_TYPE(py::isinstance<py::tuple>(result) || py::isinstance<py::list>(result), op, ": ",
                   impl, " returned ", py::str(result.get_type()).cast<std::string>(),
                   ", expected a tuple of ", returns.size(), " outputs");
  auto tuple = result.cast<py::sequence>();
  TORCH_CHECK(tuple.size() == returns.size(), op, ": ", impl, " returned ", tuple.size(),
              " values, expected ", returns.size());
  for (size_t i = 0; i < returns.size(); ++i) {
    stack->push_back(to_output(op, impl, tuple[i], returns[i], i));
  }
}

std::string device_of(const torch::jit::Stack& stack, size_t num_args) {
  for (auto it = stack.end() - num_args; it != stack.end(); ++it) {
    if (it->isTensor() && it->toTensor().defined()) return it->toTensor().device().str();
  }
  return "-";
}

// "kernel 'triton'" for the trace label "kernel:triton", "the fallback" for "fallback", as the
// core's messages say it.
std::string in_words(const std::string& label) {
  if (label.rfind("kernel:", 0) == 0) return "kernel '" + label.substr(7) + "'";
  return "the " + label;
}

// A fallback, kernel or fake written in Python. A kernel with `accepts` serves the calls it
// declines from the Python fallback directly.
class PythonKernel final : public c10::OperatorKernel {
 public:
  PythonKernel(const KernelContext& context, std::string label, PyRef fn, PyRef accepts,
               PyRef fallback)
      : op_(context.op),
        schema_(context.schema),
        label_(std::move(label)),
        words_(in_words(label_)),
        fn_(std::move(fn)),
        accepts_(std::move(accepts)),
        fallback_(std::move(fallback)) {}

  void operator()(const c10::OperatorHandle&, c10::DispatchKeySet, torch::jit::Stack* stack) {
    const size_t num_args = schema_.arguments().size();
    const std::string device = trace_enabled() ? device_of(*stack, num_args) : "";
    check_python_can_run(op_, words_);
    py::gil_scoped_acquire gil;
    InsideOp inside;
    auto arguments = pop_arguments(schema_, stack);
    const bool declined = accepts_ && !accepted(noted(
                                          op_, [&] { return "the accepts of " + words_; },
                                          [&] { return call(*accepts_, arguments); }));
    const py::object* fn = declined ? fallback_.get() : fn_.get();
    if (trace_enabled()) {
      detail::record_trace(op_, declined ? "fallback(declined by " + label_ + ")" : label_, device);
    }
    static const auto& kFallback = *new std::string("the fallback");
    const std::string& piece = declined ? kFallback : words_;
    // An error of PyTorch's raised deep in the piece (vmap's ".item()" one, say) names no op.
    py::object result = noted(
        op_, [&]() -> const std::string& { return piece; }, [&] { return call(*fn, arguments); });
    push_result(op_, piece, schema_, std::move(result), stack);
  }

 private:
  bool accepted(const py::object& answer) const {
    TORCH_CHECK_TYPE(PyBool_Check(answer.ptr()), op_, ": the accepts of ", in_words(label_),
                     " returned ", py::str(answer.get_type()).cast<std::string>(),
                     ", expected True or False");
    return answer.ptr() == Py_True;
  }

  std::string op_;
  c10::FunctionSchema schema_;  // this definition's: a replace may change the op's schema
  std::string label_;
  std::string words_;  // the label as messages say it: "kernel 'triton'"
  PyRef fn_, accepts_, fallback_;
};

// A Python callable as a kernel factory. `label`: the trace's name for it (default: the context's).
KernelFactory python_kernel(const py::object& fn, const py::object& accepts,
                            const py::object& fallback, const std::string& label) {
  return {[fn = ref(fn), accepts = ref(accepts), fallback = ref(fallback),
           label](const KernelContext& context) {
    const std::string& trace_label =
        label.empty() || context.label != "fallback" ? context.label : label;
    return c10::KernelFunction::makeFromBoxedFunctor(
        std::make_unique<PythonKernel>(context, trace_label, fn, accepts, fallback));
  }};
}

AutogradPolicy parse_policy(const std::string& policy) {
  if (policy == "fallback") return AutogradPolicy::kFallback;
  if (policy == "error") return AutogradPolicy::kError;
  if (policy == "none") return AutogradPolicy::kNone;
  TORCH_CHECK_VALUE(false, "opreg: autograd policy must be 'fallback', 'error' or 'none', got '",
                    policy, "'");
}

// A schema's arguments, to give setup_context and vmap rules the op's arguments as pop_arguments
// gives them to the fallback; null when the text does not parse (define() refuses it, saying why).
using SchemaPtr = std::shared_ptr<const c10::FunctionSchema>;

SchemaPtr parse_for_arguments(const std::string& text) {
  if (text.find('(') == std::string::npos) return nullptr;
  try {
    return std::make_shared<const c10::FunctionSchema>(torch::schema(text.c_str()));
  } catch (const std::exception&) {
    return nullptr;
  }
}

py::object to_python(const std::vector<c10::IValue>& values, bool single_as_value,
                     const SchemaPtr& arguments_of = nullptr) {
  if (single_as_value && values.size() == 1) return torch::jit::toPyObject(values[0]);
  const bool typed = arguments_of && arguments_of->arguments().size() == values.size();
  py::tuple tuple(values.size());
  for (size_t i = 0; i < values.size(); ++i) {
    tuple[i] =
        typed ? to_python_argument(values[i], arguments_of->arguments()[i], arguments_of->name())
              : torch::jit::toPyObject(values[i]);
  }
  return std::move(tuple);
}

// A Python backward's error in flight through the autograd engine. The engine drops it on whichever
// thread finishes the graph task last, and it may hold a deep traceback; if the interpreter begins
// to finalize meanwhile, that thread is killed while freeing it, which aborts the process
// (torch.autograd.Function shares this). Counted so that exit can wait for it (see
// wait_for_backward_errors).
class BackwardError final : public ::python_error {
 public:
  explicit BackwardError(py::error_already_set& error) {  // the GIL is held
    error.restore();
    persist();
    count(+1);
  }
  BackwardError(const BackwardError& other) : ::python_error(other) { count(+1); }
  BackwardError(BackwardError&& other) noexcept : ::python_error(std::move(other)) { count(+1); }
  ~BackwardError() override {
    if (type != nullptr || value != nullptr || traceback != nullptr) {
      py::gil_scoped_acquire gil;
      Py_CLEAR(type);
      Py_CLEAR(value);
      Py_CLEAR(traceback);
    }
    count(-1);
  }

  // Until no error is alive, then until kSettle has passed since the last one went: it goes with
  // the engine's GraphTask, whose destruction goes on after it (the task's thread-local state
  // holds a Python object, the contextvars.Context that torch.autograd.grad stashes there, and
  // frees it under the GIL; seen killed mid-free at exit, one run in six on a loaded machine).
  static bool wait_until_none(std::chrono::milliseconds limit) {
    constexpr auto kSettle = std::chrono::milliseconds(250);
    const auto deadline = std::chrono::steady_clock::now() + limit;
    std::unique_lock<std::mutex> lock(state().mutex);
    while (true) {
      if (!state().released.wait_until(lock, deadline, [] { return state().alive == 0; })) {
        return false;
      }
      if (!state().last_freed) return true;
      const auto seen = *state().last_freed;
      const auto settled = std::min(seen + kSettle, deadline);
      // Woken early by another error freed (or made) meanwhile: wait again, from that one.
      if (!state().released.wait_until(lock, settled, [seen] {
            return state().alive != 0 || *state().last_freed != seen;
          })) {
        return true;  // settled with none alive
      }
    }
  }

 private:
  struct State {
    std::mutex mutex;
    std::condition_variable released;
    int64_t alive = 0;
    std::optional<std::chrono::steady_clock::time_point> last_freed;
  };
  static State*& instance() {
    static State* state = [] {
      // A forked child has none of the threads that held its errors (nor, maybe, its lock).
      pthread_atfork(nullptr, nullptr, [] { instance() = new State(); });
      return new State();  // never destroyed: errors may outlive static teardown
    }();
    return state;
  }
  static State& state() { return *instance(); }
  static void count(int delta) {
    std::lock_guard<std::mutex> lock(state().mutex);
    state().alive += delta;
    if (delta < 0) state().last_freed = std::chrono::steady_clock::now();
    if (state().alive == 0) state().released.notify_all();
  }
};

constexpr const char* kPythonContext = "__opreg_python_ctx";

void add_autograd(OpBuilder& builder, PyRef backward, PyRef setup_context, PyRef make_context,
                  SchemaPtr schema) {
  if (!backward) return;
  auto name = builder.declared_name();
  SetupContext setup = [setup_context, make_context, schema, name](
                           AutogradContext& ctx, const std::vector<c10::IValue>& inputs,
                           const std::vector<c10::IValue>& outputs) {
    check_python_can_run(name, "its setup_context");
    py::gil_scoped_acquire gil;
    InsideOp inside;
    // Held by the context before Python sees it: a setup_context that keeps the ctx and raises
    // leaves it linked to a context that goes now.
    auto link = std::make_shared<ContextLink>(&ctx, name);
    auto held = c10::make_intrusive<PythonContext>(link);
    ctx.saved_data[kPythonContext] = c10::IValue::make_capsule(held);
    py::object py_ctx = (*make_context)(py::cast(link));
    if (setup_context) {
      noted(
          name, [] { return "the setup_context"; },
          [&] {
            (*setup_context)(py_ctx, to_python(inputs, false, schema), to_python(outputs, true));
          });
    }
    held->object = ref(py_ctx);
  };
  Backward run_backward = [backward, name](AutogradContext& ctx,
                                           const std::vector<at::Tensor>& grads) {
    check_python_can_run(name, "its backward");
    py::gil_scoped_acquire gil;
    InsideOp inside;
    py::object py_ctx =
        *static_cast<PythonContext*>(ctx.saved_data.at(kPythonContext).toCapsule().get())->object;
    py::tuple py_grads(grads.size());
    for (size_t i = 0; i < grads.size(); ++i) py_grads[i] = py::cast(grads[i]);
    py::object result;
    try {
      result = (*backward)(py_ctx, *py_grads);
    } catch (py::error_already_set& error) {
      add_note(error, "raised in the backward of " + name);
      throw BackwardError(error);
    }
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
  builder.backward(std::move(run_backward), std::move(setup));
}

std::string type_name(const py::handle& value) {
  return py::str(value.get_type()).cast<std::string>();
}

// `declared`: the schema's return at this position, when it has one. A Tensor[] or Tensor?[]
// output comes as a list or tuple of tensors (None too for Tensor?[]); an output with no tensor
// in its type (int[], str, Scalar, ...) converts as the fallback's does.
c10::IValue output_to_ivalue(const std::string& op, const py::handle& value,
                             const c10::Argument* returned, size_t index) {
  const c10::TypePtr declared = returned != nullptr ? returned->type() : nullptr;
  if (declared && !detail::holds_kind(*declared, c10::TypeKind::TensorType)) {
    return to_output(op, "the vmap rule", value, *returned, index);
  }
  if (value.is_none()) return c10::IValue();
  if (THPVariable_Check(value.ptr())) return THPVariable_Unpack(value.ptr());
  const auto* list_type = declared ? declared->castRaw<c10::ListType>() : nullptr;
  if (list_type && (py::isinstance<py::list>(value) || py::isinstance<py::tuple>(value))) {
    const auto& element_type = list_type->getElementType();
    const bool optional = element_type->kind() == c10::TypeKind::OptionalType;
    if (element_type->kind() == c10::TypeKind::TensorType || optional) {
      c10::List<std::optional<at::Tensor>> tensors;
      for (const auto& element : value) {
        TORCH_CHECK_TYPE(THPVariable_Check(element.ptr()) || (optional && element.is_none()), op,
                         ": the vmap rule returned a list output holding a ", type_name(element),
                         "; expected tensors", optional ? " or None" : "");
        tensors.push_back(element.is_none() ? std::nullopt
                                            : std::optional(THPVariable_Unpack(element.ptr())));
      }
      if (optional) return tensors;
      c10::List<at::Tensor> plain;
      for (size_t i = 0; i < tensors.size(); ++i) plain.push_back(*tensors.get(i));
      return plain;
    }
  }
  if (py::isinstance<py::bool_>(value)) return value.cast<bool>();
  if (py::isinstance<py::int_>(value)) return value.cast<int64_t>();
  if (py::isinstance<py::float_>(value)) return value.cast<double>();
  TORCH_CHECK_TYPE(false, op, ": the vmap rule returned a ", type_name(value),
                   " among its outputs; expected tensors, numbers or None");
}

// A vmap rule's (outputs, out_dims), each a tuple or list, converted; anything else is the rule's
// mistake and says so.
VmapResult vmap_result(const std::string& op, const py::object& result, const SchemaPtr& schema) {
  auto is_sequence = [](const py::handle& value) {
    return py::isinstance<py::tuple>(value) || py::isinstance<py::list>(value);
  };
  TORCH_CHECK_TYPE(is_sequence(result) && py::len(result) == 2, op, ": the vmap rule returned a ",
                   type_name(result), ", expected a pair (outputs, out_dims)");
  py::sequence pair = result.cast<py::sequence>();
  py::object outputs = pair[0], out_dims = pair[1];
  // One output may come bare, as torch.library's vmap rules return it.
  if (!py::isinstance<py::tuple>(outputs)) outputs = py::make_tuple(outputs);
  if (!is_sequence(out_dims)) out_dims = py::make_tuple(out_dims);
  VmapResult converted;
  for (const auto& value : outputs) {
    const size_t index = converted.outputs.size();
    const c10::Argument* returned =
        schema && index < schema->returns().size() ? &schema->returns()[index] : nullptr;
    converted.outputs.push_back(output_to_ivalue(op, value, returned, index));
  }
  for (const auto& dim : out_dims) {
    if (dim.is_none()) {
      converted.out_dims.emplace_back(std::nullopt);
      continue;
    }
    TORCH_CHECK_TYPE(py::isinstance<py::int_>(dim) && !py::isinstance<py::bool_>(dim), op,
                     ": the vmap rule's out_dims holds a ", type_name(dim),
                     ", expected an int or None per output");
    int overflow = 0;  // pybind11's cast said only "Unable to cast" (sweep 48 B-Y1)
    const long long value = PyLong_AsLongLongAndOverflow(dim.ptr(), &overflow);
    TORCH_CHECK_VALUE(overflow == 0, op,
                      ": the vmap rule's out_dims holds an int past 64 bits, expected a dim of "
                      "its output (an int) or None per output");
    converted.out_dims.emplace_back(static_cast<int64_t>(value));
  }
  return converted;
}

void add_vmap_rule(OpBuilder& builder, PyRef rule, SchemaPtr schema) {
  if (!rule) return;
  // What errors' notes call it: a vmap_fn's rule is the vmap_fn the user wrote (sweep 45 A-F3).
  const py::object named = py::getattr(*rule, "opreg_piece", py::none());
  std::string piece = named.is_none() ? "the vmap rule" : py::cast<std::string>(named);
  builder.vmap([rule, schema, op = builder.declared_name(), piece = std::move(piece)](
                   const VmapInfo& info, const std::vector<std::optional<int64_t>>& in_dims,
                   const std::vector<c10::IValue>& args) {
    check_python_can_run(op, "its vmap rule");
    py::gil_scoped_acquire gil;
    InsideOp inside;
    static const char* kRandomness[] = {"error", "same", "different"};
    py::list dims;
    for (const auto& dim : in_dims) dims.append(dim ? py::cast(*dim) : py::none());
    return vmap_result(op,
                       noted(
                           op, [&piece] { return piece; },
                           [&] {
                             return (*rule)(info.batch_size,
                                            kRandomness[static_cast<int>(info.randomness)], dims,
                                            to_python(args, false, schema));
                           }),
                       schema);
  });
}

}  // namespace

namespace {
thread_local bool front_drops_compiled_code = false;
}  // namespace

FrontDropsCompiledCode::FrontDropsCompiledCode() : outer_(front_drops_compiled_code) {
  front_drops_compiled_code = true;
}
FrontDropsCompiledCode::~FrontDropsCompiledCode() { front_drops_compiled_code = outer_; }

bool wait_for_backward_errors(double seconds) {
  TORCH_CHECK_VALUE(seconds >= 0, "opreg: wait_for_backward_errors: seconds must be >= 0, got ",
                    seconds);
  constexpr double kDay = 86400;  // longer waits are a day: a millisecond count must not overflow
  const auto limit =
      std::chrono::milliseconds(static_cast<int64_t>(std::min(seconds, kDay) * 1000));
  py::gil_scoped_release release;
  return BackwardError::wait_until_none(limit);
}

// Python pieces are called later, in a call or a backward: refuse what cannot be called now.
void require_callable(const OpBuilder& builder, const std::string& what, const py::object& fn) {
  TORCH_CHECK_TYPE(PyCallable_Check(fn.ptr()) != 0, "opreg: op '", builder.declared_name(),
                   "': ", what, " must be callable, got ",
                   py::str(fn.get_type()).cast<std::string>());
}

void bind_op_builder(py::module& m) {
  py::class_<ContextLink, std::shared_ptr<ContextLink>>(m, "AutogradContext")
      .def("save_for_backward",
           [](ContextLink& link, const std::vector<std::optional<at::Tensor>>& values) {
             std::vector<at::Tensor> tensors;  // None: an undefined tensor, given back as None
             for (const auto& value : values) tensors.push_back(value.value_or(at::Tensor()));
             link.with([&](AutogradContext& ctx) { ctx.save_for_backward(std::move(tensors)); });
           })
      .def_property_readonly(
          "saved_tensors",
          [](ContextLink& link) {
            return link.with([](AutogradContext& ctx) { return ctx.saved_tensors(); });
          })
      .def("mark_non_differentiable",
           [](ContextLink& link, const std::vector<at::Tensor>& tensors) {
             link.with([&](AutogradContext& ctx) { ctx.mark_non_differentiable(tensors); });
           })
      .def("set_materialize_grads",
           [](ContextLink& link, bool materialize) {
             link.with([&](AutogradContext& ctx) { ctx.set_materialize_grads(materialize); });
           })
      .def("needs_input_grad",
           [](ContextLink& link, size_t index) {
             return link.with([&](AutogradContext& ctx) { return ctx.needs_input_grad(index); });
           })
      .def_property_readonly("num_inputs", [](ContextLink& link) {
        return link.with([](AutogradContext& ctx) { return ctx.num_inputs(); });
      });
  py::class_<KernelFactory>(m, "KernelFactory",
                            "A kernel made when the op is defined (e.g. _C.triton_aot(launch))");
  m.def(
      "triton_aot", [](AotLaunch launch) { return triton::aot(std::move(launch)); },
      py::arg("launch"));
  m.def("op_flags", &op_flag_names);
  // A Python fake's output with no tensor in its type, converted as the fallback's would be:
  // under FakeTensorMode, torch's own conversion of a wrong value names neither op nor output.
  m.def(
      "check_fake_output",
      [](const std::string& op, const py::handle& value, const std::string& schema, size_t index) {
        const auto parsed = torch::jit::parseSchema(schema);
        const auto& returned = parsed.returns().at(index);
        if (detail::holds_kind(*returned.type(), c10::TypeKind::TensorType)) return;
        TORCH_CHECK_TYPE(!THPVariable_Check(value.ptr()), op,
                         ": its fake returned a Tensor for output ", index, ", expected ",
                         detail::written_type(returned), ": a fake tensor holds no value to give");
        to_output(op, "its fake", value, returned, index);
      },
      py::arg("op"), py::arg("value"), py::arg("schema"), py::arg("index"));
  py::class_<OpBuilder>(m, "OpBuilder")
      .def(py::init(&detail::PythonFront::declared_in_python), py::arg("schema"))
      .def("declared_name", &OpBuilder::declared_name)
      .def(
          "fallback",
          [](OpBuilder& builder, const py::object& fn, const std::string& label,
             std::string words) {
            require_callable(builder, "the fallback", fn);
            builder.fallback(python_kernel(fn, py::none(), py::none(), label));
            if (!words.empty()) detail::PythonFront::fallback_words(builder, std::move(words));
          },
          py::arg("fn"), py::arg("label") = "", py::arg("words") = "")
      .def(
          "python_fake",
          [](OpBuilder& builder, std::string module, const py::object& meta) {
            require_callable(builder, "the fake", meta);
            detail::PythonFront::python_fake(builder, std::move(module),
                                             python_kernel(meta, py::none(), py::none(), ""));
          },
          py::arg("module"), py::arg("meta"))
      .def(
          "kernel",
          [](OpBuilder& builder, KernelFactory factory, std::string name,
             std::optional<std::vector<std::string>> devices) {
            builder.kernel(std::move(factory), std::move(name), std::move(devices));
          },
          py::arg("factory"), py::arg("name"), py::arg("devices"))
      .def(
          "kernel",
          [](OpBuilder& builder, const py::object& fn, std::string name,
             std::optional<std::vector<std::string>> devices, const py::object& accepts,
             const py::object& fallback) {
            require_callable(builder, "kernel '" + name + "'", fn);
            if (!accepts.is_none()) {
              require_callable(builder, "the accepts of kernel '" + name + "'", accepts);
              require_callable(builder, "the fallback of kernel '" + name + "' (it declines)",
                               fallback);
            }
            builder.kernel(python_kernel(fn, accepts, fallback, ""), std::move(name),
                           std::move(devices));
          },
          py::arg("fn"), py::arg("name"), py::arg("devices"), py::arg("accepts"),
          py::arg("fallback"))
      .def(
          "dtypes",
          [](OpBuilder& builder, std::string argument, std::vector<c10::ScalarType> allowed) {
            builder.dtypes(std::move(argument), std::move(allowed));
          },
          py::arg("argument"), py::arg("allowed"))
      .def(
          "flag",
          [](OpBuilder& builder, const std::string& name, bool on) { builder.flag(name, on); },
          py::arg("name"), py::arg("on"))
      .def(
          "sharding", [](OpBuilder& builder, Sharding sharding) { builder.sharding(sharding); },
          py::arg("sharding"))
      .def(
          "backward",
          [](OpBuilder& builder, const py::object& backward, const py::object& setup_context,
             const py::object& make_context, const std::string& schema) {
            require_callable(builder, "backward", backward);
            require_callable(builder, "make_context", make_context);
            add_autograd(builder, ref(backward), ref(setup_context), ref(make_context),
                         parse_for_arguments(schema));
          },
          py::arg("backward"), py::arg("setup_context"), py::arg("make_context"),
          py::arg("schema") = "")
      .def(
          "autograd",
          [](OpBuilder& builder, const std::string& policy) {
            builder.autograd(parse_policy(policy));
          },
          py::arg("policy"))
      .def(
          "vmap",
          [](OpBuilder& builder, const py::object& rule, const std::string& schema) {
            add_vmap_rule(builder, ref(rule), parse_for_arguments(schema));
          },
          py::arg("rule"), py::arg("schema") = "")
      .def(
          "replace", [](OpBuilder& builder, bool replace) { builder.replace(replace); },
          py::arg("replace"))
      .def(
          "replace_only", [](OpBuilder& builder, uint64_t serial) { builder.replace_only(serial); },
          py::arg("serial"))
      .def(
          "origin", [](OpBuilder& builder, std::string where) { builder.origin(std::move(where)); },
          py::arg("origin"))
      .def(
          "part_of",
          [](OpBuilder& builder, std::string owner) { builder.part_of(std::move(owner)); },
          py::arg("owner"));
  // All or none; each builder is used up (its Python object can no longer be defined). Puts
  // {name: serial} of the definitions published in `published`, the caller's dict, before it
  // returns: a KeyboardInterrupt raised on the way back still finds what was published (a
  // returned dict was lost with it). Read afterwards, a serial could be that of a definition made
  // meanwhile (a C++ thread's replace, a definition nested in this one's records).
  m.def(
      "define_all",
      [](const std::vector<OpBuilder*>& builders, py::dict published) {
        std::vector<OpBuilder> owned;
        for (auto* builder : builders) {
          TORCH_CHECK_TYPE(builder != nullptr, "opreg: define_all takes OpBuilders, got None");
        }
        for (auto* builder : builders) owned.push_back(std::move(*builder));
        const FrontDropsCompiledCode front;
        for (auto& definition : detail::define_all_published(std::move(owned), AbiTag{})) {
          published[py::str(definition.name)] = py::int_(definition.serial);
        }
      },
      py::arg("builders"), py::arg("published"));
  // For the Python front's own bookkeeping (a vmap_fn companion its op no longer uses).
  m.def("undefine", &opreg::undefine, py::arg("name"));
  m.def("is_defined", &opreg::is_defined, py::arg("name"));
  // A replace made from C++ (a thread, an extension) passes no Python front, which would drop
  // torch.compile's code compiled before it: Python's main thread asks for it at its next chance,
  // without waiting for the GIL here (this thread may hold locks a GIL holder waits for). Replaces
  // that come one after another share one drop.
  detail::set_replace_listener([] {
    static std::atomic<bool> scheduled{false};
    if (front_drops_compiled_code || !Py_IsInitialized() || interpreter_finalizing() ||
        scheduled.exchange(true)) {
      return;
    }
    const int added = Py_AddPendingCall(
        [](void*) -> int {
          scheduled = false;
          PyObject* registry = PyImport_ImportModule("opreg._registry");
          PyObject* result =
              registry != nullptr
                  ? PyObject_CallMethod(registry, "forget_compiled_code_later", nullptr)
                  : nullptr;
          if (result == nullptr) PyErr_WriteUnraisable(nullptr);  // it never raises; not here
          Py_XDECREF(result);
          Py_XDECREF(registry);
          return 0;
        },
        nullptr);
    if (added != 0) scheduled = false;  // the queue is full: the next replace tries again
  });
  // See Note [A schema change and Python's callers] in src/core/registry.cpp.
  detail::set_schema_change_lock([]() -> std::shared_ptr<void> {
    if (!Py_IsInitialized() || interpreter_finalizing() || PyGILState_Check()) return nullptr;
    return hold_gil_by_proxy(std::chrono::seconds(1));
  });
  detail::set_schema_change_lock_needed(
      [] { return Py_IsInitialized() && !interpreter_finalizing() && PyGILState_Check() == 0; });
}

}  // namespace opreg::python
