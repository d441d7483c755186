// src/core/load_internal.h: what define() and opreg::load_library share while a library's static
// initializers define ops (src/core/load.cpp): errors are recorded instead of thrown, and what
// was published is remembered so that a failed load can be rolled back.
#pragma once

#include <functional>
#include <memory>
#include <string>

namespace opreg::detail {

// Whether this thread is inside opreg::load_library.
bool loading_library();
// The path of the library this thread is loading ("" when none): the origin of a definition
// whose builder names no caller (a raw OpBuilder, define_all).
std::string loading_library_path();
void record_load_failure(const std::string& op, const std::string& message);
// A definition published during the load of this thread (null: an undefine), and the one it
// replaced (or null).
void record_loaded_definition(const std::string& qualified, std::shared_ptr<const void> published,
                              std::shared_ptr<const void> previous);

// Whether another thread is inside opreg::load_library's dlopen. It holds the dynamic loader's
// lock, which dladdr and dlopen wait for: a define() on a thread that a library's initializer
// waits for must not call them (it would wait forever).
bool library_loading_elsewhere();
// Runs `task` (which calls dladdr or dlopen) now, or, while a library is loading on another
// thread, once that load's dlopen has returned.
void when_loader_is_free(std::function<void()> task);

// An accelerated device type registered during the load of this thread: a failed load
// unregisters it, once the ops it added kernels to have their earlier definitions back.
void record_loaded_device_type(const std::string& name);

// Puts back an op's earlier definition (null: undefined) where the op still has the definition
// the load published: one that another thread made since (a define, a replace, an undefine) is
// that thread's, not the load's, and stays. src/core/registry.cpp.
void restore_definition(const std::string& qualified, const std::shared_ptr<const void>& published,
                        std::shared_ptr<const void> previous);
// Takes a device type out of the registry of accelerated ones; src/core/registry.cpp.
void unregister_device_type(const std::string& name);
// The lock a change of a registered schema holds (see Note [A schema change and Python's
// callers] in src/core/registry.cpp); null where none is set or needed.
std::shared_ptr<void> take_schema_change_lock();

}  // namespace opreg::detail
