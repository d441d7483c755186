// src/core/registry_internal.h: what other parts of the core read from the op registry.
#pragma once

#include <memory>
#include <string>

#include <ATen/core/boxing/KernelFunction.h>

namespace opreg::detail {

// The op's fallback, callable boxed (bypassing its kernels); throws for unknown ops.
std::shared_ptr<c10::KernelFunction> fallback_kernel_of(const std::string& op);

}  // namespace opreg::detail
