// src/triton/launch.cpp: see the header.
#include "launch.h"

#include <c10/util/Half.h>

#include <cmath>
#include <cstring>
#include <unordered_map>

namespace opreg::triton {

std::optional<ParamType> param_type_of(const std::string& type) {
  if (!type.empty() && type[0] == '*') return ParamType::kPointer;
  static const auto& types = *new std::unordered_map<std::string, ParamType>{
      {"i1", ParamType::kI1},    {"i8", ParamType::kI8},     {"i16", ParamType::kI16},
      {"i32", ParamType::kI32},  {"i64", ParamType::kI64},   {"u8", ParamType::kU8},
      {"u16", ParamType::kU16},  {"u32", ParamType::kU32},   {"u64", ParamType::kU64},
      {"fp16", ParamType::kF16}, {"bf16", ParamType::kBF16}, {"fp32", ParamType::kF32},
      {"fp64", ParamType::kF64}};
  auto found = types.find(type);
  if (found == types.end()) return std::nullopt;
  return found->second;
}

bool is_float_type(ParamType type) {
  return type == ParamType::kF16 || type == ParamType::kBF16 || type == ParamType::kF32 ||
         type == ParamType::kF64;
}

bool is_integer_type(ParamType type) { return type != ParamType::kPointer && !is_float_type(type); }

int param_size(ParamType type) {
  switch (type) {
    case ParamType::kI1:
    case ParamType::kI8:
    case ParamType::kU8:
      return 1;
    case ParamType::kI16:
    case ParamType::kU16:
    case ParamType::kF16:
    case ParamType::kBF16:
      return 2;
    case ParamType::kI32:
    case ParamType::kU32:
    case ParamType::kF32:
      return 4;
    default:
      return 8;
  }
}

std::pair<int64_t, int64_t> integer_range(ParamType type) {
  switch (type) {
    case ParamType::kI1:
      return {0, 1};
    case ParamType::kI8:
      return {INT8_MIN, INT8_MAX};
    case ParamType::kU8:
      return {0, UINT8_MAX};
    case ParamType::kI16:
      return {INT16_MIN, INT16_MAX};
    case ParamType::kU16:
      return {0, UINT16_MAX};
    case ParamType::kI32:
      return {INT32_MIN, INT32_MAX};
    case ParamType::kU32:
      return {0, UINT32_MAX};
    default:
      return {INT64_MIN, INT64_MAX};
  }
}

bool pack_integer(ParamType type, int64_t value, uint64_t* slot) {
  const auto [low, high] = integer_range(type);
  if (value < low || value > high) return false;
  // Two's complement; on little-endian hosts (every CUDA host) the low bytes are the value.
  const auto bits = static_cast<uint64_t>(value);
  *slot = 0;
  std::memcpy(slot, &bits, param_size(type));
  return true;
}

namespace {

// The double rounded to float toward zero, its last bit set when inexact ("round to odd"): then
// rounding that float to fp16 (nearest even) gives the double correctly rounded to fp16, as
// Python's PyFloat_Pack2 (Triton's pack_fp16) does, with no double rounding.
float round_to_odd_float(double value) {
  float narrow = static_cast<float>(value);
  if (!std::isfinite(narrow) || static_cast<double>(narrow) == value) return narrow;
  uint32_t bits;
  std::memcpy(&bits, &narrow, sizeof(bits));
  if (std::fabs(static_cast<double>(narrow)) > std::fabs(value)) --bits;  // magnitude down
  bits |= 1;
  std::memcpy(&narrow, &bits, sizeof(bits));
  return narrow;
}

}  // namespace

bool pack_float(ParamType type, double value, uint64_t* slot) {
  *slot = 0;
  switch (type) {
    case ParamType::kF16: {
      const c10::Half half(round_to_odd_float(value));
      if (std::isfinite(value) && std::isinf(static_cast<float>(half))) return false;
      std::memcpy(slot, &half.x, sizeof(half.x));
      return true;
    }
    case ParamType::kBF16: {
      const float single = static_cast<float>(value);
      uint32_t bits;
      std::memcpy(&bits, &single, sizeof(bits));
      const auto upper = static_cast<uint16_t>(bits >> 16);
      std::memcpy(slot, &upper, sizeof(upper));
      return true;
    }
    case ParamType::kF32: {
      const float single = static_cast<float>(value);
      std::memcpy(slot, &single, sizeof(single));
      return true;
    }
    case ParamType::kF64:
      std::memcpy(slot, &value, sizeof(value));
      return true;
    default:
      return false;
  }
}

void pack_pointer(const void* pointer, uint64_t* slot) {
  *slot = 0;
  std::memcpy(slot, &pointer, sizeof(pointer));
}

cuda::CUresult launch_kernel(const cuda::Driver& d, cuda::CUfunction function,
                             const LaunchShape& shape, cuda::CUstream stream, void** params) {
  if (shape.num_ctas == 1 && !shape.pdl && !shape.cooperative) {
    return d.cuLaunchKernel(function, shape.grid_x, shape.grid_y, shape.grid_z, shape.block, 1, 1,
                            shape.shared, stream, params, nullptr);
  }
  std::array<cuda::LaunchAttribute, 3> attributes{};
  unsigned num_attributes = 0;
  if (shape.num_ctas > 1) {
    auto& a = attributes[num_attributes++];
    a.id = cuda::kLaunchAttrClusterDimension;
    a.value.cluster_dim = {shape.num_ctas, 1, 1};
  }
  if (shape.pdl) {
    auto& a = attributes[num_attributes++];
    a.id = cuda::kLaunchAttrProgrammaticStreamSerialization;
    a.value.programmatic_stream_serialization_allowed = 1;
  }
  if (shape.cooperative) {
    auto& a = attributes[num_attributes++];
    a.id = cuda::kLaunchAttrCooperative;
    a.value.cooperative = 1;
  }
  cuda::LaunchConfig config{shape.grid_x * shape.num_ctas,
                            shape.grid_y,
                            shape.grid_z,
                            shape.block,
                            1,
                            1,
                            shape.shared,
                            stream,
                            attributes.data(),
                            num_attributes};
  return d.cuLaunchKernelEx(&config, function, params, nullptr);
}

}  // namespace opreg::triton
