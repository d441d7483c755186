// include/opreg/autograd.h: gradients for opreg ops. An explicit backward has the shape of
// torch.library.register_autograd: setup_context(ctx, inputs, outputs) saves what backward needs;
// backward(ctx, grad_outputs) gets one gradient per output (undefined for outputs that are not
// differentiable: integer tensors, numbers; zeros for those marked non-differentiable) and returns
// one per input (undefined where there is none).
// Without a backward, the op's AutogradPolicy decides (see Note [Autograd policies]).
#pragma once

#include <functional>
#include <memory>
#include <string>
#include <unordered_map>
#include <vector>

#include <ATen/core/Tensor.h>
#include <ATen/core/ivalue.h>
#include <c10/core/SymIntArrayRef.h>
#include <c10/util/DimVector.h>

#include "opreg/export.h"

namespace torch::autograd {
struct Node;
class SavedVariable;
}  // namespace torch::autograd

namespace opreg {

// Note [Autograd policies]
// kFallback (default): when grad mode is on and a tensor input requires grad, the fallback runs
//   under autograd, so gradients are right (PyTorch differentiates its ATen ops) and the kernel
//   is skipped for that call. Calls without such inputs run the kernel as usual.
// kError: such calls raise an error naming the op and how to add a backward.
// kNone: outputs never require grad (random number generation, integer-valued ops).
enum class AutogradPolicy { kFallback, kError, kNone };

class OpregBackward;  // the autograd node of an op with a backward (src/core/autograd.cpp)

class OPREG_API AutogradContext {
 public:
  AutogradContext();
  ~AutogradContext();
  AutogradContext(const AutogradContext&) = delete;
  AutogradContext& operator=(const AutogradContext&) = delete;

  // Tensors the backward needs; inputs and outputs alike (outputs are saved without a cycle).
  void save_for_backward(std::vector<at::Tensor> tensors);
  std::vector<at::Tensor> saved_tensors() const;

  // Outputs that get no gradient, as torch.autograd.Function's: they do not require grad, and
  // backward gets zeros for them (undefined tensors without materialized gradients). Called in
  // setup_context, with outputs of the call.
  void mark_non_differentiable(std::vector<at::Tensor> outputs);
  // Whether backward gets zeros (the default) or undefined tensors for the outputs that got no
  // gradient, as torch.autograd.Function's ctx.set_materialize_grads.
  void set_materialize_grads(bool materialize);

  // Non-tensor values the backward needs.
  std::unordered_map<std::string, c10::IValue> saved_data;

  // Whether input `index` (schema position) needs a gradient: in setup_context, whether it
  // requires grad; in backward, whether the engine will use it.
  bool needs_input_grad(size_t index) const;
  size_t num_inputs() const { return input_edges_.size(); }

  // Shape and dtype of tensor input `index` (schema position), recorded at the forward call
  // without saving anything: what most backwards need to reduce a gradient to its input.
  c10::SymIntArrayRef input_sym_sizes(size_t index) const;
  at::ScalarType input_scalar_type(size_t index) const;

  // For code that keeps the context beyond the call (opreg's Python ctx): keeps the autograd node
  // that owns it alive while held, or null once that node is being freed, when nothing of the
  // context may be used. Before the node exists (in setup_context), a holder of nothing. The
  // caller holds what the context's destruction waits for (an object in saved_data whose
  // destructor takes the caller's lock), so that the node's memory stays while this runs.
  std::shared_ptr<void> keep_alive() const;

 private:
  friend class OpregBackward;
  friend class AutogradKernel;
  struct InputMeta {
    c10::SymDimVector sizes;
    at::ScalarType scalar_type;
  };
  const InputMeta& tensor_input(size_t index, const char* accessor) const;

  std::vector<at::Tensor> to_save_;
  std::vector<at::Tensor> non_differentiable_;
  bool materialize_grads_ = true;
  std::vector<torch::autograd::SavedVariable> saved_;
  std::vector<int64_t> input_edges_;  // per input: its edge in the node, or -1
  std::vector<bool> input_requires_grad_;
  std::vector<InputMeta> edge_inputs_;  // per edge
  OpregBackward* node_ = nullptr;
  bool in_backward_ = false;
};

using SetupContext =
    std::function<void(AutogradContext& ctx, const std::vector<c10::IValue>& inputs,
                       const std::vector<c10::IValue>& outputs)>;
using Backward = std::function<std::vector<at::Tensor>(
    AutogradContext& ctx, const std::vector<at::Tensor>& grad_outputs)>;

}  // namespace opreg
