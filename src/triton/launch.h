// src/triton/launch.h: how a Triton-compiled kernel is launched, shared by the AOT launcher
// (kernel.cpp) and opreg._C's cached JIT launches (src/python/jit_cache/direct_launch.cpp): the
// parameter types, their packing into 8-byte slots as Triton's CUDA launcher packs them, and the
// one call of cuLaunchKernel(Ex) with the launch attributes the kernel asks for. No Python here.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <utility>

#include "cuda_driver.h"

namespace opreg::triton {

// Whether `name` can name a kernel: a C identifier, as the AOT compiler requires (it names files
// and C++ symbols), so the only names a bundle can register.
bool is_identifier(const std::string& name);

// A kernel parameter's type, as Triton's signatures spell it ("*fp32" -> kPointer, "i32", ...).
enum class ParamType : uint8_t {
  kPointer,
  kI1,
  kI8,
  kI16,
  kI32,
  kI64,
  kU8,
  kU16,
  kU32,
  kU64,
  kF16,
  kBF16,
  kF32,
  kF64
};

// The type a signature names; nullopt for anything else ("constexpr", tuples, descriptors, and
// spellings python -m opreg.aot refuses, such as "u1"): the list is SCALAR_SIZES in
// python/opreg/aot/compile.py, plus pointers.
OPREG_API std::optional<ParamType> param_type_of(const std::string& type);
OPREG_API bool is_integer_type(ParamType type);
OPREG_API bool is_float_type(ParamType type);
// Bytes the kernel reads for the parameter.
OPREG_API int param_size(ParamType type);
// The values an integer parameter holds.
OPREG_API std::pair<int64_t, int64_t> integer_range(ParamType type);

// Writes a parameter's bytes into its slot, as the kernel reads them. Integers: false (slot
// untouched) when out of the type's range. Floats as Triton's launcher converts a Python float:
// fp16 rounded to nearest even from the double (false when a finite value overflows fp16),
// bf16 the upper half of the float32 (truncated), fp32 rounded to nearest.
OPREG_API bool pack_integer(ParamType type, int64_t value, uint64_t* slot);
OPREG_API bool pack_float(ParamType type, double value, uint64_t* slot);
OPREG_API void pack_pointer(const void* pointer, uint64_t* slot);

constexpr size_t kMaxParams = 64;

// A launch's parameters: the packed slots and the pointer array cuLaunchKernel reads. Triton's
// kernels take two more pointers after their own parameters (global and profile scratch).
class PackedParams {
 public:
  // The next slot, zeroed; nullptr when kMaxParams + 2 are in use.
  uint64_t* next() {
    if (count_ == slots_.size()) return nullptr;
    slots_[count_] = 0;
    pointers_[count_] = &slots_[count_];
    return &slots_[count_++];
  }
  void** data() { return pointers_.data(); }
  size_t size() const { return count_; }

 private:
  std::array<uint64_t, kMaxParams + 2> slots_;
  std::array<void*, kMaxParams + 2> pointers_;
  size_t count_ = 0;
};

// What cuLaunchKernel(Ex) is told besides the function, the stream and the parameters.
struct LaunchShape {
  unsigned grid_x = 1, grid_y = 1, grid_z = 1;  // programs; each is num_ctas CTAs along x
  unsigned block = 128;                         // threads per CTA (32 * num_warps)
  unsigned shared = 0;                          // dynamic shared memory, bytes
  unsigned num_ctas = 1;                        // CTAs per cluster
  bool pdl = false, cooperative = false;        // programmatic dependent launch, cooperative grid
};

// Launches on `stream` in the current context: cuLaunchKernel, or cuLaunchKernelEx with the
// cluster, PDL and cooperative attributes when the shape needs any.
OPREG_API cuda::CUresult launch_kernel(const cuda::Driver& d, cuda::CUfunction function,
                                       const LaunchShape& shape, cuda::CUstream stream,
                                       void** params);

}  // namespace opreg::triton
