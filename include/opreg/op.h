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

#include <array>
#include <atomic>
#include <cstdint>
#include <exception>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <tuple>
#include <type_traits>
#include <utility>
#include <vector>

#include <ATen/core/List.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/core/op_registration/infer_schema.h>
#include <c10/util/Exception.h>
#include <c10/util/OptionalArrayRef.h>

#include "opreg/autograd.h"
#include "opreg/definition.h"
#include "opreg/detail/typed_kernels.h"
#include "opreg/export.h"
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

// The dispatcher's handle of "ns::name" or "ns::name.overload"; a ValueError when there is none
// (inside opreg::load_library, the load fails instead: see ARCHITECTURE.md, Guarantees). Its
// schema() must not be read while another thread changes the op's schema (PyTorch's dispatcher
// frees it unlocked): describe_op(name).schema can be.
OPREG_API c10::OperatorHandle find_operator(const std::string& qualified);

// A ValueError, naming the op, when a handle's C++ signature does not fit the op's schema.
// `reference_results`: a bit for each result the handle takes as a Tensor reference, and
// detail::kReturnsFirstArgument where PyTorch's typed call returns its first argument for them.
OPREG_API void check_handle_signature(const c10::OperatorHandle& handle,
                                      const c10::FunctionSchema& handle_signature);
OPREG_API void check_handle_signature(const c10::OperatorHandle& handle,
                                      const c10::FunctionSchema& handle_signature,
                                      uint64_t reference_results);

