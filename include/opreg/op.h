// include/opreg/op.h: the op builder. One declaration turns a fallback (the reference
// implementation), optional accelerated kernels and an optional fake into PyTorch dispatcher
// registrations:
//
//   static const auto scale_add =
//       opreg::op("mylib::scale_add(Tensor x, Tensor y, float alpha) -> Tensor")
//           .fallback(scale_add_reference)
//           .kernel(scale_add_cuda, opreg::on({"cuda"}).accepts(is_contiguous))
//           .fake(scale_add_fake)
//           .define();
//
// See Note [How an opreg op maps onto the dispatcher] in src/core/registry.cpp.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/core/op_registration/infer_schema.h>
#include <c10/util/Exception.h>
#include <torch/library.h>

#include "opreg/aot_launch.h"
#include "opreg/autograd.h"
#include "opreg/check.h"
#include "opreg/trace.h"
#include "opreg/version.h"
#include "opreg/vmap.h"

namespace opreg {

// Where and when a kernel serves calls. Without devices(), a kernel follows the registry of
// accelerated device types (opreg/device_types.h), including types registered after define().
// With accepts(predicate), a call for which the predicate (the op's signature, returning bool)
// says false is declined and served by the fallback.
template <class Predicate = std::nullptr_t>
class KernelOptions {
 public:
  KernelOptions() = default;
  KernelOptions(std::string name, std::optional<std::vector<std::string>> devices,
                Predicate predicate)
      : name_(std::move(name)), devices_(std::move(devices)), accepts_(std::move(predicate)) {}

  KernelOptions name(std::string kernel_name) const {
    return KernelOptions(std::move(kernel_name), devices_, accepts_);
  }
  KernelOptions devices(std::vector<std::string> device_types) const {
    return KernelOptions(name_, std::move(device_types), accepts_);
  }
  template <class NewPredicate>
  KernelOptions<std::decay_t<NewPredicate>> accepts(NewPredicate predicate) const {
    return {name_, devices_, std::move(predicate)};
  }

  const std::string& kernel_name() const { return name_; }
  const std::optional<std::vector<std::string>>& device_types() const { return devices_; }
  const Predicate& predicate() const { return accepts_; }

