// src/core/testing.cpp: opreg::testing::check, the C++ half of opcheck (include/opreg/testing.h).
#include "opreg/testing.h"

#include <sstream>

#include <ATen/ATen.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <c10/util/Exception.h>

#include "op_internal.h"
#include "opreg/op.h"
#include "opreg/registry.h"

namespace opreg::testing {
namespace {

std::string device_of(const std::vector<c10::IValue>& args) {
  for (const auto& arg : args) {
    if (arg.isTensor() && arg.toTensor().defined()) return arg.toTensor().device().str();
  }
  return "-";
}

std::vector<c10::IValue> to_meta(const std::vector<c10::IValue>& args) {
  std::vector<c10::IValue> meta;
  for (const auto& arg : args) {
    if (arg.isTensor() && arg.toTensor().defined()) {
      const auto& t = arg.toTensor();
      meta.emplace_back(at::empty_strided(t.sizes(), t.strides(), t.options().device(at::kMeta)));
    } else {
      meta.push_back(arg);
    }
  }
  return meta;
}

std::vector<c10::IValue> clone_tensors(const std::vector<c10::IValue>& args) {
  std::vector<c10::IValue> cloned;
  for (const auto& arg : args) {
    cloned.push_back(
        arg.isTensor() && arg.toTensor().defined() ? c10::IValue(arg.toTensor().clone()) : arg);
  }
  return cloned;
}

// Largest |a - b| over outputs, or a message when they differ in kind, shape, dtype or by more
// than the tolerance.
std::string compare(const std::vector<c10::IValue>& got, const std::vector<c10::IValue>& want,
                    bool bitwise, double* max_error) {
  *max_error = 0;
  if (got.size() != want.size()) return "output counts differ";
  for (size_t i = 0; i < got.size(); ++i) {
    if (!got[i].isTensor() || !want[i].isTensor()) {
      if (!(got[i] == want[i])) return "output " + std::to_string(i) + " differs";
      continue;
    }
    const auto& a = got[i].toTensor();
    const auto& b = want[i].toTensor();
    std::ostringstream why;
    if (a.sizes() != b.sizes() || a.scalar_type() != b.scalar_type()) {
      why << "output " << i << " is " << a.scalar_type() << a.sizes() << ", the fallback's "
          << b.scalar_type() << b.sizes();
      return why.str();
    }
    if (a.numel() == 0) continue;
    const auto allowed = bitwise ? Tolerance{} : tolerance(a.scalar_type());
    const bool is_bool = a.scalar_type() == at::kBool;
    const auto a_values = is_bool ? a.to(at::kByte) : a;
    const auto b_values = is_bool ? b.to(at::kByte) : b.to(a.device());
    auto diff = a.is_complex() ? (a - b).abs().to(at::kDouble)
                               : (a_values.to(at::kDouble) - b_values.to(at::kDouble)).abs();
    const double error = diff.nan_to_num(0).max().item<double>();
    *max_error = std::max(*max_error, error);
    if ((a.is_floating_point() || a.is_complex()) && !at::equal(a.isnan(), b.isnan())) {
      return "output " + std::to_string(i) + " has NaN at other positions than the fallback's";
    }
    if (at::isclose(a_values, b_values, allowed.rtol, allowed.atol, /*equal_nan=*/true)
            .all()
            .item<bool>()) {
      continue;
    }
    if (bitwise) {
      why << "output " << i << " is not bitwise equal to the fallback's (max |diff| " << error
          << "); the op declares its kernels bitwise";
    } else if (allowed.atol == 0 && allowed.rtol == 0) {
      why << "output " << i << " (" << a.scalar_type() << ") is not equal to the fallback's (max "
          << "|diff| " << error << ")";
    } else {
      why << "output " << i << " differs from the fallback's by up to " << error
          << ", more than atol " << allowed.atol << " + rtol " << allowed.rtol << " * |fallback| ("
          << a.scalar_type() << ")";
    }
    return why.str();
  }
  return "";
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

std::vector<c10::IValue> call_fallback(const std::string& op, std::vector<c10::IValue> args) {
  torch::jit::Stack stack(std::move(args));
  detail::call_checked_fallback(op, find_operator(op), &stack);
  return stack;
}

std::vector<CheckResult> check(const std::string& op,
                               const std::vector<std::vector<c10::IValue>>& samples) {
  auto handle = find_operator(op);
  auto report = describe_op(op);
  std::vector<CheckResult> results;
  for (size_t index = 0; index < samples.size(); ++index) {
    const auto& sample = samples[index];
    const std::string device = device_of(sample);

    CheckResult kernel{"kernel_vs_fallback", op, device, index};
    torch::jit::Stack stack = clone_tensors(sample);
    detail::check_stack(op, stack);
    handle.callBoxed(&stack);
    auto fallback = call_fallback(op, clone_tensors(sample));
    kernel.message = compare(stack, fallback, report.flags.bitwise, &kernel.max_error);
    kernel.passed = kernel.message.empty();
    results.push_back(kernel);

    CheckResult fake{"fake_vs_real", op, device, index};
    torch::jit::Stack meta = to_meta(sample);
    handle.callBoxed(&meta);
    for (size_t i = 0; i < meta.size() && fake.passed && i < stack.size(); ++i) {
      if (!meta[i].isTensor()) continue;
      const auto& m = meta[i].toTensor();
      const auto& r = stack[i].toTensor();
      std::ostringstream why;
      if (m.sizes() != r.sizes()) {
        why << "output " << i << ": the fake's shape is " << m.sizes() << ", the real one "
            << r.sizes();
      } else if (m.scalar_type() != r.scalar_type()) {
        why << "output " << i << ": the fake's dtype is " << m.scalar_type() << ", the real one "
            << r.scalar_type();
      } else if (r.numel() > 1 && m.strides() != r.strides()) {
        why << "output " << i << ": the fake's strides are " << m.strides() << ", the real ones "
            << r.strides();
      }
      fake.message = why.str();
      fake.passed = fake.message.empty();
    }
    results.push_back(fake);
  }
  return results;
}

void check_or_throw(const std::string& op, const std::vector<std::vector<c10::IValue>>& samples) {
  std::ostringstream failures;
  for (const auto& result : check(op, samples)) {
    if (!result.passed) {
      failures << "\n  " << result.check << " failed for " << result.op << " on " << result.device
               << ", sample " << result.sample << ": " << result.message;
    }
  }
  TORCH_CHECK(failures.tellp() == 0, "opreg::testing::check:", failures.str());
}

}  // namespace opreg::testing
