// src/core/autograd.cpp: the Autograd-key kernel of every opreg op, and the autograd Node that
// runs an explicit backward. See Note [Autograd policies] in include/opreg/autograd.h.
#include "opreg/autograd.h"

#include <algorithm>
#include <atomic>
#include <optional>
#include <set>
#include <sstream>
#include <type_traits>
#include <utility>

#include <ATen/ExpandUtils.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <c10/core/GradMode.h>
#include <c10/util/Exception.h>
#include <c10/util/ScopeExit.h>
#include <torch/csrc/autograd/VariableTypeUtils.h>
#include <torch/csrc/autograd/function.h>
#include <torch/csrc/autograd/functions/utils.h>
#include <torch/csrc/autograd/saved_variable.h>
#include <torch/library.h>

#include "op_internal.h"
#include "opreg/detail/typed_kernels.h"
#include "opreg/trace.h"
#include "transform_levels.h"

namespace opreg {

AutogradContext::AutogradContext() = default;
// saved_data first: what it holds may link to this context (Python's ctx), and cuts the link as
// it goes, before anything it could reach is freed.
AutogradContext::~AutogradContext() { saved_data.clear(); }

void AutogradContext::save_for_backward(std::vector<at::Tensor> tensors) {
  TORCH_CHECK(!in_backward_, "opreg: save_for_backward() belongs in setup_context, not backward");
  to_save_ = std::move(tensors);
}

void AutogradContext::mark_non_differentiable(std::vector<at::Tensor> outputs) {
  TORCH_CHECK(!in_backward_ && node_ == nullptr,
              "opreg: mark_non_differentiable() belongs in setup_context, not backward");
  for (auto& output : outputs) non_differentiable_.push_back(std::move(output));
}

void AutogradContext::set_materialize_grads(bool materialize) { materialize_grads_ = materialize; }

namespace detail {

// PyTorch 2.13 holds autograd nodes in c10::intrusive_ptr, earlier releases in std::shared_ptr.
using NodePtr = decltype(std::declval<torch::autograd::Node&>().getptr());

template <class T, class Ptr = NodePtr, class... Args>
auto make_node(Args&&... args) {
  if constexpr (std::is_same_v<Ptr, std::shared_ptr<torch::autograd::Node>>) {
    return std::make_shared<T>(std::forward<Args>(args)...);
  } else {
    return c10::make_intrusive<T>(std::forward<Args>(args)...);
  }
}

struct OutputMeta {
  c10::SymDimVector sizes;
  at::TensorOptions options;
};

// A strong reference to `node`, or null where its last one has gone (it is being freed): never
// one taken back from zero, which getptr() would take, and the node would be freed twice. The
// node's memory must stay while this runs (the caller holds what its destruction waits for).
template <class Ptr = NodePtr, class N = torch::autograd::Node>
Ptr hold_if_alive(N* node) {
  if constexpr (std::is_same_v<Ptr, std::shared_ptr<N>>) {
    return node->weak_from_this().lock();
  } else {
    if (c10::raw::intrusive_ptr::use_count(node) == 0) return Ptr();
    c10::raw::weak_intrusive_ptr::incref(node);
    auto weak = c10::weak_intrusive_ptr<N>::reclaim(node);
    auto strong = weak.lock();
    // Lost the race to its last reference, going on another thread, which may free the node
    // once the caller lets go: the weak count is left as it is (the node's memory, not freed).
    if (!strong) weak.release();
    return strong;
  }
}

}  // namespace detail

// opreg backward calls running now, on all threads. A backward that calls its own op's backward
// again without end (torch.autograd.grad inside it) is stopped here: PyTorch's engine moves deep
// reentrant backward calls to new threads, so Python's recursion limit never stops it.
namespace {
std::atomic<int> backwards_in_flight{0};
constexpr int kMaxBackwardsInFlight = 1024;
}  // namespace

// torch's compiled autograd asks each node for its state in a form it can trace; opreg's nodes
// (a backward's context, with saved Python objects among it) have none yet. Without a backtrace:
// torch shows this error's what(), which would otherwise end in C++ frames.
[[noreturn]] void refuse_compiled_autograd(const std::string& op, const std::string& way_out) {
  throw c10::NotImplementedError(op +
                                     ": torch's compiled autograd cannot trace this opreg op's "
                                     "backward; run the backward without it "
                                     "(torch._dynamo.config.compiled_autograd = False), or " +
                                     way_out,
                                 /*backtrace=*/nullptr);
}

// The grad_fn of an output of an opreg op with an explicit backward. Shares the op's identity
// and declaration instead of copying them: a node is made on every forward call that needs grads.
class OpregBackward : public torch::autograd::Node {
 public:
  detail::IdentityPtr op;
  std::shared_ptr<const AutogradDeclaration> declaration;
  AutogradContext ctx;
  std::vector<detail::OutputMeta> outputs;  // per differentiable output
  std::vector<size_t> positions;            // each differentiable output's index in the returns
  // Outputs of a differentiable dtype that setup_context marked non-differentiable.
  std::vector<std::pair<size_t, detail::OutputMeta>> marked;
  size_t num_returns = 0;

