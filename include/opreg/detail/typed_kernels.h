// include/opreg/detail/typed_kernels.h: how the typed builder (opreg/op.h) turns C++ callables
// into the boxed kernel factories of an OpBuilder. Each wrapper records its trace and, for a
// kernel with a predicate, serves declined calls from the fallback directly; the argument and
// output checks run around it, in the op's trampoline (src/core/registry.cpp).
#pragma once

#include <algorithm>
#include <exception>
#include <functional>
#include <memory>
#include <optional>
#include <sstream>
#include <stdexcept>
#include <string>
#include <string_view>
#include <type_traits>
#include <typeinfo>
#include <utility>
#include <variant>

#if defined(__GLIBCXX__)
#include <cxxabi.h>
#endif

#include <ATen/core/Tensor.h>
#include <ATen/core/op_registration/infer_schema.h>
#include <c10/util/Exception.h>

#include "opreg/definition.h"
#include "opreg/detail/text.h"
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

// A c10 error whose message holds bytes that are not UTF-8 (a path, the user's data) cannot reach
// Python: decoding it there fails with a UnicodeDecodeError, and the message is lost. Such an
// error is thrown again as its own type, with those bytes written \xNN; one of a type that cannot
// be rebuilt so becomes a c10::Error.
template <class Type>
[[noreturn]] void throw_rebuilt_as(const c10::Error& error, const std::string& msg) {
  Type readable(msg, error.backtrace(), error.caller());
  for (const auto& entry : error.context()) readable.add_context(readable_message(entry));
  throw readable;
}

template <class Type>
void throw_readable_as(const c10::Error& error, const std::string& msg) {
  if (typeid(error) == typeid(Type)) throw_rebuilt_as<Type>(error, msg);
}

inline bool readable_in_python(const c10::Error& error) {
  const auto& context = error.context();
  return readable_message(error.msg()) == error.msg() &&
         std::all_of(context.begin(), context.end(),
                     [](const std::string& entry) { return readable_message(entry) == entry; });
}

[[noreturn]] inline void throw_readable(const c10::Error& error) {
  const std::string msg = readable_message(error.msg());
  throw_readable_as<c10::IndexError>(error, msg);
  throw_readable_as<c10::ValueError>(error, msg);
  throw_readable_as<c10::TypeError>(error, msg);
  throw_readable_as<c10::NotImplementedError>(error, msg);
  throw_readable_as<c10::BufferError>(error, msg);
  throw_readable_as<c10::EnforceFiniteError>(error, msg);
  throw_readable_as<c10::LinAlgError>(error, msg);
  throw_readable_as<c10::OutOfMemoryError>(error, msg);
  throw_readable_as<c10::SyntaxError>(error, msg);
  throw_readable_as<c10::ErrorAlwaysShowCppStacktrace>(error, msg);
  throw_readable_as<c10::DistError>(error, msg);
  throw_readable_as<c10::DistBackendError>(error, msg);
  throw_readable_as<c10::DistStoreError>(error, msg);
  throw_readable_as<c10::DistNetworkError>(error, msg);
  throw_readable_as<c10::DistQueueEmptyError>(error, msg);
  throw_rebuilt_as<c10::Error>(error, msg);
}

// Whether `error` is a Python exception on its way back to Python (pybind11's error_already_set,
// raised by a Python piece): its message is Python's to read. pybind11 formats it in what(),
// without end for one whose str() raises another such (or at the recursion limit, where str()
// fails): a segfault (sweep 49 A x01/x02). Told by opreg's Python module; false without it.
OPREG_API bool is_python_error(const std::exception& error) noexcept;
// `error.what()`, but a Python error's "Type: message" read without pybind11's formatting (a
// str() that fails reads "<str() failed>"), and a c10 error's without its C++ backtrace.
OPREG_API std::string message_of(const std::exception& error);
struct PythonErrorReader {
  bool (*is_python_error)(const std::exception&) noexcept = nullptr;
  std::string (*message_of)(const std::exception&) = nullptr;
};
OPREG_API void set_python_error_reader(PythonErrorReader reader);

