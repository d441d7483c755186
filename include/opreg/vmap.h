// include/opreg/vmap.h: how opreg ops behave under torch.vmap (see Note [vmap of opreg ops] in
// src/core/vmap.cpp). In order of preference:
//   rule:              an explicit batching rule, which may launch batched kernels;
//   batch_polymorphic: the op accepts extra leading dimensions on every tensor argument, so vmap
//                      moves the batch dims to the front and calls the op once;
//   fallback:          the default: the fallback runs on batched tensors and PyTorch batches its
//                      ATen ops;
//   per-example loop:  only when asked for (data-dependent output shapes), warned once.
// Declared together, batch_polymorphic serves the calls whose tensor arguments all have one
// logical rank and the per-example loop the others (which the fallback serves otherwise).
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <vector>

#include <ATen/core/ivalue.h>
#include <c10/core/SymInt.h>

#include "opreg/export.h"

namespace opreg {

enum class Randomness { kError, kSame, kDifferent };

struct VmapInfo {
  // Symbolic under tracing with a dynamic batch (torch.export's Dim, torch.compile's dynamic
  // shapes), as torch's own VmapInfo: sizes built from it keep the graph general
  // (expand_symint), while a number taken from it (guard_int) specializes the graph to it.
  c10::SymInt batch_size{0};
  Randomness randomness = Randomness::kError;
};

struct VmapResult {
  std::vector<c10::IValue> outputs;              // one per return of the schema
  std::vector<std::optional<int64_t>> out_dims;  // the batch dim of each, nullopt if none
};

// rule(info, in_dims, args): args are unwrapped (plain tensors), in_dims[i] is the batch dim of
// argument i or nullopt. A Tensor[] (or Tensor?[]) argument is batched as a whole: when any of
// its tensors is, each has the batch at dim 0 (unbatched ones expanded; None stays None) and
// in_dims[i] is 0. Calls to ops inside
// the rule run below this vmap level.
using VmapRule = std::function<VmapResult(const VmapInfo& info,
                                          const std::vector<std::optional<int64_t>>& in_dims,
                                          const std::vector<c10::IValue>& args)>;

namespace detail {

// Whether autograd records below the current vmap level for a call with these (unwrapped)
// arguments, through every functorch layer under it (Note [Gradients through vmap]).
struct GradientsBelow {
  bool reverse = false;  // an input requires grad (and grad mode is on)
  bool forward = false;  // an input has a forward-mode tangent
};
OPREG_API GradientsBelow gradients_below(const std::vector<c10::IValue>& args);

}  // namespace detail
}  // namespace opreg
