// src/python/jit_cache/jit_cache.cpp: the JIT launch cache, cached launches of Triton JIT kernels
// inside opreg ops (see python/opreg/_jit_cache.py). An adopted kernel's `run` is a LaunchCache's
// entry point: inside an op, a launch whose specialization key (launch_key.cpp) was seen before
// skips Triton's Python launch path and goes to the compiled kernel's launcher, or, for a plain
// CUDA kernel, from here to cuLaunchKernel with no Python in between (direct_launch.cpp).
// Everything else is handed to Triton's own `run`, unchanged.
#include "jit_cache.h"

#include <c10/core/impl/DeviceGuardImplInterface.h>
#include <c10/util/SmallVector.h>
#include <torch/csrc/Exceptions.h>

#include <array>
#include <optional>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include "direct_launch.h"
#include "launch_key.h"

namespace opreg::python {
namespace {
thread_local int inside_op_depth = 0;
}  // namespace

InsideOp::InsideOp() { ++inside_op_depth; }
InsideOp::~InsideOp() { --inside_op_depth; }
bool inside_op() { return inside_op_depth > 0; }

namespace py = pybind11;

std::string python_type_name(const py::handle& object) {
  auto type = py::type::handle_of(object);
  return py::str(type.attr("__module__")).cast<std::string>() + "." +
         py::str(type.attr("__qualname__")).cast<std::string>();
}

namespace {

// Names looked up on every launch, interned once.
PyObject* interned(const char* text) {
  PyObject* name = PyUnicode_InternFromString(text);
  if (name == nullptr) throw py::error_already_set();
  return name;  // kept for the life of the process
}

struct Names {
  PyObject* grid = interned("grid");
  PyObject* warmup = interned("warmup");
  PyObject* debug = interned("debug");
  PyObject* pre_run_hooks = interned("pre_run_hooks");
  PyObject* used_global_vals = interned("used_global_vals");
  PyObject* instrumentation_mode = interned("instrumentation_mode");
  PyObject* launch_enter_hook = interned("launch_enter_hook");
  PyObject* launch_exit_hook = interned("launch_exit_hook");
  PyObject* calls = interned("calls");
};

const Names& names() {
  static const Names* instance = new Names();
  return *instance;
}

py::object attribute(PyObject* object, PyObject* name) {
  PyObject* value = PyObject_GetAttr(object, name);
  if (value == nullptr) throw py::error_already_set();
  return py::reinterpret_steal<py::object>(value);
}

bool truthy(PyObject* object) {
  const int result = PyObject_IsTrue(object);
  if (result < 0) throw py::error_already_set();
  return result == 1;
}

// A parameter after the positional ones: given by keyword, or its default.
struct Fill {
  py::object name;
  py::object default_value;
};

// A compiled kernel and how launches that hit it reach it.
struct Entry {
  py::object compiled, launcher, function, packed_metadata;
  std::vector<Fill> fills;             // parameters after the positional ones
  std::optional<DirectLaunch> direct;  // absent: through Triton's compiled launcher
};

constexpr size_t kMaxEntries = 4096;

bool observed(PyObject* hook) {
  if (hook == Py_None) return false;
  PyObject* calls = PyObject_GetAttr(hook, names().calls);  // Triton's hook lists
  if (calls == nullptr) {
    PyErr_Clear();
    return true;
  }
  const bool any = truthy(calls);
  Py_DECREF(calls);
  return any;
}

// ---------------------------------------------------------------------------------------------

// The launches of one JIT kernel inside opreg ops: compiled kernels by key, and the counts that
// opreg.kernel_status reports.
class LaunchCache {
 public:
  // params: (name, default, is_constexpr) per kernel parameter, in order. direct_launch_off:
  // empty, or why cache hits must not launch from C++ (then they use Triton's compiled launcher).
  LaunchCache(py::object kernel, py::object triton_run, const py::list& params,
              py::object runtime_knobs, py::object compilation_knobs, std::string direct_launch_off)
      : kernel_(std::move(kernel)),
        triton_run_(std::move(triton_run)),
        runtime_knobs_(std::move(runtime_knobs)),
        compilation_knobs_(std::move(compilation_knobs)),
        direct_launch_off_(std::move(direct_launch_off)) {
    for (const auto& param : params) {
      auto fields = param.cast<py::tuple>();
      param_names_.push_back(fields[0].cast<py::str>());
      defaults_.push_back(fields[1]);
      const bool is_constexpr = fields[2].cast<bool>();
      constexpr_params_.push_back(is_constexpr);
      constexpr_by_name_[fields[0]] = py::bool_(is_constexpr);
    }
  }

