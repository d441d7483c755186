// src/core/vmap.cpp: the FuncTorchBatched-key kernel of every opreg op.
//
// Note [vmap of opreg ops]
// PyTorch has no public C++ API for batching rules; its Python torch.library.register_vmap costs a
// Python round trip per call and is not reachable from C++-only programs. opreg registers one
// boxed C++ kernel at FuncTorchBatched per op and uses functorch's exported plumbing
// (maybeCurrentDynamicLayer, unwrapTensorAtLevel, makeBatched), the same calls PyTorch's
// generated batching plumbing makes. At each vmap level the kernel either
//   - calls the op's rule on the unwrapped arguments,
//   - moves the batch dims to the front and calls the op once (batch-polymorphic ops), or
//   - runs the fallback on the batched tensors, so PyTorch batches its ATen ops, or
//   - loops over the examples, when the op asked for it (warned once per op).
// Nested vmap needs nothing more: each level unwraps one layer and calls the op again, which
// reaches this kernel for the next level down. Rules written in Python (the EvoX-style front)
// are registered the same way, as C++ rules that call back into Python.
#include "opreg/vmap.h"

#include <ATen/ATen.h>
#include <ATen/MemoryOverlap.h>
#include <ATen/functorch/BatchedTensorImpl.h>
#include <ATen/functorch/DynamicLayer.h>
#include <ATen/functorch/PlumbingHelper.h>
#include <ATen/functorch/TensorWrapper.h>
#include <c10/core/WrapDimMinimal.h>
#include <c10/core/impl/LocalDispatchKeySet.h>
#include <c10/util/Exception.h>
#include <c10/util/ScopeExit.h>
#include <torch/library.h>

#include <algorithm>
#include <cmath>
#include <mutex>

#include "op_internal.h"
#include "opreg/detail/schema_types.h"
#include "opreg/detail/typed_kernels.h"
#include "opreg/trace.h"
#include "transform_levels.h"

namespace opreg {
namespace {

namespace functorch = at::functorch;

Randomness randomness_of(const functorch::DynamicLayer& layer) {
  switch (layer.randomness()) {
    case functorch::RandomnessType::Same:
      return Randomness::kSame;
    case functorch::RandomnessType::Different:
      return Randomness::kDifferent;
    default:
      return Randomness::kError;
  }
}

struct Unwrapped {
  std::vector<c10::IValue> values;
  std::vector<std::optional<int64_t>> in_dims;
  bool any_batched = false;
};

// The sizes of `value` with the batch in front (symbolic under torch.compile's dynamic shapes).
std::vector<c10::SymInt> with_batch(const at::Tensor& value, const c10::SymInt& batch_size) {
  std::vector<c10::SymInt> sizes{batch_size};
  sizes.insert(sizes.end(), value.sym_sizes().begin(), value.sym_sizes().end());
  return sizes;
}

// A Tensor[] or Tensor?[] argument with `fn` applied to each of its tensors (None kept).
template <class Fn>
c10::IValue map_tensor_list(const c10::IValue& list, Fn&& fn) {
  if (list.isTensorList()) {
    c10::List<at::Tensor> mapped;
    for (const at::Tensor& element : list.toTensorList()) mapped.push_back(fn(element));
    return mapped;
  }
  c10::List<std::optional<at::Tensor>> mapped;
  for (const c10::IValue& element : list.toListRef()) {
    if (element.isTensor() && element.toTensor().defined()) {
      mapped.push_back(fn(element.toTensor()));
    } else {
      mapped.push_back(std::nullopt);
    }
  }
  return mapped;
}

bool is_tensor_list(const c10::IValue& value) {
  return value.isTensorList() || value.isOptionalTensorList();
}

// A Tensor[] (or Tensor?[]) argument is batched as a whole: when any of its tensors is batched,
// each gets the batch at dim 0 (unbatched ones expanded, a view; None stays None) and its in_dim
// is 0.
Unwrapped unwrap(const std::vector<c10::IValue>& args, int64_t level,
                 const c10::SymInt& batch_size) {
  Unwrapped unwrapped;
  for (const auto& arg : args) {
    if (arg.isTensor() && arg.toTensor().defined()) {
      auto [value, bdim] = functorch::unwrapTensorAtLevel(arg.toTensor(), level);
      unwrapped.any_batched = unwrapped.any_batched || bdim.has_value();
      unwrapped.values.emplace_back(std::move(value));
      unwrapped.in_dims.push_back(bdim);
    } else if (is_tensor_list(arg)) {
      bool any_batched = false;
      for (const c10::IValue& element : arg.toListRef()) {
        any_batched = any_batched || (element.isTensor() &&
                                      functorch::isBatchedAtLevel(element.toTensor(), level));
      }
      unwrapped.values.push_back(map_tensor_list(arg, [&](const at::Tensor& element) {
        auto [value, bdim] = functorch::unwrapTensorAtLevel(element, level);
        if (!any_batched) return value;
        return bdim ? value.movedim(*bdim, 0)
                    : value.unsqueeze(0).expand_symint(with_batch(value, batch_size));
      }));
      unwrapped.any_batched = unwrapped.any_batched || any_batched;
      unwrapped.in_dims.push_back(any_batched ? std::optional<int64_t>(0) : std::nullopt);
    } else {
      unwrapped.values.push_back(arg);
      unwrapped.in_dims.push_back(std::nullopt);
    }
  }
  return unwrapped;
}

}  // namespace

// Note [Gradients through vmap]
// When autograd records below a vmap level (an input requires grad outside torch.vmap, or a
// grad/jvp transform wraps it), the fallback run on batched tensors is recorded ATen op by ATen
// op: right for the 'fallback' policy (its eager calls record the same ops), but it would skip an
// op's own backward and its 'error' and 'none' policies. So for those ops such calls keep the
// op's autograd: 'error' refuses as the eager call does, 'none' runs the fallback with gradients
// off, and an op with a backward is called once per example, each call recording the op's node
// (torch.library's default vmap does the same). Forward-mode tangents take the fallback in eager
// calls too (the autograd kernel's step 2), so they keep the batched fallback. A vmap_fn (the
// Python front's batched fallback) is held to the same (python/opreg/_vmap.py). The loop stacks
// the examples' outputs into new tensors, so an op whose schema declares an output a view of an
// input is refused there rather than silently copied, and the loop, running per example, needs
// the batch size as a number (under tracing, the graph is specialized to it); a batch of no
// examples takes the fallback, whose empty outputs keep the graph. A replace racing the loop is
// refused, as for the other paths that call the op again (call it again).
detail::GradientsBelow detail::gradients_below(const std::vector<c10::IValue>& args) {
  detail::GradientsBelow found;
  // Every layer under this one: an outer vmap's BatchedTensor hides the tensor that requires grad.
  auto look_at = [&](const c10::IValue& value) {
    if (!value.isTensor()) return;
    at::Tensor tensor = value.toTensor();
    while (tensor.defined()) {
      found.reverse = found.reverse || tensor.requires_grad();
      found.forward = found.forward || tensor._fw_grad(/*level=*/0).defined();
      if (const auto* batched = functorch::maybeGetBatchedImpl(tensor)) {
        tensor = batched->value();
      } else if (const auto* wrapper = functorch::maybeGetTensorWrapper(tensor)) {
        tensor = wrapper->value();
      } else {
        break;
      }
    }
  };
  for (const auto& arg : args) {
    if (arg.isList()) {
      for (const auto& element : arg.toListRef()) look_at(element);
    } else {
      look_at(arg);
    }
  }
  found.reverse = found.reverse && c10::GradMode::is_enabled();
  return found;
}

namespace {

// Calls the op on plain (unwrapped) arguments, below this vmap level.
std::vector<c10::IValue> call_below(const c10::OperatorHandle& op, std::vector<c10::IValue> args) {
  c10::impl::ExcludeDispatchKeyGuard guard(c10::DispatchKey::FuncTorchBatched);
  torch::jit::Stack stack(std::move(args));
  detail::call_boxed_padded(op, &stack);
  return stack;
}

class VmapKernel final : public c10::OperatorKernel {
 public:
  VmapKernel(detail::IdentityPtr op, VmapRule rule, const OpFlags& flags, AutogradSupport autograd,
             detail::FallbackPtr fallback)
      : op_(std::move(op)),
        rule_(std::move(rule)),
        random_(flags.random),
        batch_polymorphic_(flags.batch_polymorphic),
        per_example_loop_(flags.vmap_per_example_loop),
        autograd_(autograd),
        fallback_(std::move(fallback)) {}

