// src/python/jit_direct_launch.cpp: see the header.
#include "jit_direct_launch.h"

#include <torch/csrc/autograd/python_variable.h>

#include <climits>
#include <cstring>

namespace opreg::python {
namespace {

namespace py = pybind11;
namespace cuda = triton::cuda;

constexpr size_t kMaxParams = 64;

std::optional<ParamSlot> slot_of(const std::string& type) {
  if (!type.empty() && type[0] == '*') return ParamSlot::kPointer;
  static const std::pair<const char*, ParamSlot> kTypes[] = {
      {"i1", ParamSlot::kI8},     {"i8", ParamSlot::kI8},     {"i16", ParamSlot::kI16},
      {"i32", ParamSlot::kI32},   {"i64", ParamSlot::kI64},   {"u1", ParamSlot::kU8},
      {"u8", ParamSlot::kU8},     {"u16", ParamSlot::kU16},   {"u32", ParamSlot::kU32},
      {"u64", ParamSlot::kU64},   {"fp16", ParamSlot::kFp16}, {"bf16", ParamSlot::kBf16},
      {"fp32", ParamSlot::kFp32}, {"f32", ParamSlot::kFp32},  {"fp64", ParamSlot::kFp64}};
  for (const auto& [name, slot] : kTypes) {
    if (type == name) return slot;
  }
  return std::nullopt;
}

// Writes one parameter into its 8-byte slot as Triton's launcher would; false when the value is
// one the direct path leaves to Triton's launcher (a CPU tensor, an out-of-range integer, ...).
bool pack(ParamSlot slot, PyObject* value, uint64_t* out) {
  *out = 0;
  auto store = [&](auto number) { std::memcpy(out, &number, sizeof(number)); };
  if (slot == ParamSlot::kPointer) {
    if (THPVariable_Check(value)) {
      const auto& tensor = THPVariable_Unpack(value);
      if (!tensor.is_cuda()) return false;
      store(reinterpret_cast<uint64_t>(tensor.data_ptr()));
      return true;
    }
    return value == Py_None;  // a null pointer; raw integer addresses go through Triton
  }
  if (slot >= ParamSlot::kFp16) {
    if (!PyFloat_Check(value) && !PyLong_Check(value)) return false;
    const double number = PyFloat_AsDouble(value);
    if (number == -1.0 && PyErr_Occurred()) {
      PyErr_Clear();
      return false;
    }
    switch (slot) {
      case ParamSlot::kFp16: {
        uint16_t bits;
        if (PyFloat_Pack2(number, reinterpret_cast<char*>(&bits), 1) != 0) {
          PyErr_Clear();
          return false;
        }
        store(bits);
        return true;
      }
      case ParamSlot::kBf16: {
        const float single = static_cast<float>(number);
        uint32_t bits;
        std::memcpy(&bits, &single, sizeof(bits));
        store(static_cast<uint16_t>(bits >> 16));
        return true;
      }
      case ParamSlot::kFp32:
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
    case ParamSlot::kI8:  // Triton parses 8-bit integers as unsigned char, signed or not
    case ParamSlot::kU8:
      if (!within(0, UCHAR_MAX)) return false;
      store(static_cast<uint8_t>(number));
      return true;
    case ParamSlot::kI16:
      if (!within(SHRT_MIN, SHRT_MAX)) return false;
      store(static_cast<int16_t>(number));
      return true;
    case ParamSlot::kU16:
      if (!within(0, USHRT_MAX)) return false;
      store(static_cast<uint16_t>(number));
      return true;
    case ParamSlot::kI32:
      if (!within(INT_MIN, INT_MAX)) return false;
      store(static_cast<int32_t>(number));
      return true;
    case ParamSlot::kU32:
      if (!within(0, UINT_MAX)) return false;
      store(static_cast<uint32_t>(number));
      return true;
    case ParamSlot::kI64:
      store(static_cast<int64_t>(number));
      return true;
    default:  // kU64
      if (number < 0) return false;
      store(static_cast<uint64_t>(number));
      return true;
  }
}

}  // namespace

std::string python_type_name(const py::handle& object) {
  auto type = py::type::handle_of(object);
  return py::str(type.attr("__module__")).cast<std::string>() + "." +
         py::str(type.attr("__qualname__")).cast<std::string>();
}

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
  direct.block = 32 * metadata[0].cast<unsigned>();
  direct.shared = metadata[2].cast<unsigned>();
  direct.pdl = py::bool_(py::getattr(launcher_object, "launch_pdl", py::bool_(false)));
  direct.cooperative =
      py::bool_(py::getattr(launcher_object, "launch_cooperative_grid", py::bool_(false)));
  direct.function = reinterpret_cast<cuda::CUfunction>(compiled.attr("function").cast<uint64_t>());
  auto signature = compiled.attr("src").attr("signature").cast<py::dict>();
  if (signature.size() != num_params || num_params > kMaxParams) {
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

bool DirectLaunch::launch(int64_t device, uint64_t stream, const std::array<py::object, 3>& dims,
                          c10::ArrayRef<PyObject*> values) const {
  std::array<long long, 3> grid{};
  for (size_t i = 0; i < 3; ++i) {
    int overflow = 0;
    grid[i] =
        PyLong_Check(dims[i].ptr()) ? PyLong_AsLongLongAndOverflow(dims[i].ptr(), &overflow) : -1;
    if (overflow != 0 || grid[i] < 0 || grid[i] > INT_MAX) return false;
  }
  std::array<uint64_t, kMaxParams + 2> storage{};
  std::array<void*, kMaxParams + 2> params{};
  size_t count = 0;
  for (const auto& [index, slot] : slots) {
    if (!pack(slot, values[index], &storage[count])) return false;
    params[count] = &storage[count];
    ++count;
  }
  params[count] = &storage[count];  // global scratch: none (checked in of())
  ++count;
  params[count] = &storage[count];  // profile scratch: none
  if (grid[0] == 0 || grid[1] == 0 || grid[2] == 0) return true;

  const auto* d = cuda::driver();
  cuda::make_context_current(*d, static_cast<int>(device));
  auto cu_stream = reinterpret_cast<cuda::CUstream>(stream);
  cuda::CUresult result;
  {
    py::gil_scoped_release no_gil;
    if (!pdl && !cooperative) {
      result = d->cuLaunchKernel(function, static_cast<unsigned>(grid[0]),
                                 static_cast<unsigned>(grid[1]), static_cast<unsigned>(grid[2]),
                                 block, 1, 1, shared, cu_stream, params.data(), nullptr);
    } else {
      std::array<cuda::LaunchAttribute, 2> attributes{};
      unsigned num_attributes = 0;
      if (pdl) {
        auto& a = attributes[num_attributes++];
        a.id = cuda::kLaunchAttrProgrammaticStreamSerialization;
        a.value.programmatic_stream_serialization_allowed = 1;
      }
      if (cooperative) {
        auto& a = attributes[num_attributes++];
        a.id = cuda::kLaunchAttrCooperative;
        a.value.cooperative = 1;
      }
      cuda::LaunchConfig config{static_cast<unsigned>(grid[0]),
                                static_cast<unsigned>(grid[1]),
                                static_cast<unsigned>(grid[2]),
                                block,
                                1,
                                1,
                                shared,
                                cu_stream,
                                attributes.data(),
                                num_attributes};
      result = d->cuLaunchKernelEx(&config, function, params.data(), nullptr);
    }
  }
  TORCH_CHECK(result == cuda::kSuccess, "opreg: launching Triton kernel '", name, "' with grid (",
              grid[0], ", ", grid[1], ", ", grid[2], ") on cuda:", device,
              " failed: ", cuda::error_text(result));
  return true;
}

}  // namespace opreg::python
