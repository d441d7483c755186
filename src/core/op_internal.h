// src/core/op_internal.h: the kernels that every op's definition gets, one per dispatch key
// family, each built in its own file (autograd.cpp, vmap.cpp), and what the rest of the core
// reads from the op registry.
#pragma once

#include <memory>
#include <optional>
#include <string>

#include <ATen/core/boxing/KernelFunction.h>
#include <ATen/core/stack.h>

#include "opreg/registry.h"
#include "spec.h"

namespace opreg::detail {

using IdentityPtr = std::shared_ptr<const OpIdentity>;
using FallbackPtr = std::shared_ptr<const c10::KernelFunction>;

// OPREG_DEBUG=1: calls are also run through the op's fake, and must agree with it
// (src/core/registry.cpp; read once).
bool debug_checks();

// Validates the autograd declaration against the schema; throws naming the op. `fallback` is the
// op's checked fallback, run under autograd when gradients are needed and there is no backward.
c10::KernelFunction make_autograd_kernel(IdentityPtr op, const AutogradDeclaration& autograd,
                                         FallbackPtr fallback);
AutogradSupport autograd_support(const AutogradDeclaration& autograd);

// `autograd` says how the op's autograd serves calls; vmap keeps it for gradients taken through
// a vmapped call (Note [Gradients through vmap]).
c10::KernelFunction make_vmap_kernel(IdentityPtr op, VmapRule rule, const OpFlags& flags,
                                     AutogradSupport autograd, FallbackPtr fallback);
// The FuncTorchVmapMode kernel of random ops; nullopt for the others.
std::optional<c10::KernelFunction> make_randomness_kernel(IdentityPtr op, const OpFlags& flags);
VmapSupport vmap_support(const VmapRule& rule, const OpFlags& flags);

// Calls the op's current fallback (checked, bypassing its kernels) on a boxed stack, after the
// checks of a call; throws for unknown ops.
void call_checked_fallback(const std::string& op, const c10::OperatorHandle& handle,
                           torch::jit::Stack* stack);

// The op's current schema, kept alive with its definition: a replace on another thread frees the
// dispatcher's copy, which OperatorHandle::schema() refers to. Throws for unknown ops.
std::shared_ptr<const c10::FunctionSchema> current_schema(const std::string& op);

// handle.callBoxed(stack) for a stack that holds the call's arguments alone, made by opreg for
// the schema of one definition: safe against a replace that changes the op's schema meanwhile
// (see the definition).
void call_boxed_padded(const c10::OperatorHandle& handle, torch::jit::Stack* stack);

// Checks a boxed call's stack against the op's current schema before anything reads it: enough
// arguments, and a defined tensor for every non-optional Tensor argument.
void check_stack(const std::string& op, const torch::jit::Stack& stack);
// The op's dtypes() rules on a call's arguments: for the pieces that serve calls without the
// checks of a call around them (vmap rules).
void check_stack_dtypes(const std::string& op, const torch::jit::Stack& stack);

// Whether a value is of a schema type that holds no tensor (int, float[], str, Scalar, ...), as
// a call's arguments are checked; src/core/registry.cpp.
bool value_fits(const c10::IValue& value, const c10::Type& type);

// The arguments a return is declared an alias of, through its alias sets and its elements'
// (`Tensor(a)[]`); none for a return without one, or where a wildcard argument may hold anything.
std::vector<size_t> alias_arguments_of(const c10::FunctionSchema& schema, const c10::Argument& ret);

[[noreturn]] void throw_no_fake(const std::string& op, const std::string& reason);

// Refuses two tensors among a piece's outputs (the elements of a Tensor[] too) on one memory,
// where the schema declares neither an alias (declared_alias: per output); src/core/registry.cpp.
void check_outputs_apart(const std::string& op, const std::string& schema_text,
                         c10::ArrayRef<c10::IValue> outputs,
                         const std::vector<bool>& declared_alias, const std::string& impl);

// Whether two tensors with storage share memory: one storage, or two on the same bytes (numpy,
// from_blob or DLPack wrap one's memory in a storage of their own), as the output checks compare.
bool share_memory(const at::Tensor& a, const at::Tensor& b);

}  // namespace opreg::detail
