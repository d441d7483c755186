// include/opreg/device_types.h: the registry of accelerated device types that kernels serve by
// default, and the mapping from a device-type name to PyTorch's dispatch key.
#pragma once

#include <optional>
#include <string>
#include <vector>

#include <c10/core/DispatchKey.h>

#include "opreg/export.h"

namespace opreg {

// The device types a kernel serves when its declaration names none. Initially {"cuda"}.
OPREG_API std::vector<std::string> accelerated_device_types();

// Adds `name` (stripped, lower-cased) to the registry. Ops defined earlier whose kernels follow the
// registry are registered for the new type at once. Returns the normalised name. Inside
// opreg::load_library a refused name fails the load (and "" is returned), as a definition's error.
OPREG_API std::string register_accelerated_device_type(const std::string& name);

// The dense dispatch key of a device type ("cuda" -> CUDA), or nullopt with `why_not` set when the
// running PyTorch does not know the type.
OPREG_API std::optional<c10::DispatchKey> dispatch_key_for_device_type(const std::string& name,
                                                                       std::string* why_not);

// "cuda" from " CUDA ", as EvoX's register_triton_device_type normalises names.
OPREG_API std::string normalize_device_type(const std::string& name);

}  // namespace opreg
