// src/python/jit_launch.cpp: the per-call part of cached Triton JIT launches (see
// python/opreg/_jit_launch.py): the specialization key and, on a hit, the launch through
// Triton's compiled launcher. In C++ because this runs on every launch and Python-level
// argument inspection costs more than the launch it saves.
#include "jit_launch.h"

#include <torch/csrc/autograd/python_variable.h>

namespace opreg::python {
namespace {

namespace py = pybind11;

// Tags that keep the flattened key unambiguous: each is followed by a fixed number of fields.
constexpr int kTensor = 0, kBool = 1, kInt = 2, kBigInt = 3, kFloat = 4, kNone = 5, kKeyword = 6;

// Appends the key fields of one value; false when the key does not cover its type.
bool append_value_key(py::handle value, std::vector<py::object>& key) {
  PyObject* object = value.ptr();
  if (THPVariable_Check(object)) {
    const auto& tensor = THPVariable_Unpack(object);
    const bool aligned = reinterpret_cast<uintptr_t>(tensor.data_ptr()) % 16 == 0;
    key.push_back(py::int_(kTensor));
    key.push_back(py::int_(static_cast<int>(tensor.scalar_type())));
    key.push_back(py::bool_(aligned));
    return true;
  }
  if (PyBool_Check(object)) {
    key.push_back(py::int_(kBool));
    key.push_back(py::reinterpret_borrow<py::object>(value));
    return true;
  }
  if (PyLong_CheckExact(object)) {
    int overflow = 0;
    const long long number = PyLong_AsLongLongAndOverflow(object, &overflow);
    if (overflow != 0) {  // beyond 64 bits: the value itself
      key.push_back(py::int_(kBigInt));
      key.push_back(py::reinterpret_borrow<py::object>(value));
      return true;
    }
    const int width = number >= INT32_MIN && number <= INT32_MAX ? 32 : 64;
    key.push_back(py::int_(kInt));
    key.push_back(py::int_(width * 4 + (number == 1 ? 2 : 0) + (number % 16 == 0 ? 1 : 0)));
    return true;
  }
  if (PyFloat_CheckExact(object)) {
    key.push_back(py::int_(kFloat));
    return true;
  }
  if (value.is_none()) {
    key.push_back(py::int_(kNone));
    return true;
  }
  return false;
}

// Keyword values are part of the key by value (constexprs, options), with their type, so that
// 1, 1.0 and True differ; tensors passed by keyword are keyed as positional ones.
bool append_keyword_key(py::handle name, py::handle value, std::vector<py::object>& key) {
  key.push_back(py::int_(kKeyword));
  key.push_back(py::reinterpret_borrow<py::object>(name));
  PyObject* object = value.ptr();
  if (PyLong_CheckExact(object) || PyBool_Check(object) || PyFloat_CheckExact(object) ||
      PyUnicode_CheckExact(object) || value.is_none()) {
    key.push_back(py::reinterpret_borrow<py::object>(reinterpret_cast<PyObject*>(Py_TYPE(object))));
    key.push_back(py::reinterpret_borrow<py::object>(value));
    return true;
  }
  return THPVariable_Check(object) && append_value_key(value, key);
}

py::object launch_key(const py::object& device, const py::tuple& args, const py::dict& kwargs,
                      const py::object& salt) {
  std::vector<py::object> key;
  key.reserve(2 + 3 * args.size() + 4 * kwargs.size());
  key.push_back(device);
  for (const auto& value : args) {
    if (!append_value_key(value, key)) return py::none();
  }
  for (const auto& [name, value] : kwargs) {
    if (!append_keyword_key(name, value, key)) return py::none();
  }
  key.push_back(salt);
  py::tuple result(key.size());
  for (size_t i = 0; i < key.size(); ++i) result[i] = std::move(key[i]);
  return std::move(result);
}

bool observed(const py::object& hook) {
  if (hook.is_none()) return false;
  static const py::str calls("calls");
  if (!py::hasattr(hook, calls)) return true;
  return PyObject_IsTrue(hook.attr(calls).ptr()) == 1;
}

// The state every launch reads, held in C++ so that a hit costs no attribute lookups: the
// compiled kernels by key (entries: key -> (compiled, run, function, packed_metadata, plan)),
// the kernel's parameter names, and how to get the current device and stream.
class LaunchCache {
 public:
  LaunchCache(py::tuple names, py::object runtime_knobs)
      : names_(std::move(names)), runtime_knobs_(std::move(runtime_knobs)) {}

