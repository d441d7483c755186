// src/python/module.cpp: the extension module opreg._C, which exposes the C++ core's registry,
// device types, trace, the AOT Triton launcher and Python-defined ops to the Python package.
#include <algorithm>
#include <cstring>
#include <optional>
#include <typeinfo>

#include <torch/csrc/Exceptions.h>
#include <torch/csrc/autograd/python_variable.h>
#include <torch/csrc/jit/python/pybind_utils.h>
#include <torch/csrc/utils/pybind.h>

#include "jit_cache/jit_cache.h"
#include "opreg/opreg.h"
#include "opreg/triton.h"
#include "opreg/vmap.h"
#include "python_op.h"

namespace py = pybind11;

namespace {

// One Python `opreg.trace()` block: an open TraceScope until close(), then its records, frozen.
class TraceBlock {
 public:
  TraceBlock() { scope_.emplace(); }
  std::vector<opreg::TraceRecord> records() const { return scope_ ? scope_->records() : frozen_; }
  void close() {
    if (!scope_) return;
    frozen_ = scope_->records();
    scope_.reset();
  }

 private:
  std::optional<opreg::TraceScope> scope_;
  std::vector<opreg::TraceRecord> frozen_;
};

std::string type_name(const py::handle& value) {
  return py::str(py::type::handle_of(value).attr("__name__")).cast<std::string>();
}

// Python arguments of a kernel launch (opreg.AotKernel); keeps the tensors alive while the Args
// point at them.
struct LaunchArgs {
  std::vector<at::Tensor> tensors;
  std::vector<opreg::triton::Arg> args;

  LaunchArgs(const opreg::triton::Kernel& kernel, const py::args& values) {
    tensors.reserve(values.size());
    args.reserve(values.size());
    for (const auto& value : values) {
      if (THPVariable_Check(value.ptr())) {
        tensors.push_back(THPVariable_Unpack(value.ptr()));
        args.emplace_back(tensors.back());
      } else if (py::isinstance<py::bool_>(value) || py::isinstance<py::int_>(value)) {
        add_integer(kernel, value);
      } else if (py::isinstance<py::float_>(value)) {
        args.emplace_back(value.cast<double>());
      } else {
        TORCH_CHECK_TYPE(false, "opreg.AotKernel '", kernel.name(), "': ", described(kernel),
                         " is a ", type_name(value), "; expected a tensor, an int or a float");
      }
    }
  }

 private:
  // An int beyond 64 bits converts for a float parameter, as Triton's launcher converts it; for
  // any other it is refused with the parameter's type.
  void add_integer(const opreg::triton::Kernel& kernel, const py::handle& value) {
    int overflow = 0;
    const long long integer = PyLong_AsLongLongAndOverflow(value.ptr(), &overflow);
    if (overflow == 0) {
      args.emplace_back(static_cast<int64_t>(integer));
      return;
    }
    const auto params = kernel.parameters();
    const auto type = params && args.size() < params->size() ? (*params)[args.size()].type : "";
    if (type == "fp16" || type == "bf16" || type == "fp32" || type == "fp64") {
      args.emplace_back(PyLong_AsDouble(value.ptr()));
      return;
    }
    TORCH_CHECK_VALUE(false, "opreg.AotKernel '", kernel.name(), "': ", described(kernel), " = ",
                      py::str(value).cast<std::string>(), " does not fit ",
                      type.empty() ? "64 bits" : type,
                      " (an integer parameter is at most 64 bits: -2^63 to 2^63 - 1)");
  }