  // Where the device and stream come from: Python callables (tests), or PyTorch's current CUDA
  // device and stream (what Triton's CUDA and HIP drivers read as well).
  void bind_driver(py::object current_device, py::object current_stream) {
    current_device_ = std::move(current_device);
    current_stream_ = std::move(current_stream);
    bound_ = true;
  }

  // The kernel's `run`: Triton's signature (*args, grid, warmup, **kwargs).
  py::object run(PyObject* args, PyObject* kwargs) {
    const auto& n = names();
    PyObject* grid = kwargs != nullptr ? PyDict_GetItemWithError(kwargs, n.grid) : nullptr;
    PyObject* warmup = kwargs != nullptr ? PyDict_GetItemWithError(kwargs, n.warmup) : nullptr;
    if (PyErr_Occurred()) throw py::error_already_set();
    if (!inside_op() || grid == nullptr || warmup == nullptr || truthy(warmup)) {
      return call_triton(args, kwargs);
    }
    if (const char* why = declined()) {
      count(why);
      return call_triton(args, kwargs);
    }
    if (!bound_) bind_default_driver();
    LaunchKeyContext context{current_device(), &constexpr_params_, constexpr_by_name_.ptr(), false,
                             nullptr};
    context.debug = truthy(attribute(kernel_.ptr(), n.debug).ptr()) ||
                    truthy(attribute(runtime_knobs_.ptr(), n.debug).ptr());
    const py::object mode = attribute(compilation_knobs_.ptr(), n.instrumentation_mode);
    context.instrumentation_mode = mode.ptr();
    std::string key;
    key.reserve(64);
    if (!launch_key(context, args, kwargs, &key)) {
      count("arguments outside the key");
      return call_triton(args, kwargs);
    }
    auto found = entries_.find(key);
    if (found == entries_.end()) {
      count("first launch of a specialization");
      py::object compiled = call_triton(args, kwargs);
      if (entries_.size() < kMaxEntries && py::hasattr(compiled, "function")) {
        store(std::move(key), compiled, PyTuple_GET_SIZE(args));
      }
      return compiled;
    }
    launch(found->second, context.device, grid, args, kwargs);
    ++hits_;
    return found->second.compiled;
  }

  int64_t hits() const { return hits_; }
  int64_t direct_hits() const { return direct_hits_; }
  size_t size() const { return entries_.size(); }
  // Why compiled kernels are not launched from C++ (one line per reason), for kernel_status.
  std::vector<std::string> indirect_reasons() const { return indirect_reasons_; }
  std::vector<std::pair<std::string, int64_t>> through_triton() const { return through_triton_; }

  py::object key_of(PyObject* args, PyObject* kwargs, int64_t device, bool debug,
                    const py::str& instrumentation_mode) const {
    LaunchKeyContext context{device, &constexpr_params_, constexpr_by_name_.ptr(), debug,
                             instrumentation_mode.ptr()};
    std::string key;
    if (!launch_key(context, args, kwargs, &key)) return py::none();
    return py::bytes(key);
  }

 private:
  py::object call_triton(PyObject* args, PyObject* kwargs) {
    PyObject* result = PyObject_Call(triton_run_.ptr(), args, kwargs);
    if (result == nullptr) throw py::error_already_set();
    return py::reinterpret_steal<py::object>(result);
  }