  void operator()(const c10::OperatorHandle& op, c10::DispatchKeySet keys,
                  torch::jit::Stack* stack) {
    auto layer = functorch::maybeCurrentDynamicLayer();
    // Reached outside torch.vmap by a BatchedTensor kept from inside one (PyTorch's own batch
    // rules say the same of such a tensor).
    TORCH_CHECK(layer.has_value(), op_->name,
                ": called with a tensor batched by torch.vmap outside any vmap; it escaped from "
                "the function being vmapped (returned through a side channel, a global or a "
                "closure): use only the tensors vmap returns");
    const int64_t level = layer->layerId();
    const auto randomness = randomness_of(*layer);
    TORCH_CHECK(!random_ || randomness != Randomness::kError, op_->name,
                ": the op is random, and vmap was called with randomness='error'; pass "
                "randomness='same' or 'different' to torch.vmap");

    const size_t num_args = op_->schema.arguments().size();
    const size_t num_returns = op_->schema.returns().size();
    std::vector<c10::IValue> args(stack->end() - num_args, stack->end());

    // Without a rule, only the fallback's own random ops, run at this vmap level, can draw the
    // same numbers for every example.
    const bool same_draws = random_ && randomness == Randomness::kSame;
    const bool polymorphic_call = batch_polymorphic_ && same_logical_rank(args);
    bool loop_for_backward = false;
    if (!rule_ && (same_draws || (!polymorphic_call && !per_example_loop_))) {
      if (autograd_ == AutogradSupport::kFallback) return run_fallback(op, keys, stack);
      const auto gradients = detail::gradients_below(args);
      if (!gradients.reverse && !gradients.forward) return run_fallback(op, keys, stack);
      refuse_under_error_policy(gradients);
      if (autograd_ == AutogradSupport::kNone) {
        c10::AutoGradMode no_grad(false);
        c10::AutoFwGradMode no_forward_grad(false);
        return run_fallback(op, keys, stack);
      }
      if (!gradients.reverse) return run_fallback(op, keys, stack);
      // No example to call the op on: the fallback's outputs, empty, are what keeps the graph
      // (its gradients are empty too).
      if (layer->batchSize().maybe_as_int() == std::optional<int64_t>(0)) {
        return run_fallback(op, keys, stack);
      }
      TORCH_CHECK(!same_draws, op_->name,
                  ": under vmap with randomness='same', an input requires grad, and the op's "
                  "backward needs it called once per example, which draws different numbers for "
                  "each; give the op a vmap rule, or use randomness='different'");
      refuse_view_outputs(
          "an input requires grad, and the op's backward needs it called once per "
          "example");
      loop_for_backward = true;
    }
    // Symbolic under tracing with a dynamic batch: only the per-example loops need a number (and
    // so specialize it).
    const c10::SymInt batch_size = layer->batchSize();
    auto unwrapped = unwrap(args, level, batch_size);
    refuse_shared_writes(unwrapped);
    torch::jit::drop(*stack, num_args);
    const bool expand_all = random_ && randomness == Randomness::kDifferent;
    if (!unwrapped.any_batched && !expand_all) {
      auto outputs = call_below(op, std::move(unwrapped.values));
      for (auto& output : outputs) stack->push_back(std::move(output));
      return;
    }

    VmapResult result;
    std::vector<c10::IValue> unwrapped_inputs;  // for the alias check of the rule's outputs
    if (rule_) {
      detail::check_stack_dtypes(op_->name, unwrapped.values);  // the fallback's calls check them
      // A rule's ATen ops are recorded below this level: the 'error' and 'none' policies hold as
      // in an eager call (Note [Gradients through vmap]).
      std::optional<c10::AutoGradMode> no_grad;
      std::optional<c10::AutoFwGradMode> no_forward_grad;
      if (autograd_ == AutogradSupport::kError || autograd_ == AutogradSupport::kNone) {
        const auto gradients = detail::gradients_below(args);
        refuse_under_error_policy(gradients);
        if (gradients.reverse || gradients.forward) {
          no_grad.emplace(false);
          no_forward_grad.emplace(false);
        }
      }
      unwrapped_inputs = unwrapped.values;
      trace("vmap:rule", unwrapped);
      c10::impl::ExcludeDispatchKeyGuard guard(c10::DispatchKey::FuncTorchBatched);
      detail::run_below_transform_level([&] {
        result = detail::run_user_code_named<VmapResult>(op_->name, "the vmap rule", [&] {
          return rule_(VmapInfo{batch_size, randomness}, unwrapped.in_dims, unwrapped.values);
        });
      });
    } else if (polymorphic_call) {
      trace("vmap:batch-polymorphic", unwrapped);
      // The op is called again: by name, so a replace racing this call would have it run the
      // other definition's fallback, which may not take the batch in front.
      check_still_current("its definition now may not take the batch in front");
      result = batch_polymorphic(op, std::move(unwrapped), batch_size);
      check_still_current("its definition now may not take the batch in front");
    } else {
      if (!loop_for_backward) {
        refuse_view_outputs("the op asked to be called once per example (vmap_per_example_loop)");
        warn_once_about_loop();
      }
      trace("vmap:per-example loop", unwrapped);
      // Called by name once per example: a replace racing the loop would mix two definitions
      // in one result.
      check_still_current("the examples would mix two definitions");
      result = per_example_loop(op, unwrapped, batch_size.guard_int(__FILE__, __LINE__));
      check_still_current("the examples would mix two definitions");
    }
    // Batch-polymorphic ops promise their outputs keep the batch as dim 0; the checks say so.
    const char* source = rule_              ? "the vmap rule"
                         : polymorphic_call ? "the batch-polymorphic call"
                                            : "the per-example loop";
    const char* promise =
        rule_ || !polymorphic_call
            ? ""
            : " (an op declared batch_polymorphic keeps the batch as its outputs' first dim)";
    TORCH_CHECK(result.outputs.size() == num_returns, op_->name, ": ", source, " returned ",
                result.outputs.size(), " outputs, expected ", num_returns);
    TORCH_CHECK(result.out_dims.size() == num_returns, op_->name, ": ", source, " returned ",
                result.out_dims.size(), " out_dims, expected ", num_returns, " (one per output)");
    // sweep 45 B-N1/B-N2: a rule's output on another device, or two outputs on one memory,
    // were passed on (a fallback's are refused).
    const std::optional<c10::Device> rule_device =
        rule_ ? single_device(unwrapped_inputs) : std::nullopt;
    if (rule_) check_rule_outputs_apart(result.outputs);
    for (size_t i = 0; i < num_returns; ++i) {
      auto& output = result.outputs[i];
      if (rule_) check_rule_output(output, i);
      // A rule's tensor output: on its inputs' device, apart from them unless declared an alias.
      auto check_rule_tensor = [&](const at::Tensor& tensor, size_t index) {
        if (!rule_) return;
        if (rule_device && tensor.device() != *rule_device) {
          TORCH_CHECK(false, op_->name, ": the vmap rule returned output ", index, " on ",
                      tensor.device(), ", expected ", *rule_device, " (the device of its inputs)");
        }
        if (op_->schema.returns()[index].alias_info() == nullptr) {
          check_no_alias(tensor, unwrapped_inputs, index);
        } else {
          check_declared_alias(tensor, unwrapped_inputs, index);
        }
      };
      // C++'s None: fine where the schema allows one.
      auto check_undefined_allowed = [&]() {
        const auto& type = op_->schema.returns()[i].type();
        const auto* list = type->castRaw<c10::ListType>();
        const auto& element = list != nullptr ? list->getElementType() : type;
        TORCH_CHECK_TYPE(element->kind() == c10::TypeKind::OptionalType, op_->name, ": ", source,
                         " returned an undefined tensor for output ", i, ", declared ", type->str(),
                         " in the schema; expected a tensor");
      };
      auto batched = [&](const at::Tensor& tensor) {
        if (!tensor.defined()) {
          check_undefined_allowed();
          return tensor;
        }
        const int64_t dim = *result.out_dims[i];
        TORCH_CHECK(dim >= -tensor.dim() && dim < tensor.dim(), op_->name, ": ", source,
                    " gave out_dim ", dim, " for output ", i, ", which has ", tensor.dim(), " dims",
                    promise);
        // sym_size: under torch.compile with dynamic shapes the sizes are symbolic.
        TORCH_CHECK(tensor.sym_size(dim) == batch_size, op_->name, ": ", source,
                    " returned output ", i, " with ", tensor.sym_size(dim),
                    " entries along its batch dim ", dim, ", expected the batch size ", batch_size,
                    promise);
        check_rule_tensor(tensor, i);
        return functorch::makeBatched(tensor, dim, level);
      };
      if (output.isTensor() && result.out_dims[i].has_value()) {
        stack->push_back(batched(output.toTensor()));
      } else if (is_tensor_list(output) && result.out_dims[i].has_value()) {
        // Every element carries the batch at out_dim (left as it was, the elements would be
        // taken for unbatched ones and given the batch a second time); None stays None.
        stack->push_back(map_tensor_list(output, batched));
      } else {
        // Unbatched (out_dim None): checked as batched ones are (sweep 46 B-F1: one on meta, or
        // the input itself, came out unchecked).
        // An undefined one too (sweep 48 B-V5: it came out as None for a Tensor output).
        auto check_unbatched = [&](const at::Tensor& tensor) {
          if (tensor.defined()) {
            check_rule_tensor(tensor, i);
          } else {
            check_undefined_allowed();
          }
        };
        if (output.isTensor()) {
          check_unbatched(output.toTensor());
        } else if (is_tensor_list(output)) {
          for (const c10::IValue& element : output.toListRef()) {
            if (element.isTensor()) check_unbatched(element.toTensor());
          }
        }
        stack->push_back(std::move(output));
      }
    }
  }

