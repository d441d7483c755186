// src/core/load_internal.h: what define() and opreg::load_library share while a library's static
// initializers define ops (src/core/load.cpp): errors are recorded instead of thrown, and what
// was published is remembered so that a failed load can be rolled back.
#pragma once

#include <memory>
#include <string>

namespace opreg::detail {

// Whether this thread is inside opreg::load_library.
bool loading_library();
void record_load_failure(const std::string& op, const std::string& message);
// A definition published during the load of this thread, and the one it replaced (or null).
void record_loaded_definition(const std::string& qualified, std::shared_ptr<const void> previous);

// Puts back an op's earlier definition (null: undefined); src/core/registry.cpp.
void restore_definition(const std::string& qualified, std::shared_ptr<const void> previous);

}  // namespace opreg::detail