  std::string name() const override { return op->name + "Backward"; }

  void compiled_args(torch::autograd::CompiledNodeArgs& /*args*/) const override {
    refuse_compiled_autograd(op->name,
                             "leave the op without a backward (autograd='fallback'), so that "
                             "PyTorch differentiates its fallback");
  }

  // Set when values saved for the backward were freed (after a backward without retain_graph).
  void release_variables() override {
    released_ = released_ || !ctx.saved_.empty() || !ctx.saved_data.empty();
    ctx.saved_data.clear();  // first: what holds a link to the context cuts it (Python's ctx)
    ctx.saved_.clear();
  }
  bool released_ = false;

  torch::autograd::variable_list apply(torch::autograd::variable_list&& grads) override {
    const std::string& op_name = op->name;
    if (trace_enabled()) {
      detail::record_trace(op_name, "backward",
                           grads.empty() || !grads[0].defined() ? "-" : grads[0].device().str());
    }
    // One gradient per output of the op, as torch.autograd.Function's backward gets them:
    // zeros for a differentiable output that got none and for those marked non-differentiable
    // (undefined without materialized gradients), undefined (None in Python) for the others
    // (integer outputs, numbers).
    const bool zeros = ctx.materialize_grads_;
    torch::autograd::variable_list per_output(num_returns);
    for (size_t i = 0; i < grads.size(); ++i) {
      if (grads[i].defined()) {
        per_output[positions[i]] = std::move(grads[i]);
      } else if (zeros) {
        per_output[positions[i]] = at::zeros_symint(outputs[i].sizes, outputs[i].options);
      }
    }
    for (const auto& [index, meta] : marked) {
      if (zeros) per_output[index] = at::zeros_symint(meta.sizes, meta.options);
    }
    TORCH_CHECK(!released_, op_name,
                ": backward ran a second time through the same graph, whose saved values were "
                "freed after the first; pass retain_graph=True to the first backward");
    const int in_flight = ++backwards_in_flight;
    const auto leave = c10::make_scope_exit([] { --backwards_in_flight; });
    TORCH_CHECK(in_flight <= kMaxBackwardsInFlight, op_name, ": ", in_flight,
                " opreg backward calls are running at once, all threads together (the limit is ",
                kMaxBackwardsInFlight,
                "): a backward that calls its op's backward again without end "
                "(torch.autograd.grad inside the backward) stops here, and so does deep nesting "
                "of backward calls in several threads at once");
    ctx.in_backward_ = true;
    auto result = [&] {
      try {
        // A throw of no std::exception would otherwise reach the autograd engine's thread,
        // which catches only std::exceptions: the process would terminate.
        return detail::run_user_code_named<std::vector<at::Tensor>>(
            op_name, "backward", [&] { return declaration->backward(ctx, per_output); });
      } catch (...) {
        ctx.in_backward_ = false;
        throw;
      }
    }();
    ctx.in_backward_ = false;
    TORCH_CHECK(result.size() == ctx.input_edges_.size(), op_name, ": backward returned ",
                result.size(), " gradients, expected ", ctx.input_edges_.size(),
                " (one per input, undefined (None in Python) for inputs without a gradient)");
    torch::autograd::variable_list edge_grads(num_outputs());
    for (size_t i = 0; i < result.size(); ++i) {
      const auto edge = ctx.input_edges_[i];
      if (!result[i].defined()) continue;
      TORCH_CHECK(edge >= 0, op_name, ": backward returned a gradient for input '",
                  op->schema.arguments()[i].name(),
                  "', which is not a tensor; return an undefined tensor (None in Python) there");
      const auto input_type = ctx.edge_inputs_[edge].scalar_type;
      // The engine casts a gradient to its input's dtype: a floating one to any, another only
      // between two real dtypes or two complex ones.
      TORCH_CHECK(at::isFloatingType(result[i].scalar_type()) ||
                      result[i].is_complex() == at::isComplexType(input_type),
                  op_name, ": backward's gradient for input '", op->schema.arguments()[i].name(),
                  "' is ", result[i].scalar_type(), ", which cannot stand for the input's ",
                  input_type,
                  (result[i].is_complex() ? "; return a real gradient (the real part, say)"
                                          : "; return a floating or complex gradient"));
      TORCH_CHECK(!result[i].is_nested(), op_name, ": backward's gradient for input '",
                  op->schema.arguments()[i].name(),
                  "' is a nested tensor, which has no shape to match the input's; return a "
                  "strided gradient of the input's shape");
      const c10::SymIntArrayRef expected = ctx.edge_inputs_[edge].sizes;
      // A gradient of the broadcast shape is summed down to the input's, as PyTorch's engine
      // does for its own nodes (torch.library's backwards rely on it).
      if (!result[i].sym_sizes().equals(expected) &&
          at::is_expandable_to(expected, result[i].sym_sizes())) {
        result[i] = at::sum_to(std::move(result[i]), expected);
      }
      TORCH_CHECK(result[i].sym_sizes().equals(expected), op_name,
                  ": backward's gradient for input '", op->schema.arguments()[i].name(),
                  "' has shape ", result[i].sym_sizes(), ", expected ", expected,
                  " (the input's shape, or a shape it broadcasts to)");
      edge_grads[edge] = std::move(result[i]);
    }
    return edge_grads;
  }
};

std::shared_ptr<void> AutogradContext::keep_alive() const {
  if (node_ == nullptr) return std::make_shared<bool>(false);
  auto held = detail::hold_if_alive(static_cast<torch::autograd::Node*>(node_));
  if (!held) return nullptr;
  return std::make_shared<detail::NodePtr>(std::move(held));
}

std::vector<at::Tensor> AutogradContext::saved_tensors() const {
  std::vector<at::Tensor> tensors;
  if (node_ == nullptr) return to_save_;
  auto self = node_->getptr();
  for (const auto& saved : saved_) tensors.push_back(saved.unpack(self));
  return tensors;
}

const AutogradContext::InputMeta& AutogradContext::tensor_input(size_t index,
                                                                const char* accessor) const {
  TORCH_CHECK(index < input_edges_.size(), "opreg: ", accessor, "(", index, "): the op has ",
              input_edges_.size(), " inputs");
  TORCH_CHECK(input_edges_[index] >= 0, "opreg: ", accessor, "(", index,
              "): that input is not a tensor");
  return edge_inputs_[input_edges_[index]];
}

c10::SymIntArrayRef AutogradContext::input_sym_sizes(size_t index) const {
  return tensor_input(index, "input_sym_sizes").sizes;
}

at::ScalarType AutogradContext::input_scalar_type(size_t index) const {
  return tensor_input(index, "input_scalar_type").scalar_type;
}

bool AutogradContext::needs_input_grad(size_t index) const {
  TORCH_CHECK(index < input_edges_.size(), "opreg: needs_input_grad(", index, "): the op has ",
              input_edges_.size(), " inputs");
  if (input_edges_[index] < 0) return false;
  if (in_backward_ && node_ != nullptr) {
    return node_->task_should_compute_output(static_cast<size_t>(input_edges_[index]));
  }
  return input_requires_grad_[index];
}

namespace {

// Calls `f` with each defined tensor a Tensor, Tensor?, Tensor[] or Tensor?[] argument holds.
template <typename F>
void for_each_tensor(const c10::IValue& value, F f) {
  if (value.isTensor()) {
    if (value.toTensor().defined()) f(value.toTensor());
  } else if (value.isList()) {
    for (const c10::IValue& element : value.toListRef()) {
      if (element.isTensor() && element.toTensor().defined()) f(element.toTensor());
    }
  }
}

bool requires_grad(const c10::IValue& value) {
  bool any = false;
  for_each_tensor(value, [&](const at::Tensor& tensor) { any = any || tensor.requires_grad(); });
  return any;
}

bool has_tangent(const c10::IValue& value) {
  bool any = false;
  for_each_tensor(value, [&](const at::Tensor& tensor) {
    any = any || tensor._fw_grad(/*level=*/0).defined();
  });
  return any;
}

void bump_versions_of_mutated_inputs(const c10::FunctionSchema& schema,
                                     const std::vector<c10::IValue>& inputs) {
  for (size_t i = 0; i < inputs.size(); ++i) {
    const auto* alias = schema.arguments()[i].alias_info();
    if (alias != nullptr && alias->isWrite() && inputs[i].isTensor()) {
      torch::autograd::increment_version(inputs[i].toTensor());
    }
  }
}

// Note [Outputs the schema declares views]
// An output declared an alias of an argument (`Tensor(a) x -> Tensor(a)`) is a view of it. An op
// run below ADInplaceOrView (the no-gradient path, an explicit backward's forward) makes it a plain
// tensor on the same memory, with a version counter of its own: an in-place change through it went
// unseen by the tensors autograd saved, and autograd read stale values (a silently wrong
// gradient). So such outputs are made views of their argument, as PyTorch's ADInplaceOrView kernels
// make theirs: one version counter, and autograd's view + in-place handling.
struct ViewReturn {
  size_t index;                   // of the return
  std::vector<size_t> arguments;  // it may view (empty: any tensor argument, a wildcard)
};

std::vector<ViewReturn> view_returns_of(const c10::FunctionSchema& schema) {
  std::vector<ViewReturn> views;
  const auto& returns = schema.returns();
  for (size_t index = 0; index < returns.size(); ++index) {
    const auto* alias = returns[index].alias_info();
    if (alias == nullptr || alias->isWrite()) continue;
    ViewReturn view{index, {}};
    for (size_t i = 0; i < schema.arguments().size(); ++i) {
      const auto* argument = schema.arguments()[i].alias_info();
      if (argument == nullptr || argument->isWildcardBefore() || alias->isWildcardBefore())
        continue;
      for (const auto& set : alias->beforeSets()) {
        if (argument->beforeSets().count(set) != 0) {
          view.arguments.push_back(i);
          break;
        }
      }
    }
    views.push_back(std::move(view));
  }
  return views;
}

// Replays of a view that as_strided cannot make (another dtype, layout or conjugation) are
// refused: autograd would otherwise rebuild the view wrongly.
class UnreplayableView final : public torch::autograd::ViewFunc {
 public:
  explicit UnreplayableView(std::string message) : message_(std::move(message)) {}
  at::Tensor operator()(const at::Tensor& /*base*/) const override {
    TORCH_CHECK(false, message_);
    return {};
  }
  std::unique_ptr<torch::autograd::ViewFunc> clone_and_set(
      std::optional<std::vector<c10::SymInt>> /*symints*/,
      std::optional<std::vector<at::Tensor>> /*tensors*/) const override {
    return std::make_unique<UnreplayableView>(message_);
  }