 private:
  // A rule's output must be of its declared kind: passed on as it came, a tensor for a Tensor[]
  // would reach the caller where the op's eager calls give a list, a float for an int a float.
  // As eager calls do, an int is taken for a float.
  void check_rule_output(c10::IValue& output, size_t index) const {
    const auto& type = op_->schema.returns()[index].real_type();  // ScalarType, not its int
    if (!detail::holds_kind(*type, c10::TypeKind::TensorType)) {
      const auto* optional = type->castRaw<c10::OptionalType>();
      const auto kind = (optional ? optional->getElementType() : type)->kind();
      if (kind == c10::TypeKind::FloatType && output.isInt()) output = output.toInt() * 1.0;
      TORCH_CHECK_TYPE(detail::value_fits(output, *type), op_->name, ": the vmap rule returned a ",
                       output.isTensorList() ? "list of tensors" : output.tagKind(), " for output ",
                       index, ", declared ", type->str(),
                       " in the schema; expected a value of that type");
      return;
    }
    const char* expected = nullptr;
    if (type->kind() == c10::TypeKind::ListType && !output.isTensorList() &&
        type->cast<c10::ListType>()->getElementType()->kind() == c10::TypeKind::TensorType) {
      expected = "a list of tensors";
    } else if (type->kind() == c10::TypeKind::TensorType && !output.isTensor()) {
      expected = "a tensor";
    } else if (type->kind() == c10::TypeKind::OptionalType && !output.isTensor() &&
               !output.isNone() &&
               type->cast<c10::OptionalType>()->getElementType()->kind() ==
                   c10::TypeKind::TensorType) {
      expected = "a tensor or None";
    }
    TORCH_CHECK_TYPE(expected == nullptr, op_->name, ": the vmap rule returned a ",
                     output.isTensorList() ? "list of tensors" : output.tagKind(), " for output ",
                     index, ", declared ", type->str(), " in the schema; expected ", expected);
  }

