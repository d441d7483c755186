// src/python/jit_launch.cpp: cached launches of Triton JIT kernels inside opreg ops (see
// python/opreg/_jit_launch.py). An adopted kernel's `run` is a LaunchCache's entry point: inside
// an op, a launch whose specialization key was seen before skips Triton's Python launch path;
// when the compiled kernel is a plain CUDA one, it goes from here to cuLaunchKernel with no
// Python in between. Everything else is handed to Triton's own `run`, unchanged.
#include "jit_launch.h"

#include <c10/core/impl/DeviceGuardImplInterface.h>
#include <c10/util/SmallVector.h>
#include <torch/csrc/Exceptions.h>
#include <torch/csrc/autograd/python_variable.h>

#include <array>
#include <climits>
#include <cstring>
#include <optional>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include "../triton/cuda_driver.h"

namespace opreg::python {
namespace {
thread_local int inside_op_depth = 0;
}  // namespace

InsideOp::InsideOp() { ++inside_op_depth; }
InsideOp::~InsideOp() { --inside_op_depth; }
bool inside_op() { return inside_op_depth > 0; }

namespace {

namespace py = pybind11;
namespace cuda = opreg::triton::cuda;

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

// ---------------------------------------------------------------------------------------------
// The specialization key: bytes, at least as fine as what makes Triton compile another kernel.

enum Tag : char {
  kTensor = 'T',
  kBool = 'B',
  kInt = 'I',
  kFloat = 'F',
  kNone = 'N',
  kValue = 'V',
  kKeyword = 'K',
  kSalt = 'S',
};

template <class T>
void append_raw(std::string& key, const T& value) {
  key.append(reinterpret_cast<const char*>(&value), sizeof(value));
}

bool append_text(std::string& key, PyObject* text) {
  Py_ssize_t size = 0;
  const char* data = PyUnicode_AsUTF8AndSize(text, &size);
  if (data == nullptr) {
    PyErr_Clear();
    return false;
  }
  append_raw(key, static_cast<int64_t>(size));
  key.append(data, size);
  return true;
}

// A tensor, as Triton specializes a pointer: dtype and 16-byte alignment.
void append_tensor(std::string& key, PyObject* object) {
  const auto& tensor = THPVariable_Unpack(object);
  key.push_back(kTensor);
  key.push_back(static_cast<char>(tensor.scalar_type()));
  key.push_back(reinterpret_cast<uintptr_t>(tensor.data_ptr()) % 16 == 0 ? 1 : 0);
}

// A runtime argument: its type and what Triton specializes it on (for integers: 32 or 64 bits,
// == 1, divisible by 16). False when the key does not cover its type.
bool append_argument(std::string& key, PyObject* object) {
  if (THPVariable_Check(object)) {
    append_tensor(key, object);
    return true;
  }
  if (PyBool_Check(object)) {
    key.push_back(kBool);
    key.push_back(object == Py_True ? 1 : 0);
    return true;
  }
  if (PyLong_CheckExact(object)) {
    int overflow = 0;
    const long long number = PyLong_AsLongLongAndOverflow(object, &overflow);
    if (overflow != 0) return false;  // beyond 64 bits: Triton's to judge
    const bool narrow = number >= INT32_MIN && number <= INT32_MAX;
    key.push_back(kInt);
    key.push_back(
        static_cast<char>((narrow ? 4 : 0) | (number == 1 ? 2 : 0) | (number % 16 == 0 ? 1 : 0)));
    return true;
  }
  if (PyFloat_CheckExact(object)) {
    key.push_back(kFloat);
    return true;
  }
  if (object == Py_None) {
    key.push_back(kNone);
    return true;
  }
  return false;
}

// A constexpr or an option: by type and value, so that 1, 1.0 and True differ.
bool append_value(std::string& key, PyObject* object) {
  if (THPVariable_Check(object)) {
    append_tensor(key, object);
    return true;
  }
  key.push_back(kValue);
  if (PyBool_Check(object)) {
    key.push_back('b');
    key.push_back(object == Py_True ? 1 : 0);
    return true;
  }
  if (PyLong_CheckExact(object)) {
    int overflow = 0;
    const long long number = PyLong_AsLongLongAndOverflow(object, &overflow);
    if (overflow != 0) return false;
    key.push_back('i');
    append_raw(key, number);
    return true;
  }
  if (PyFloat_CheckExact(object)) {
    key.push_back('f');
    append_raw(key, PyFloat_AS_DOUBLE(object));
    return true;
  }
  if (PyUnicode_CheckExact(object)) {
    key.push_back('s');
    return append_text(key, object);
  }
  if (object == Py_None) {
    key.push_back('n');
    return true;
  }
  return false;
}

// What a launch's key is built from besides its arguments.
struct KeyContext {
  int64_t device;
  const std::vector<bool>* constexpr_params;  // by position
  PyObject* constexpr_by_name;                // dict: parameter name -> bool
  bool debug;
  PyObject* instrumentation_mode;  // str
};

// The key of a launch, or false when an argument is outside what it covers. `grid` and `warmup`
// (the launch's own keywords) are not part of it.
bool launch_key(const KeyContext& context, PyObject* args, PyObject* kwargs, std::string* key) {
  key->clear();
  append_raw(*key, context.device);
  const Py_ssize_t num_args = PyTuple_GET_SIZE(args);
  for (Py_ssize_t i = 0; i < num_args; ++i) {
    PyObject* value = PyTuple_GET_ITEM(args, i);
    const bool by_value =
        static_cast<size_t>(i) < context.constexpr_params->size() && (*context.constexpr_params)[i];
    if (!(by_value ? append_value(*key, value) : append_argument(*key, value))) return false;
  }
  if (kwargs != nullptr) {
    const auto& n = names();
    Py_ssize_t position = 0;
    PyObject *name, *value;
    while (PyDict_Next(kwargs, &position, &name, &value)) {
      if (name == n.grid || name == n.warmup) continue;
      key->push_back(kKeyword);
      if (!PyUnicode_Check(name) || !append_text(*key, name)) return false;
      PyObject* constexpr_flag = PyDict_GetItemWithError(context.constexpr_by_name, name);
      if (constexpr_flag == nullptr && PyErr_Occurred()) throw py::error_already_set();
      const bool runtime_param = constexpr_flag == Py_False;  // options and constexprs: by value
      if (!(runtime_param ? append_argument(*key, value) : append_value(*key, value))) return false;
    }
  }
  key->push_back(kSalt);
  key->push_back(context.debug ? 1 : 0);
  return PyUnicode_Check(context.instrumentation_mode) &&
         append_text(*key, context.instrumentation_mode);
}

// ---------------------------------------------------------------------------------------------
// Compiled kernels and how to launch them.

// A parameter after the positional ones: given by keyword, or its default.
struct Fill {
  py::object name;
  py::object default_value;
};

// A parameter as Triton's CUDA launcher passes it (the `signature` of the compiled kernel).
enum class Slot : uint8_t {
  kPointer,
  kI8,
  kI16,
  kI32,
  kI64,
  kU8,
  kU16,
  kU32,
  kU64,
  kFp16,
  kBf16,
  kFp32,
  kFp64
};

std::optional<Slot> slot_of(const std::string& type) {
  if (!type.empty() && type[0] == '*') return Slot::kPointer;
  static const std::pair<const char*, Slot> kTypes[] = {
      {"i1", Slot::kI8},     {"i8", Slot::kI8},    {"i16", Slot::kI16},   {"i32", Slot::kI32},
      {"i64", Slot::kI64},   {"u1", Slot::kU8},    {"u8", Slot::kU8},     {"u16", Slot::kU16},
      {"u32", Slot::kU32},   {"u64", Slot::kU64},  {"fp16", Slot::kFp16}, {"bf16", Slot::kBf16},
      {"fp32", Slot::kFp32}, {"f32", Slot::kFp32}, {"fp64", Slot::kFp64}};
  for (const auto& [name, slot] : kTypes) {
    if (type == name) return slot;
  }
  return std::nullopt;
}

// A compiled kernel launched from C++: its CUfunction and configuration as Triton loaded it.
struct DirectLaunch {
  cuda::CUfunction function = nullptr;
  unsigned block = 0, shared = 0;
  bool pdl = false, cooperative = false;
  std::vector<std::pair<size_t, Slot>> slots;  // (parameter index, how it is passed)
};

struct Entry {
  py::object compiled, launcher, function, packed_metadata;
  std::vector<Fill> fills;  // parameters after the positional ones
  std::optional<DirectLaunch> direct;
  std::string name;
};

constexpr size_t kMaxParams = 64;
constexpr size_t kMaxEntries = 4096;

// Writes one parameter into its 8-byte slot as Triton's launcher would; false when the value is
// one the direct path leaves to Triton's launcher (a CPU tensor, an out-of-range integer, ...).
bool pack(Slot slot, PyObject* value, uint64_t* out) {
  *out = 0;
  auto store = [&](auto number) { std::memcpy(out, &number, sizeof(number)); };
  if (slot == Slot::kPointer) {
    if (THPVariable_Check(value)) {
      const auto& tensor = THPVariable_Unpack(value);
      if (!tensor.is_cuda()) return false;
      store(reinterpret_cast<uint64_t>(tensor.data_ptr()));
      return true;
    }
    return value == Py_None;  // a null pointer; raw integer addresses go through Triton
  }
  if (slot >= Slot::kFp16) {
    if (!PyFloat_Check(value) && !PyLong_Check(value)) return false;
    const double number = PyFloat_AsDouble(value);
    if (number == -1.0 && PyErr_Occurred()) {
      PyErr_Clear();
      return false;
    }
    switch (slot) {
      case Slot::kFp16: {
        uint16_t bits;
        if (PyFloat_Pack2(number, reinterpret_cast<char*>(&bits), 1) != 0) {
          PyErr_Clear();
          return false;
        }
        store(bits);
        return true;
      }
      case Slot::kBf16: {
        const float single = static_cast<float>(number);
        uint32_t bits;
        std::memcpy(&bits, &single, sizeof(bits));
        store(static_cast<uint16_t>(bits >> 16));
        return true;
      }
      case Slot::kFp32:
        store(static_cast<float>(number));
        return true;
      default:
        store(number);
        return true;
    }
  }
  if (!PyLong_Check(value)) return false;
  int overflow = 0;
  const long long number = PyLong_AsLongLongAndOverflow(value, &overflow);
  if (overflow != 0 || (number == -1 && PyErr_Occurred())) {
    PyErr_Clear();
    return false;
  }
  auto within = [&](long long low, long long high) { return number >= low && number <= high; };
  switch (slot) {
    case Slot::kI8:  // Triton parses 8-bit integers as unsigned char, signed or not
    case Slot::kU8:
      if (!within(0, UCHAR_MAX)) return false;
      store(static_cast<uint8_t>(number));
      return true;
    case Slot::kI16:
      if (!within(SHRT_MIN, SHRT_MAX)) return false;
      store(static_cast<int16_t>(number));
      return true;
    case Slot::kU16:
      if (!within(0, USHRT_MAX)) return false;
      store(static_cast<uint16_t>(number));
      return true;
    case Slot::kI32:
      if (!within(INT_MIN, INT_MAX)) return false;
      store(static_cast<int32_t>(number));
      return true;
    case Slot::kU32:
      if (!within(0, UINT_MAX)) return false;
      store(static_cast<uint32_t>(number));
      return true;
    case Slot::kI64:
      store(static_cast<int64_t>(number));
      return true;
    default:  // kU64
      if (number < 0) return false;
      store(static_cast<uint64_t>(number));
      return true;
  }
}

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

std::string type_name(const py::handle& object) {
  auto type = py::type::handle_of(object);
  return py::str(type.attr("__module__")).cast<std::string>() + "." +
         py::str(type.attr("__qualname__")).cast<std::string>();
}

// ---------------------------------------------------------------------------------------------

// The launches of one JIT kernel inside opreg ops: compiled kernels by key, and the counts that
// opreg.kernel_status reports.
class LaunchCache {
 public:
  // params: (name, default, is_constexpr) per kernel parameter, in order.
  LaunchCache(py::object kernel, py::object triton_run, const py::list& params,
              py::object runtime_knobs, py::object compilation_knobs)
      : kernel_(std::move(kernel)),
        triton_run_(std::move(triton_run)),
        runtime_knobs_(std::move(runtime_knobs)),
        compilation_knobs_(std::move(compilation_knobs)) {
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
    KeyContext context{current_device(), &constexpr_params_, constexpr_by_name_.ptr(), false,
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
  size_t direct_entries() const {
    size_t count = 0;
    for (const auto& [key, entry] : entries_) count += entry.direct ? 1 : 0;
    return count;
  }
  // Why compiled kernels are not launched from C++ (one line per reason), for kernel_status.
  std::vector<std::string> indirect_reasons() const { return indirect_reasons_; }
  std::vector<std::pair<std::string, int64_t>> through_triton() const { return through_triton_; }

  py::object key_of(PyObject* args, PyObject* kwargs, int64_t device, bool debug,
                    const py::str& instrumentation_mode) const {
    KeyContext context{device, &constexpr_params_, constexpr_by_name_.ptr(), debug,
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
    const std::string driver = type_name(active);
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
    entry.name = py::str(py::getattr(compiled, "name", py::str("?"))).cast<std::string>();
    for (size_t i = static_cast<size_t>(num_args); i < param_names_.size(); ++i) {
      entry.fills.push_back({param_names_[i], defaults_[i]});
    }
    std::string why_not;
    entry.direct = direct_launch(compiled, entry, &why_not);
    if (!entry.direct) note_indirect(why_not);
    entries_.emplace(std::move(key), std::move(entry));
  }

  void note_indirect(const std::string& why) {
    for (const auto& known : indirect_reasons_) {
      if (known == why) return;
    }
    indirect_reasons_.push_back(why);
  }

  // Whether this compiled kernel can be launched from C++: Triton's CUDA launcher, one CTA per
  // program, no scratch memory, every parameter a pointer or a number.
  std::optional<DirectLaunch> direct_launch(const py::object& compiled, const Entry& entry,
                                            std::string* why_not) const {
    if (!torch_cuda_ || !cuda_driver_) {
      *why_not = "Triton's active driver is not CUDA";
      return std::nullopt;
    }
    std::string driver_error;
    if (cuda::driver(&driver_error) == nullptr) {
      *why_not = driver_error;
      return std::nullopt;
    }
    const std::string launcher = type_name(entry.launcher);
    if (launcher != "triton.backends.nvidia.driver.CudaLauncher") {
      *why_not = "the launcher is " + launcher;
      return std::nullopt;
    }
    auto get_int = [&](const char* name) {
      return py::getattr(entry.launcher, name, py::int_(-1)).cast<int64_t>();
    };
    if (get_int("num_ctas") != 1 || get_int("global_scratch_size") != 0 ||
        get_int("profile_scratch_size") != 0) {
      *why_not = "the kernel uses clusters or scratch memory";
      return std::nullopt;
    }
    auto metadata = entry.packed_metadata.cast<py::tuple>();  // (num_warps, num_ctas, shared)
    DirectLaunch direct;
    direct.block = 32 * metadata[0].cast<unsigned>();
    direct.shared = metadata[2].cast<unsigned>();
    direct.pdl = truthy(py::getattr(entry.launcher, "launch_pdl", py::bool_(false)).ptr());
    direct.cooperative =
        truthy(py::getattr(entry.launcher, "launch_cooperative_grid", py::bool_(false)).ptr());
    direct.function = reinterpret_cast<cuda::CUfunction>(entry.function.cast<uint64_t>());
    auto signature = compiled.attr("src").attr("signature").cast<py::dict>();
    if (signature.size() != param_names_.size() || param_names_.size() > kMaxParams) {
      *why_not = "the compiled signature does not list one type per parameter";
      return std::nullopt;
    }
    size_t index = 0;
    for (const auto& [name, type] : signature) {
      if (!py::isinstance<py::str>(type)) {
        *why_not = "a tuple parameter";
        return std::nullopt;
      }
      const auto text = type.cast<std::string>();
      if (text != "constexpr") {
        auto slot = slot_of(text);
        if (!slot) {
          *why_not = "a parameter of type " + text;
          return std::nullopt;
        }
        direct.slots.emplace_back(index, *slot);
      }
      ++index;
    }
    return direct;
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
    if (!hooks && entry.direct && launch_directly(entry, device, stream, dims, values)) {
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

  // cuLaunchKernel with the parameters packed as Triton's CUDA launcher packs them; false (and
  // nothing launched) when a value is one the direct path leaves to Triton's launcher.
  bool launch_directly(const Entry& entry, int64_t device, uint64_t stream,
                       const std::array<py::object, 3>& dims,
                       const c10::SmallVector<PyObject*, 16>& values) {
    const DirectLaunch& direct = *entry.direct;
    std::array<long long, 3> grid{};
    for (size_t i = 0; i < 3; ++i) {
      int overflow = 0;
      grid[i] =
          PyLong_Check(dims[i].ptr()) ? PyLong_AsLongLongAndOverflow(dims[i].ptr(), &overflow) : -1;
      if (overflow != 0 || grid[i] < 0 || grid[i] > INT_MAX) return false;
    }
    std::array<uint64_t, kMaxParams + 2> slots{};
    std::array<void*, kMaxParams + 2> params{};
    size_t count = 0;
    for (const auto& [index, slot] : direct.slots) {
      if (!pack(slot, values[index], &slots[count])) return false;
      params[count] = &slots[count];
      ++count;
    }
    params[count] = &slots[count];  // global scratch: none (checked when stored)
    ++count;
    params[count] = &slots[count];  // profile scratch: none
    if (grid[0] == 0 || grid[1] == 0 || grid[2] == 0) return true;

    const auto* d = cuda::driver();
    cuda::make_context_current(*d, static_cast<int>(device));
    auto cu_stream = reinterpret_cast<cuda::CUstream>(stream);
    cuda::CUresult result;
    {
      py::gil_scoped_release no_gil;
      if (!direct.pdl && !direct.cooperative) {
        result =
            d->cuLaunchKernel(direct.function, static_cast<unsigned>(grid[0]),
                              static_cast<unsigned>(grid[1]), static_cast<unsigned>(grid[2]),
                              direct.block, 1, 1, direct.shared, cu_stream, params.data(), nullptr);
      } else {
        std::array<cuda::LaunchAttribute, 2> attributes{};
        unsigned num_attributes = 0;
        if (direct.pdl) {
          auto& a = attributes[num_attributes++];
          a.id = cuda::kLaunchAttrProgrammaticStreamSerialization;
          a.value.programmatic_stream_serialization_allowed = 1;
        }
        if (direct.cooperative) {
          auto& a = attributes[num_attributes++];
          a.id = cuda::kLaunchAttrCooperative;
          a.value.cooperative = 1;
        }
        cuda::LaunchConfig config{static_cast<unsigned>(grid[0]),
                                  static_cast<unsigned>(grid[1]),
                                  static_cast<unsigned>(grid[2]),
                                  direct.block,
                                  1,
                                  1,
                                  direct.shared,
                                  cu_stream,
                                  attributes.data(),
                                  num_attributes};
        result = d->cuLaunchKernelEx(&config, direct.function, params.data(), nullptr);
      }
    }
    TORCH_CHECK(result == cuda::kSuccess, "opreg: launching Triton kernel '", entry.name,
                "' with grid (", grid[0], ", ", grid[1], ", ", grid[2], ") on cuda:", device,
                " failed: ", cuda::error_text(result));
    return true;
  }

  py::object kernel_, triton_run_, runtime_knobs_, compilation_knobs_;
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

void bind_jit_launch(py::module& m) {
  py::class_<LaunchCache>(m, "TritonLaunchCache")
      .def(py::init<py::object, py::object, const py::list&, py::object, py::object>(),
           py::arg("kernel"), py::arg("triton_run"), py::arg("params"), py::arg("runtime_knobs"),
           py::arg("compilation_knobs"))
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
      .def_property_readonly("direct_entries", &LaunchCache::direct_entries)
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
}

}  // namespace opreg::python
