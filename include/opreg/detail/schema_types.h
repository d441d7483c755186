// include/opreg/detail/schema_types.h: questions about a schema's types that the core and the
// Python module both ask (which kinds of value an argument or output can hold).
#pragma once

#include <ATen/core/function_schema.h>
#include <ATen/core/jit_type.h>

#include <algorithm>
#include <string>

namespace opreg::detail {

// Whether `type` is of `kind` or holds one of that kind anywhere inside (a list, an optional, a
// dict, a tuple).
inline bool holds_kind(const c10::Type& type, c10::TypeKind kind) {
  if (type.kind() == kind) return true;
  const auto contained = type.containedTypes();
  return std::any_of(contained.begin(), contained.end(),
                     [kind](const c10::TypePtr& inner) { return holds_kind(*inner, kind); });
}

// How a message names an argument's or output's type: as the schema wrote it (ScalarType,
// Layout and MemoryFormat are ints underneath), but SymInt as int, which the user wrote or
// annotated (torch's schema inference writes SymInt for an int).
inline std::string written_type(const c10::Argument& argument) {
  const auto& real = *argument.real_type();
  return (holds_kind(real, c10::TypeKind::SymIntType) ? *argument.type() : real).str();
}

}  // namespace opreg::detail
