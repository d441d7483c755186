// include/opreg/testing.h: checks that an opreg op keeps its promises, from C++ (usable in
// GoogleTest): on each sample, every kernel against the fallback (equal when the op declares
// bitwise, else within the tolerance of the output's dtype; shapes and dtypes alone when it
// declares random, as two runs draw other numbers) and the fake against real outputs (shapes,
// dtypes, strides). The Python opreg.opcheck adds torch.library.opcheck, gradients, vmap and
// compile, and applies the same tolerance (docs/opcheck.md).
#pragma once

#include <string>
#include <vector>

#include <ATen/core/ivalue.h>
#include <c10/core/ScalarType.h>

#include "opreg/export.h"

namespace opreg::testing {

struct CheckResult {
  std::string check;  // "kernel_vs_fallback", "fake_vs_real"
  std::string op;
  std::string device;
  size_t sample = 0;
  bool passed = true;
  double max_error = 0;
  std::string message;  // why it failed
};

// kernel_vs_fallback accepts a kernel's output k against the fallback's f when, elementwise,
// |k - f| <= atol + rtol * |f|, NaN where and only where f has NaN (torch.isclose with
// equal_nan). Zero (equality) for integer and bool dtypes and for ops that declare bitwise;
// complex dtypes take their real type's tolerance.
struct Tolerance {
  double atol = 0;
  double rtol = 0;
};
OPREG_API Tolerance tolerance(at::ScalarType dtype);

// Runs the op through the dispatcher and its fallback directly on each sample (arguments in
// schema order), on the samples' own devices.
OPREG_API std::vector<CheckResult> check(const std::string& op,
                                         const std::vector<std::vector<c10::IValue>>& samples);

// As check(), but throws a c10::Error listing every failure.
OPREG_API void check_or_throw(const std::string& op,
                              const std::vector<std::vector<c10::IValue>>& samples);

// Calls the op's fallback directly (no kernel), boxed: for tests and opreg.opcheck.
OPREG_API std::vector<c10::IValue> call_fallback(const std::string& op,
                                                 std::vector<c10::IValue> args);

}  // namespace opreg::testing