  void bind_driver(py::object current_device, py::object current_stream) {
    current_device_ = std::move(current_device);
    current_stream_ = std::move(current_stream);
  }
  bool bound() const { return static_cast<bool>(current_device_); }
  py::object current_device() const { return current_device_(); }

  void store(const py::object& key, const py::object& compiled, const py::tuple& plan) {
    entries_[key] = py::make_tuple(compiled, compiled.attr("run"), compiled.attr("function"),
                                   compiled.attr("packed_metadata"), plan);
  }
  int64_t hits() const { return hits_; }
  size_t size() const { return entries_.size(); }

  // The hit path: None when the launch's key has no compiled kernel yet (or no key).
  py::object launch(const py::object& grid, const py::tuple& args, const py::dict& kwargs,
                    const py::object& salt) {
    const py::object device = current_device_();
    const py::object key = launch_key(device, args, kwargs, salt);
    if (key.is_none()) return py::none();
    PyObject* found = PyDict_GetItemWithError(entries_.ptr(), key.ptr());
    if (found == nullptr) {
      if (PyErr_Occurred()) throw py::error_already_set();
      return py::none();
    }
    const auto entry = py::reinterpret_borrow<py::tuple>(found);
    const auto plan = py::reinterpret_borrow<py::tuple>(entry[4]);

    const size_t num_values = args.size() + plan.size();
    py::tuple call(9 + num_values);  // Triton's launcher: grid, stream, function, ..., values
    for (size_t i = 0; i < args.size(); ++i) call[9 + i] = args[i];
    for (size_t i = 0; i < plan.size(); ++i) {
      const auto step = py::reinterpret_borrow<py::tuple>(plan[i]);  // (keyword?, name, default)
      call[9 + args.size() + i] =
          PyObject_IsTrue(step[0].ptr()) == 1 ? py::object(kwargs[step[1]]) : py::object(step[2]);
    }
    py::object launch_grid = grid;
    if (PyCallable_Check(grid.ptr())) {
      py::dict meta;
      for (size_t i = 0; i < names_.size(); ++i) meta[names_[i]] = call[9 + i];
      launch_grid = grid(meta);
    }
    const auto sizes = py::reinterpret_borrow<py::sequence>(launch_grid);
    const size_t rank = sizes.size();
    const py::object stream = current_stream_(device);

    static const py::str enter_name("launch_enter_hook"), exit_name("launch_exit_hook");
    py::object enter = runtime_knobs_.attr(enter_name);
    py::object exit = runtime_knobs_.attr(exit_name);
    py::object metadata = py::none();
    if (observed(enter) || observed(exit)) {  // as Triton does: hooks get the launch metadata
      py::tuple metadata_args(2 + num_values);
      metadata_args[0] = launch_grid;
      metadata_args[1] = stream;
      for (size_t i = 0; i < num_values; ++i) metadata_args[2 + i] = call[9 + i];
      metadata = entry[0].attr("launch_metadata")(*metadata_args);
    } else {
      enter = exit = py::none();
    }
    call[0] = sizes[0];
    call[1] = rank > 1 ? py::object(sizes[1]) : py::int_(1);
    call[2] = rank > 2 ? py::object(sizes[2]) : py::int_(1);
    call[3] = stream;
    call[4] = entry[2];
    call[5] = entry[3];
    call[6] = metadata;
    call[7] = enter;
    call[8] = exit;
    PyObject* result = PyObject_Call(entry[1].ptr(), call.ptr(), nullptr);
    if (result == nullptr) throw py::error_already_set();
    Py_DECREF(result);
    ++hits_;
    return entry[0];
  }

 private:
  py::dict entries_;
  py::tuple names_;
  py::object runtime_knobs_;
  py::object current_device_, current_stream_;
  int64_t hits_ = 0;
};

}  // namespace

void bind_jit_launch(py::module& m) {
  m.def("triton_launch_key", &launch_key, py::arg("device"), py::arg("args"), py::arg("kwargs"),
        py::arg("salt"));
  py::class_<LaunchCache>(m, "TritonLaunchCache")
      .def(py::init<py::tuple, py::object>(), py::arg("names"), py::arg("runtime_knobs"))
      .def("bind_driver", &LaunchCache::bind_driver)
      .def_property_readonly("bound", &LaunchCache::bound)
      .def("current_device", &LaunchCache::current_device)
      .def("store", &LaunchCache::store)
      .def_property_readonly("hits", &LaunchCache::hits)
      .def("__len__", &LaunchCache::size)
      .def("launch", &LaunchCache::launch);
}

}  // namespace opreg::python
