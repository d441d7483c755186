// src/core/op_internal.h: the kernels that every op's definition gets, one per dispatch key
// family, each built in its own file (autograd.cpp, vmap.cpp), and what the rest of the core
// reads from the op registry.
#pragma once

#include <memory>
#include <optional>
#include <string>

#include <ATen/core/boxing/KernelFunction.h>

#include "opreg/op.h"

namespace opreg::detail {

// Validates the autograd declaration against the schema; throws naming the op.
c10::KernelFunction make_autograd_kernel(const OpSpec& spec, const c10::FunctionSchema& schema);
std::string describe_autograd(const OpSpec& spec);

c10::KernelFunction make_vmap_kernel(const OpSpec& spec);
// The FuncTorchVmapMode kernel of random ops; nullopt for the others.
std::optional<c10::KernelFunction> make_randomness_kernel(const OpSpec& spec);
std::string describe_vmap(const OpSpec& spec);

// The op's current fallback, callable boxed (bypassing its kernels); throws for unknown ops.
std::shared_ptr<const c10::KernelFunction> fallback_kernel_of(const std::string& op);

// Checks a boxed call's stack against the op's current schema before anything reads it: enough
// arguments, and a defined tensor for every non-optional Tensor argument.
void check_stack(const std::string& op, const torch::jit::Stack& stack);

}  // namespace opreg::detail