// Runs a piece of the user's C++ code. What it throws as a std::runtime_error or
// std::logic_error, as one of the standard library's std::bad_* errors but bad_alloc (an empty
// optional's value(), a variant's, a cast's), or as no std::exception at all (`throw 42`) is said
// with the op and the piece, as a c10::Error. Everything else passes as it is: c10 errors (made
// readable in Python first), std::bad_alloc (MemoryError in Python), and Python's errors coming
// back through the dispatcher from a piece of PyTorch written in Python, which must reach Python
// as what they are; so does a std::exception of the user's own, which cannot be told from those
// (but for one whose message is not UTF-8).
// The message is built only on a throw.
template <class Ret, class Fn>
Ret run_user_code(const std::string& op, const char* what, std::string_view label, Fn&& fn) {
  try {
    return fn();
  } catch (const c10::Error& error) {
    if (!readable_in_python(error)) throw_readable(error);
    throw;
  } catch (const std::runtime_error& error) {
    TORCH_CHECK(false, op, ": ", what, label, " threw: ", valid_utf8(what_of(error)));
  } catch (const std::logic_error& error) {
    TORCH_CHECK(false, op, ": ", what, label, " threw: ", valid_utf8(what_of(error)));
  } catch (const std::bad_optional_access& error) {  // `n.value()` of an `int? n` given None
    TORCH_CHECK(false, op, ": ", what, label, " threw: ", valid_utf8(what_of(error)));
  } catch (const std::bad_variant_access& error) {
    TORCH_CHECK(false, op, ": ", what, label, " threw: ", valid_utf8(what_of(error)));
  } catch (const std::bad_function_call& error) {
    TORCH_CHECK(false, op, ": ", what, label, " threw: ", valid_utf8(what_of(error)));
  } catch (const std::bad_cast& error) {  // std::any_cast's too
    TORCH_CHECK(false, op, ": ", what, label, " threw: ", valid_utf8(what_of(error)));
  } catch (const std::bad_weak_ptr& error) {
    TORCH_CHECK(false, op, ": ", what, label, " threw: ", valid_utf8(what_of(error)));
  } catch (const std::bad_typeid& error) {  // typeid(*p) of a null p
    TORCH_CHECK(false, op, ": ", what, label, " threw: ", valid_utf8(what_of(error)));
  } catch (const std::bad_exception& error) {
    TORCH_CHECK(false, op, ": ", what, label, " threw: ", valid_utf8(what_of(error)));
  } catch (const std::exception& error) {
    if (is_python_error(error)) throw;
    // Passes as it is, but for one whose message Python could not read (sweep 44 B-F2: a
    // UnicodeDecodeError in its place, naming nothing; sweep 51 B-N6: a null what(), a segfault)
    // and for the base class itself, whose message is "std::exception" (sweep 51 B-N8). Not for a
    // blank one (sweep 54 B-N48): an error carrying Python's exception reads blank until asked.
    // what() read once: a user's may give a new pointer on each call (sweep 52 B-N1: it rebuilt
    // its message, and the first pointer read afterwards was freed).
    const char* message = error.what();
    const std::string readable = valid_utf8(what_of(message));
    TORCH_CHECK(
        message != nullptr && readable == message && typeid(error) != typeid(std::exception), op,
        ": ", what, label, " threw: ", readable);
    throw;
#if defined(__GLIBCXX__)
  } catch (const abi::__forced_unwind&) {
    throw;  // a cancelled thread's unwinding must go on
#endif
  } catch (...) {
    TORCH_CHECK(false, op, ": ", what, label, " threw something that is not a std::exception");
  }
}

// run_user_code for the pieces no dispatcher kernel wraps (a backward, setup_context, a vmap
// rule): c10's errors, which pass as they are, also say whose piece raised them.
inline bool names_op(const c10::Error& error, const std::string& op) {
  const auto& context = error.context();
  return error.msg().find(op) != std::string::npos ||
         std::any_of(context.begin(), context.end(),
                     [&](const std::string& entry) { return entry.find(op) != std::string::npos; });
}

template <class Ret, class Fn>
Ret run_user_code_named(const std::string& op, std::string_view label, Fn&& fn) {
  try {
    return run_user_code<Ret>(op, "", label, std::forward<Fn>(fn));
  } catch (c10::Error& error) {
    if (!names_op(error, op)) error.add_context("in " + std::string(label) + " of " + op);
    throw;
  }
}

