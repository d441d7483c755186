// src/core/spec.h: what an OpBuilder gathers (OpBuilder::State), read by define() to build the
// op's definition, and the pieces of a definition that the autograd and vmap kernels share.
#pragma once

#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "opreg/definition.h"

namespace opreg {

struct KernelDeclaration {
  std::string name;
  std::optional<std::vector<std::string>> device_types;  // nullopt: follow the registry
  KernelFactory factory;
};

struct AutogradDeclaration {
  AutogradPolicy policy = AutogradPolicy::kFallback;
  Backward backward;
  SetupContext setup_context;  // may be empty when backward needs nothing saved
};

struct OpBuilder::State {
  std::string name_or_schema;
  std::function<c10::FunctionSchema()> infer_schema;  // from the C++ signature; empty in Python
  KernelFactory fallback;
  std::string fallback_words;         // how messages name the fallback (empty: "the fallback")
  bool declared_in_python = false;    // messages spell declarations as Python does
  std::optional<KernelFactory> fake;  // nullopt: the fallback runs on meta tensors
  std::string python_module;          // set: the fake is registered from Python by this module
  // With python_module: the fake as a kernel, which serves calls on meta tensors (Python's
  // registration serves FakeTensorMode).
  std::optional<KernelFactory> python_meta;
  std::vector<KernelDeclaration> kernels;
  std::vector<std::pair<std::string, std::vector<c10::ScalarType>>> dtype_rules;
  OpFlags flags;
  AutogradDeclaration autograd;
  VmapRule vmap_rule;
  std::optional<Sharding> sharding;  // nullopt: the default (see Sharding)
  bool replace = false;
  // Set: replace only the definition of this serial (detail::definition_serial; 0: none).
  std::optional<uint64_t> replace_only;
  std::string origin;
  std::optional<std::string> part_of;  // set: undefined together with this op (OpBuilder::part_of)
  const void* caller = nullptr;
  // A builder call's mistake (an unknown flag name), raised by define(): within a library's
  // load it is recorded there, where a builder's own throw would escape its static initializer.
  std::string mistake;
};

namespace detail {

// The identity of one definition of an op: its name and schema (an op replaced with another
// schema gets a new one, so a kernel never reads the schema of another definition).
struct OpIdentity {
  std::string name;  // "ns::name" or "ns::name.overload"
  c10::FunctionSchema schema;
  std::string schema_text;
  uint64_t serial = 0;  // the definition's (detail::definition_serial)
};

}  // namespace detail
}  // namespace opreg