  // The one device of a rule's tensor inputs (CPU scalars aside), where its outputs must be;
  // none where they are on several.
  static std::optional<c10::Device> single_device(const std::vector<c10::IValue>& inputs) {
    std::optional<c10::Device> device;
    bool several = false;
    auto see = [&](const at::Tensor& tensor) {
      if (!tensor.defined() || (tensor.is_cpu() && tensor.dim() == 0)) return;
      several = several || (device && *device != tensor.device());
      device = tensor.device();
    };
    for (const auto& input : inputs) {
      if (input.isTensor()) see(input.toTensor());
      if (input.isTensorList()) {
        for (const at::Tensor& tensor : input.toTensorList()) see(tensor);
      }
    }
    return several ? std::nullopt : device;
  }

  // Two tensors among a rule's outputs (a Tensor[]'s elements too) on one memory, where the
  // schema declares neither an alias.
  void check_rule_outputs_apart(const std::vector<c10::IValue>& outputs) const {
    std::vector<bool> declared_alias;
    for (const auto& ret : op_->schema.returns())
      declared_alias.push_back(ret.alias_info() != nullptr);
    detail::check_outputs_apart(op_->name, op_->schema_text, outputs, declared_alias,
                                "the vmap rule");
  }

  // A rule's output may not share memory with an input unless the schema declares the alias:
  // the caller would see a later write to one in the other.
  void check_no_alias(const at::Tensor& output, const std::vector<c10::IValue>& inputs,
                      size_t index) const {
    if (!output.has_storage()) return;
    auto refuse_shared = [&](const c10::IValue& input) {
      if (!input.isTensor() || !input.toTensor().defined() || !input.toTensor().has_storage()) {
        return;
      }
      TORCH_CHECK(!detail::share_memory(input.toTensor(), output), op_->name,
                  ": the vmap rule returned output ", index,
                  " sharing memory with an input, but the schema '", op_->schema_text,
                  "' declares no alias; return a new tensor (e.g. x.clone())");
    };
    for (const auto& input : inputs) {
      if (input.isList()) {  // a Tensor[]'s elements too
        for (const c10::IValue& element : input.toListRef()) refuse_shared(element);
      } else {
        refuse_shared(input);
      }
    }
  }

  // An output the schema declares an alias of an input must be one under vmap too: a rule that
  // returned a new tensor, or a view of another input, made an in-place change through the output
  // silently miss the input.
  void check_declared_alias(const at::Tensor& output, const std::vector<c10::IValue>& inputs,
                            size_t index) const {
    if (!output.has_storage()) return;
    const auto& schema = op_->schema;
    // Its alias sets' arguments, `Tensor(a)[]` ones included; none where a wildcard may hold it.
    const auto arguments = detail::alias_arguments_of(schema, schema.returns()[index]);
    if (arguments.empty()) return;
    bool comparable = false;  // an input with memory to compare (not a functorch wrapper)
    auto shares = [&](const c10::IValue& input) {
      if (!input.isTensor() || !input.toTensor().defined() || !input.toTensor().has_storage()) {
        return false;
      }
      comparable = true;
      return detail::share_memory(input.toTensor(), output);
    };
    std::string named;
    for (const size_t i : arguments) {
      if (i >= inputs.size()) continue;
      named += (named.empty() ? "'" : ", '") + schema.arguments()[i].name() + "'";
      if (inputs[i].isList()) {
        for (const c10::IValue& element : inputs[i].toListRef()) {
          if (shares(element)) return;
        }
      } else if (shares(inputs[i])) {
        return;
      }
    }
    TORCH_CHECK(!comparable, op_->name, ": the vmap rule returned output ", index,
                " sharing memory with none of ", named, ", but the schema '", op_->schema_text,
                "' declares it an alias of ", named, "; return a view of ", named,
                " (e.g. x.view(...)), so that changes through the output reach it");
  }

  // The per-example loops stack the examples' outputs into new tensors: a view the schema
  // declares would silently become a copy, so such calls are refused.
  void refuse_view_outputs(const char* why) const {
    for (size_t i = 0; i < op_->schema.returns().size(); ++i) {
      TORCH_CHECK(op_->schema.returns()[i].alias_info() == nullptr, op_->name, ": under vmap, ",
                  why, ", whose outputs are stacked into new tensors; but its schema declares ",
                  "output ", i, " a view of an input, which they cannot stay; give the op a ",
                  "vmap rule");
    }
  }

  void check_still_current(const char* why) const {
    TORCH_CHECK(detail::definition_serial(op_->name) == op_->serial, op_->name,
                ": the op was replaced (or undefined) while this vmapped call ran, and ", why,
                "; call it again");
  }

  void trace(const char* how, const Unwrapped& unwrapped) const {
    if (!trace_enabled()) return;
    std::string device = "-";
    for (const auto& value : unwrapped.values) {
      if (value.isTensor()) {
        device = value.toTensor().device().str();
        break;
      }
    }
    detail::record_trace(op_->name, how, device);
  }

  void run_fallback(const c10::OperatorHandle& op, c10::DispatchKeySet keys,
                    torch::jit::Stack* stack) const {
    if (trace_enabled()) detail::record_trace(op_->name, "vmap:fallback", "-");
    // The randomness kernel hid vmap mode from this op; the fallback's random ops must see it to
    // apply vmap's randomness.
    constexpr auto kVmapMode = c10::DispatchKey::FuncTorchVmapMode;
    const bool hidden = c10::impl::tls_is_dispatch_key_excluded(kVmapMode);
    if (random_) c10::impl::tls_set_dispatch_key_excluded(kVmapMode, false);
    const auto restore = c10::make_scope_exit(
        [hidden] { c10::impl::tls_set_dispatch_key_excluded(kVmapMode, hidden); });
    std::optional<torch::jit::Stack> meta;
    if (detail::debug_checks()) meta = one_example_on_meta(*stack);
    try {
      detail::run_at_transform_level([&] { fallback_->callBoxed(op, keys, stack); });
    } catch (c10::Error& error) {
      // The op's own checks (its arguments' dtypes, its outputs) fail the same way outside vmap:
      // no vmap advice.
      if (error.msg().rfind(op_->name + ": ", 0) == 0) throw;
      const std::string& message = error.msg();
      const bool from_vmap = message.find("vmap") != std::string::npos ||
                             message.find("atching rule") != std::string::npos;
      TORCH_CHECK(!from_vmap, op_->name,
                  ": its fallback cannot run under vmap; give the op a vmap rule, declare it "
                  "batch-polymorphic, or ask for the per-example loop. The fallback said: ",
                  error.what_without_backtrace());
      // Anything else may be the fallback's own check, which each example fails outside vmap too:
      // it keeps its type and message.
      error.add_context(c10::str(
          "(raised by the fallback of ", op_->name,
          " under vmap; if the call succeeds without vmap, give the op a vmap rule, declare it "
          "batch-polymorphic, or ask for the per-example loop)"));
      throw;
    }
    if (meta) compare_with_fake(op, std::move(*meta), *stack);
  }