  // "argument 'n' (i64)" for the next argument, or "argument 3" when the kernel is not loaded.
  std::string described(const opreg::triton::Kernel& kernel) const {
    const auto params = kernel.parameters();
    if (!params || args.size() >= params->size()) return "argument " + std::to_string(args.size());
    const auto& param = (*params)[args.size()];
    return "argument '" + param.name + "' (" + param.type + ")";
  }
};

// A launch grid: an int or a tuple or list of 1 to 3 ints (or objects with __index__), each
// within 64 bits (the launcher checks CUDA's limits).
opreg::triton::Grid grid_of(const opreg::triton::Kernel& kernel, const py::handle& grid) {
  const bool sequence = py::isinstance<py::tuple>(grid) || py::isinstance<py::list>(grid);
  const auto dims =
      sequence ? py::reinterpret_borrow<py::sequence>(grid) : py::sequence(py::make_tuple(grid));
  TORCH_CHECK_VALUE(!dims.empty() && dims.size() <= 3, "opreg.AotKernel '", kernel.name(),
                    "': the grid has 1 to 3 dimensions, got ", dims.size());
  std::vector<int64_t> sizes;
  for (const auto& dim : dims) {
    TORCH_CHECK_TYPE(PyIndex_Check(dim.ptr()) && !py::isinstance<py::bool_>(dim),
                     "opreg.AotKernel '", kernel.name(),
                     "': the grid must be an int or a tuple of 1 to 3 ints, got ",
                     py::repr(grid).cast<std::string>());
    int overflow = 0;
    const auto index = py::reinterpret_steal<py::object>(PyNumber_Index(dim.ptr()));
    if (!index) throw py::error_already_set();
    sizes.push_back(PyLong_AsLongLongAndOverflow(index.ptr(), &overflow));
    TORCH_CHECK_VALUE(overflow == 0, "opreg.AotKernel '", kernel.name(), "': grid ",
                      py::repr(grid).cast<std::string>(),
                      " is outside CUDA's limits (x < 2^31, y and z < 65536)");
  }
  sizes.resize(3, 1);
  return opreg::triton::Grid(sizes[0], sizes[1], sizes[2]);
}

// pybind11's error_already_set: its own type, or one of another module's copy of pybind11
// (torch's).
bool is_python_error(const std::exception& error) noexcept {
  return dynamic_cast<const py::error_already_set*>(&error) != nullptr ||
         std::strcmp(typeid(error).name(), typeid(py::error_already_set).name()) == 0;
}

std::string python_error_message(const std::exception& error) {
  const auto* python = dynamic_cast<const py::error_already_set*>(&error);
  if (python == nullptr || !python->value()) return "a Python exception";
  py::gil_scoped_acquire gil;
  PyObject *type = nullptr, *value = nullptr, *trace = nullptr;
  PyErr_Fetch(&type, &value, &trace);  // one in flight stays as it was
  PyObject* raised = python->value().ptr();
  std::string message = Py_TYPE(raised)->tp_name;
  message += ": ";
  if (PyObject* text = PyObject_Str(raised)) {
    Py_ssize_t size = 0;
    const char* utf8 = PyUnicode_AsUTF8AndSize(text, &size);
    message += utf8 != nullptr ? std::string(utf8, size) : "<str() gave no UTF-8>";
    Py_DECREF(text);
  } else {
    message += "<str() failed>";
  }
  PyErr_Clear();
  PyErr_Restore(type, value, trace);
  return message;
}

// A field of opreg.AotLaunch that is one str; a TypeError naming the field otherwise.
std::string aot_launch_text(const py::handle& value, const char* field, const char* expected) {
  TORCH_CHECK_TYPE(py::isinstance<py::str>(value), "opreg.AotLaunch: '", field, "' must be ",
                   expected, ", got ", type_name(value), " ", py::repr(value).cast<std::string>());
  return value.cast<std::string>();
}

// A field of opreg.AotLaunch that is a tuple or list of str expressions.
std::vector<std::string> aot_launch_texts(const py::handle& value, const char* field) {
  const bool sequence = py::isinstance<py::tuple>(value) || py::isinstance<py::list>(value);
  bool all_text = sequence;
  for (size_t i = 0; all_text && i < py::len(value); ++i) {
    all_text = py::isinstance<py::str>(value[py::int_(i)]);
  }
  TORCH_CHECK_TYPE(all_text, "opreg.AotLaunch: '", field,
                   "' must be a tuple of str expressions over the op's arguments, got ",
                   type_name(value), " ", py::repr(value).cast<std::string>());
  return value.cast<std::vector<std::string>>();
}

// A Python lock (or none) held for a with block, taken with a timeout, and Python's thread
// switching held off while it is held if asked: for kAloneS, much longer than any block holding
// it takes, but not for good, since the block may let the GIL go and another thread take it
// until then (seen: the CI run of 99b9739 stalled when a thread spinning in Python took the GIL
// from one renewing torch.ops' packets, whose lookup let it go). Entering and leaving are calls
// into C++, so no trace hook's line event and no signal handler's exception comes between taking
// the lock and the block's cleanup (Note [Locks and trace hooks] in python/opreg/_tracing.py): left
// held, Dynamo's compile lock would make every later compile wait for good.
class HeldLock {
 public:
  HeldLock(py::object lock, double timeout_s, bool alone)
      : lock_(std::move(lock)), timeout_s_(timeout_s), alone_(alone) {}

