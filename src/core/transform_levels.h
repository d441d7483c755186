// src/core/transform_levels.h: where an op's user code runs among functorch's transforms (vmap,
// grad, jvp). An opreg kernel at FuncTorchBatched or Autograd runs while functorch's front
// fallback processes the top layer: that layer holds the key set the op was called with, and the
// front is excluded. User code run there as is cannot start a transform of its own (torch.vmap
// inside a fallback hit functorch's internal assert), so it runs as PyTorch runs code at and
// below a layer.
#pragma once

#include <c10/util/FunctionRef.h>

namespace opreg::detail {

// Runs `body` as code called at the top layer's level, as a composite op's body is: its ops
// enter that layer through the front again, and transforms it starts nest above the layer. For
// a fallback given the layer's wrapped tensors.
void run_at_transform_level(c10::function_ref<void()> body);

// Runs `body` below the top layer, as functorch's back fallback does: the layer is off the
// stack and the key set the op was called with is restored. For a vmap rule given unwrapped
// tensors.
void run_below_transform_level(c10::function_ref<void()> body);

// The grad mode an op's forward runs in below its autograd node: off, as torch.autograd.Function
// runs its forward, except under functorch's grad transform, where it is the mode the top layer
// was entered with (as functorch lowers an autograd.Function): the layers below, an outer grad
// among them, record the call, so a grad of a grad differentiates it again.
bool forward_grad_mode();

}  // namespace opreg::detail