namespace detail {
// Whether this thread is inside opreg::load_library, running a library's static initializers.
OPREG_API bool inside_library_load();
// Fails the load of this thread with `error`, naming `what`; `caller` is an address in the
// library whose code failed.
OPREG_API void fail_library_load(const std::string& what, const void* caller,
                                 const std::exception& error);
// Whether T is a Template<...> (a std::tuple, a std::optional).
template <class T, template <class...> class Template>
struct is_instance_of : std::false_type {};
template <template <class...> class Template, class... Types>
struct is_instance_of<Template<Types...>, Template> : std::true_type {};

// A bit for each of a handle's results typed `at::Tensor&`: PyTorch's unboxing gives such a
// result the call's in-place argument, whatever the op returned (sweep 52 B-N43).
template <class T>
constexpr uint64_t tensor_reference_bit(size_t index) {
  return std::is_lvalue_reference_v<T> && std::is_same_v<std::decay_t<T>, at::Tensor>
             ? uint64_t{1} << index
             : 0;
}
template <class... Results, size_t... I>
constexpr uint64_t tuple_reference_bits(std::tuple<Results...>* /*results*/,
                                        std::index_sequence<I...> /*indices*/) {
  return (uint64_t{0} | ... | tensor_reference_bit<Results>(I));
}
// The last bit says the typed call returns its first argument for them (an in-place op's
// signature: the first parameter a Tensor reference of the result's constness), not its last ones.
inline constexpr uint64_t kReturnsFirstArgument = uint64_t{1} << 63;
template <class Ret, class... Args>
constexpr uint64_t reference_results() {
  if constexpr (is_instance_of<Ret, std::tuple>::value) {
    return tuple_reference_bits(static_cast<Ret*>(nullptr),
                                std::make_index_sequence<std::tuple_size_v<Ret>>{});
  } else if constexpr (sizeof...(Args) > 0 && tensor_reference_bit<Ret>(0) != 0) {
    using First = std::tuple_element_t<0, std::tuple<Args...>>;
    return std::is_same_v<First, Ret> ? 1 | kReturnsFirstArgument : 1;
  } else {
    return tensor_reference_bit<Ret>(0);
  }
}

// A handle's result of a C++ enum within its values: one from a definition whose schema returns
// `int`, published between the handle's check and its call, was not (sweep 52 B-N2: a
// ScalarType of -96).
template <class T>
void check_enum_result(const std::string& op, const T& value) {
  if constexpr (std::is_same_v<T, at::ScalarType> || std::is_same_v<T, at::Layout> ||
                std::is_same_v<T, at::MemoryFormat>) {
    const auto number = static_cast<int64_t>(value);
    TORCH_CHECK(number >= 0 && number < static_cast<int64_t>(T::NumOptions), op,
                ": the call returned ", number, " for an enum result, which is no value of it: ",
                "the op was replaced by one returning int during the call; call it again");
  } else if constexpr (is_instance_of<T, std::optional>::value) {
    if (value.has_value()) check_enum_result(op, *value);
  } else if constexpr (is_instance_of<T, std::tuple>::value) {
    std::apply([&op](const auto&... element) { (check_enum_result(op, element), ...); }, value);
  }
}

// A count of an opreg op's schema changes (null for ops opreg did not define): a typed handle
// checks its signature again when it moves. It lives as long as the process.
OPREG_API const std::atomic<uint64_t>* schema_changes_of(const std::string& qualified);

// What a call that failed a library load gives back: an empty value of the output's type (a
// Device, which has none, is the CPU).
template <class T>
T placeholder();

template <class... T>
std::tuple<T...> tuple_placeholder(std::tuple<T...>* /*type*/) {
  return std::tuple<T...>(placeholder<T>()...);
}

template <class T>
T placeholder() {
  using Value = std::remove_cv_t<std::remove_reference_t<T>>;
  if constexpr (std::is_reference_v<T>) {
    static thread_local Value value = placeholder<Value>();
    return value;
  } else if constexpr (std::is_default_constructible_v<T>) {
    return T();
  } else if constexpr (!std::is_same_v<T, c10::Device>) {
    return tuple_placeholder(static_cast<T*>(nullptr));
  } else {
    return c10::Device(c10::kCPU);
  }
}

// Whether a piece's parameters can be read: a function, or a functor whose operator() is no
// template (a generic lambda's is).
template <class Piece, class = void>
constexpr bool has_readable_parameters = std::is_function_v<std::remove_pointer_t<Piece>>;
template <class Piece>
constexpr bool has_readable_parameters<Piece, std::void_t<decltype(&Piece::operator())>> = true;

// The scalar a parameter carries, through the wrappers a schema type maps to and std::function may
// convert across (`int? n` is std::optional<int64_t>; std::optional<int> takes it, cutting it).
template <class T>
struct carried_scalar {
  using type = T;
};
template <class T>
struct carried_scalar<std::optional<T>> : carried_scalar<std::decay_t<T>> {};
template <class T>
struct carried_scalar<c10::ArrayRef<T>> : carried_scalar<std::decay_t<T>> {};
template <class T>
struct carried_scalar<c10::OptionalArrayRef<T>> : carried_scalar<std::decay_t<T>> {};
template <class T, class Allocator>
struct carried_scalar<std::vector<T, Allocator>> : carried_scalar<std::decay_t<T>> {};
template <class T>
struct carried_scalar<c10::List<T>> : carried_scalar<std::decay_t<T>> {};
template <class T, size_t N>
struct carried_scalar<std::array<T, N>> : carried_scalar<std::decay_t<T>> {};

template <class Expected, class Given>
constexpr bool same_scalar() {
  using E = typename carried_scalar<std::decay_t<Expected>>::type;
  using G = typename carried_scalar<std::decay_t<Given>>::type;
  return !(std::is_arithmetic_v<E> || std::is_arithmetic_v<G>) || std::is_same_v<E, G>;
}

template <class... Expected, class... Given>
constexpr bool same_scalars(c10::guts::typelist::typelist<Expected...>* /*expected*/,
                            c10::guts::typelist::typelist<Given...>* /*given*/) {
  if constexpr (sizeof...(Expected) != sizeof...(Given)) {
    return true;  // std::function refuses the piece, with the compiler's message
  } else {
    return (same_scalar<Expected, Given>() && ...);
  }
}

// A kernel's, fake's or predicate's scalar parameters (bare or in an optional or a list) are the
// fallback's exactly: std::function would convert the arguments on the way in, an int64_t to an
// int dropping bits, a double to a float or a bool losing value, and the piece would silently
// compute with other numbers than the call's; and its return's, which std::function converts on
// the way out. A functor with an overloaded operator() cannot be read, nor std::bind's (a generic
// lambda's is called with the exact types).
template <class T>
struct unwrapped_reference {
  using type = T;
};
template <class T>
struct unwrapped_reference<std::reference_wrapper<T>> {
  using type = std::decay_t<T>;
};

// The return's scalars too (an int output returned as a double was cut), element by element for
// a tuple of outputs.
template <class Expected, class Given>
constexpr bool same_return_scalars(Expected* /*expected*/, Given* /*given*/) {
  return same_scalar<Expected, Given>();
}
template <class... Expected, class... Given>
constexpr bool same_return_scalars(std::tuple<Expected...>* /*expected*/,
                                   std::tuple<Given...>* /*given*/) {
  if constexpr (sizeof...(Expected) != sizeof...(Given)) {
    return true;  // std::function refuses the piece, with the compiler's message
  } else {
    return (same_scalar<Expected, Given>() && ...);
  }
}

template <class E1, class E2, class G1, class G2>  // a std::pair converts to a tuple of two
constexpr bool same_return_scalars(std::tuple<E1, E2>* /*expected*/, std::pair<G1, G2>* /*given*/) {
  return same_scalar<E1, G1>() && same_scalar<E2, G2>();
}

// `returns`: the piece's return too (a kernel's or fake's; a predicate returns its bool).
template <class Signature, class Piece, bool returns = true>
constexpr bool takes_the_scalars_of() {
  using Decayed = typename unwrapped_reference<std::decay_t<Piece>>::type;  // std::ref(kernel)
  if constexpr (has_readable_parameters<Decayed>) {
    using ExpectedTraits = c10::guts::infer_function_traits_t<Signature>;
    using GivenTraits = c10::guts::infer_function_traits_t<Decayed>;
    return same_scalars(static_cast<typename ExpectedTraits::parameter_types*>(nullptr),
                        static_cast<typename GivenTraits::parameter_types*>(nullptr)) &&
           (!returns ||
            same_return_scalars(
                static_cast<std::decay_t<typename ExpectedTraits::return_type>*>(nullptr),
                static_cast<std::decay_t<typename GivenTraits::return_type>*>(nullptr)));
  } else {
    return true;
  }
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
  // Inside opreg::load_library (a library's static initializer), a call's error fails the load
  // and an empty Ret comes back: an exception there would terminate the process.
  Ret operator()(Args... args) const {
    if (!detail::inside_library_load()) return call(std::forward<Args>(args)...);
    try {
      return call(std::forward<Args>(args)...);
    } catch (const std::exception& error) {
      detail::fail_library_load(name_, __builtin_return_address(0), error);
    }
    if constexpr (!std::is_void_v<Ret>) return detail::placeholder<Ret>();
  }

  // The dispatcher's handle, looked up (and its signature checked) on first use, and checked
  // again after a replace changes the op's schema (a signature that no longer fits would read its
  // arguments, or drop outputs, wrongly). It stays valid when the op is replaced or undefined:
  // opreg keeps an op's dispatcher entry for the life of the process.
  c10::TypedOperatorHandle<Ret(Args...)> typed() const {
    std::call_once(found_, [this] {
      auto handle = find_operator(name_);
      schema_changes_ = detail::schema_changes_of(name_);
      if (schema_changes_ != nullptr) checked_at_ = schema_changes_->load();
      check_handle_signature(handle, signature(), detail::reference_results<Ret, Args...>());
      cached_.emplace(handle.template typed<Ret(Args...)>());
    });
    if (schema_changes_ != nullptr) {
      const uint64_t now = schema_changes_->load(std::memory_order_acquire);
      if (now != checked_at_.load(std::memory_order_relaxed)) {
        check_handle_signature(*cached_, signature(), detail::reference_results<Ret, Args...>());
        checked_at_.store(now, std::memory_order_relaxed);
      }
    }
    return *cached_;
  }

 private:
  static c10::FunctionSchema signature() {
    return c10::inferFunctionSchemaFlattenedReturns<Ret(Args...)>();
  }

  Ret call(Args... args) const {
    if constexpr (std::is_void_v<Ret> || std::is_reference_v<Ret>) {
      return typed().call(std::forward<Args>(args)...);
    } else {
      Ret result = typed().call(std::forward<Args>(args)...);
      detail::check_enum_result(name_, result);
      return result;
    }
  }

  std::string name_;
  mutable std::once_flag found_;
  mutable std::optional<c10::TypedOperatorHandle<Ret(Args...)>> cached_;
  mutable const std::atomic<uint64_t>* schema_changes_ = nullptr;
  mutable std::atomic<uint64_t> checked_at_{0};
};

template <class Sig>
class Op;

// The builder for an op whose C++ signature is Ret(Args...), fixed by its fallback. It fills an
// OpBuilder (opreg/definition.h), as the Python front does.
template <class Ret, class... Args>
class Op<Ret(Args...)> {
 public:
  using Signature = Ret(Args...);
  using Function = std::function<Ret(Args...)>;