  bool enter() {
    // One with block each: a second enter would take the lock twice and release it once (sweep
    // 54 B-N27: left owned, and the switch interval left changed).
    TORCH_CHECK(!entered_, "opreg._C.HeldLock: entered while in use; make one for each with block");
    entered_ = true;
    if (!lock_.is_none()) {
      const py::object acquire = lock_.attr("acquire");
      held_ = (timeout_s_ > 0 ? acquire(true, timeout_s_) : acquire(false)).cast<bool>();
    }
    if ((held_ || lock_.is_none()) && alone_) {
      // The interval before the first of the blocks under way, on any thread: each saving its
      // own, two threads' blocks ending out of order left the process at kAloneS for good.
      // (Under the GIL, as every enter and exit.)
      const py::module_ sys = py::module_::import("sys");
      if (alone_blocks_ == 0) *interval_before_ = sys.attr("getswitchinterval")();
      ++alone_blocks_;
      alone_entered_ = true;
      sys.attr("setswitchinterval")(kAloneS);
    }
    return held_;
  }

  void exit(const py::args&) {
    entered_ = false;
    const bool alone = alone_entered_;
    if (alone) {
      alone_entered_ = false;
      if (--alone_blocks_ == 0) {
        py::module_::import("sys").attr("setswitchinterval")(*interval_before_);
      }
    }
    if (held_) {
      held_ = false;
      lock_.attr("release")();
    }
    // A thread that asked for the GIL meanwhile waits out the interval it read unless the GIL is
    // let go (seen with a million seconds: a main thread blocked in Thread.start for half an hour
    // under ASan while another replaced ops in a loop).
    if (alone) py::module_::import("time").attr("sleep")(0);
  }

 private:
  static constexpr double kAloneS = 2.0;
  py::object lock_;
  double timeout_s_;
  bool alone_;
  bool held_ = false;
  bool entered_ = false;
  bool alone_entered_ = false;
  inline static int alone_blocks_ = 0;
  inline static py::object* interval_before_ = new py::object();  // immortal: see kReserved
};
}  // namespace