  // OPREG_DEBUG=1 (registry.cpp compares eager calls): the arguments of one example, as meta
  // tensors of the batched tensors' sizes (which are one example's); nullopt when there is
  // nothing to compare: no tensor, or tensors without plain data (meta, fake, symbolic sizes),
  // or a Python dispatch mode, which would see (and a tracer record) the fake's call.
  std::optional<torch::jit::Stack> one_example_on_meta(const torch::jit::Stack& stack) const {
    if (c10::impl::tls_is_dispatch_key_included(c10::DispatchKey::Python)) return std::nullopt;
    const size_t num_args = op_->schema.arguments().size();
    bool any_tensor = false, comparable = true;
    auto to_meta = [&](const at::Tensor& tensor) {
      any_tensor = true;
      at::Tensor data = tensor;
      while (true) {
        if (const auto* batched = functorch::maybeGetBatchedImpl(data)) {
          data = batched->value();
        } else if (const auto* wrapper = functorch::maybeGetTensorWrapper(data)) {
          data = wrapper->value();
        } else {
          break;
        }
      }
      comparable = comparable && !data.is_meta() && data.layout() == at::kStrided &&
                   !data.key_set().has(c10::DispatchKey::Python) &&
                   !data.key_set().has(c10::DispatchKey::Functionalize) &&
                   !data.unsafeGetTensorImpl()->has_symbolic_sizes_strides();
      return comparable ? at::empty(tensor.sizes(), tensor.options().device(at::kMeta)) : tensor;
    };
    torch::jit::Stack meta;
    for (auto it = stack.end() - num_args; it != stack.end(); ++it) {
      if (it->isTensor() && it->toTensor().defined()) {
        meta.emplace_back(to_meta(it->toTensor()));
      } else if (is_tensor_list(*it)) {
        meta.push_back(map_tensor_list(*it, to_meta));
      } else {
        meta.push_back(*it);
      }
    }
    if (!any_tensor || !comparable) return std::nullopt;
    return meta;
  }

  // The fake's outputs for one example against the fallback's, per example: shapes and dtypes.
  // A fake that fails is left to the eager calls' comparison, which tells failures apart.
  void compare_with_fake(const c10::OperatorHandle& op, torch::jit::Stack meta,
                         const torch::jit::Stack& stack) const {
    auto still_current = [&] { return detail::definition_serial(op_->name) == op_->serial; };
    if (!still_current()) return;
    try {
      c10::impl::ExcludeDispatchKeyGuard below(
          c10::autograd_dispatch_keyset |
          c10::DispatchKeySet(
              {c10::DispatchKey::FuncTorchBatched, c10::DispatchKey::FuncTorchVmapMode}));
      detail::call_boxed_padded(op, &meta);
    } catch (const std::exception&) {
      return;
    }
    if (!still_current()) return;
    const size_t num_returns = op_->schema.returns().size();
    const std::string impl = "OPREG_DEBUG: " + op_->name + ": the fallback under vmap returned ";
    auto same = [&](const at::Tensor& fake, const at::Tensor& real, const std::string& what) {
      TORCH_CHECK(fake.defined() == real.defined(), impl, what,
                  real.defined() ? " defined" : " None", ", but the op's fake gives ",
                  fake.defined() ? "a tensor" : "None");
      if (!real.defined()) return;
      TORCH_CHECK(fake.sizes() == real.sizes() && fake.scalar_type() == real.scalar_type(), impl,
                  what, " of shape ", real.sizes(), " per example and dtype ", real.scalar_type(),
                  ", but the op's fake gives shape ", fake.sizes(), " and dtype ",
                  fake.scalar_type());
    };
    for (size_t index = 0; index < num_returns && index < meta.size(); ++index) {
      const c10::IValue& fake = meta[index];
      const c10::IValue& real = stack[stack.size() - num_returns + index];
      const std::string what = "output " + std::to_string(index);
      if (fake.isTensorList() && real.isTensorList()) {
        const auto fakes = fake.toTensorList();
        const auto reals = real.toTensorList();
        TORCH_CHECK(fakes.size() == reals.size(), impl, what, " with ", reals.size(),
                    " tensors, but the op's fake gives ", fakes.size());
        for (size_t i = 0; i < reals.size(); ++i) {
          same(fakes.get(i), reals.get(i), what + " element " + std::to_string(i));
        }
      } else if ((fake.isTensor() || fake.isNone()) && (real.isTensor() || real.isNone())) {
        same(fake.isTensor() ? fake.toTensor() : at::Tensor(),
             real.isTensor() ? real.toTensor() : at::Tensor(), what);
      }
    }
  }

  // Note [Batch-polymorphic calls need one rank]: the op gets every tensor argument with the
  // batch as one more leading dim. Per example, arguments of different ranks broadcast aligned
  // from the right ((3,) with (3, 3)); with the batch in front they would not ((B, 3) with
  // (B, 3, 3) pairs the batch with a row). So only calls whose tensor arguments all have one
  // rank (per example) are made batch-polymorphic; the others run the fallback, which PyTorch
  // batches.
  static bool same_logical_rank(const std::vector<c10::IValue>& args) {
    std::optional<int64_t> rank;
    for (const auto& arg : args) {
      if (!arg.isTensor() || !arg.toTensor().defined()) continue;
      const int64_t dim = arg.toTensor().dim();  // a BatchedTensor's dims are per example
      if (rank && *rank != dim) return false;
      rank = dim;
    }
    return true;
  }