 private:
  std::string name_ = "kernel";
  std::optional<std::vector<std::string>> devices_;
  Predicate accepts_{};
};

inline KernelOptions<> on(std::vector<std::string> device_types) {
  return KernelOptions<>().devices(std::move(device_types));
}

namespace detail {

// What an op's wrappers need to know about it, completed by define() once the schema is known
// and never changed after the definition is published.
struct OpRuntime {
  std::string name;
  std::vector<std::string> arg_names;
  std::vector<std::pair<size_t, std::vector<c10::ScalarType>>> dtype_rules;
  bool same_device = true;
};

// What a kernel's factory gets: the op's runtime, its checked fallback (boxed) and schema.
struct KernelContext {
  std::shared_ptr<const OpRuntime> runtime;
  std::shared_ptr<const c10::KernelFunction> fallback;
  const c10::FunctionSchema& schema;
};

struct KernelSpec {
  std::string name;
  std::optional<std::vector<std::string>> device_types;  // nullopt: follow the registry
  std::function<c10::KernelFunction(const KernelContext&)> make;
};

// Everything define() needs, with the C++ signature erased. Each define() builds a new,
// immutable definition from it; see Note [Definitions are immutable] in src/core/registry.cpp.
struct OpSpec {
  std::string name_or_schema;
  std::function<c10::FunctionSchema()> infer_schema;  // from the C++ signature; empty in Python
  std::shared_ptr<OpRuntime> runtime;
  std::shared_ptr<const c10::KernelFunction> fallback;  // runs the checks, then the fallback
  std::shared_ptr<const c10::KernelFunction> meta;      // null: a fake registered from Python
  bool explicit_fake = false;
  std::string python_module;  // the module that registers its Python pieces (set_python_module)
  std::vector<KernelSpec> kernels;
  std::vector<std::pair<std::string, std::vector<c10::ScalarType>>> dtype_rules;
  AutogradSpec autograd;
  VmapSpec vmap;
  bool bitwise = false;  // kernels promise bitwise equality with the fallback
  bool replace = false;
  std::string origin;
  const void* caller = nullptr;  // an address in the defining library, for `origin`
};

// The dispatcher's handle of "ns::name" or "ns::name.overload"; a ValueError when there is none.
c10::OperatorHandle find_operator(const std::string& qualified);

// The argument checks on a boxed call's arguments (`count` IValues from `first`).
void check_boxed_arguments(const OpRuntime& runtime, const c10::IValue* first, size_t count);

[[noreturn]] void throw_no_fake(const std::string& op, const std::string& reason);

// The kernel of .aot_kernel(): src/triton/aot_launch.cpp.
c10::KernelFunction make_aot_launch_kernel(const KernelContext& context, const AotLaunch& launch,
                                           const std::string& label);

// The opreg headers a definition was compiled with. The default arguments below are evaluated
// where an op is declared, so that libopreg refuses (with an error naming both versions) a
// library built against headers of another minor version, instead of misreading its spec.
struct HeadersTag {
  int major = OPREG_VERSION_MAJOR;
  int minor = OPREG_VERSION_MINOR;
  int patch = OPREG_VERSION_PATCH;
  size_t spec_size = sizeof(OpSpec);
};

// Validates the spec completely, then publishes it as the op's definition at once; a failure
// changes nothing. Returns the qualified name.
std::string define(OpSpec spec, HeadersTag headers = {});

// Defines several ops together: all of them, or (on any error) none.
std::vector<std::string> define_all(std::vector<OpSpec> specs, HeadersTag headers = {});

// Each tensor argument, in schema order, for the argument checks.
template <class... Args>
void check_args(const OpRuntime& runtime, const Args&... args) {
  ArgChecker checker(runtime.name, runtime.arg_names, runtime.dtype_rules, runtime.same_device);
  size_t index = 0;
  (checker.visit(index++, args), ...);
}

template <class... Args>
std::string device_of(const Args&... args) {
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

template <class Lambda>
std::shared_ptr<const c10::KernelFunction> make_kernel_function(Lambda lambda) {
  return std::make_shared<const c10::KernelFunction>(
      c10::KernelFunction::makeFromUnboxedLambda(std::move(lambda)));
}

}  // namespace detail

// A callable handle on a defined op: calls go through the dispatcher, like any PyTorch op.
template <class Sig>
class OpHandle;

template <class Ret, class... Args>
class OpHandle<Ret(Args...)> {
 public:
  explicit OpHandle(std::string name) : name_(std::move(name)) {}
  OpHandle(const OpHandle& other) : name_(other.name_) {}
  const std::string& name() const { return name_; }
  Ret operator()(Args... args) const { return typed().call(std::forward<Args>(args)...); }

  // The dispatcher's handle, looked up on first use. It stays valid when the op is replaced or
  // undefined: opreg keeps an op's dispatcher entry for the life of the process.
  c10::TypedOperatorHandle<Ret(Args...)> typed() const {
    std::call_once(found_, [this] {
      cached_.emplace(detail::find_operator(name_).template typed<Ret(Args...)>());
    });
    return *cached_;
  }

 private:
  std::string name_;
  mutable std::once_flag found_;
  mutable std::optional<c10::TypedOperatorHandle<Ret(Args...)>> cached_;
};

template <class Sig>
class Op;

// The builder for an op whose C++ signature is Ret(Args...), fixed by its fallback.
template <class Ret, class... Args>
class Op<Ret(Args...)> {
 public:
  using Signature = Ret(Args...);
  using Function = std::function<Ret(Args...)>;