PYBIND11_MODULE(_C, m) {
  m.doc() = "opreg's C++ core (private: use the opreg package)";
  m.attr("version") = OPREG_VERSION_STRING;

  py::class_<opreg::OpFlags>(m, "OpFlags").def("as_dict", [](const opreg::OpFlags& flags) {
    py::dict values;
#define OPREG_FLAG_ITEM(flag, promise) values[#flag] = flags.flag;
    OPREG_OP_FLAGS(OPREG_FLAG_ITEM)
#undef OPREG_FLAG_ITEM
    return values;
  });
  py::class_<opreg::DeviceServing> serving(m, "DeviceServing");
  py::enum_<opreg::DeviceServing::Kind>(serving, "Kind")
      .value("KERNEL", opreg::DeviceServing::Kind::kKernel)
      .value("SKIPPED", opreg::DeviceServing::Kind::kSkipped);
  serving.def_readonly("device_type", &opreg::DeviceServing::device_type)
      .def_readonly("kind", &opreg::DeviceServing::kind)
      .def_readonly("kernel", &opreg::DeviceServing::kernel)
      .def_readonly("reason", &opreg::DeviceServing::reason)
      .def("describe", [](const opreg::DeviceServing& s) { return opreg::describe(s); });
  py::enum_<opreg::FakeSource>(m, "FakeSource")
      .value("EXPLICIT", opreg::FakeSource::kExplicit)
      .value("PYTHON", opreg::FakeSource::kPython)
      .value("FALLBACK_ON_META", opreg::FakeSource::kFallbackOnMeta);
  py::enum_<opreg::AutogradSupport>(m, "AutogradSupport")
      .value("BACKWARD", opreg::AutogradSupport::kBackward)
      .value("FALLBACK", opreg::AutogradSupport::kFallback)
      .value("ERROR", opreg::AutogradSupport::kError)
      .value("NONE", opreg::AutogradSupport::kNone);
  py::enum_<opreg::VmapSupport>(m, "VmapSupport")
      .value("RULE", opreg::VmapSupport::kRule)
      .value("BATCH_POLYMORPHIC", opreg::VmapSupport::kBatchPolymorphic)
      .value("FALLBACK", opreg::VmapSupport::kFallback)
      .value("PER_EXAMPLE_LOOP", opreg::VmapSupport::kPerExampleLoop);
  py::enum_<opreg::Sharding>(m, "Sharding")
      .value("NONE", opreg::Sharding::kNone)
      .value("REPLICATE", opreg::Sharding::kReplicate)
      .value("POINTWISE", opreg::Sharding::kPointwise)
      .value("PYTHON", opreg::Sharding::kPython);
  m.def("describe_fake", py::overload_cast<opreg::FakeSource>(&opreg::describe));
  m.def("describe_autograd", py::overload_cast<opreg::AutogradSupport>(&opreg::describe));
  m.def("describe_vmap", py::overload_cast<opreg::VmapSupport>(&opreg::describe));
  m.def("describe_sharding", py::overload_cast<opreg::Sharding>(&opreg::describe));
  py::class_<opreg::OpReport>(m, "OpReport")
      .def_readonly("name", &opreg::OpReport::name)
      .def_readonly("schema", &opreg::OpReport::schema)
      .def_readonly("origin", &opreg::OpReport::origin)
      .def_readonly("kernels", &opreg::OpReport::kernels)
      .def_readonly("fake", &opreg::OpReport::fake)
      .def_readonly("autograd", &opreg::OpReport::autograd)
      .def_readonly("vmap", &opreg::OpReport::vmap)
      .def_readonly("flags", &opreg::OpReport::flags)
      .def_readonly("sharding", &opreg::OpReport::sharding)
      .def_readonly("dtypes", &opreg::OpReport::dtypes)
      .def("describe", [](const opreg::OpReport& r) { return opreg::describe(r); });
  m.def("describe_ops", &opreg::describe_ops);
  m.def("describe_op", &opreg::describe_op, py::arg("name"));
  m.def("definition_serial", &opreg::detail::definition_serial, py::arg("name"));
  m.def("defined_before", &opreg::detail::defined_before, py::arg("name"));
  m.def(
      "gradients_below",
      [](const std::vector<at::Tensor>& tensors) {
        const auto found = opreg::detail::gradients_below({tensors.begin(), tensors.end()});
        return std::make_pair(found.reverse, found.forward);
      },
      py::arg("tensors"));
  // Without the GIL: a thread that the library's initializers start and wait for may define (or
  // replace) ops from Python pieces, which takes the GIL.
  m.def(
      "load_library",
      [](const std::string& path) {
        const opreg::python::FrontDropsCompiledCode
            front;  // opreg.load_library drops it after the load
        opreg::load_library(path);
      },
      py::arg("path"), py::call_guard<py::gil_scoped_release>());
  m.def(
      "library_file",
      [](const std::string& path) { return py::bytes(opreg::detail::library_file(path)); },
      py::arg("path"));
  // How many values an enumeration the schema language names has (the range of such an output).
  m.def("enum_value_count", [](const std::string& name) -> int64_t {
    if (name == "ScalarType") return static_cast<int64_t>(c10::ScalarType::NumOptions);
    if (name == "Layout") return static_cast<int64_t>(c10::Layout::NumOptions);
    if (name == "MemoryFormat") return static_cast<int64_t>(c10::MemoryFormat::NumOptions);
    TORCH_CHECK_VALUE(false, "opreg: '", name, "' is no enumeration of the schema language");
  });

  m.def("accelerated_device_types", &opreg::accelerated_device_types);
  m.def("register_accelerated_device_type", &opreg::register_accelerated_device_type,
        py::arg("name"));

  // Triton AOT kernels, launched through the C++ launcher.
  py::class_<opreg::triton::Kernel>(m, "TritonKernel")
      .def(py::init<std::string>(), py::arg("name"))
      .def_property_readonly("name", &opreg::triton::Kernel::name)
      .def("available_on",
           [](const opreg::triton::Kernel& kernel, int device) {
             std::string why;
             bool ok = kernel.available_on(device, &why);
             return py::make_tuple(ok, why);
           })
      .def("variant_for",
           [](const opreg::triton::Kernel& kernel, const py::args& args) {
             LaunchArgs launch_args(kernel, args);
             return kernel.variant_for(launch_args.args);
           })
      .def("launch",
           [](const opreg::triton::Kernel& kernel, const py::handle& grid, const py::args& args) {
             const auto dims = grid_of(kernel, grid);
             LaunchArgs launch_args(kernel, args);
             kernel.launch(dims, launch_args.args);
           });
  m.def("triton_load_bundle_dir", &opreg::triton::load_bundle_dir, py::arg("path"));
  m.def("triton_driver_available", [] {
    std::string why;
    bool ok = opreg::triton::driver_available(&why);
    return py::make_tuple(ok, why);
  });
  m.def("triton_describe_kernels", [] {
    py::list kernels;
    for (const auto& k : opreg::triton::describe_kernels()) {
      py::list variants;
      for (const auto& v : k.variants) {
        variants.append(py::dict(py::arg("arch") = v.arch, py::arg("assumptions") = v.assumptions,
                                 py::arg("config") = v.config, py::arg("shared") = v.shared));
      }
      kernels.append(py::dict(py::arg("name") = k.name, py::arg("source") = k.source,
                              py::arg("params") = k.params, py::arg("variants") = variants));
    }
    return kernels;
  });

  // Ops defined from Python, through the same core.
  py::class_<opreg::AotLaunch>(m, "AotLaunch")
      .def(py::init([](const py::handle& kernel, const py::handle& grid,
                       const py::handle& arguments, const py::handle& outputs) {
             return opreg::AotLaunch{
                 aot_launch_text(kernel, "kernel", "a str, the name of an AOT Triton kernel"),
                 aot_launch_texts(grid, "grid"), aot_launch_texts(arguments, "arguments"),
                 aot_launch_text(outputs, "outputs", "'fake' or 'like:<argument>'")};
           }),
           py::arg("kernel"), py::arg("grid"), py::arg("arguments"), py::arg("outputs") = "fake")
      .def_readonly("kernel", &opreg::AotLaunch::kernel)
      .def_readonly("grid", &opreg::AotLaunch::grid)
      .def_readonly("arguments", &opreg::AotLaunch::arguments)
      .def_readonly("outputs", &opreg::AotLaunch::outputs)
      .def("__repr__", [](const opreg::AotLaunch& launch) {
        return "AotLaunch(kernel='" + launch.kernel + "', outputs='" + launch.outputs + "')";
      });
  opreg::python::bind_op_builder(m);
  opreg::python::bind_jit_cache(m);

  opreg::detail::set_python_error_reader({&is_python_error, &python_error_message});
  // A Python error that crossed C++ (a backward's, through the engine) reaches Python as itself.
  py::register_local_exception_translator([](std::exception_ptr error) {
    try {
      if (error) std::rethrow_exception(error);
    } catch (::python_error& python_error) {
      if (python_error.type == nullptr) {
        // Not fetched: Python's error indicator still holds it (a dispatch mode's error raised
        // under a fallback that opreg.opcheck or a FakeTensorMode rule called), and what() is
        // empty.
        if (PyErr_Occurred() == nullptr) PyErr_SetString(PyExc_RuntimeError, python_error.what());
      } else {
        python_error.restore();
      }
    }
  });
  m.def("wait_for_backward_errors", &opreg::python::wait_for_backward_errors, py::arg("seconds"));
  // Before finalization begins, so that no thread is killed while freeing such an error.
  py::module_::import("atexit").attr("register")(m.attr("wait_for_backward_errors"), 5.0);

  // The fallback alone, bypassing kernels: for opreg.opcheck.
  m.def("call_fallback", [](const std::string& name, const py::list& args, const py::dict& kwargs) {
    const auto& schema = opreg::find_operator(name).schema();
    const auto& arguments = schema.arguments();
    TORCH_CHECK_TYPE(args.size() <= arguments.size(), name, ": ", args.size(),
                     " positional arguments given, the schema takes ", arguments.size());
    for (const auto& [key, value] : kwargs) {
      const auto keyword = py::str(key).cast<std::string>();
      TORCH_CHECK_TYPE(
          std::any_of(arguments.begin() + args.size(), arguments.end(),
                      [&](const auto& argument) { return argument.name() == keyword; }),
          name, ": unexpected keyword argument '", keyword, "'");
    }
    std::vector<c10::IValue> stack;
    auto convert = [&](const py::handle& value, const c10::Argument& argument) {
      try {
        // real_type: a SymInt stays symbolic (under FakeTensorMode a size is one).
        return torch::jit::toIValue(value, argument.real_type());
      } catch (const std::exception&) {
        TORCH_CHECK_TYPE(false, name, ": argument '", argument.name(), "' is a ",
                         py::str(value.get_type()).cast<std::string>(), ", expected ",
                         argument.real_type()->str());
      }
    };
    for (size_t i = 0; i < arguments.size(); ++i) {
      const auto& argument = arguments[i];
      if (i < args.size()) {
        stack.push_back(convert(args[i], argument));
      } else if (kwargs.contains(argument.name())) {
        stack.push_back(convert(kwargs[py::str(argument.name())], argument));
      } else {
        TORCH_CHECK_VALUE(argument.default_value().has_value(), name, ": argument '",
                          argument.name(), "' is missing");
        stack.push_back(*argument.default_value());
      }
    }
    std::vector<c10::IValue> outputs;
    {
      py::gil_scoped_release no_gil;
      outputs = opreg::testing::call_fallback(name, std::move(stack));
    }
    py::list result;
    for (auto& output : outputs) result.append(torch::jit::toPyObject(std::move(output)));
    return result;
  });

  py::class_<HeldLock>(m, "HeldLock")
      .def(py::init<py::object, double, bool>(), py::arg("lock"), py::arg("timeout_s"),
           py::arg("alone") = false)
      .def("__enter__", &HeldLock::enter)
      .def("__exit__", &HeldLock::exit);

  py::class_<TraceBlock>(m, "TraceScope")
      .def(py::init<>())
      .def("records",
           [](const TraceBlock& block) {
             py::list records;
             for (const auto& record : block.records()) {
               records.append(py::make_tuple(record.op, record.impl, record.device));
             }
             return records;
           })
      .def("close", &TraceBlock::close);
  // For pieces run by Python rather than by the core (a fake registered with torch).
  m.def("trace_enabled", &opreg::trace_enabled);
  m.def("record_trace", &opreg::detail::record_trace, py::arg("op"), py::arg("impl"),
        py::arg("device"));

  // kernel_vs_fallback's (atol, rtol) for a dtype: opreg.opcheck applies the C++ rule.
  m.def("testing_tolerance", [](at::ScalarType dtype) {
    const auto tolerance = opreg::testing::tolerance(dtype);
    return py::make_tuple(tolerance.atol, tolerance.rtol);
  });
}