  // An empty fallback is refused by define() (detail::typed_kernel), not here: a definition's
  // error is recorded within a library's load, a constructor's escapes its static initializer.
  Op(std::string name_or_schema, Function fallback)
      : builder_(name_or_schema), fallback_(std::move(fallback)) {
    builder_.infer_schema([] { return c10::inferFunctionSchemaFlattenedReturns<Signature>(); });
  }

  // An accelerated implementation with the fallback's signature.
  template <class Kernel, class Predicate = std::nullptr_t>
  Op&& kernel(Kernel kernel, KernelOptions<Predicate> options = {}) && {
    static_assert(detail::takes_the_scalars_of<Signature, Kernel>(),
                  "opreg: a kernel's int, float and bool parameters and outputs must have the "
                  "fallback's exact C++ types (int64_t, double, bool): a conversion would change "
                  "the values");
    std::function<bool(Args...)> accepts;
    if constexpr (!std::is_same_v<Predicate, std::nullptr_t>) {
      static_assert(detail::takes_the_scalars_of<Signature, Predicate, false>(),
                    "opreg: an accepts() predicate's int, float and bool parameters must have the "
                    "fallback's exact C++ types (int64_t, double, bool): a conversion would change "
                    "the values it decides on");
      accepts = options.predicate();
    }
    builder_.kernel(
        detail::typed_kernel(Function(std::move(kernel)), std::move(accepts), fallback_),
        options.kernel_name(), options.device_types());
    return std::move(*this);
  }