 private:
  std::string message_;
};

bool replayable_by_as_strided(const at::Tensor& base, const at::Tensor& view) {
  return base.layout() == at::kStrided && view.layout() == at::kStrided &&
         base.scalar_type() == view.scalar_type() && base.is_conj() == view.is_conj() &&
         base.is_neg() == view.is_neg();
}

// `output` made a view of the argument it shares memory with; as it is where it shares none (a
// functorch wrapper, which has no storage to compare, or a value the call checks refused).
at::Tensor as_view_of_argument(const std::string& op, const at::Tensor& output,
                               const ViewReturn& view, const std::vector<c10::IValue>& inputs,
                               bool differentiable, torch::autograd::CreationMeta creation) {
  if (!output.defined() || !output.has_storage()) return output;
  std::optional<at::Tensor> base;
  auto consider = [&](const c10::IValue& value) {
    if (base || !value.isTensor()) return;
    const at::Tensor& input = value.toTensor();
    if (input.defined() && input.has_storage() && detail::share_memory(input, output)) {
      base = input;
    }
  };
  for (size_t i = 0; i < inputs.size(); ++i) {
    const bool allowed =
        view.arguments.empty() ||
        std::find(view.arguments.begin(), view.arguments.end(), i) != view.arguments.end();
    if (!allowed) continue;
    if (inputs[i].isList()) {  // Tensor(a)[]: a view of one of its elements
      for (const c10::IValue& element : inputs[i].toListRef()) consider(element);
    } else {
      consider(inputs[i]);
    }
  }
  if (!base || base->is_inference()) return output;
  at::Tensor view_tensor = output;
  // A tensor that is its own base, or one autograd knows already (an input returned as it is),
  // cannot be made a view: a new tensor on its memory can.
  if (output.is_same(*base) || torch::autograd::impl::get_autograd_meta(output) != nullptr) {
    at::AutoDispatchBelowADInplaceOrView guard;
    view_tensor = output.alias();
  }
  std::unique_ptr<torch::autograd::ViewFunc> replay;
  // Another storage on the same bytes (from_blob over the argument): as_strided would read its
  // offset against the argument's storage.
  if (!replayable_by_as_strided(*base, view_tensor) ||
      !base->storage().is_alias_of(view_tensor.storage())) {
    replay = std::make_unique<UnreplayableView>(
        op + ": output " + std::to_string(view.index) +
        " is a view of another dtype, layout, conjugation or storage than its argument, which "
        "autograd "
        "cannot rebuild after an in-place change; clone the output before changing it or its "
        "argument in place");
  }
  // An integer view carries no gradient (PyTorch's own view(int32) alike).
  if (!differentiable || !torch::autograd::isDifferentiableType(view_tensor.scalar_type())) {
    return torch::autograd::as_view(*base, view_tensor, false, false, std::move(replay), nullptr,
                                    torch::autograd::CreationMeta::DEFAULT);
  }
  return torch::autograd::as_view(*base, view_tensor, true, true, std::move(replay), nullptr,
                                  creation);
}

// The outputs on `stack` that the schema declares views, made views of their arguments.
// `multiple`: a creation for an op with several views (a Tensor(a)[] output included), which
// PyTorch forbids changing in place under autograd.
void make_views(const std::string& op, const std::vector<ViewReturn>& views,
                const std::vector<c10::IValue>& inputs, size_t num_returns,
                torch::jit::Stack* stack, bool differentiable, torch::autograd::CreationMeta single,
                torch::autograd::CreationMeta multiple) {
  const size_t first = stack->size() - num_returns;
  const bool several = views.size() > 1 || std::any_of(views.begin(), views.end(), [&](auto& v) {
                         return (*stack)[first + v.index].isTensorList();
                       });
  const auto creation = several ? multiple : single;
  for (const auto& view : views) {
    c10::IValue& slot = (*stack)[first + view.index];
    if (slot.isTensor()) {
      slot = as_view_of_argument(op, slot.toTensor(), view, inputs, differentiable, creation);
    } else if (slot.isTensorList()) {
      auto list = slot.toTensorList().copy();
      for (size_t i = 0; i < list.size(); ++i) {
        list.set(i, as_view_of_argument(op, list.get(i), view, inputs, differentiable, creation));
      }
      slot = std::move(list);
    }
  }
}

torch::autograd::CreationMeta creation_in_grad_mode(torch::autograd::CreationMeta grad_mode) {
  return c10::GradMode::is_enabled() ? grad_mode : torch::autograd::CreationMeta::NO_GRAD_MODE;
}

}  // namespace

// The grad_fn of a fallback's outputs that are not connected to its inputs (see
// check_fallback_is_differentiable): warns once per op and passes no gradient on.
class DisconnectedOutput final : public torch::autograd::Node {
 public:
  DisconnectedOutput(std::string op, std::string message, std::shared_ptr<std::atomic<bool>> warned,
                     torch::autograd::edge_list&& next_edges)
      : Node(std::move(next_edges)),
        op_(std::move(op)),
        message_(std::move(message)),
        warned_(std::move(warned)) {}
  torch::autograd::variable_list apply(torch::autograd::variable_list&&) override {
    if (!warned_->exchange(true)) TORCH_WARN(message_);
    return torch::autograd::variable_list(num_outputs());
  }
  std::string name() const override { return "DisconnectedOutput"; }
  void compiled_args(torch::autograd::CompiledNodeArgs& /*args*/) const override {
    refuse_compiled_autograd(op_, "make its outputs depend on its inputs through PyTorch ops");
  }

