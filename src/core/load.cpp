// src/core/load.cpp: opreg::load_library, which opens an op library so that an error in one of
// its definitions raises an exception instead of terminating the process, and rolls the
// library's definitions back when any failed. See Note [Loading op libraries].
//
// Note [Loading op libraries]
// Ops declared in a static initializer are defined while dlopen runs, where an exception would
// call std::terminate. load_library marks the thread as loading; define() then records errors
// instead of throwing. After dlopen returns, if anything failed, every definition the library
// made is rolled back (replaced ops get their earlier definition again, new ops are undefined)
// and one exception lists the library and each failure. The library stays mapped: its code may
// still be referenced, and libraries that define ops are never unloaded (define() pins them).
// A library opened some other way (torch.ops.load_library, a plain dlopen) gets no such
// protection: a failing definition there throws out of its static initializer. A load_library
// called from a library's static initializers (a library that loads another) records its
// failure in the outer load instead of throwing.
#include "opreg/detail/text.h"
#include "opreg/registry.h"

#include <dlfcn.h>
#include <elf.h>
#include <execinfo.h>

#include <atomic>
#include <fstream>
#include <functional>

#include <cstring>
#include <map>
#include <mutex>
#include <sstream>
#include <utility>
#include <vector>

#include <c10/util/Exception.h>

#include "load_internal.h"

