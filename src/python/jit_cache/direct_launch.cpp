// src/python/jit_cache/direct_launch.cpp: see the header.
#include "direct_launch.h"

#include <torch/csrc/autograd/python_variable.h>

#include <climits>

#include "jit_cache.h"

namespace opreg::python {
namespace {

namespace py = pybind11;
namespace cuda = triton::cuda;
using triton::ParamType;

// Writes one parameter's value into its slot as Triton's launcher would; false when the value is
// one the direct path leaves to Triton's launcher.
bool pack(ParamType type, PyObject* value, uint64_t* slot) {
  if (type == ParamType::kPointer) {
    if (THPVariable_Check(value)) {
      const auto& tensor = THPVariable_Unpack(value);
      if (!tensor.is_cuda()) return false;
      triton::pack_pointer(tensor.data_ptr(), slot);
      return true;
    }
    if (value != Py_None) return false;  // raw integer addresses go through Triton
    triton::pack_pointer(nullptr, slot);
    return true;
  }
  if (triton::is_float_type(type)) {
    if (!PyFloat_Check(value) && !PyLong_Check(value)) return false;
    const double number = PyFloat_AsDouble(value);
    if (number == -1.0 && PyErr_Occurred()) {
      PyErr_Clear();
      return false;
    }
    return triton::pack_float(type, number, slot);
  }
  if (!PyLong_Check(value)) return false;
  int overflow = 0;
  const long long number = PyLong_AsLongLongAndOverflow(value, &overflow);
  if (overflow != 0 || (number == -1 && PyErr_Occurred())) {
    PyErr_Clear();
    return false;
  }
  // Triton's launcher parses 8-bit integers as unsigned char, signed or not: negatives are its
  // to refuse.
  if ((type == ParamType::kI1 || type == ParamType::kI8) && number < 0) return false;
  return triton::pack_integer(type, number, slot);
}

}  // namespace

std::optional<DirectLaunch> DirectLaunch::of(const py::object& compiled, size_t num_params,
                                             std::string* why_not) {
  std::string driver_error;
  if (cuda::driver(&driver_error) == nullptr) {
    *why_not = driver_error;
    return std::nullopt;
  }
  const py::object launcher_object = compiled.attr("run");
  const std::string launcher = python_type_name(launcher_object);
  if (launcher != "triton.backends.nvidia.driver.CudaLauncher") {
    *why_not = "the launcher is " + launcher;
    return std::nullopt;
  }
  auto get_int = [&](const char* name) {
    return py::getattr(launcher_object, name, py::int_(-1)).cast<int64_t>();
  };
  if (get_int("num_ctas") != 1 || get_int("global_scratch_size") != 0 ||
      get_int("profile_scratch_size") != 0) {
    *why_not = "the kernel uses clusters or scratch memory";
    return std::nullopt;
  }
  auto metadata =
      compiled.attr("packed_metadata").cast<py::tuple>();  // (num_warps, num_ctas, shared)
  DirectLaunch direct;
  direct.name = py::str(py::getattr(compiled, "name", py::str("?"))).cast<std::string>();
  direct.shape.block = 32 * metadata[0].cast<unsigned>();
  direct.shape.shared = metadata[2].cast<unsigned>();
  direct.shape.pdl = py::bool_(py::getattr(launcher_object, "launch_pdl", py::bool_(false)));
  direct.shape.cooperative =
      py::bool_(py::getattr(launcher_object, "launch_cooperative_grid", py::bool_(false)));
  direct.function = reinterpret_cast<cuda::CUfunction>(compiled.attr("function").cast<uint64_t>());
  auto signature = compiled.attr("src").attr("signature").cast<py::dict>();
  if (signature.size() != num_params || num_params > triton::kMaxParams) {
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
      auto param_type = triton::param_type_of(text);
      if (!param_type) {
        *why_not = "a parameter of type " + text;
        return std::nullopt;
      }
      direct.params.emplace_back(index, *param_type);
    }
    ++index;
  }
  return direct;
}

bool DirectLaunch::launch(int64_t device, uint64_t stream, const std::array<py::object, 3>& dims,
                          c10::ArrayRef<PyObject*> values) const {
  std::array<long long, 3> grid{};
  for (size_t i = 0; i < 3; ++i) {
    int overflow = 0;
    grid[i] =
        PyLong_Check(dims[i].ptr()) ? PyLong_AsLongLongAndOverflow(dims[i].ptr(), &overflow) : -1;
    if (overflow != 0 || grid[i] < 0 || grid[i] > INT_MAX) return false;
  }
  triton::PackedParams packed;
  for (const auto& [index, type] : params) {
    if (!pack(type, values[index], packed.next())) return false;
  }
  triton::pack_pointer(nullptr, packed.next());  // global scratch: none (checked in of())
  triton::pack_pointer(nullptr, packed.next());  // profile scratch: none
  if (grid[0] == 0 || grid[1] == 0 || grid[2] == 0) return true;

  triton::LaunchShape launch_shape = shape;
  launch_shape.grid_x = static_cast<unsigned>(grid[0]);
  launch_shape.grid_y = static_cast<unsigned>(grid[1]);
  launch_shape.grid_z = static_cast<unsigned>(grid[2]);
  const auto* d = cuda::driver();
  cuda::make_context_current(*d, static_cast<int>(device));
  cuda::CUresult result;
  {
    py::gil_scoped_release no_gil;
    result = triton::launch_kernel(*d, function, launch_shape,
                                   reinterpret_cast<cuda::CUstream>(stream), packed.data());
  }
  TORCH_CHECK(result == cuda::kSuccess, "opreg: launching Triton kernel '", name, "' with grid (",
              grid[0], ", ", grid[1], ", ", grid[2], ") on cuda:", device,
              " failed: ", cuda::error_text(result));
  return true;
}

void bind_direct_launch(py::module& m) {
  m.def(
      "_jit_cache_pack",
      [](const std::string& type, const py::object& value) -> py::object {
        const auto param_type = triton::param_type_of(type);
        if (!param_type || *param_type == ParamType::kPointer) {
          throw py::value_error("opreg: _jit_cache_pack: not a scalar parameter type: " + type);
        }
        uint64_t slot = 0;
        if (!pack(*param_type, value.ptr(), &slot)) return py::none();
        return py::bytes(reinterpret_cast<const char*>(&slot),
                         static_cast<size_t>(triton::param_size(*param_type)));
      },
      py::arg("type"), py::arg("value"),
      "The bytes a scalar parameter of this Triton type gets on a direct launch, or None when "
      "the value goes through Triton's launcher (tests).");
}

}  // namespace opreg::python