 private:
  std::string op_;
  std::string message_;
  std::shared_ptr<std::atomic<bool>> warned_;
};

class AutogradKernel final : public c10::OperatorKernel {
 public:
  AutogradKernel(detail::IdentityPtr op, AutogradDeclaration declaration,
                 detail::FallbackPtr fallback)
      : op_(std::move(op)),
        spec_(std::make_shared<const AutogradDeclaration>(std::move(declaration))),
        fallback_(std::move(fallback)),
        views_(view_returns_of(op_->schema)) {}

  void operator()(const c10::OperatorHandle& op, c10::DispatchKeySet keys,
                  torch::jit::Stack* stack) {
    const auto& schema = op_->schema;
    const size_t num_args = schema.arguments().size();
    bool any_requires_grad = false;
    bool any_tangent = false;
    for (auto it = stack->end() - num_args; it != stack->end(); ++it) {
      any_requires_grad = any_requires_grad || requires_grad(*it);
      any_tangent = any_tangent || has_tangent(*it);
    }
    any_requires_grad = any_requires_grad && c10::GradMode::is_enabled();
    const bool differentiable = spec_->backward || spec_->policy != AutogradPolicy::kNone;
    // 1. No gradient needed (or never given): run below autograd, kernel included.
    if ((!any_requires_grad && !any_tangent) || !differentiable) {
      std::vector<c10::IValue> inputs;
      if (schema.is_mutable() || !views_.empty()) {
        inputs.assign(stack->end() - num_args, stack->end());
      }
      {
        at::AutoDispatchBelowADInplaceOrView guard;
        op.redispatchBoxed(keys & c10::after_ADInplaceOrView_keyset, stack);
      }
      if (schema.is_mutable()) bump_versions_of_mutated_inputs(schema, inputs);
      if (!views_.empty()) {
        using torch::autograd::CreationMeta;
        make_views(op_->name, views_, inputs, schema.returns().size(), stack, differentiable,
                   creation_in_grad_mode(CreationMeta::DEFAULT),
                   creation_in_grad_mode(CreationMeta::MULTI_OUTPUT_NODE));
      }
      return;
    }
    // 2. Gradient needed, no backward: the policy decides. Forward-mode tangents always take
    // the fallback: its ATen ops have forward formulas (an explicit backward is reverse-only).
    if (!spec_->backward || any_tangent) {
      TORCH_CHECK(spec_->policy != AutogradPolicy::kError || spec_->backward, op_->name,
                  ": an input ", any_tangent ? "has a forward-mode tangent" : "requires grad",
                  ", but the op has no backward and its autograd policy is 'error'; give it a "
                  "backward (.backward(backward, setup_context) in C++, backward= in Python), or "
                  "use the 'fallback' policy");
      std::vector<at::Tensor> inputs;
      for (auto it = stack->end() - num_args; it != stack->end(); ++it) {
        if (it->isTensor() && it->toTensor().defined()) inputs.push_back(it->toTensor());
      }
      detail::run_at_transform_level([&] { fallback_->callBoxed(op, keys, stack); });
      check_fallback_is_differentiable(any_requires_grad, any_tangent, inputs, stack);
      return;
    }
    check_no_list_requires_grad(*stack);
    run_with_backward(op, keys, stack);
  }

