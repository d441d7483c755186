// src/python/jit_cache/direct_launch.h: the direct half of the JIT launch cache: launching, from
// C++, a kernel that Triton's JIT compiled and loaded (its CUfunction, the parameters packed by
// src/triton/launch.h as Triton's CUDA launcher packs them, on the stream given), with no Python
// in between. Without it, cache hits go through Triton's compiled launcher (jit_cache.cpp).
#pragma once

#include <c10/util/ArrayRef.h>
#include <torch/csrc/utils/pybind.h>

#include <array>
#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "../../triton/launch.h"

namespace opreg::python {

struct DirectLaunch {
  triton::cuda::CUfunction function = nullptr;
  triton::LaunchShape shape;                                 // grid filled in per launch
  std::vector<std::pair<size_t, triton::ParamType>> params;  // (parameter index, type)
  std::string name;

  // How to launch `compiled` (a Triton CompiledKernel whose handles are loaded) with
  // `num_params` parameters from C++; nullopt, with why, when only Triton's launcher can
  // (another launcher, clusters, scratch memory, tuple or tensor-descriptor parameters).
  static std::optional<DirectLaunch> of(const pybind11::object& compiled, size_t num_params,
                                        std::string* why_not);

  // Launches with every parameter's value, in order; false (and nothing launched) when a value
  // is one only Triton's launcher takes: a CPU tensor, a raw address, an integer out of its
  // type's range, a finite float beyond fp16, a grid size that is not a non-negative int.
  bool launch(int64_t device, uint64_t stream, const std::array<pybind11::object, 3>& dims,
              c10::ArrayRef<PyObject*> values) const;
};

// opreg._C._jit_cache_pack (tests): one Python value packed as the direct launch packs it.
void bind_direct_launch(pybind11::module& m);

}  // namespace opreg::python