// Where C++ reads as an at::ScalarType, at::Layout or at::MemoryFormat (an optional or a list of
// one too) a value the schema declares as `int`: c10::findSchemaDifferences compares what a value
// is passed as, the same int for both, but only a value the schema declares as such an enum gets
// its range checked. `what` says whose values these are ("argument", "result").
inline std::optional<std::string> int_read_as_enum(const std::vector<c10::Argument>& cpp,
                                                   const std::vector<c10::Argument>& declared,
                                                   const char* what, const char* where) {
  for (size_t i = 0; i < cpp.size() && i < declared.size(); ++i) {
    const std::string cpp_type = cpp[i].real_type()->str();
    const std::string schema_type = declared[i].real_type()->str();
    if (cpp_type == schema_type) continue;
    for (const char* kind : {"ScalarType", "Layout", "MemoryFormat"}) {
      if (cpp_type.find(kind) == std::string::npos) continue;
      const std::string name =
          declared[i].name().empty() ? std::to_string(i) : "'" + declared[i].name() + "'";
      return std::string(what) + " " + name + " is " + cpp_type + " in " + where + " but " +
             schema_type + " in the schema, which would pass it any int; declare it " + cpp_type +
             " in the schema (its values are then checked on every call)";
    }
  }
  return std::nullopt;
}

// How a piece's C++ signature (`inferred` from it) differs from the schema it is to serve; none if
// it serves it. An argument declared `int` reached a C++ enum parameter unchecked (sweep 50 B-T5:
// `x.to(d)` of an out-of-range int segfaulted or hung).
inline std::optional<std::string> signature_difference(const c10::FunctionSchema& inferred,
                                                       const c10::FunctionSchema& declared) {
  if (auto difference = c10::findSchemaDifferences(inferred, declared)) return difference;
  return int_read_as_enum(inferred.arguments(), declared.arguments(), "argument", "C++");
}

// A callable run as is (the fallback, a fake), its calls traced under the context's label.
// A piece whose C++ arguments are not the schema's would have its stack misread at every call
// (PyTorch's internal assert "expected int"): refused at the definition, naming both.
template <class Signature>
void check_signature(const KernelContext& context) {
  const auto inferred = c10::inferFunctionSchemaFlattenedReturns<Signature>();
  if (auto difference = signature_difference(inferred, context.schema)) {
    std::ostringstream inferred_text, schema_text;
    inferred_text << inferred;
    schema_text << context.schema;
    TORCH_CHECK_VALUE(false, context.op, ": its ", context.label,
                      "'s C++ signature does not match the schema: ", *difference,
                      " (the signature reads as '", inferred_text.str(), "', the schema is '",
                      schema_text.str(), "')");
  }
}

template <class Ret, class... Args>
KernelFactory typed_kernel(std::function<Ret(Args...)> fn) {
  return {[fn = std::move(fn)](const KernelContext& context) {
    // Refused here, at the definition, not by the builder: a definition's error is recorded
    // within a library's load, a builder's escapes its static initializer.
    TORCH_CHECK_VALUE(static_cast<bool>(fn), context.op, ": its ", context.label,
                      " is an empty function; pass a function");
    check_signature<Ret(Args...)>(context);
    return c10::KernelFunction::makeFromUnboxedLambda(
        [fn, op = context.op, label = context.label](Args... args) -> Ret {
          if (trace_enabled()) record_trace(op, label, trace_device_of(args...));
          return run_user_code<Ret>(op, "", label, [&]() -> Ret { return fn(args...); });
        });
  }};
}

// A kernel that may decline a call (its predicate says false): the fallback then serves it.
template <class Ret, class... Args>
KernelFactory typed_kernel(std::function<Ret(Args...)> kernel, std::function<bool(Args...)> accepts,
                           std::function<Ret(Args...)> fallback) {
  if (!accepts) return typed_kernel(std::move(kernel));
  return {[=](const KernelContext& context) {
    TORCH_CHECK_VALUE(static_cast<bool>(kernel), context.op, ": its ", context.label,
                      " is an empty function; pass a function");
    check_signature<Ret(Args...)>(context);
    return c10::KernelFunction::makeFromUnboxedLambda([=, op = context.op,
                                                       label = context.label](Args... args) -> Ret {
      const bool accepted = run_user_code<bool>(op, "the accepts predicate of ", label,
                                                [&] { return accepts(args...); });
      if (!accepted) {
        if (trace_enabled()) {
          record_trace(op, "fallback(declined by " + label + ")", trace_device_of(args...));
        }
        try {
          return run_user_code<Ret>(op, "", "fallback", [&]() -> Ret { return fallback(args...); });
        } catch (c10::Error& error) {  // not the kernel's, though the kernel called it
          if (!names_op(error, op)) {
            error.add_context("in the fallback of " + op + ", which served the call " + label +
                              " declined");
          }
          throw;
        }
      }
      if (trace_enabled()) record_trace(op, label, trace_device_of(args...));
      return run_user_code<Ret>(op, "", label, [&]() -> Ret { return kernel(args...); });
    });
  }};
}

}  // namespace opreg::detail