  // Every tensor argument gets the batch as its leading dim (unbatched ones are expanded, a
  // view), and the op runs once.
  VmapResult batch_polymorphic(const c10::OperatorHandle& op, Unwrapped unwrapped,
                               const c10::SymInt& batch_size) const {
    auto batch_in_front = [&](const at::Tensor& value, std::optional<int64_t> in_dim) {
      if (!in_dim) return value.unsqueeze(0).expand_symint(with_batch(value, batch_size));
      return *in_dim == 0 ? value : value.movedim(*in_dim, 0);
    };
    for (size_t i = 0; i < unwrapped.values.size(); ++i) {
      auto& value = unwrapped.values[i];
      const auto in_dim = unwrapped.in_dims[i];
      if (value.isTensor()) {
        value = batch_in_front(value.toTensor(), in_dim);
      } else if (is_tensor_list(value)) {
        value = map_tensor_list(
            value, [&](const at::Tensor& element) { return batch_in_front(element, in_dim); });
      }
    }
    VmapResult result;
    result.outputs = call_below(op, std::move(unwrapped.values));
    for (const auto& output : result.outputs) {
      result.out_dims.push_back(
          output.isTensor() || output.isTensorList() ? std::optional<int64_t>(0) : std::nullopt);
    }
    return result;
  }

  // The 'error' policy: a call whose inputs carry gradients (requires grad, a forward tangent).
  void refuse_under_error_policy(const detail::GradientsBelow& gradients) const {
    TORCH_CHECK(autograd_ != AutogradSupport::kError || (!gradients.reverse && !gradients.forward),
                op_->name, ": under vmap, an input ",
                gradients.reverse ? "requires grad" : "has a forward-mode tangent",
                ", but the op has no backward and its autograd policy is 'error'; give it a "
                "backward (.backward(backward, setup_context) in C++, backward= in Python), or "
                "use the 'fallback' policy");
  }

  // Every example would write the one tensor, and the last write would be all that is left (or
  // a rule's reduction over the batch): refused before any runs, on every path that unwraps, as
  // vmap refuses an in-place write of a batch into an unbatched tensor, or into one whose
  // examples share memory (expanded, or an unbatched element of a list batched as a whole, which
  // unwrap() expands). None and empty lists write nothing.
  void refuse_shared_writes(const Unwrapped& unwrapped) const {
    const auto& arguments = op_->schema.arguments();
    for (size_t i = 0; i < arguments.size() && i < unwrapped.in_dims.size(); ++i) {
      const auto* alias = arguments[i].alias_info();
      if (alias == nullptr || !alias->isWrite()) continue;
      std::vector<at::Tensor> written;
      const auto& value = unwrapped.values[i];
      if (value.isTensor() && value.toTensor().defined()) written.push_back(value.toTensor());
      if (is_tensor_list(value)) {
        for (const auto& element : value.toListRef()) {
          if (element.isTensor() && element.toTensor().defined()) {
            written.push_back(element.toTensor());
          }
        }
      }
      if (written.empty()) continue;
      TORCH_CHECK(unwrapped.in_dims[i].has_value() || !unwrapped.any_batched, op_->name,
                  ": vmap over this op writes argument '", arguments[i].name(),
                  "', which is not batched while another argument is: each example would write "
                  "it in turn; batch it too (vmap writes a batch only into batched tensors)");
      for (const auto& tensor : written) {
        TORCH_CHECK(
            !unwrapped.in_dims[i] || at::has_internal_overlap(tensor) != at::MemOverlap::Yes,
            op_->name, ": vmap over this op writes argument '", arguments[i].name(),
            "', whose examples share memory (an expanded tensor, or an unbatched tensor "
            "in a list whose other tensors are batched): each example would write it in "
            "turn; give every example its own memory (e.g. .clone() it)");
      }
    }
  }

  VmapResult per_example_loop(const c10::OperatorHandle& op, const Unwrapped& unwrapped,
                              int64_t batch_size) const {
    if (batch_size == 0) return empty_batch(op, unwrapped);
    std::vector<std::vector<c10::IValue>> per_output;
    for (int64_t b = 0; b < batch_size; ++b) {
      std::vector<c10::IValue> args;
      for (size_t i = 0; i < unwrapped.values.size(); ++i) {
        const auto& value = unwrapped.values[i];
        const auto& in_dim = unwrapped.in_dims[i];
        if (!in_dim) {
          args.push_back(value);
        } else if (is_tensor_list(value)) {
          args.push_back(map_tensor_list(
              value, [&](const at::Tensor& element) { return element.select(*in_dim, b); }));
        } else {
          args.emplace_back(value.toTensor().select(*in_dim, b));
        }
      }
      auto outputs = call_below(op, std::move(args));
      per_output.resize(outputs.size());
      for (size_t o = 0; o < outputs.size(); ++o) per_output[o].push_back(std::move(outputs[o]));
    }
    // Tensors are stacked along a new batch dim (a list's elements each on its own, None kept
    // where every example gives None); an output that is not a tensor (None for a Tensor?, a
    // number) is one value for all examples, unbatched.
    VmapResult result;
    for (size_t o = 0; o < per_output.size(); ++o) {
      const auto& examples = per_output[o];
      const std::string what = "output " + std::to_string(o);
      if (examples[0].isTensor()) {
        std::vector<at::Tensor> tensors;
        for (const auto& example : examples) {
          TORCH_CHECK(example.isTensor(), op_->name, ": ", what,
                      " is a tensor for some examples and not for others (", example.tagKind(),
                      "), which vmap cannot batch");
          tensors.push_back(example.toTensor());
        }
        result.outputs.emplace_back(stack_examples(tensors, what));
        result.out_dims.emplace_back(0);
        continue;
      }
      if (is_tensor_list(examples[0])) {
        result.outputs.push_back(stack_lists(examples, what));
        result.out_dims.emplace_back(0);
        continue;
      }
      for (const auto& example : examples) {
        TORCH_CHECK(!example.isTensor() && same_value(example, examples[0]), op_->name, ": ", what,
                    " (", examples[0].tagKind(),
                    ") differs between examples, and vmap batches only tensors");
      }
      result.outputs.push_back(examples[0]);
      result.out_dims.emplace_back(std::nullopt);
    }
    return result;
  }

  // NaN equals NaN here, in lists too: the examples agree on it.
  static bool same_value(const c10::IValue& a, const c10::IValue& b) {
    if (a.isDouble() && b.isDouble() && std::isnan(a.toDouble()) && std::isnan(b.toDouble())) {
      return true;
    }
    if (a.isList() && b.isList()) {
      const auto first = a.toListRef();
      const auto second = b.toListRef();
      if (first.size() != second.size()) return false;
      for (size_t i = 0; i < first.size(); ++i) {
        if (!same_value(first[i], second[i])) return false;
      }
      return true;
    }
    return a == b;
  }