 private:
  // The fallback ran under autograd because an input needs a gradient, but none of its floating
  // outputs is connected to the inputs: its code went through numpy, .detach() or an integer
  // step, and the op's part is missing from every derivative through it; or the outputs do not
  // depend on those inputs, and the derivative is zero. opreg cannot tell the two apart, so it
  // warns (once per op) when a derivative meets such an output: in forward mode at the call, in
  // reverse mode when a gradient reaches the output (a DisconnectedOutput node, which passes no
  // gradient on). An op with at least one connected output is taken at its word: its other
  // outputs may well be constant.
  void check_fallback_is_differentiable(bool any_requires_grad, bool any_tangent,
                                        const std::vector<at::Tensor>& inputs,
                                        torch::jit::Stack* stack) const {
    const auto& returns = op_->schema.returns();
    const size_t first = stack->size() - returns.size();
    std::vector<std::pair<size_t, std::optional<size_t>>> floating;  // (output, list element)
    std::set<size_t> indices;  // of floating outputs, declared aliases included
    bool reverse_connected = !any_requires_grad;
    bool forward_connected = !any_tangent;
    for (size_t index = 0; index < returns.size(); ++index) {
      // A declared alias must stay the very tensor the fallback returned: it gets no node, and
      // a disconnected one is told at the call.
      const bool alias = returns[index].alias_info() != nullptr;
      auto visit = [&](const at::Tensor& tensor, std::optional<size_t> element) {
        if (!tensor.defined() || !torch::autograd::isDifferentiableType(tensor.scalar_type())) {
          return;
        }
        if (!alias) floating.emplace_back(index, element);
        indices.insert(index);
        reverse_connected = reverse_connected || tensor.requires_grad();
        forward_connected = forward_connected || tensor._fw_grad(/*level=*/0).defined();
      };
      const c10::IValue& output = (*stack)[first + index];
      if (output.isTensor()) {
        visit(output.toTensor(), std::nullopt);
      } else if (output.isTensorList()) {
        const auto list = output.toTensorList();
        for (size_t i = 0; i < list.size(); ++i) visit(list.get(i), i);
      }
    }
    if (indices.empty() || (reverse_connected && forward_connected)) return;
    std::string output = indices.size() == 1 ? "output " : "outputs ";  // "outputs 0, 1"
    for (size_t index : indices) {
      output += (index == *indices.begin() ? "" : ", ") + std::to_string(index);
    }
    const std::string what =
        std::string(indices.size() == 1 ? " is" : " are") +
        " not connected to its inputs: the fallback computed the values outside autograd (numpy, "
        ".detach(), .item(), an integer step), or they do not depend on the inputs; the op adds "
        "nothing to the derivative. If it should, give the op a backward (backward= in Python, "
        ".backward() in C++); declare autograd='none' (AutogradPolicy::kNone) if it has none";
    if (!forward_connected && !warned_->exchange(true)) {
      if (spec_->backward) {  // forward mode runs the fallback: a backward serves reverse mode
        TORCH_WARN(op_->name, ": an input has a forward-mode tangent, but ", output,
                   indices.size() == 1 ? " is" : " are",
                   " not connected to its inputs: forward mode differentiates the fallback (the "
                   "op's backward serves reverse mode only), which computed the values outside "
                   "autograd (numpy, .detach(), .item(), an integer step); the tangent is zero. "
                   "Write the fallback with torch ops to get tangents");
      } else {
        TORCH_WARN(op_->name, ": an input has a forward-mode tangent, but ", output, what);
      }
    }
    if (reverse_connected) return;
    if (floating.empty()) {  // declared aliases alone
      if (!warned_->exchange(true)) {
        TORCH_WARN(op_->name, ": an input requires grad, but ", output, what);
      }
      return;
    }
    auto node = detail::make_node<DisconnectedOutput>(
        op_->name, op_->name + ": a gradient reached " + output + ", which" + what, warned_,
        torch::autograd::collect_next_edges(inputs));
    for (const auto& [index, element] : floating) {
      // A new tensor on the same memory: the fallback may have returned one that it keeps.
      c10::IValue& slot = (*stack)[first + index];
      if (!element) {
        at::Tensor tensor = slot.toTensor().detach();
        torch::autograd::set_history(tensor, detail::NodePtr(node));
        slot = std::move(tensor);
      } else {
        auto list = slot.toTensorList().copy();
        at::Tensor tensor = list.get(*element).detach();
        torch::autograd::set_history(tensor, detail::NodePtr(node));
        list.set(*element, tensor);
        slot = std::move(list);
      }
    }
  }

