// src/core/load_internal.h: what define() and opreg::load_library share while a library's static
// initializers define ops (src/core/load.cpp): errors are recorded instead of thrown, and what
// was published is remembered so that a failed load can be rolled back.
#pragma once

#include <c10/util/Exception.h>

#include "opreg/detail/text.h"

#include <exception>
#include <functional>
#include <memory>
#include <string>
#include <type_traits>

namespace opreg::detail {

// Whether this thread is inside opreg::load_library.
bool loading_library();
// The path of the library this thread is loading ("" when none): the origin of a definition
// whose builder names no caller (a raw OpBuilder, define_all).
std::string loading_library_path();
void record_load_failure(const std::string& op, const std::string& message);
// Code that acted during the load of this thread other than by defining ops (asked for a device
// type, undefined an op, registered Triton kernels): the library it is in fails with the load.
void record_load_caller(const void* address);

// Runs an opreg function that a library's static initializer may call: inside
// opreg::load_library an exception would leave the initializer and terminate the process, so
// `fn`'s error is recorded (the load fails, naming `what`) and `Ret{}` comes back. `caller`: the
// function's return address. Outside a load, `fn` runs as it is.
template <class Ret, class Fn>
Ret or_fail_the_load(const std::string& what, const void* caller, Fn&& fn) {
  if (!loading_library()) return fn();
  record_load_caller(caller);
  try {
    return fn();
  } catch (const c10::Error& error) {
    record_load_failure(what, error.what_without_backtrace());
  } catch (const std::exception& error) {
    record_load_failure(what, what_of(error));
  }
  if constexpr (!std::is_void_v<Ret>) return Ret{};
}
// An op's count of published definitions before and after one publish (src/core/registry.cpp's
// OpEntry::changes).
struct ChangeCount {
  uint64_t before = 0;
  uint64_t after = 0;
};
// A definition published during the load of this thread (null: an undefine), and the one it
// replaced (or null).
void record_loaded_definition(const std::string& qualified, std::shared_ptr<const void> published,
                              std::shared_ptr<const void> previous, ChangeCount changes);

// Whether another thread is inside opreg::load_library's dlopen. It holds the dynamic loader's
// lock, which dladdr and dlopen wait for: a define() on a thread that a library's initializer
// waits for must not call them (it would wait forever).
bool library_loading_elsewhere();
// Runs `task` (which calls dladdr or dlopen) now, or, while a library is loading on another
// thread, once that load's dlopen has returned.
void when_loader_is_free(std::function<void()> task);

// An accelerated device type asked for during the load of this thread (registered, or already
// registered): a failed load takes its request back.
void record_loaded_device_type(const std::string& name);
// Work that waits for the load of this thread to succeed (registering its embedded Triton
// kernels): the outermost load runs it once every initializer has run without a failure, and a
// failed load drops it. An exception from it fails the load, and the `undo` of each commit that
// ran before it runs, latest first.
void when_load_succeeds(std::function<void()> commit, std::function<void()> undo);
// Names the load of this thread (0: none); a nested load has an id of its own.
uint64_t current_load_id();

// Puts back an op's earlier definition (null: undefined) where the op still has the definition
// the load published: one that another thread made since (a define, a replace, an undefine) is
// that thread's, not the load's, and stays. The earlier definition serves the device types
// registered now. src/core/registry.cpp.
// False where another thread's definition stays.
bool restore_definition(const std::string& qualified, const std::shared_ptr<const void>& published,
                        std::shared_ptr<const void> previous, ChangeCount changes);
// Whether two definitions (null: undefined) are one declaration (a definition rebuilt for a new
// device type is the one it was rebuilt from). src/core/registry.cpp.
bool same_declaration(const std::shared_ptr<const void>& a, const std::shared_ptr<const void>& b);
// The file a definition was declared in (a library's path); src/core/registry.cpp.
std::string origin_of_definition(const std::shared_ptr<const void>& definition);
// Takes back a request for a device type (record_loaded_device_type); a type nobody asks for any
// more leaves the registry, and every op's kernels for it go. src/core/registry.cpp.
void unregister_device_type(const std::string& name);
// The lock a change of a registered schema holds (see Note [A schema change and Python's
// callers] in src/core/registry.cpp); null where none is set or needed.
std::shared_ptr<void> take_schema_change_lock();

}  // namespace opreg::detail