  at::Tensor stack_examples(const std::vector<at::Tensor>& tensors, const std::string& what) const {
    for (size_t b = 1; b < tensors.size(); ++b) {
      TORCH_CHECK(tensors[b].sym_sizes() == tensors[0].sym_sizes(), op_->name, ": ", what,
                  " has shape ", tensors[0].sym_sizes(), " for example 0 and ",
                  tensors[b].sym_sizes(), " for example ", b,
                  ", which vmap cannot batch (it stacks the examples' outputs)");
    }
    return at::stack(tensors);
  }

  // A Tensor[] or Tensor?[] output: every example's list of one length, each element stacked
  // on its own (None where every example gives None).
  c10::IValue stack_lists(const std::vector<c10::IValue>& examples, const std::string& what) const {
    const size_t length = examples[0].toListRef().size();
    for (size_t b = 1; b < examples.size(); ++b) {
      TORCH_CHECK(is_tensor_list(examples[b]), op_->name, ": ", what,
                  " is a list of tensors for example 0 and ", examples[b].tagKind(),
                  " for example ", b, ", which vmap cannot batch");
      const size_t other = examples[b].toListRef().size();
      TORCH_CHECK(other == length, op_->name, ": ", what, " holds ", length,
                  " tensors for example 0 and ", other, " for example ", b,
                  ", which vmap cannot batch");
    }
    c10::List<std::optional<at::Tensor>> stacked;
    for (size_t e = 0; e < length; ++e) {
      const std::string element = what + " element " + std::to_string(e);
      std::vector<at::Tensor> tensors;
      for (const auto& example : examples) {
        const c10::IValue& value = example.toListRef()[e];
        if (value.isTensor() && value.toTensor().defined()) tensors.push_back(value.toTensor());
      }
      TORCH_CHECK(tensors.empty() || tensors.size() == examples.size(), op_->name, ": ", element,
                  " is a tensor for some examples and None for others, which vmap cannot batch");
      stacked.push_back(tensors.empty()
                            ? std::nullopt
                            : std::optional<at::Tensor>(stack_examples(tensors, element)));
    }
    if (!examples[0].isTensorList()) return stacked;
    c10::List<at::Tensor> tensors;
    for (size_t e = 0; e < length; ++e) tensors.push_back(stacked.get(e).value());
    return tensors;
  }

  // A batch of no examples has no example to call the op on: the op's fake, on meta tensors of
  // one example's shape, gives the outputs' shapes and dtypes, and each output is empty along
  // the batch, on the batch's device.
  VmapResult empty_batch(const c10::OperatorHandle& op, const Unwrapped& unwrapped) const {
    std::optional<c10::Device> device;
    std::vector<c10::IValue> args;
    auto one_example = [&](const at::Tensor& tensor, std::optional<int64_t> in_dim) {
      auto sizes = tensor.sizes().vec();
      if (in_dim) {
        if (!device) device = tensor.device();
        sizes.erase(sizes.begin() + c10::maybe_wrap_dim(*in_dim, tensor.dim()));
      }
      return at::empty(sizes, tensor.options().device(at::kMeta));
    };
    for (size_t i = 0; i < unwrapped.values.size(); ++i) {
      const auto& value = unwrapped.values[i];
      if (is_tensor_list(value)) {
        args.push_back(map_tensor_list(value, [&](const at::Tensor& element) {
          return one_example(element, unwrapped.in_dims[i]);
        }));
      } else if (value.isTensor() && value.toTensor().defined()) {
        args.emplace_back(one_example(value.toTensor(), unwrapped.in_dims[i]));
      } else {
        args.push_back(value);
      }
    }
    TORCH_INTERNAL_ASSERT(device.has_value(), "an empty batch with no batched tensor");
    refuse_under_error_policy(detail::gradients_below(unwrapped.values));  // as examples would
    // No example recorded the op's autograd: each floating output is tied to the inputs that
    // require grad (through a zero), so the graph holds as when examples were there. Below an
    // outer vmap, the input that requires grad is under that level's BatchedTensor.
    at::Tensor tie;
    if (autograd_ != AutogradSupport::kNone && c10::GradMode::is_enabled()) {
      auto add = [&](const c10::IValue& value) {
        if (!value.isTensor() || !value.toTensor().defined() ||
            !detail::gradients_below({value}).reverse) {
          return;
        }
        const auto zero = at::real(value.toTensor().sum()).mul(0);
        tie = tie.defined() ? tie + zero : zero;
      };
      for (const auto& value : unwrapped.values) {
        if (!is_tensor_list(value)) {
          add(value);
        } else {
          for (const auto& element : value.toListRef()) add(element);
        }
      }
    }
    auto no_examples = [&](const at::Tensor& example) {
      auto sizes = example.sizes().vec();
      sizes.insert(sizes.begin(), 0);
      auto empty = at::empty(sizes, example.options().device(*device));
      if (tie.defined() && (empty.is_floating_point() || empty.is_complex())) {
        empty = empty + tie.to(empty.scalar_type());
      }
      return empty;
    };
    std::vector<c10::IValue> outputs;
    try {
      outputs = call_below(op, std::move(args));
    } catch (c10::Error& error) {
      error.add_context(op_->name +
                        ": vmap over a batch of 0 examples takes each output's shape and dtype "
                        "from the op's fake, run on meta tensors of one example's shape");
      throw;
    }
    // As the per-example loop batches them: tensors, alone or in lists (None kept), along a new
    // dim of size 0; anything else (None for a Tensor?, a number) is one unbatched value.
    VmapResult result;
    for (auto& output : outputs) {
      if (output.isTensor()) {
        result.outputs.emplace_back(no_examples(output.toTensor()));
        result.out_dims.emplace_back(0);
      } else if (is_tensor_list(output)) {
        result.outputs.push_back(map_tensor_list(output, no_examples));
        result.out_dims.emplace_back(0);
      } else {
        result.outputs.push_back(std::move(output));
        result.out_dims.emplace_back(std::nullopt);
      }
    }
    return result;
  }

  void warn_once_about_loop() {
    std::call_once(loop_warning_, [&] {
      TORCH_WARN(op_->name,
                 ": vmap runs this op once per example (the op asked for the per-example loop); "
                 "this warning is shown once per definition of the op");
    });
  }