  Op(std::string name_or_schema, Function fallback) : fallback_(std::move(fallback)) {
    TORCH_CHECK_VALUE(static_cast<bool>(fallback_), "opreg: op '", name_or_schema,
                      "': the fallback is empty; pass a function");
    spec_.name_or_schema = std::move(name_or_schema);
    spec_.runtime = std::make_shared<detail::OpRuntime>();
    spec_.infer_schema = [] { return c10::inferFunctionSchemaFlattenedReturns<Signature>(); };
  }

  // An accelerated implementation with the fallback's signature.
  template <class Kernel, class Predicate = std::nullptr_t>
  Op&& kernel(Kernel kernel, KernelOptions<Predicate> options = {}) && {
    Function kernel_fn(std::move(kernel));
    std::function<bool(Args...)> accepts;
    if constexpr (!std::is_same_v<Predicate, std::nullptr_t>) {
      accepts = options.predicate();
    }
    auto runtime = spec_.runtime;
    auto fallback = fallback_;
    std::string trace_label = "kernel:" + options.kernel_name();
    detail::KernelSpec kernel_spec;
    kernel_spec.name = options.kernel_name();
    kernel_spec.device_types = options.device_types();
    kernel_spec.make = [=](const detail::KernelContext&) {
      return c10::KernelFunction::makeFromUnboxedLambda([=](Args... args) -> Ret {
        detail::check_args(*runtime, args...);
        if (accepts && !accepts(args...)) {
          if (trace_enabled()) {
            detail::record_trace(runtime->name, "fallback(declined by " + trace_label + ")",
                                 detail::device_of(args...));
          }
          return fallback(args...);
        }
        if (trace_enabled()) {
          detail::record_trace(runtime->name, trace_label, detail::device_of(args...));
        }
        return kernel_fn(args...);
      });
    };
    spec_.kernels.push_back(std::move(kernel_spec));
    return std::move(*this);
  }

  // An AOT-compiled Triton kernel attached by declaration (see opreg/aot_launch.h), for the
  // given device types (CUDA by default).
  Op&& aot_kernel(AotLaunch launch, std::vector<std::string> devices = {"cuda"},
                  std::string name = "triton_aot") && {
    std::string label = "kernel:" + name;
    detail::KernelSpec kernel_spec;
    kernel_spec.name = std::move(name);
    kernel_spec.device_types = std::move(devices);
    kernel_spec.make = [launch = std::move(launch), label](const detail::KernelContext& context) {
      return detail::make_aot_launch_kernel(context, launch, label);
    };
    spec_.kernels.push_back(std::move(kernel_spec));
    return std::move(*this);
  }

  // The op's abstract evaluation: output metadata only, run on meta and fake tensors. Read sizes
  // with sym_sizes() so dynamic shapes stay symbolic.
  template <class Fake>
  Op&& fake(Fake fake) && {
    Function fake_fn(std::move(fake));
    auto runtime = spec_.runtime;
    spec_.explicit_fake = true;
    spec_.meta = detail::make_kernel_function([=](Args... args) -> Ret {
      detail::check_args(*runtime, args...);
      if (trace_enabled()) detail::record_trace(runtime->name, "fake", "meta");
      return fake_fn(args...);
    });
    return std::move(*this);
  }

  // Restricts the dtypes of a tensor argument, checked on every call with a message naming it.
  Op&& dtypes(std::string argument, std::vector<c10::ScalarType> allowed) && {
    spec_.dtype_rules.emplace_back(std::move(argument), std::move(allowed));
    return std::move(*this);
  }

  // The kernels promise results bitwise equal to the fallback's (checked by opcheck).
  Op&& bitwise() && {
    spec_.bitwise = true;
    return std::move(*this);
  }

  // By default all defined tensor arguments (0-dim CPU tensors aside) must share one device.
  Op&& allow_mixed_devices() && {
    spec_.runtime->same_device = false;
    return std::move(*this);
  }