  // A kernel made by a factory, e.g. an AOT-compiled Triton kernel: opreg::triton::aot(launch).
  Op&& kernel(KernelFactory factory, KernelOptions<> options = {}) && {
    builder_.kernel(std::move(factory), options.kernel_name(), options.device_types());
    return std::move(*this);
  }

  // The op's abstract evaluation: output metadata only, run on meta and fake tensors. Read sizes
  // with sym_sizes() so dynamic shapes stay symbolic.
  template <class Fake>
  Op&& fake(Fake fake) && {
    static_assert(detail::takes_the_scalars_of<Signature, Fake>(),
                  "opreg: a fake's int, float and bool parameters and outputs must have the "
                  "fallback's exact C++ types (int64_t, double, bool): a conversion would change "
                  "the values");
    builder_.fake(detail::typed_kernel(Function(std::move(fake))));
    return std::move(*this);
  }

  // Restricts the dtypes of a tensor argument, checked on every call with a message naming it.
  Op&& dtypes(std::string argument, std::vector<c10::ScalarType> allowed) && {
    builder_.dtypes(std::move(argument), std::move(allowed));
    return std::move(*this);
  }

  // One method per flag of OPREG_OP_FLAGS (opreg/definition.h): .bitwise(), .random(), ...
#define OPREG_FLAG_METHOD(flag_name, promise) \
  Op&& flag_name(bool on = true) && {         \
    builder_.flag(&OpFlags::flag_name, on);   \
    return std::move(*this);                  \
  }
  OPREG_OP_FLAGS(OPREG_FLAG_METHOD)
#undef OPREG_FLAG_METHOD

  // Gradients from an explicit backward: setup_context(ctx, inputs, outputs) then
  // backward(ctx, grad_outputs) -> one gradient per input. See opreg/autograd.h.
  Op&& backward(Backward backward, SetupContext setup_context = nullptr) && {
    builder_.backward(std::move(backward), std::move(setup_context));
    return std::move(*this);
  }

  // What happens under autograd when no backward is given (default: AutogradPolicy::kFallback).
  Op&& autograd(AutogradPolicy policy) && {
    builder_.autograd(policy);
    return std::move(*this);
  }

  // How DTensor runs the op on sharded tensors (see Sharding in opreg/definition.h). Without it,
  // Sharding::kNone: DTensor refuses the op.
  Op&& sharding(Sharding sharding) && {
    builder_.sharding(sharding);
    return std::move(*this);
  }

  // An explicit vmap rule (see opreg/vmap.h). Without one (and without batch_polymorphic() or
  // vmap_per_example_loop()) the fallback runs on batched tensors.
  Op&& vmap(VmapRule rule) && {
    builder_.vmap(std::move(rule));
    return std::move(*this);
  }

  // Defining an existing opreg op again is an error unless replacement is asked for.
  Op&& replace(bool replace = true) && {
    builder_.replace(replace);
    return std::move(*this);
  }
  Op&& origin(std::string where) && {
    builder_.origin(std::move(where));
    return std::move(*this);
  }
  // The op serves `owner` and is undefined with it (OpBuilder::part_of).
  Op&& part_of(std::string owner) && {
    builder_.part_of(std::move(owner));
    return std::move(*this);
  }

  // Registers everything with the dispatcher. Errors name the op and the piece at fault.
  __attribute__((noinline)) OpHandle<Signature> define() && {
    builder_.fallback(detail::typed_kernel(fallback_));
    builder_.caller(__builtin_return_address(0));
    return OpHandle<Signature>(std::move(builder_).define());
  }

 private:
  OpBuilder builder_;
  Function fallback_;
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