  void count(const std::string& why) {
    for (auto& [reason, times] : through_triton_) {
      if (reason == why) {
        ++times;
        return;
      }
    }
    through_triton_.emplace_back(why, 1);
  }

  // Why this launch must go through Triton's own path (nullptr when it need not).
  const char* declined() const {
    const auto& n = names();
    if (truthy(attribute(kernel_.ptr(), n.pre_run_hooks).ptr())) return "pre-run hooks";
    PyObject* used = PyObject_GetAttr(kernel_.ptr(), n.used_global_vals);
    if (used == nullptr) {
      PyErr_Clear();
      return nullptr;
    }
    auto owned = py::reinterpret_steal<py::object>(used);
    if (!PyDict_Check(used)) return nullptr;
    Py_ssize_t position = 0;
    PyObject *key, *value;
    while (PyDict_Next(used, &position, &key, &value)) {
      // Triton's layout: (name, id) -> (value when compiled, the globals it came from)
      if (!PyTuple_Check(key) || PyTuple_GET_SIZE(key) < 1 || !PyTuple_Check(value) ||
          PyTuple_GET_SIZE(value) < 2 || !PyDict_Check(PyTuple_GET_ITEM(value, 1))) {
        return "a global the kernel read has changed";
      }
      PyObject* now = PyDict_GetItemWithError(PyTuple_GET_ITEM(value, 1), PyTuple_GET_ITEM(key, 0));
      if (now == nullptr) {
        if (PyErr_Occurred()) throw py::error_already_set();
        return "a global the kernel read has changed";
      }
      const int changed = PyObject_RichCompareBool(now, PyTuple_GET_ITEM(value, 0), Py_NE);
      if (changed < 0) throw py::error_already_set();
      if (changed == 1) return "a global the kernel read has changed";
    }
    return nullptr;
  }

  void bind_default_driver() {
    py::object active = py::module_::import("triton.runtime.driver").attr("driver").attr("active");
    const std::string driver = python_type_name(active);
    torch_cuda_ = (driver.find("CudaDriver") != std::string::npos ||
                   driver.find("HIPDriver") != std::string::npos) &&
                  c10::impl::hasDeviceGuardImpl(c10::DeviceType::CUDA);
    cuda_driver_ = driver.find("CudaDriver") != std::string::npos;
    if (!torch_cuda_) {
      bind_driver(active.attr("get_current_device"), active.attr("get_current_stream"));
    }
    bound_ = true;
  }

  int64_t current_device() const {
    if (!torch_cuda_) return current_device_().cast<int64_t>();
    return c10::impl::getDeviceGuardImpl(c10::DeviceType::CUDA)->getDevice().index();
  }

  uint64_t current_stream(int64_t device) const {
    if (!torch_cuda_) return current_stream_(device).cast<uint64_t>();
    const c10::Device cuda_device(c10::DeviceType::CUDA, static_cast<c10::DeviceIndex>(device));
    return reinterpret_cast<uint64_t>(c10::impl::getDeviceGuardImpl(c10::DeviceType::CUDA)
                                          ->getStream(cuda_device)
                                          .native_handle());
  }

  void store(std::string key, const py::object& compiled, Py_ssize_t num_args) {
    Entry entry;
    entry.compiled = compiled;
    entry.launcher = compiled.attr("run");
    entry.function = compiled.attr("function");
    entry.packed_metadata = compiled.attr("packed_metadata");
    for (size_t i = static_cast<size_t>(num_args); i < param_names_.size(); ++i) {
      entry.fills.push_back({param_names_[i], defaults_[i]});
    }
    std::string why_not;
    entry.direct = direct_launch(compiled, &why_not);
    if (!entry.direct) note_indirect(why_not);
    entries_.emplace(std::move(key), std::move(entry));
  }

  void note_indirect(const std::string& why) {
    for (const auto& known : indirect_reasons_) {
      if (known == why) return;
    }
    indirect_reasons_.push_back(why);
  }