  detail::IdentityPtr op_;
  VmapRule rule_;
  bool random_, batch_polymorphic_, per_example_loop_;
  AutogradSupport autograd_;
  detail::FallbackPtr fallback_;
  std::once_flag loop_warning_;
};

// Random ops also run at FuncTorchVmapMode, which sees every call made inside vmap, batched
// inputs or not (as PyTorch's own random ops do): randomness='error' refuses; 'same' calls the op
// once for the whole batch; 'different' gives unbatched inputs the batch dim first, so that each
// example draws its own numbers.
class RandomnessKernel final : public c10::OperatorKernel {
 public:
  explicit RandomnessKernel(detail::IdentityPtr op) : op_(std::move(op)) {}

  void operator()(const c10::OperatorHandle& op, c10::DispatchKeySet, torch::jit::Stack* stack) {
    auto layer = functorch::maybeCurrentDynamicLayer();
    TORCH_INTERNAL_ASSERT(layer.has_value(), op_->name, ": vmap mode without a vmap layer");
    const auto randomness = randomness_of(*layer);
    TORCH_CHECK(randomness != Randomness::kError, op_->name,
                ": the op is random, and vmap was called with randomness='error'; pass "
                "randomness='same' or 'different' to torch.vmap");
    const int64_t level = layer->layerId();
    const size_t num_args = op_->schema.arguments().size();
    bool any_batched = false;
    for (auto it = stack->end() - num_args; it != stack->end(); ++it) {
      any_batched = any_batched || (it->isTensor() && it->toTensor().defined() &&
                                    functorch::isBatchedAtLevel(it->toTensor(), level));
    }
    if (randomness == Randomness::kDifferent && !any_batched) {
      const int64_t batch_size = layer->batchSize().guard_int(__FILE__, __LINE__);
      bool any_tensor = false;
      for (auto it = stack->end() - num_args; it != stack->end(); ++it) {
        if (!it->isTensor() || !it->toTensor().defined()) continue;
        auto value = it->toTensor();
        *it = functorch::makeBatched(
            value.unsqueeze(0).expand_symint(with_batch(value, batch_size)), 0, level);
        any_tensor = true;
      }
      if (!any_tensor) return draw_per_example(op, stack, batch_size, level);
    }
    c10::impl::ExcludeDispatchKeyGuard guard(c10::DispatchKey::FuncTorchVmapMode);
    op.callBoxed(stack);
  }

 private:
  // A call with no tensor to give the batch dim to: each example calls the op for its own draws,
  // and their outputs are stacked into the batch.
  void draw_per_example(const c10::OperatorHandle& op, torch::jit::Stack* stack, int64_t batch_size,
                        int64_t level) const {
    const size_t num_args = op_->schema.arguments().size();
    const std::vector<c10::IValue> arguments(stack->end() - num_args, stack->end());
    torch::jit::drop(*stack, num_args);
    std::vector<torch::jit::Stack> draws;
    {
      c10::impl::ExcludeDispatchKeyGuard guard(c10::DispatchKey::FuncTorchVmapMode);
      // A batch of none still calls the op once, for its outputs' shapes.
      for (int64_t example = 0; example < std::max<int64_t>(batch_size, 1); ++example) {
        torch::jit::Stack one(arguments.begin(), arguments.end());
        detail::call_boxed_padded(op, &one);
        draws.push_back(std::move(one));
      }
    }
    auto batched = [&](const std::vector<at::Tensor>& per_example, size_t index) {
      for (const auto& tensor : per_example) {
        TORCH_CHECK(tensor.sizes() == per_example.front().sizes() &&
                        tensor.dtype() == per_example.front().dtype(),
                    op_->name, ": under vmap with randomness='different', output ", index,
                    " has shape ", per_example.front().sizes(), " for one example and ",
                    tensor.sizes(), " for another; vmap stacks the examples' outputs");
      }
      return functorch::makeBatched(at::stack(per_example).narrow(0, 0, batch_size), 0, level);
    };
    const size_t num_returns = draws.front().size();
    for (size_t index = 0; index < num_returns; ++index) {
      const auto& first = draws.front()[index];
      if (first.isTensor()) {
        std::vector<at::Tensor> per_example;
        for (const auto& draw : draws) per_example.push_back(draw[index].toTensor());
        stack->emplace_back(batched(per_example, index));
      } else if (first.isTensorList()) {
        const size_t length = first.toTensorList().size();
        std::vector<at::Tensor> elements;
        for (size_t element = 0; element < length; ++element) {
          std::vector<at::Tensor> per_example;
          for (const auto& draw : draws) {
            const auto list = draw[index].toTensorList();
            TORCH_CHECK(list.size() == length, op_->name,
                        ": under vmap with randomness='different', output ", index, " holds ",
                        length, " tensors for one example and ", list.size(),
                        " for another; vmap stacks the examples' outputs");
            per_example.push_back(list.get(element));
          }
          elements.push_back(batched(per_example, index));
        }
        stack->emplace_back(c10::List<at::Tensor>(elements));
      } else {
        for (const auto& draw : draws) {
          TORCH_CHECK(draw[index] == first, op_->name,
                      ": under vmap with randomness='different', output ", index, " is ",
                      first.tagKind(), " ", first, " for one example and ", draw[index],
                      " for another, which vmap cannot batch");
        }
        stack->push_back(first);
      }
    }
  }

  detail::IdentityPtr op_;
};

}  // namespace

namespace detail {

c10::KernelFunction make_vmap_kernel(IdentityPtr op, VmapRule rule, const OpFlags& flags,
                                     AutogradSupport autograd, FallbackPtr fallback) {
  TORCH_CHECK_VALUE(!(flags.batch_polymorphic && flags.vmap_per_example_loop), op->name,
                    ": batch_polymorphic and vmap_per_example_loop are both declared, but they "
                    "say two things of how vmap calls the op (once, with the batch dims in front, "
                    "or once per example); declare one");
  return c10::KernelFunction::makeFromBoxedFunctor(std::make_unique<VmapKernel>(
      std::move(op), std::move(rule), flags, autograd, std::move(fallback)));
}

std::optional<c10::KernelFunction> make_randomness_kernel(IdentityPtr op, const OpFlags& flags) {
  if (!flags.random) return std::nullopt;
  return c10::KernelFunction::makeFromBoxedFunctor(
      std::make_unique<RandomnessKernel>(std::move(op)));
}

VmapSupport vmap_support(const VmapRule& rule, const OpFlags& flags) {
  if (rule) return VmapSupport::kRule;
  if (flags.batch_polymorphic) return VmapSupport::kBatchPolymorphic;
  if (flags.vmap_per_example_loop) return VmapSupport::kPerExampleLoop;
  return VmapSupport::kFallback;
}

}  // namespace detail
}  // namespace opreg