namespace opreg {
namespace {

struct LoadContext {
  std::string path;
  std::vector<std::pair<std::string, std::string>> failures;  // (op, message)
  struct Published {
    std::string qualified;
    std::shared_ptr<const void> definition;  // null: an undefine
    std::shared_ptr<const void> previous;
  };
  std::vector<Published> published;
  // Libraries loaded (successfully) from this load's initializers: they fail with it.
  std::vector<std::pair<void*, std::string>> nested;
  std::vector<std::string> device_types;  // accelerated device types it registered
  LoadContext* outer = nullptr;
};

thread_local LoadContext* t_load = nullptr;

// Threads inside load_once's dlopen (all, and this one), and the work that waits for them.
std::atomic<int> g_dlopens{0};
thread_local int t_dlopens = 0;
std::mutex g_deferred_mutex;
std::vector<std::function<void()>>& deferred() {
  static auto* tasks = new std::vector<std::function<void()>>();  // leaked: used until exit
  return *tasks;
}

void run_deferred() {
  std::vector<std::function<void()>> tasks;
  {
    std::lock_guard<std::mutex> lock(g_deferred_mutex);
    tasks.swap(deferred());
  }
  for (auto& task : tasks) task();
}

// Libraries whose load failed, by dlopen handle, with the error: opening one again does not run
// its initializers, so a second load_library must raise the same error instead of succeeding.
std::mutex g_failed_mutex;
std::map<void*, std::string>& failed_loads() {
  static auto* failed = new std::map<void*, std::string>();  // leaked: read until exit
  return *failed;
}

// Why a 64-bit ELF file cannot be mapped whole, or "" when it can (and for anything else, which
// dlopen refuses by itself). dlopen maps each loadable segment at its file offset and reads it:
// a segment past the end of a truncated file is a SIGBUS, not an error.
std::string truncated_elf(const std::string& path) {
  std::ifstream file(path, std::ios::binary | std::ios::ate);
  if (!file) return "";
  const auto size = static_cast<uint64_t>(file.tellg());
  Elf64_Ehdr header{};
  file.seekg(0);
  if (!file.read(reinterpret_cast<char*>(&header), sizeof(header))) return "";
  if (std::memcmp(header.e_ident, ELFMAG, SELFMAG) != 0 || header.e_ident[EI_CLASS] != ELFCLASS64) {
    return "";
  }
  if (header.e_phentsize != sizeof(Elf64_Phdr) ||
      header.e_phoff + uint64_t{header.e_phnum} * sizeof(Elf64_Phdr) > size) {
    return "its program headers lie past its end";
  }
  for (uint16_t i = 0; i < header.e_phnum; ++i) {
    Elf64_Phdr segment{};
    file.seekg(static_cast<std::streamoff>(header.e_phoff + i * sizeof(Elf64_Phdr)));
    if (!file.read(reinterpret_cast<char*>(&segment), sizeof(segment))) return "it cannot be read";
    if (segment.p_type == PT_LOAD && segment.p_offset + segment.p_filesz > size) {
      return "segment " + std::to_string(i) + " ends at byte " +
             std::to_string(segment.p_offset + segment.p_filesz) + ", the file has " +
             std::to_string(size);
    }
  }
  return "";
}

}  // namespace

namespace detail {

bool loading_library() { return t_load != nullptr; }

std::string loading_library_path() { return t_load != nullptr ? t_load->path : ""; }

bool library_loading_elsewhere() { return g_dlopens.load() > t_dlopens; }

void when_loader_is_free(std::function<void()> task) {
  if (!library_loading_elsewhere()) {
    task();
    return;
  }
  {
    std::lock_guard<std::mutex> lock(g_deferred_mutex);
    deferred().push_back(std::move(task));
  }
  // The load may have ended (and run what was deferred) between the check and the push.
  if (!library_loading_elsewhere()) run_deferred();
}

void record_load_failure(const std::string& op, const std::string& message) {
  t_load->failures.emplace_back(op, message);
}

void record_loaded_definition(const std::string& qualified, std::shared_ptr<const void> published,
                              std::shared_ptr<const void> previous) {
  if (t_load != nullptr) {
    t_load->published.push_back({qualified, std::move(published), std::move(previous)});
  }
}

void record_loaded_device_type(const std::string& name) {
  if (t_load != nullptr) t_load->device_types.push_back(name);
}

}  // namespace detail

namespace {

// glibc's backtrace() loads its unwinder (libgcc_s) on its first call, under the dynamic loader's
// lock, and every c10 error takes a backtrace. The first error of a process raised while opreg's
// registry lock is held, as another thread's dlopen holds the loader's lock and its library's
// definitions wait for the registry lock, deadlocked both threads: the unwinder is loaded first,
// when libopreg loads and again before each library.
void load_unwinder() {
  static const bool loaded = [] {
    void* frame = nullptr;
    return backtrace(&frame, 1) >= 0;
  }();
  (void)loaded;
}
const bool unwinder_loaded_with_libopreg = (load_unwinder(), true);

void load_once(const std::string& path) {
  load_unwinder();
  // dlopen("") opens the program itself.
  TORCH_CHECK_VALUE(!path.empty(),
                    "opreg::load_library: 'path' is empty; pass the path of a library");
  const std::string truncated = truncated_elf(path);
  TORCH_CHECK_VALUE(truncated.empty(), "opreg::load_library: cannot load '",
                    detail::valid_utf8(path), "': the file is a truncated shared library (",
                    truncated, ")");
  LoadContext context;
  context.path = path;
  context.outer = t_load;
  t_load = &context;
  ++g_dlopens;
  ++t_dlopens;
  void* handle = dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL);
  --t_dlopens;
  --g_dlopens;
  t_load = context.outer;
  if (!detail::library_loading_elsewhere()) run_deferred();
  if (handle == nullptr) {
    const char* why = dlerror();
    TORCH_CHECK(false, "opreg::load_library: cannot load '", detail::valid_utf8(path),
                "': ", detail::valid_utf8(why != nullptr ? why : "unknown error"));
  }
  if (context.failures.empty()) {
    {
      std::lock_guard<std::mutex> lock(g_failed_mutex);
      auto failed = failed_loads().find(handle);
      TORCH_CHECK_VALUE(failed == failed_loads().end(), failed->second,
                        " (the library failed when it was first loaded in this process)");
    }
    // A library loaded from inside another one's initializers belongs to the outer load.
    if (context.outer != nullptr) {
      for (auto& published : context.published) context.outer->published.push_back(published);
      for (auto& type : context.device_types) context.outer->device_types.push_back(type);
      context.outer->nested.emplace_back(handle, path);
      for (auto& nested : context.nested) context.outer->nested.push_back(nested);
    }
    return;
  }
  {  // the rollback may change schemas back; the loader's lock is free unless this load nests
    const auto schema_change_lock =
        detail::loading_library() ? nullptr : detail::take_schema_change_lock();
    for (auto it = context.published.rbegin(); it != context.published.rend(); ++it) {
      detail::restore_definition(it->qualified, it->definition, it->previous);
    }
    for (const auto& type : context.device_types) detail::unregister_device_type(type);
  }
  std::ostringstream failures;
  failures << "opreg::load_library: '" << path << "' defines ops that failed ("
           << context.failures.size() << "); none of its ops is defined:";
  for (const auto& [op, message] : context.failures) failures << "\n  " << op << ": " << message;
  const std::string text = detail::valid_utf8(failures.str());  // a name may hold any bytes
  {
    std::lock_guard<std::mutex> lock(g_failed_mutex);
    failed_loads()[handle] = text;
    // Its ops were rolled back with this library's, and a library loads once per process.
    for (const auto& [nested, nested_path] : context.nested) {
      failed_loads()[nested] = detail::valid_utf8(
          "opreg::load_library: '" + nested_path + "' was loaded by '" + path +
          "', whose load failed, and its ops were rolled back with that library's: " + text);
    }
  }
  TORCH_CHECK_VALUE(false, text);
}

}  // namespace

void load_library(const std::string& path) {
  LoadContext* outer = t_load;
  if (outer == nullptr) {
    load_once(path);
    return;
  }
  // Called from another library's static initializers: an exception would terminate the
  // process. The failure becomes one of the outer library's, which then fails as a whole.
  const std::string what = "opreg::load_library('" + path + "')";
  try {
    load_once(path);
  } catch (const c10::Error& error) {
    outer->failures.emplace_back(what, error.what_without_backtrace());
  } catch (const std::exception& error) {
    outer->failures.emplace_back(what, error.what());
  }
}

}  // namespace opreg