  // How this compiled kernel is launched from C++, or why it is not.
  std::optional<DirectLaunch> direct_launch(const py::object& compiled,
                                            std::string* why_not) const {
    if (!direct_launch_off_.empty()) {
      *why_not = direct_launch_off_;
      return std::nullopt;
    }
    if (!torch_cuda_ || !cuda_driver_) {
      *why_not = "Triton's active driver is not CUDA";
      return std::nullopt;
    }
    return DirectLaunch::of(compiled, param_names_.size(), why_not);
  }

  void launch(Entry& entry, int64_t device, PyObject* grid, PyObject* args, PyObject* kwargs) {
    // Every parameter's value, in order: positional, then keyword or default.
    c10::SmallVector<PyObject*, 16> values;
    const Py_ssize_t num_args = PyTuple_GET_SIZE(args);
    for (Py_ssize_t i = 0; i < num_args; ++i) values.push_back(PyTuple_GET_ITEM(args, i));
    for (const auto& fill : entry.fills) {
      PyObject* given = PyDict_GetItemWithError(kwargs, fill.name.ptr());
      if (given == nullptr && PyErr_Occurred()) throw py::error_already_set();
      values.push_back(given != nullptr ? given : fill.default_value.ptr());
    }

    py::object grid_sizes = py::reinterpret_borrow<py::object>(grid);
    if (PyCallable_Check(grid)) {  // Triton calls it with every parameter by name
      py::dict meta;
      for (size_t i = 0; i < values.size(); ++i) {
        if (PyDict_SetItem(meta.ptr(), param_names_[i].ptr(), values[i]) != 0) {
          throw py::error_already_set();
        }
      }
      PyObject* result = PyObject_CallOneArg(grid, meta.ptr());
      if (result == nullptr) throw py::error_already_set();
      grid_sizes = py::reinterpret_steal<py::object>(result);
    }
    const Py_ssize_t rank = PyObject_Length(grid_sizes.ptr());
    if (rank < 0) throw py::error_already_set();
    if (rank == 0) {
      PyErr_SetString(PyExc_IndexError, "opreg: a Triton launch grid needs 1 to 3 sizes, got ()");
      throw py::error_already_set();
    }
    std::array<py::object, 3> dims{py::int_(1), py::int_(1), py::int_(1)};
    for (Py_ssize_t i = 0; i < std::min<Py_ssize_t>(rank, 3); ++i) {
      PyObject* item = PySequence_GetItem(grid_sizes.ptr(), i);
      if (item == nullptr) throw py::error_already_set();
      dims[i] = py::reinterpret_steal<py::object>(item);
    }
    const uint64_t stream = current_stream(device);

    const auto& n = names();
    py::object enter = attribute(runtime_knobs_.ptr(), n.launch_enter_hook);
    py::object exit = attribute(runtime_knobs_.ptr(), n.launch_exit_hook);
    const bool hooks = observed(enter.ptr()) || observed(exit.ptr());
    if (!hooks && entry.direct && entry.direct->launch(device, stream, dims, values)) {
      ++direct_hits_;
      return;
    }

    // Through Triton's compiled launcher, with the arguments Triton's `run` gives it.
    const size_t num_values = values.size();
    py::object metadata = py::none();
    if (hooks) {  // as Triton does: hooks get the launch metadata
      py::tuple metadata_args(2 + num_values);
      metadata_args[0] = grid_sizes;
      metadata_args[1] = py::int_(stream);
      for (size_t i = 0; i < num_values; ++i) {
        metadata_args[2 + i] = py::reinterpret_borrow<py::object>(values[i]);
      }
      metadata = entry.compiled.attr("launch_metadata")(*metadata_args);
    } else {
      enter = exit = py::none();
    }
    py::tuple call(9 + num_values);
    call[0] = dims[0];
    call[1] = dims[1];
    call[2] = dims[2];
    call[3] = py::int_(stream);
    call[4] = entry.function;
    call[5] = entry.packed_metadata;
    call[6] = metadata;
    call[7] = enter;
    call[8] = exit;
    for (size_t i = 0; i < num_values; ++i) {
      call[9 + i] = py::reinterpret_borrow<py::object>(values[i]);
    }
    PyObject* result = PyObject_Call(entry.launcher.ptr(), call.ptr(), nullptr);
    if (result == nullptr) throw py::error_already_set();
    Py_DECREF(result);
  }