  // Gradients from an explicit backward: setup_context(ctx, inputs, outputs) then
  // backward(ctx, grad_outputs) -> one gradient per input. See opreg/autograd.h.
  Op&& backward(Backward backward, SetupContext setup_context = nullptr) && {
    spec_.autograd.backward = std::move(backward);
    spec_.autograd.setup_context = std::move(setup_context);
    return std::move(*this);
  }

  // What happens under autograd when no backward is given (default: AutogradPolicy::kFallback).
  Op&& autograd(AutogradPolicy policy) && {
    spec_.autograd.policy = policy;
    return std::move(*this);
  }

  // vmap (see opreg/vmap.h): an explicit rule; or the op accepts extra leading dimensions on every
  // tensor argument; or, only for ops whose output shape depends on the data, the per-example
  // loop. Without any of these the fallback runs on batched tensors.
  Op&& vmap(VmapRule rule) && {
    spec_.vmap.rule = std::move(rule);
    return std::move(*this);
  }
  Op&& batch_polymorphic() && {
    spec_.vmap.batch_polymorphic = true;
    return std::move(*this);
  }
  Op&& vmap_per_example_loop() && {
    spec_.vmap.per_example_loop = true;
    return std::move(*this);
  }
  // The op draws random numbers: torch.vmap's randomness argument applies to it.
  Op&& random() && {
    spec_.vmap.random = true;
    return std::move(*this);
  }

  // Defining an existing opreg op again is an error unless replacement is asked for.
  Op&& replace(bool replace = true) && {
    spec_.replace = replace;
    return std::move(*this);
  }
  Op&& origin(std::string where) && {
    spec_.origin = std::move(where);
    return std::move(*this);
  }

  // Registers everything with the dispatcher. Errors name the op and the piece at fault.
  __attribute__((noinline)) OpHandle<Signature> define() && {
    auto runtime = spec_.runtime;
    auto fallback = fallback_;
    auto checked_fallback = [=](Args... args) -> Ret {
      detail::check_args(*runtime, args...);
      if (trace_enabled()) {
        detail::record_trace(runtime->name, "fallback", detail::device_of(args...));
      }
      return fallback(args...);
    };
    spec_.fallback = detail::make_kernel_function(checked_fallback);
    if (!spec_.meta) {
      spec_.meta = detail::make_kernel_function([=](Args... args) -> Ret {
        detail::check_args(*runtime, args...);
        if (trace_enabled()) detail::record_trace(runtime->name, "fallback(meta)", "meta");
        try {
          return fallback(args...);
        } catch (const c10::Error& error) {
          detail::throw_no_fake(runtime->name, error.what_without_backtrace());
        } catch (const std::exception& error) {  // a Python meta function raised
          detail::throw_no_fake(runtime->name, error.what());
        }
      });
    }
    spec_.caller = __builtin_return_address(0);
    return OpHandle<Signature>(detail::define(std::move(spec_)));
  }

 private:
  Function fallback_;
  detail::OpSpec spec_;
};

// The start of a declaration: the op's name ("ns::name"), or its full schema
// ("ns::name(Tensor x) -> Tensor"). Without a schema, it is inferred from the fallback's C++ type.
class OpDeclaration {
 public:
  explicit OpDeclaration(std::string name_or_schema) : name_or_schema_(std::move(name_or_schema)) {}

  template <class Fallback>
  auto fallback(Fallback fallback) && {
    using Traits = c10::guts::infer_function_traits_t<std::decay_t<Fallback>>;
    using Sig = typename Traits::func_type;
    return Op<Sig>(std::move(name_or_schema_), std::function<Sig>(std::move(fallback)));
  }

 private:
  std::string name_or_schema_;
};

inline OpDeclaration op(std::string name_or_schema) {
  return OpDeclaration(std::move(name_or_schema));
}

}  // namespace opreg
