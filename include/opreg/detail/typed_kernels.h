// include/opreg/detail/typed_kernels.h: how the typed builder (opreg/op.h) turns C++ callables
// into the boxed kernel factories of an OpBuilder. Each wrapper records its trace and, for a
// kernel with a predicate, serves declined calls from the fallback directly; the argument and
// output checks run around it, in the op's trampoline (src/core/registry.cpp).
#pragma once

#include <functional>
#include <string>
#include <type_traits>
#include <utility>

#include <ATen/core/Tensor.h>

#include "opreg/definition.h"
#include "opreg/trace.h"

namespace opreg::detail {

template <class... Args>
std::string trace_device_of(const Args&... args) {
  std::string device = "-";
  bool found = false;
  auto visit = [&](const auto& arg) {
    if constexpr (std::is_same_v<std::decay_t<decltype(arg)>, at::Tensor>) {
      if (!found && arg.defined()) {
        device = arg.device().str();
        found = true;
      }
    }
  };
  (visit(args), ...);
  return device;
}

// A callable run as is (the fallback, a fake), its calls traced under the context's label.
template <class Ret, class... Args>
KernelFactory typed_kernel(std::function<Ret(Args...)> fn) {
  return {[fn = std::move(fn)](const KernelContext& context) {
    return c10::KernelFunction::makeFromUnboxedLambda(
        [fn, op = context.op, label = context.label](Args... args) -> Ret {
          if (trace_enabled()) record_trace(op, label, trace_device_of(args...));
          return fn(args...);
        });
  }};
}

// A kernel that may decline a call (its predicate says false): the fallback then serves it.
template <class Ret, class... Args>
KernelFactory typed_kernel(std::function<Ret(Args...)> kernel, std::function<bool(Args...)> accepts,
                           std::function<Ret(Args...)> fallback) {
  if (!accepts) return typed_kernel(std::move(kernel));
  return {[=](const KernelContext& context) {
    return c10::KernelFunction::makeFromUnboxedLambda(
        [=, op = context.op, label = context.label](Args... args) -> Ret {
          if (!accepts(args...)) {
            if (trace_enabled()) {
              record_trace(op, "fallback(declined by " + label + ")", trace_device_of(args...));
            }
            return fallback(args...);
          }
          if (trace_enabled()) record_trace(op, label, trace_device_of(args...));
          return kernel(args...);
        });
  }};
}

}  // namespace opreg::detail