  py::object kernel_, triton_run_, runtime_knobs_, compilation_knobs_;
  std::string direct_launch_off_;
  std::vector<py::str> param_names_;
  std::vector<py::object> defaults_;
  std::vector<bool> constexpr_params_;
  py::dict constexpr_by_name_;
  bool bound_ = false, torch_cuda_ = false, cuda_driver_ = false;
  py::object current_device_, current_stream_;
  std::unordered_map<std::string, Entry> entries_;
  std::vector<std::pair<std::string, int64_t>> through_triton_;
  std::vector<std::string> indirect_reasons_;
  int64_t hits_ = 0, direct_hits_ = 0;
};

// The `run` entry point as a plain C function: Triton's launch lambda calls it directly.
PyObject* run_entry(PyObject* self, PyObject* args, PyObject* kwargs) {
  HANDLE_TH_ERRORS
  auto* cache = py::handle(self).cast<LaunchCache*>();
  return cache->run(args, kwargs).release().ptr();
  END_HANDLE_TH_ERRORS
}

PyMethodDef run_entry_def = {
    "run", reinterpret_cast<PyCFunction>(reinterpret_cast<void (*)()>(run_entry)),
    METH_VARARGS | METH_KEYWORDS,
    "Launch the kernel (Triton's run signature), cached inside opreg ops."};

// `with _C.InsideOpScope():` marks Python code as running inside an op (for tests).
struct InsideOpScope {
  std::optional<InsideOp> scope;
};

}  // namespace

void bind_jit_cache(py::module& m) {
  py::class_<LaunchCache>(m, "TritonLaunchCache")
      .def(py::init<py::object, py::object, const py::list&, py::object, py::object, std::string>(),
           py::arg("kernel"), py::arg("triton_run"), py::arg("params"), py::arg("runtime_knobs"),
           py::arg("compilation_knobs"), py::arg("direct_launch_off") = "")
      .def("bind_driver", &LaunchCache::bind_driver)
      .def_property_readonly("run",
                             [](py::object self) {
                               PyObject* entry =
                                   PyCFunction_NewEx(&run_entry_def, self.ptr(), nullptr);
                               if (entry == nullptr) throw py::error_already_set();
                               return py::reinterpret_steal<py::object>(entry);
                             })
      .def_property_readonly("hits", &LaunchCache::hits)
      .def_property_readonly("direct_hits", &LaunchCache::direct_hits)
      .def_property_readonly("indirect_reasons", &LaunchCache::indirect_reasons)
      .def_property_readonly("through_triton", &LaunchCache::through_triton)
      .def("__len__", &LaunchCache::size)
      .def(
          "key",
          [](const LaunchCache& cache, const py::tuple& args, const py::dict& kwargs,
             int64_t device, bool debug, const py::str& instrumentation_mode) {
            return cache.key_of(args.ptr(), kwargs.ptr(), device, debug, instrumentation_mode);
          },
          py::arg("args"), py::arg("kwargs"), py::arg("device") = 0, py::arg("debug") = false,
          py::arg("instrumentation_mode") = "");
  py::class_<InsideOpScope>(m, "InsideOpScope")
      .def(py::init<>())
      .def("__enter__", [](InsideOpScope& scope) { scope.scope.emplace(); })
      .def("__exit__", [](InsideOpScope& scope, const py::args&) { scope.scope.reset(); });
  m.def("inside_op", &inside_op);
  bind_direct_launch(m);
}

}  // namespace opreg::python
