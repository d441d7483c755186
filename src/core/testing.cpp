// src/core/testing.cpp: opreg::testing::check, the C++ half of opcheck (include/opreg/testing.h).
#include "opreg/testing.h"

#include <cmath>
#include <sstream>
#include <unordered_map>

#include <ATen/ATen.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <c10/util/Exception.h>

#include "load_internal.h"
#include "op_internal.h"
#include "opreg/op.h"
#include "opreg/registry.h"

namespace opreg::testing {
namespace {

// A dispatched call's stack may hold more than its arguments; a sample is its arguments alone
// (seen: extra values were passed over and came back as outputs).
void check_count(const std::string& op, const c10::FunctionSchema& schema, size_t given) {
  TORCH_CHECK(given == schema.arguments().size(), op, ": called with ", given,
              " arguments, expected ", schema.arguments().size(), " (schema '", schema, "')");
}

std::string device_of(const std::vector<c10::IValue>& args) {
  for (const auto& arg : args) {
    if (arg.isTensor() && arg.toTensor().defined()) return arg.toTensor().device().str();
  }
  return "-";
}

// `value` with each tensor in it (alone, or in a Tensor[] / Tensor?[] list) replaced by
// change(tensor); everything else as it is.
template <typename Change>
c10::IValue map_tensors(const c10::IValue& value, const Change& change) {
  if (value.isTensor()) {
    const auto& tensor = value.toTensor();
    return tensor.defined() ? c10::IValue(change(tensor)) : value;
  }
  if (value.isTensorList()) {
    c10::List<at::Tensor> mapped;
    for (const at::Tensor& tensor : value.toTensorList()) {
      mapped.push_back(tensor.defined() ? change(tensor) : tensor);
    }
    return mapped;
  }
  if (value.isList()) {  // Tensor?[] and lists of numbers
    const auto list = value.toList();
    c10::impl::GenericList mapped(list.elementType());
    for (const c10::IValue& element : list) mapped.push_back(map_tensors(element, change));
    return mapped;
  }
  return value;
}

std::vector<c10::IValue> to_meta(const std::vector<c10::IValue>& args) {
  std::vector<c10::IValue> meta;
  for (const auto& arg : args) {
    meta.push_back(map_tensors(arg, [](const at::Tensor& t) {
      return at::empty_strided(t.sizes(), t.strides(), t.options().device(at::kMeta));
    }));
  }
  return meta;
}

// Each run gets its own copies, so that an op that writes its arguments changes neither the
// caller's samples nor another run's. A copy keeps its tensor's layout (strides, offset, the
// memory it shares with another argument): a kernel that reads a layout wrongly must meet the
// sample's own. Detached: a sample that requires grad would send the call to the fallback
// (AutogradPolicy::kFallback), which would then be compared with itself.
std::vector<c10::IValue> clone_tensors(const std::vector<c10::IValue>& args) {
  std::unordered_map<const c10::StorageImpl*, c10::Storage> copies;  // a sample's, and its copy
  auto copy = [&](const at::Tensor& t) {
    if (t.layout() != at::kStrided || !t.has_storage() || t.is_meta()) return t.detach().clone();
    auto& storage = copies[t.storage().unsafeGetStorageImpl()];
    if (!storage) {
      const auto bytes = static_cast<int64_t>(t.storage().nbytes());
      const auto as_bytes = t.options().dtype(at::kByte);
      storage =
          at::empty({bytes}, as_bytes).copy_(at::empty({0}, as_bytes).set_(t.storage())).storage();
    }
    auto same =
        at::empty({0}, t.options()).set_(storage, t.storage_offset(), t.sizes(), t.strides());
    if (t.is_conj()) same = same.conj();
    return t.is_neg() ? at::_neg_view(same) : same;
  };
  std::vector<c10::IValue> cloned;
  for (const auto& arg : args) cloned.push_back(map_tensors(arg, copy));
  return cloned;
}

// Equal values of a bitwise op's outputs have one sign too: -0.0 == +0.0 in isclose, not in
// bits. NaN positions (equal already) are left out: NaN's sign bit is no result.
bool same_zero_signs(const at::Tensor& a, const at::Tensor& b) {
  if (!a.is_floating_point() && !a.is_complex()) return true;
  const auto real_a = a.is_complex() ? at::view_as_real(a.resolve_conj()) : a;
  const auto real_b = b.is_complex() ? at::view_as_real(b.resolve_conj()) : b;
  const auto numbers = real_a.isnan().logical_not();
  return at::equal(real_a.signbit().logical_and(numbers), real_b.signbit().logical_and(numbers));
}

// The index within `sizes` of the element at `flat` in row-major order: "[1, 0]".
std::string index_of(int64_t flat, at::IntArrayRef sizes) {
  std::vector<int64_t> index(sizes.size());
  for (size_t d = sizes.size(); d-- > 0;) {
    index[d] = flat % sizes[d];
    flat /= sizes[d];
  }
  std::ostringstream text;
  text << at::IntArrayRef(index);
  return text.str();
}

// How two runs' values are compared: a random op's two runs draw other numbers, so only their
// metadata (shapes and dtypes) can be, as opreg.opcheck does (python/opreg/_opcheck.py).
struct Comparison {
  bool bitwise = false;
  bool random = false;
};

std::string compare_tensors(const std::string& what, const at::Tensor& a, const at::Tensor& b,
                            Comparison how, double* max_error) {
  std::ostringstream why;
  if (!a.defined() || !b.defined()) {
    if (a.defined() == b.defined()) return "";
    why << what << " is " << (a.defined() ? "a tensor" : "undefined") << ", the fallback's "
        << (b.defined() ? "a tensor" : "undefined");
    return why.str();
  }
  if (a.is_nested() || b.is_nested()) {  // component by component
    if (!a.is_nested() || !b.is_nested()) {
      return what + " is " + (a.is_nested() ? "a nested tensor" : "not nested") +
             ", the fallback's " + (b.is_nested() ? "a nested tensor" : "not nested");
    }
    if (a.layout() != b.layout()) {
      why << what << " has layout " << a.layout() << ", the fallback's " << b.layout();
      return why.str();
    }
    const auto got = a.unbind(), want = b.unbind();
    if (got.size() != want.size()) {
      why << what << " has " << got.size() << " components, the fallback's " << want.size();
      return why.str();
    }
    for (size_t i = 0; i < got.size(); ++i) {
      auto differs = compare_tensors(what + " component " + std::to_string(i), got[i], want[i], how,
                                     max_error);
      if (!differs.empty()) return differs;
    }
    return "";
  }
  if (a.sizes() != b.sizes() || a.scalar_type() != b.scalar_type()) {
    why << what << " is " << a.scalar_type() << a.sizes() << ", the fallback's " << b.scalar_type()
        << b.sizes();
    return why.str();
  }
  if (a.layout() != b.layout()) {
    why << what << " has layout " << a.layout() << ", the fallback's " << b.layout();
    return why.str();
  }
  if (a.is_quantized() && b.is_quantized()) {  // by the values they stand for
    return compare_tensors(what, a.dequantize(), b.dequantize(), how, max_error);
  }
  if (a.is_quantized() || b.is_quantized()) {
    return what + " is a quantized tensor, which the checks do not compare with a plain one";
  }
  if (a.layout() != at::kStrided) {  // a sparse tensor: its values, where it stores none as 0
    return compare_tensors(what, a.to_dense(), b.to_dense(), how, max_error);
  }
  if (a.numel() == 0 || how.random) return "";
  const bool bitwise = how.bitwise;
  const auto allowed = bitwise ? Tolerance{} : tolerance(a.scalar_type());
  const bool is_bool = a.scalar_type() == at::kBool;
  const auto a_values = is_bool ? a.to(at::kByte) : a;
  const auto b_values = is_bool ? b.to(at::kByte) : b.to(a.device());
  auto diff = a.is_complex() ? (a - b.to(a.device())).abs().to(at::kDouble)
                             : (a_values.to(at::kDouble) - b_values.to(at::kDouble)).abs();
  const double error = diff.nan_to_num(0).max().item<double>();
  *max_error = std::max(*max_error, error);
  if ((a.is_floating_point() || a.is_complex()) &&
      !at::equal(a.isnan(), b.isnan().to(a.device()))) {
    return what + " has NaN at other positions than the fallback's";
  }
  const auto close =
      at::isclose(a_values, b_values, allowed.rtol, allowed.atol, /*equal_nan=*/true);
  if (close.all().item<bool>()) {
    if (!bitwise || same_zero_signs(a, b.to(a.device()))) return "";
    return what +
           " has -0.0 where the fallback's has +0.0, or the reverse; the op declares its "
           "kernels bitwise";
  }
  // Where a value is infinite the difference is no number (inf+1j against inf+0j: NaN), and the
  // largest difference said nothing; the first such element is shown instead.
  const auto infinite_apart =
      (a_values.isinf().logical_or(b_values.isinf())).logical_and(close.logical_not()).flatten();
  if (!bitwise && infinite_apart.any().item<bool>()) {
    const int64_t flat = infinite_apart.nonzero()[0][0].item<int64_t>();
    why << what << " at index " << index_of(flat, a.sizes()) << " is "
        << a_values.flatten()[flat].item() << ", the fallback's " << b_values.flatten()[flat].item()
        << " (a difference where a value is infinite)";
    return why.str();
  }
  if (bitwise) {
    why << what << " is not bitwise equal to the fallback's (max |diff| " << error
        << "); the op declares its kernels bitwise";
  } else if (allowed.atol == 0 && allowed.rtol == 0) {
    why << what << " (" << a.scalar_type() << ") is not equal to the fallback's (max |diff| "
        << error << ")";
  } else {
    why << what << " differs from the fallback's by up to " << error << ", more than atol "
        << allowed.atol << " + rtol " << allowed.rtol << " * |fallback| (" << a.scalar_type()
        << ")";
  }
  return why.str();
}

// "" when the kernel's value `got` matches the fallback's `want`, else why. `what` names the
// value ("output 0", "output 1[2]", "the written argument 'xs'[0]"); lists are compared
// element by element, with the tolerance of each tensor's dtype.
std::string compare_values(const std::string& what, const c10::IValue& got, const c10::IValue& want,
                           Comparison how, double* max_error) {
  const bool bitwise = how.bitwise;
  if (got.isTensor() && want.isTensor()) {
    return compare_tensors(what, got.toTensor(), want.toTensor(), how, max_error);
  }
  if (got.isList() && want.isList()) {
    const auto a = got.toListRef();
    const auto b = want.toListRef();
    if (a.size() != b.size()) {
      return what + " has " + std::to_string(a.size()) + " elements, the fallback's " +
             std::to_string(b.size());
    }
    for (size_t j = 0; j < a.size(); ++j) {
      auto why = compare_values(what + "[" + std::to_string(j) + "]", a[j], b[j], how, max_error);
      if (!why.empty()) return why;
    }
    return "";
  }
  if (got.isTensor() || want.isTensor() || got.isList() || want.isList()) {
    return what + " is a " + got.tagKind() + ", the fallback's a " + want.tagKind();
  }
  if (got.isDouble() && want.isDouble()) {  // NaN equals NaN; bitwise: -0.0 is not +0.0
    const double a = got.toDouble(), b = want.toDouble();
    const auto allowed = bitwise ? Tolerance{} : tolerance(at::kDouble);
    // An infinity is close to itself only (the tolerance around it is infinite).
    const bool finite = std::isfinite(a) && std::isfinite(b);
    const bool close = bitwise || !finite
                           ? a == b && std::signbit(a) == std::signbit(b)
                           : std::abs(a - b) <= allowed.atol + allowed.rtol * std::abs(b);
    if ((std::isnan(a) && std::isnan(b)) || close) return "";
    if (a == b) {  // zeros of two signs, which IValue prints alike
      return what + " is " + (std::signbit(a) ? "-0.0" : "+0.0") + ", the fallback's " +
             (std::signbit(b) ? "-0.0" : "+0.0") + "; the op declares its kernels bitwise";
    }
  } else if (got.isComplexDouble() && want.isComplexDouble()) {  // each part as a double
    const auto a = got.toComplexDouble(), b = want.toComplexDouble();
    if (compare_values(what, a.real(), b.real(), how, max_error).empty() &&
        compare_values(what, a.imag(), b.imag(), how, max_error).empty()) {
      return "";
    }
  } else if (got == want) {
    return "";
  }
  std::ostringstream why;
  why << what << " is " << got << ", the fallback's " << want;
  return why.str();
}

// Whether two tensors of one shape lay out their elements alike: the stride of a dim of size 1
// moves to no element, and a tensor of fewer than two elements has no layout.
bool same_strides(const at::Tensor& a, const at::Tensor& b) {
  if (b.numel() <= 1) return true;
  for (int64_t d = 0; d < b.dim(); ++d) {
    if (b.size(d) > 1 && a.stride(d) != b.stride(d)) return false;
  }
  return true;
}

// "" when the fake's `meta` has the real value's shapes, dtypes and strides, else why.
std::string compare_fake(const std::string& what, const c10::IValue& meta,
                         const c10::IValue& real) {
  if (meta.isList() && real.isList()) {
    const auto m = meta.toListRef();
    const auto r = real.toListRef();
    if (m.size() != r.size()) {
      return what + ": the fake has " + std::to_string(m.size()) + " elements, the real one " +
             std::to_string(r.size());
    }
    for (size_t j = 0; j < m.size(); ++j) {
      auto why = compare_fake(what + "[" + std::to_string(j) + "]", m[j], r[j]);
      if (!why.empty()) return why;
    }
    return "";
  }
  if (!meta.isTensor() || !real.isTensor()) return "";
  const auto& m = meta.toTensor();
  const auto& r = real.toTensor();
  if (!m.defined() || !r.defined()) {
    return m.defined() == r.defined() ? "" : what + ": one of the fake and the real is undefined";
  }
  if (m.is_nested() || r.is_nested()) {  // none on meta tensors: PyTorch has no such thing
    if (m.is_nested() && r.is_nested()) return "";
    return what + ": the real one is " + (r.is_nested() ? "a nested tensor" : "not nested") +
           ", the fake's " + (m.is_nested() ? "a nested tensor" : "not") +
           " (PyTorch has no nested tensors on the meta device, which the fake runs on)";
  }
  std::ostringstream why;
  if (m.sizes() != r.sizes()) {
    why << what << ": the fake's shape is " << m.sizes() << ", the real one " << r.sizes();
  } else if (m.scalar_type() != r.scalar_type()) {
    why << what << ": the fake's dtype is " << m.scalar_type() << ", the real one "
        << r.scalar_type();
  } else if (m.layout() != r.layout()) {
    why << what << ": the fake's layout is " << m.layout() << ", the real one " << r.layout();
  } else if (r.layout() == at::kStrided && !same_strides(m, r)) {
    why << what << ": the fake's strides are " << m.strides() << ", the real ones " << r.strides();
  }
  return why.str();
}

// One sample's two results, from one definition of the op: false when a replace changed the
// definition while the sample ran (the kernel's call and the fallback's may then belong to two).
// The checks compare values: a sample's tensors must hold them (strided, with data).
void check_sample_has_data(const std::string& op, const std::vector<c10::IValue>& sample,
                           size_t index) {
  auto check = [&](const at::Tensor& tensor) {
    if (!tensor.defined()) return;
    TORCH_CHECK_VALUE(!tensor.is_meta(), "opreg::testing::check: ", op, ": sample ", index,
                      " has a tensor on the meta device, which holds no values to compare; give "
                      "samples on a device with data (the fake is checked on meta copies of them)");
    TORCH_CHECK_VALUE(tensor.layout() == at::kStrided, "opreg::testing::check: ", op, ": sample ",
                      index, " has a tensor of layout ", tensor.layout(),
                      "; the checks take strided tensors");
  };
  for (const auto& value : sample) {
    if (value.isTensor()) check(value.toTensor());
    if (value.isList()) {
      for (const auto& element : value.toListRef()) {
        if (element.isTensor()) check(element.toTensor());
      }
    }
  }
}

// find_operator's handle, or a ValueError: inside a library's load find_operator records a missing
// op and returns a handle without a schema, which the checks must not go on with.
c10::OperatorHandle handle_of(const std::string& op) {
  TORCH_CHECK_VALUE(is_defined(op) || !detail::loading_library(), "opreg: no op named '", op,
                    "' is defined by opreg");
  return find_operator(op);
}

bool check_sample(const std::string& op, const std::vector<c10::IValue>& sample, size_t index,
                  std::vector<CheckResult>* results) {
  const uint64_t serial = detail::definition_serial(op);
  auto handle = handle_of(op);
  const auto report = describe_op(op);
  const auto schema = detail::current_schema(op);
  const auto& arguments = schema->arguments();
  check_count(op, *schema, sample.size());
  check_sample_has_data(op, sample, index);
  const std::string device = device_of(sample);

  CheckResult kernel{"kernel_vs_fallback", op, device, index, true, 0, {}};
  const auto kernel_args = clone_tensors(sample);  // shares its tensors with the call's stack
  torch::jit::Stack stack = kernel_args;
  detail::check_stack(op, stack);
  detail::call_boxed_padded(handle, &stack);
  const auto fallback_args = clone_tensors(sample);
  const auto fallback = call_fallback(op, fallback_args);
  const Comparison how{report.flags.bitwise, report.flags.random};
  if (stack.size() != fallback.size()) {
    kernel.message = "the kernel gave " + std::to_string(stack.size()) + " outputs, the fallback " +
                     std::to_string(fallback.size());
  }
  for (size_t i = 0; kernel.message.empty() && i < stack.size(); ++i) {
    kernel.message = compare_values("output " + std::to_string(i), stack[i], fallback[i], how,
                                    &kernel.max_error);
  }
  // What the op writes is its result as much as what it returns (an in-place kernel that writes
  // nothing returns nothing to compare).
  for (size_t i = 0; kernel.message.empty() && i < arguments.size() && i < sample.size(); ++i) {
    const auto* alias = arguments[i].alias_info();
    if (alias == nullptr || !alias->isWrite()) continue;
    kernel.message = compare_values("the written argument '" + arguments[i].name() + "'",
                                    kernel_args[i], fallback_args[i], how, &kernel.max_error);
  }
  kernel.passed = kernel.message.empty();

  CheckResult fake{"fake_vs_real", op, device, index, true, 0, {}};
  torch::jit::Stack meta = to_meta(sample);
  detail::call_boxed_padded(handle, &meta);
  for (size_t i = 0; fake.message.empty() && i < meta.size() && i < stack.size(); ++i) {
    fake.message = compare_fake("output " + std::to_string(i), meta[i], stack[i]);
  }
  fake.passed = fake.message.empty();

  if (detail::definition_serial(op) != serial) return false;
  results->push_back(kernel);
  results->push_back(fake);
  return true;
}

}  // namespace

Tolerance tolerance(at::ScalarType dtype) {
  const auto real = at::isComplexType(dtype) ? c10::toRealValueType(dtype) : dtype;
  switch (real) {
    case at::kHalf:
      return {1e-3, 1e-3};
    case at::kBFloat16:
      return {8e-3, 1.6e-2};
    case at::kFloat:
      return {1e-5, 1.3e-6};
    case at::kDouble:
      return {1e-7, 1e-7};
    default:
      return {};  // integers and bool: equality
  }
}

namespace {

std::vector<c10::IValue> call_fallback_now(const std::string& op, std::vector<c10::IValue> args) {
  const auto handle = handle_of(op);
  check_count(op, *detail::current_schema(op), args.size());
  torch::jit::Stack stack(std::move(args));
  detail::call_checked_fallback(op, handle, &stack);
  return stack;
}

std::vector<CheckResult> check_now(const std::string& op,
                                   const std::vector<std::vector<c10::IValue>>& samples) {
  TORCH_CHECK_VALUE(!samples.empty(), "opreg::testing::check: ", op,
                    ": 'samples' is empty, so nothing would be checked; pass at least one "
                    "sample (the op's arguments in schema order)");
  constexpr int kAttempts = 3;
  std::vector<CheckResult> results;
  for (size_t index = 0; index < samples.size(); ++index) {
    int attempt = 1;
    while (!check_sample(op, samples[index], index, &results)) {
      TORCH_CHECK(++attempt <= kAttempts, "opreg::testing::check: ", op,
                  " was replaced while sample ", index, " ran, ", kAttempts,
                  " times in a row; check it while no other thread replaces it");
    }
  }
  return results;
}

void check_or_throw_now(const std::string& op,
                        const std::vector<std::vector<c10::IValue>>& samples) {
  std::ostringstream failures;
  for (const auto& result : check_now(op, samples)) {
    if (!result.passed) {
      failures << "\n  " << result.check << " failed for " << result.op << " on " << result.device
               << ", sample " << result.sample << ": " << result.message;
    }
  }
  TORCH_CHECK(failures.tellp() == 0, "opreg::testing::check:", failures.str());
}

}  // namespace

// Called from a library's static initializer, each fails the load instead of throwing.
std::vector<c10::IValue> call_fallback(const std::string& op, std::vector<c10::IValue> args) {
  return detail::or_fail_the_load<std::vector<c10::IValue>>(
      op, __builtin_return_address(0), [&] { return call_fallback_now(op, std::move(args)); });
}

std::vector<CheckResult> check(const std::string& op,
                               const std::vector<std::vector<c10::IValue>>& samples) {
  return detail::or_fail_the_load<std::vector<CheckResult>>(op, __builtin_return_address(0),
                                                            [&] { return check_now(op, samples); });
}

void check_or_throw(const std::string& op, const std::vector<std::vector<c10::IValue>>& samples) {
  detail::or_fail_the_load<void>(op, __builtin_return_address(0),
                                 [&] { check_or_throw_now(op, samples); });
}

}  // namespace opreg::testing