  // 3. Explicit backward: run the op below autograd (kernels included), then attach a node.
  // An explicit backward returns one gradient per argument, and a Tensor[] argument's elements
  // have no edge of their own: their gradients would be lost without a word.
  void check_no_list_requires_grad(const torch::jit::Stack& stack) const {
    const auto& arguments = op_->schema.arguments();
    const c10::IValue* first = stack.data() + (stack.size() - arguments.size());
    for (size_t i = 0; i < arguments.size(); ++i) {
      if (!first[i].isList() || !requires_grad(first[i])) continue;
      TORCH_CHECK(false, op_->name, ": argument '", arguments[i].name(), "' (a ",
                  arguments[i].type()->str(),
                  ") holds a tensor that requires grad, but the op's explicit backward gives "
                  "gradients to Tensor arguments only; pass such tensors as separate Tensor "
                  "arguments, or leave backward out (the fallback's own gradients flow through "
                  "lists)");
    }
  }

  void run_with_backward(const c10::OperatorHandle& op, c10::DispatchKeySet keys,
                         torch::jit::Stack* stack) {
    const auto& schema = op_->schema;
    const size_t num_args = schema.arguments().size();
    std::vector<c10::IValue> inputs(stack->end() - num_args, stack->end());

    auto node = detail::make_node<OpregBackward>();
    node->op = op_;
    node->declaration = spec_;
    auto& ctx = node->ctx;
    ctx.input_edges_.reserve(num_args);
    ctx.input_requires_grad_.reserve(num_args);
    ctx.edge_inputs_.reserve(num_args);
    std::vector<at::Tensor> edge_tensors;
    edge_tensors.reserve(num_args);
    for (const auto& input : inputs) {
      bool is_tensor = input.isTensor() && input.toTensor().defined();
      ctx.input_edges_.push_back(is_tensor ? static_cast<int64_t>(edge_tensors.size()) : -1);
      ctx.input_requires_grad_.push_back(is_tensor && input.toTensor().requires_grad());
      if (is_tensor) {
        const auto& tensor = input.toTensor();
        edge_tensors.push_back(tensor);
        ctx.edge_inputs_.push_back(
            {c10::SymDimVector(tensor.sym_sizes().begin(), tensor.sym_sizes().end()),
             tensor.scalar_type()});
      }
    }
    node->set_next_edges(torch::autograd::collect_next_edges(edge_tensors));

    {
      // As torch.autograd.Function.forward: the backward is the gradient, so the forward runs
      // without recording (and may use what refuses tensors that require grad, e.g. numpy()),
      // but for the outer layers of functorch's nested grads (see forward_grad_mode).
      c10::AutoGradMode grad_mode(detail::forward_grad_mode());
      at::AutoDispatchBelowADInplaceOrView guard;
      op.redispatchBoxed(keys & c10::after_ADInplaceOrView_keyset, stack);
    }
    const size_t num_returns = schema.returns().size();
    // As torch.autograd.Function's outputs that view an input: changing one in place would
    // bypass the backward, so PyTorch refuses it.
    if (!views_.empty()) {
      using torch::autograd::CreationMeta;
      make_views(op_->name, views_, inputs, num_returns, stack, true,
                 CreationMeta::IN_CUSTOM_FUNCTION, CreationMeta::IN_CUSTOM_FUNCTION);
    }
    std::vector<c10::IValue> outputs(stack->end() - num_returns, stack->end());
    node->num_returns = num_returns;
    // As torch.autograd.Function: setup_context sees the outputs before they join the graph, and
    // may mark some of them non-differentiable.
    if (spec_->setup_context) {
      detail::run_user_code_named<void>(op_->name, "setup_context",
                                        [&] { spec_->setup_context(ctx, inputs, outputs); });
    }
    auto is_marked = [&](const at::Tensor& tensor) {
      for (const auto& marked : ctx.non_differentiable_) {
        if (marked.is_same(tensor)) return true;
      }
      return false;
    };
    for (size_t i = 0; i < ctx.non_differentiable_.size(); ++i) {
      bool is_output = false;
      for (const auto& output : outputs) {
        is_output = is_output ||
                    (output.isTensor() && output.toTensor().is_same(ctx.non_differentiable_[i]));
      }
      TORCH_CHECK(is_output, op_->name,
                  ": setup_context's ctx.mark_non_differentiable got a tensor (its argument ", i,
                  ") that is none of the op's outputs; mark outputs only");
    }
    node->positions.reserve(num_returns);
    node->outputs.reserve(num_returns);
    for (size_t index = 0; index < num_returns; ++index) {
      const auto& output = outputs[index];
      if (!output.isTensor()) continue;
      auto tensor = output.toTensor();
      if (!tensor.defined() || !torch::autograd::isDifferentiableType(tensor.scalar_type())) {
        continue;
      }
      detail::OutputMeta meta{
          c10::SymDimVector(tensor.sym_sizes().begin(), tensor.sym_sizes().end()),
          tensor.options()};
      if (is_marked(tensor)) {
        node->marked.emplace_back(index, std::move(meta));
        continue;
      }
      node->positions.push_back(index);
      node->outputs.push_back(std::move(meta));
      torch::autograd::set_history(tensor, detail::NodePtr(node));
    }
    ctx.non_differentiable_.clear();
    for (const auto& tensor : ctx.to_save_) {
      bool is_output = false;
      for (const auto& output : outputs) {
        is_output = is_output || (output.isTensor() && output.toTensor().is_same(tensor));
      }
      ctx.saved_.emplace_back(tensor, is_output);
    }
    ctx.to_save_.clear();
    ctx.node_ = node.get();
  }

