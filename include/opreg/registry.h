// include/opreg/registry.h: what opreg knows about the ops it defined, as typed reports: per
// device type, what serves calls (a kernel, or a skipped registration and why), and which fake,
// autograd and vmap support each op has. describe() words a report for people; `python3 -m opreg
// info` prints it.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "opreg/definition.h"
#include "opreg/export.h"

namespace opreg {

// A device type named by a kernel (or by the registry of accelerated device types).
struct DeviceServing {
  enum class Kind { kKernel, kSkipped };
  std::string device_type;  // "cuda", "cpu", "xpu", ...
  Kind kind = Kind::kKernel;
  std::string kernel;  // the kernel's name (kKernel), or the kernel that was not registered
  std::string reason;  // why it was skipped (kSkipped)
};

enum class FakeSource { kExplicit, kPython, kFallbackOnMeta };
enum class AutogradSupport { kBackward, kFallback, kError, kNone };
enum class VmapSupport { kRule, kBatchPolymorphic, kFallback, kPerExampleLoop };

struct OpReport {
  std::string name;                    // "ns::name"
  std::string schema;                  // the full schema
  std::string origin;                  // the library or file that defined it
  std::vector<DeviceServing> kernels;  // device types with a kernel; all others run the fallback
  FakeSource fake = FakeSource::kFallbackOnMeta;
  AutogradSupport autograd = AutogradSupport::kFallback;
  VmapSupport vmap = VmapSupport::kFallback;
  OpFlags flags;
  Sharding sharding = Sharding::kNone;  // as declared, or the default (see Sharding)
  std::vector<std::pair<std::string, std::vector<std::string>>> dtypes;  // declared, per argument
};

// Words for people: "kernel:triton", "skipped: <reason>", "fallback on meta", ...
OPREG_API std::string describe(const DeviceServing& serving);
OPREG_API std::string describe(FakeSource fake);
OPREG_API std::string describe(AutogradSupport autograd);
OPREG_API std::string describe(VmapSupport vmap);
OPREG_API std::string describe(Sharding sharding);
// The whole report, one line per aspect (what `python3 -m opreg info` prints for an op).
OPREG_API std::string describe(const OpReport& report);

OPREG_API std::vector<OpReport> describe_ops();
OPREG_API OpReport describe_op(const std::string& name);
OPREG_API bool is_defined(const std::string& name);

namespace detail {
// Held by a definition that changes a registered schema, taken before opreg's own lock; null
// where none is needed. opreg's Python module sets it to take the GIL: see Note [A schema change
// and Python's callers] in src/core/registry.cpp.
using SchemaChangeLock = std::function<std::shared_ptr<void>()>;
OPREG_API void set_schema_change_lock(SchemaChangeLock lock);
// Whether this thread would have to take that lock (for opreg's Python module: it does not hold
// the GIL). Asked, without waiting, by a definition made inside another, which cannot take it.
OPREG_API void set_schema_change_lock_needed(std::function<bool()> needed);
// Called after a definition replaced an op's earlier one, from any front (a C++ replace made at
// run time reaches no Python code otherwise), outside opreg's locks. opreg's Python module sets it
// to drop torch.compile's code compiled before the replace.
OPREG_API void set_replace_listener(std::function<void()> listener);
// A number naming the op's current definition (0: none): each define or replace makes another,
// undefine makes 0, and a failed load's rollback brings the earlier one back. Python's pieces of a
// definition (a fake) check it, since a definition made from C++ does not pass through Python.
OPREG_API uint64_t definition_serial(const std::string& name);
// Whether the name had a definition before in this process (defined, replaced or undefined):
// torch.compile's code compiled for it then goes, as after a replace.
OPREG_API bool defined_before(const std::string& name);
// Whether this thread is dropping the definitions a define, replace or undefine left unreachable
// (after opreg's locks are released). opreg's Python module then drops Python pieces on Python's
// main thread when this thread lacks the GIL: the thread that waits for this one may hold it.
OPREG_API bool dropping_definitions();
// Whether this thread is inside a definition (define_all, or the rebuild of definitions for a new
// device type), holding opreg's registry lock: its kernel factories run there.
OPREG_API bool inside_definition();
// The file load_library opens for `path`: `path` itself when it holds a '/', else the file of that
// name in LD_LIBRARY_PATH or the system's library directories, else the file of a library of that
// name mapped already ("" when there is none).
OPREG_API std::string library_file(const std::string& path);
}  // namespace detail

// Undefines an opreg op: calls then raise an error naming it, and it can be defined again (with
// any schema). PyTorch keeps the name, so handles taken earlier stay safe to call. Within
// load_library, a failed load puts the op back, and an error is recorded as a definition's is.
OPREG_API void undefine(const std::string& name);

// Opens a library whose static initializers define opreg ops. If any definition fails, every op
// the library defined is rolled back and one exception (a ValueError in Python) names the library
// and each failure; the process survives. A `path` without a '/' is looked up in LD_LIBRARY_PATH,
// then in the system's library directories (/etc/ld.so.conf), not in the working directory. See
// Note [Loading op libraries] in src/core/load.cpp.
OPREG_API void load_library(const std::string& path);

}  // namespace opreg
