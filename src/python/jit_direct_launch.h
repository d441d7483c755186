// src/python/jit_direct_launch.h: launching, from C++, a kernel that Triton's JIT compiled and
// loaded: its CUfunction with the parameters packed as Triton's CUDA launcher packs them, on
// the stream given. What jit_launch.cpp does on a cache hit, with no Python in between.
#pragma once

#include <c10/util/ArrayRef.h>
#include <torch/csrc/utils/pybind.h>

#include <array>
#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "../triton/cuda_driver.h"

namespace opreg::python {

// A parameter as Triton's CUDA launcher passes it (the compiled kernel's `signature`).
enum class ParamSlot : uint8_t {
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

struct DirectLaunch {
  triton::cuda::CUfunction function = nullptr;
  unsigned block = 0, shared = 0;
  bool pdl = false, cooperative = false;
  std::vector<std::pair<size_t, ParamSlot>> slots;  // (parameter index, how it is passed)
  std::string name;

  // How to launch `compiled` (a Triton CompiledKernel whose handles are loaded) with
  // `num_params` parameters from C++; nullopt, with why, when only Triton's launcher can
  // (another launcher, clusters, scratch memory, tuple or tensor-descriptor parameters).
  static std::optional<DirectLaunch> of(const pybind11::object& compiled, size_t num_params,
                                        std::string* why_not);

  // Launches with every parameter's value, in order; false (and nothing launched) when a value
  // is one only Triton's launcher takes: a CPU tensor, a raw address, an integer out of its
  // type's range, a grid size that is not a non-negative int.
  bool launch(int64_t device, uint64_t stream, const std::array<pybind11::object, 3>& dims,
              c10::ArrayRef<PyObject*> values) const;
};

// "module.QualifiedName" of an object's type.
std::string python_type_name(const pybind11::handle& object);

}  // namespace opreg::python
