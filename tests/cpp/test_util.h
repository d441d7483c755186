// tests/cpp/test_util.h: helpers shared by the C++ tests: calling an op by name through the
// dispatcher, reading the trace, and asserting on error messages.
#pragma once

#include <string>
#include <vector>

#include <ATen/ATen.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <gtest/gtest.h>
#include <opreg/opreg.h>

namespace opreg_test {

inline c10::OperatorHandle find_op(const std::string& name) {
  return c10::Dispatcher::singleton().findSchemaOrThrow(name.c_str(), "");
}

// Calls an op through the dispatcher, boxed, as Python does.
inline std::vector<c10::IValue> call_boxed(const std::string& name, std::vector<c10::IValue> args) {
  auto op = find_op(name);
  torch::jit::Stack stack(std::move(args));
  op.callBoxed(&stack);
  return stack;
}

inline std::vector<std::string> impls_of(const std::vector<opreg::TraceRecord>& records) {
  std::vector<std::string> impls;
  for (const auto& record : records) impls.push_back(record.impl);
  return impls;
}

// The message of the c10::Error that `fn` throws; fails the test when nothing is thrown.
template <class Fn>
std::string error_of(Fn&& fn) {
  try {
    fn();
  } catch (const c10::Error& error) {
    return error.what_without_backtrace();
  }
  ADD_FAILURE() << "expected a c10::Error, nothing was thrown";
  return "";
}

}  // namespace opreg_test

#define EXPECT_CONTAINS(text, part) \
  EXPECT_NE(std::string(text).find(part), std::string::npos) << "in: " << (text)
