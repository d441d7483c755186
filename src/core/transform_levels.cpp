// src/core/transform_levels.cpp: runs an op's user code at or below the functorch layer that is
// processing the op (transform_levels.h), with functorch's exported layer stack.
#include "transform_levels.h"

#include <ATen/functorch/ADInterpreters.h>
#include <ATen/functorch/DynamicLayer.h>
#include <c10/core/impl/LocalDispatchKeySet.h>
#include <c10/util/Exception.h>

namespace opreg::detail {
namespace {

namespace functorch = at::functorch;

// Whether the top layer is processing an op: its front fallback excluded the front key and saved
// the caller's key set (torch._C._DisableFuncTorch excludes the back key too, and saves nothing).
bool processing_a_layer() {
  if (functorch::getDynamicLayerStack().empty()) return false;
  const auto excluded = c10::impl::tls_local_dispatch_key_set().excluded_;
  return excluded.has(c10::DispatchKey::FuncTorchDynamicLayerFrontMode) &&
         !excluded.has(c10::DispatchKey::FuncTorchDynamicLayerBackMode);
}

// Runs `body`, then `restore` (also when `body` throws). Not a scope guard: `restore` asserts,
// and an assert thrown from a destructor would end the process.
template <class Restore>
void run_then(c10::function_ref<void()> body, Restore&& restore) {
  try {
    body();
  } catch (...) {
    restore();
    throw;
  }
  restore();
}

}  // namespace

void run_at_transform_level(c10::function_ref<void()> body) {
  if (!processing_a_layer()) return body();
  const auto processing = c10::impl::tls_local_dispatch_key_set();
  auto top = functorch::popDynamicLayer();
  const auto called_with = top.interpreter().getSavedLocalDispatchKeySet();
  top.interpreter().clearSavedLocalDispatchKeySet();
  const int64_t level = functorch::pushDynamicLayer(std::move(top));
  c10::impl::_force_tls_local_dispatch_key_set(called_with);
  run_then(body, [&] {
    auto again = functorch::popDynamicLayer();
    TORCH_INTERNAL_ASSERT(again.layerId() == level, "functorch layer ", again.layerId(),
                          " left on top of layer ", level);
    again.interpreter().saveLocalDispatchKeySet(called_with);
    functorch::pushDynamicLayer(std::move(again));
    c10::impl::_force_tls_local_dispatch_key_set(processing);
  });
}

void run_below_transform_level(c10::function_ref<void()> body) {
  if (!processing_a_layer()) return body();
  const auto processing = c10::impl::tls_local_dispatch_key_set();
  const auto& interpreter = functorch::getDynamicLayerStack().back().interpreter();
  TORCH_INTERNAL_ASSERT(interpreter.key() == functorch::TransformType::Vmap,
                        "only a vmap layer's back is emulated");
  // Before the pop: popping the last layer takes the front and back keys out of the key set.
  c10::impl::_force_tls_local_dispatch_key_set(interpreter.getSavedLocalDispatchKeySet());
  auto top = functorch::popDynamicLayer();
  run_then(body, [&] {
    functorch::pushDynamicLayer(std::move(top));  // asserts the stack is back to what it was
    c10::impl::_force_tls_local_dispatch_key_set(processing);
  });
}

bool forward_grad_mode() {
  if (!processing_a_layer()) return false;
  const auto& interpreter = functorch::getDynamicLayerStack().back().interpreter();
  if (interpreter.key() != functorch::TransformType::Grad) return false;
  return functorch::GradInterpreterPtr(&interpreter).prevGradMode();
}

}  // namespace opreg::detail