  detail::IdentityPtr op_;
  std::shared_ptr<const AutogradDeclaration> spec_;
  detail::FallbackPtr fallback_;
  std::vector<ViewReturn> views_;  // see Note [Outputs the schema declares views]
  std::shared_ptr<std::atomic<bool>> warned_ = std::make_shared<std::atomic<bool>>(false);
};

namespace detail {

c10::KernelFunction make_autograd_kernel(IdentityPtr op, const AutogradDeclaration& autograd,
                                         FallbackPtr fallback) {
  TORCH_CHECK_VALUE(!autograd.backward || !op->schema.is_mutable(), op->name,
                    ": a backward for an op that mutates its inputs is not supported; leave the "
                    "backward out (the fallback then runs under autograd)");
  TORCH_CHECK_VALUE(!autograd.setup_context || autograd.backward, op->name,
                    ": setup_context is given without a backward");
  const auto policy = static_cast<int>(autograd.policy);
  TORCH_CHECK_VALUE(policy >= static_cast<int>(AutogradPolicy::kFallback) &&
                        policy <= static_cast<int>(AutogradPolicy::kNone),
                    op->name, ": autograd policy ", policy, " is no opreg::AutogradPolicy");
  // The policy says what happens without a backward: with one, 'error' and 'none' would be
  // silently ignored (Python's front refuses the same pairs).
  TORCH_CHECK_VALUE(!autograd.backward || autograd.policy == AutogradPolicy::kFallback, op->name,
                    ": autograd policy '",
                    autograd.policy == AutogradPolicy::kError ? "error" : "none",
                    "' says the op has no gradients to give, but a backward is given; leave one "
                    "of them out");
  return c10::KernelFunction::makeFromBoxedFunctor(
      std::make_unique<AutogradKernel>(std::move(op), autograd, std::move(fallback)));
}

AutogradSupport autograd_support(const AutogradDeclaration& autograd) {
  if (autograd.backward) return AutogradSupport::kBackward;
  switch (autograd.policy) {
    case AutogradPolicy::kFallback:
      return AutogradSupport::kFallback;
    case AutogradPolicy::kError:
      return AutogradSupport::kError;
    case AutogradPolicy::kNone:
      return AutogradSupport::kNone;
  }
  TORCH_INTERNAL_ASSERT(false, "unknown autograd policy");
}

}  // namespace detail
}  // namespace opreg
