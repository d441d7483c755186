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
//
// Loads on other threads: dlopen runs one library's initializers at a time, but a load's
// rollback runs after its dlopen returned, while the next library's initializers may already
// run. So rollbacks run one at a time; a rollback that finds an op changed by a later load still
// in progress hands its own earlier definition to that load's record; and a load whose dlopen
// found its library loaded (by a load not settled yet) waits for that load's outcome, which may
// be that the library failed with it.
#include "opreg/detail/text.h"
#include "opreg/op.h"
#include "opreg/registry.h"

#include <dlfcn.h>
#include <elf.h>
#include <execinfo.h>
#include <glob.h>
#include <link.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>

#include <algorithm>
#include <atomic>
#include <cctype>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <fstream>
#include <functional>
#include <map>
#include <mutex>
#include <optional>
#include <set>
#include <sstream>
#include <utility>
#include <vector>

#include <c10/util/Exception.h>

#include "load_internal.h"

namespace opreg {
namespace {

struct LoadContext {
  LoadContext(std::string loaded, LoadContext* enclosing)
      : id(++last_id), path(std::move(loaded)), outer(enclosing) {}

  static inline std::atomic<uint64_t> last_id{0};
  const uint64_t id;
  const std::string path;
  std::vector<std::pair<std::string, std::string>> failures;  // (op, message)
  struct Published {
    std::string qualified;
    std::shared_ptr<const void> definition;  // null: an undefine
    std::shared_ptr<const void> previous;
    uint64_t sequence;  // of all loads' publications, in the order the registry made them
    detail::ChangeCount changes;
  };
  // Under g_loads_mutex: another load's rollback may hand a record an earlier definition.
  std::vector<Published> published;
  // Libraries loaded (successfully) from this load's initializers: they fail with it.
  std::vector<std::pair<void*, std::string>> nested;
  std::vector<std::string> device_types;  // accelerated device types it asked for
  std::vector<const void*> callers;       // record_load_caller
  struct Commit {
    std::function<void()> run, undo;
  };
  std::vector<Commit> on_success;
  LoadContext* const outer;
};

thread_local LoadContext* t_load = nullptr;

// Every load in progress (nested ones too), and the outermost ones whose outcome is not final
// yet (in dlopen, registering what waits for success, or rolling back), by id.
std::mutex g_loads_mutex;
std::condition_variable g_load_settled;
std::vector<LoadContext*> g_active;
std::set<uint64_t> g_unsettled;
std::atomic<uint64_t> g_publications{0};
// One rollback at a time: a rollback may hand an op's earlier definition to another failing
// load's record, which that load's rollback must then read.
std::mutex g_rollback_mutex;

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
// Libraries that other code opened inside a failed load (a library it needs, one its
// initializers dlopen) are known by their file, as no handle of theirs was returned.
using FileId = std::pair<dev_t, ino_t>;
std::mutex g_failed_mutex;
std::map<void*, std::string>& failed_loads() {
  static auto* failed = new std::map<void*, std::string>();  // leaked: read until exit
  return *failed;
}
std::map<FileId, std::string>& failed_files() {
  static auto* failed = new std::map<FileId, std::string>();  // leaked: read until exit
  return *failed;
}

// The ops each library defined when its load succeeded, by file: opening it again runs no
// initializer, so a second load_library cannot define again an op undefined since, and says so.
std::map<FileId, std::vector<std::string>>& defined_by_file() {
  static auto* defined = new std::map<FileId, std::vector<std::string>>();  // leaked: as above
  return *defined;
}

// Note [A library rebuilt under a loaded path]
// dlopen compares the path it is given with the names of the libraries it mapped before it looks
// at any file: a library loaded from a path, rebuilt there (a new file, or the old one written
// again) and loaded again gets the old mapped library back, whose initializers do not run, so none
// of the new file's ops would be defined while the load reported success. Each load records the
// file it mapped a library from (device, inode, size, modification time), and a later load that
// dlopen would answer with that library refuses when the file at its path is no longer that one.
// A library mapped during such a load (one the loaded library needs, or that its initializers
// opened) is recorded too, just after the load. A library that other code mapped (a plain
// dlopen, torch.ops.load_library) has no record: its file is known to be another only when the
// file mapped was deleted.
struct FileStamp {
  dev_t device = 0;
  ino_t inode = 0;
  off_t size = 0;
  timespec modified{};
  bool operator==(const FileStamp& other) const {
    return device == other.device && inode == other.inode && size == other.size &&
           modified.tv_sec == other.modified.tv_sec && modified.tv_nsec == other.modified.tv_nsec;
  }
};

// The file each library that load_library mapped was mapped from, by dlopen handle (under
// g_failed_mutex).
std::map<void*, FileStamp>& mapped_stamps() {
  static auto* stamps = new std::map<void*, FileStamp>();  // leaked: read until exit
  return *stamps;
}

std::optional<FileStamp> stamp_of(const std::string& path) {
  struct stat status{};
  if (stat(path.c_str(), &status) != 0) return std::nullopt;
  return FileStamp{status.st_dev, status.st_ino, status.st_size, status.st_mtim};
}

std::string describe_stamp(const FileStamp& stamp) {
  std::tm utc{};
  char when[32] = "?";
  if (gmtime_r(&stamp.modified.tv_sec, &utc) != nullptr) {
    std::strftime(when, sizeof(when), "%Y-%m-%d %H:%M:%S", &utc);
  }
  char nanoseconds[16];
  std::snprintf(nanoseconds, sizeof(nanoseconds), ".%09ld",
                static_cast<long>(stamp.modified.tv_nsec));
  std::ostringstream text;
  text << "device " << major(stamp.device) << ":" << minor(stamp.device) << ", inode "
       << stamp.inode << ", " << stamp.size << " bytes, modified " << when << nanoseconds << " UTC";
  return text.str();
}

// Whether the file that the library `map` was mapped from was deleted since (its mappings read
// "(deleted)" in /proc/self/maps).
bool mapped_file_deleted(const link_map* map) {
  std::ifstream maps("/proc/self/maps");
  const auto address = reinterpret_cast<uintptr_t>(map->l_ld);
  for (std::string line; std::getline(maps, line);) {
    uintptr_t start = 0, end = 0;
    if (std::sscanf(line.c_str(), "%lx-%lx", &start, &end) != 2) continue;
    if (address < start || address >= end) continue;
    const std::string deleted = " (deleted)";
    return line.size() > deleted.size() &&
           line.compare(line.size() - deleted.size(), deleted.size(), deleted) == 0;
  }
  return false;
}

// Before the load of `file` (`path` as given): whether dlopen would hand back a library mapped
// already, and then that the file at the path is the one it was mapped from (Note [A library
// rebuilt under a loaded path]). `stamp`: the file's stamp now.
bool check_not_rebuilt(const std::string& path, const std::string& file,
                       std::optional<FileStamp>* stamp) {
  *stamp = stamp_of(file);
  void* mapped = dlopen(file.c_str(), RTLD_LAZY | RTLD_LOCAL | RTLD_NOLOAD);
  if (mapped == nullptr) return false;
  std::optional<FileStamp> then;
  {
    std::lock_guard<std::mutex> lock(g_failed_mutex);
    const auto found = mapped_stamps().find(mapped);
    if (found != mapped_stamps().end()) then = found->second;
  }
  bool deleted = false;
  if (!then) {
    link_map* map = nullptr;
    deleted = dlinfo(mapped, RTLD_DI_LINKMAP, &map) == 0 && map != nullptr &&
              map->l_name != nullptr && file == map->l_name && mapped_file_deleted(map);
  }
  dlclose(mapped);
  const bool other_file = deleted || (then && *stamp && !(*then == **stamp));
  if (!other_file) return true;
  TORCH_CHECK_VALUE(
      false, "opreg::load_library: cannot load '", detail::readable_message(path),
      "': a library was loaded from that path earlier in this process, from another file than "
      "the one there now (",
      then ? "loaded: " + describe_stamp(*then) + "; now: " + describe_stamp(**stamp)
           : std::string("the file loaded was deleted since"),
      "). The dynamic loader hands back the library it mapped for a path it loaded before, so "
      "the new file's static initializers would not run and none of its ops would be defined: a "
      "process cannot load a rebuilt library under the same path again: restart the process to "
      "load it (a copy loaded from another path would define its ops again, which only ops "
      "declared .replace() allow)");
  return true;
}

std::optional<FileId> file_id(const char* path) {
  struct stat status{};
  if (path == nullptr || *path == '\0' || stat(path, &status) != 0) return std::nullopt;
  return FileId{status.st_dev, status.st_ino};
}

// The files of every library mapped now.
std::set<FileId> loaded_files() {
  std::set<FileId> files;
  dl_iterate_phdr(
      [](dl_phdr_info* info, size_t, void* found) {
        if (auto id = file_id(info->dlpi_name)) static_cast<std::set<FileId>*>(found)->insert(*id);
        return 0;
      },
      &files);
  return files;
}

// Records the file of each library mapped since `files_before` that has no record yet: the
// libraries a load brought in (those it needs, those its initializers opened), whose ops it
// defined too. Stamped now, just after their mapping; `loaded` (the library loaded, whose file
// is recorded only when it did not change while it was read) is left out.
void record_mapped_since(const std::set<FileId>& files_before, void* loaded) {
  std::vector<std::string> names;
  dl_iterate_phdr(
      [](dl_phdr_info* info, size_t, void* found) {
        if (info->dlpi_name != nullptr && *info->dlpi_name != '\0') {
          static_cast<std::vector<std::string>*>(found)->emplace_back(info->dlpi_name);
        }
        return 0;
      },
      &names);
  for (const auto& name : names) {  // dlopen may not run inside dl_iterate_phdr's callback
    const auto id = file_id(name.c_str());
    if (!id || files_before.count(*id) != 0) continue;
    const auto stamp = stamp_of(name);
    void* mapped = dlopen(name.c_str(), RTLD_LAZY | RTLD_LOCAL | RTLD_NOLOAD);
    if (mapped == nullptr) continue;
    if (stamp && mapped != loaded) {
      std::lock_guard<std::mutex> lock(g_failed_mutex);
      mapped_stamps().emplace(mapped, *stamp);
    }
    dlclose(mapped);
  }
}

std::optional<FileId> file_of_handle(void* handle) {
  link_map* map = nullptr;
  if (dlinfo(handle, RTLD_DI_LINKMAP, &map) != 0 || map == nullptr) return std::nullopt;
  return file_id(map->l_name);
}

// After a successful load (nested ones too): a library opened for the first time has the ops it
// left defined recorded; one that was open already (its initializers did not run) must still
// have them defined.
void check_defines_again(void* handle, const std::string& path, const LoadContext& context,
                         const std::set<FileId>& files_before) {
  const auto id = file_of_handle(handle);
  if (!id) return;
  std::vector<std::string> defined;
  if (files_before.count(*id) == 0) {
    // An op the load defined and then undefined is not among them: its last record decides.
    std::map<std::string, bool> defined_last;
    {
      std::lock_guard<std::mutex> lock(g_loads_mutex);
      for (const auto& record : context.published) {
        if (defined_last.count(record.qualified) == 0) defined.push_back(record.qualified);
        defined_last[record.qualified] = record.definition != nullptr;
      }
    }
    defined.erase(std::remove_if(defined.begin(), defined.end(),
                                 [&](const std::string& name) { return !defined_last[name]; }),
                  defined.end());
    std::lock_guard<std::mutex> lock(g_failed_mutex);
    defined_by_file()[*id] = std::move(defined);
    return;
  }
  {
    std::lock_guard<std::mutex> lock(g_failed_mutex);
    defined = defined_by_file()[*id];
  }
  std::vector<std::string> undefined;
  for (const auto& name : defined) {
    if (!is_defined(name)) undefined.push_back(name);
  }
  if (undefined.empty()) return;
  std::ostringstream names;
  for (const auto& name : undefined) names << (names.tellp() > 0 ? ", " : "") << name;
  TORCH_CHECK_VALUE(false, "opreg::load_library: '", detail::readable_message(path),
                    "' is loaded already, so its static initializers do not run again, and ops it "
                    "defined were undefined since: ",
                    names.str(),
                    "; they stay undefined (define them again from code, or load "
                    "the library in a new process)");
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

// The directories of /etc/ld.so.conf (and the files it includes) in order.
void add_configured_dirs(const std::string& conf, int depth, std::vector<std::string>& dirs) {
  std::ifstream file(conf);
  std::string line;
  while (depth < 8 && file && std::getline(file, line)) {
    line = line.substr(0, line.find('#'));
    const auto begin = line.find_first_not_of(" \t");
    if (begin == std::string::npos) continue;
    line = line.substr(begin, line.find_last_not_of(" \t\r") + 1 - begin);
    if (line.rfind("include", 0) == 0 && line.size() > 7 &&
        std::isspace(static_cast<unsigned char>(line[7]))) {
      std::string pattern = line.substr(line.find_first_not_of(" \t", 7));
      if (pattern.front() != '/') pattern = conf.substr(0, conf.rfind('/') + 1) + pattern;
      glob_t found{};
      if (glob(pattern.c_str(), 0, nullptr, &found) == 0) {
        for (size_t i = 0; i < found.gl_pathc; ++i) {
          add_configured_dirs(found.gl_pathv[i], depth + 1, dirs);
        }
      }
      globfree(&found);
    } else if (line.front() == '/') {
      dirs.push_back(line);
    }
  }
}

// The file a name without a '/' names: the first in LD_LIBRARY_PATH (an empty entry is the
// working directory, as for the dynamic loader), then in the system's library directories.
// load_library checks that file and gives dlopen its path, so the file checked is the one mapped.
std::optional<std::string> find_library_file(const std::string& name) {
  std::vector<std::string> dirs;
  // As the dynamic loader reads it: set but empty is no list.
  if (const char* searched = std::getenv("LD_LIBRARY_PATH"); searched != nullptr && *searched) {
    std::string list = searched;
    size_t start = 0;
    while (start <= list.size()) {
      const size_t end = std::min(list.find_first_of(":;", start), list.size());
      dirs.push_back(end == start ? "." : list.substr(start, end - start));
      start = end + 1;
    }
  }
  add_configured_dirs("/etc/ld.so.conf", 0, dirs);
  for (const char* dir : {"/lib64", "/usr/lib64", "/lib", "/usr/lib"}) dirs.emplace_back(dir);
  for (const auto& dir : dirs) {
    const std::string candidate = dir + "/" + name;
    struct stat status{};
    if (stat(candidate.c_str(), &status) == 0) return candidate;
  }
  return std::nullopt;
}

// The file of the library the dynamic loader mapped for the bare `name` (found elsewhere, by a
// runpath), if one is mapped ("" where it does not say). Asked before find_library_file, dlopen
// would open the file it finds even with RTLD_NOLOAD (a FIFO: no end).
std::optional<std::string> mapped_file(const std::string& name) {
  void* loaded = dlopen(name.c_str(), RTLD_LAZY | RTLD_LOCAL | RTLD_NOLOAD);
  if (loaded == nullptr) return std::nullopt;
  std::string file;
  link_map* map = nullptr;
  if (dlinfo(loaded, RTLD_DI_LINKMAP, &map) == 0 && map != nullptr && map->l_name != nullptr) {
    file = map->l_name;
  }
  dlclose(loaded);
  return file;
}

}  // namespace

namespace detail {

bool loading_library() { return t_load != nullptr; }

std::string loading_library_path() { return t_load != nullptr ? t_load->path : ""; }

bool library_loading_elsewhere() { return g_dlopens.load() > t_dlopens; }

std::string library_file(const std::string& path) {
  if (path.find('/') != std::string::npos) return path;
  if (const auto found = find_library_file(path)) return *found;
  return mapped_file(path).value_or("");  // as load_once accepts it
}

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
  // The same failure twice (a call in a loop, a lookup and then the call on what it found) is
  // listed once.
  std::pair<std::string, std::string> failure{op, message};
  auto& failures = t_load->failures;
  if (std::find(failures.begin(), failures.end(), failure) == failures.end()) {
    failures.push_back(std::move(failure));
  }
}

void record_loaded_definition(const std::string& qualified, std::shared_ptr<const void> published,
                              std::shared_ptr<const void> previous, ChangeCount changes) {
  if (t_load == nullptr) return;
  std::lock_guard<std::mutex> lock(g_loads_mutex);
  t_load->published.push_back(
      {qualified, std::move(published), std::move(previous), ++g_publications, changes});
}

void record_loaded_device_type(const std::string& name) {
  if (t_load != nullptr) t_load->device_types.push_back(name);
}

void record_load_caller(const void* address) {
  if (t_load != nullptr) t_load->callers.push_back(address);
}

void when_load_succeeds(std::function<void()> commit, std::function<void()> undo) {
  TORCH_INTERNAL_ASSERT(t_load != nullptr, "when_load_succeeds outside a load");
  t_load->on_success.push_back({std::move(commit), std::move(undo)});
}

uint64_t current_load_id() { return t_load != nullptr ? t_load->id : 0; }

bool inside_library_load() { return t_load != nullptr; }

void fail_library_load(const std::string& what, const void* caller, const std::exception& error) {
  TORCH_INTERNAL_ASSERT(t_load != nullptr, "fail_library_load outside a load");
  record_load_caller(caller);
  const auto* c10_error = dynamic_cast<const c10::Error*>(&error);
  record_load_failure(what,
                      c10_error ? c10_error->what_without_backtrace() : detail::what_of(error));
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

// A load in g_active (and, outermost, in g_unsettled) from construction until it is settled.
class ActiveLoad {
 public:
  explicit ActiveLoad(LoadContext& context) : context_(context) {
    std::lock_guard<std::mutex> lock(g_loads_mutex);
    g_active.push_back(&context_);
    if (context_.outer == nullptr) g_unsettled.insert(context_.id);
  }
  ActiveLoad(const ActiveLoad&) = delete;
  ActiveLoad& operator=(const ActiveLoad&) = delete;
  ~ActiveLoad() {
    settle();
    std::lock_guard<std::mutex> lock(g_loads_mutex);
    g_active.erase(std::find(g_active.begin(), g_active.end(), &context_));
  }

  // Its outcome is final: loads that wait for it may go on.
  void settle() {
    {
      std::lock_guard<std::mutex> lock(g_loads_mutex);
      if (g_unsettled.erase(context_.id) == 0) return;
    }
    g_load_settled.notify_all();
  }

  // The other outermost loads not settled now.
  std::set<uint64_t> unsettled_others() const {
    std::lock_guard<std::mutex> lock(g_loads_mutex);
    std::set<uint64_t> others = g_unsettled;
    others.erase(context_.id);
    return others;
  }

 private:
  LoadContext& context_;
};

// A library this load found loaded ran its initializers in an earlier load, which answers for
// its ops; such a load, once it has settled, may still have failed.
void wait_until_settled(const std::set<uint64_t>& loads) {
  std::unique_lock<std::mutex> lock(g_loads_mutex);
  g_load_settled.wait(lock, [&] {
    return std::none_of(loads.begin(), loads.end(),
                        [](uint64_t id) { return g_unsettled.count(id) != 0; });
  });
}

void check_not_failed(void* handle) {
  const auto file = file_of_handle(handle);
  std::lock_guard<std::mutex> lock(g_failed_mutex);
  auto failed = failed_loads().find(handle);
  TORCH_CHECK_VALUE(failed == failed_loads().end(), failed->second,
                    " (the library failed when it was first loaded in this process)");
  if (!file) return;
  auto failed_file = failed_files().find(*file);
  TORCH_CHECK_VALUE(failed_file == failed_files().end(), failed_file->second);
}

// The op no longer holds what `record` published: a later load's record that replaced it holds
// it as its earlier definition, and must hold what came before it instead.
void hand_over(const LoadContext& context, const LoadContext::Published& record) {
  std::lock_guard<std::mutex> lock(g_loads_mutex);
  LoadContext::Published* later = nullptr;
  for (LoadContext* other : g_active) {
    if (other == &context) continue;
    for (auto& candidate : other->published) {
      if (candidate.qualified == record.qualified && candidate.sequence > record.sequence &&
          detail::same_declaration(candidate.previous, record.definition) &&
          (later == nullptr || candidate.sequence < later->sequence)) {
        later = &candidate;
      }
    }
  }
  if (later != nullptr) {
    later->previous = record.previous;
    later->changes.before = record.changes.before;  // its rollback undoes both publications
  }
}

void roll_back(LoadContext& context) {
  std::lock_guard<std::mutex> one_at_a_time(g_rollback_mutex);
  // The rollback may change schemas back; the loader's lock is free unless this load nests.
  const auto schema_change_lock =
      detail::loading_library() ? nullptr : detail::take_schema_change_lock();
  // Types first: the earlier definitions put back are then rebuilt for the types that stay.
  for (const auto& type : context.device_types) detail::unregister_device_type(type);
  for (size_t i = context.published.size(); i-- > 0;) {
    LoadContext::Published record;
    {
      std::lock_guard<std::mutex> lock(g_loads_mutex);
      record = context.published[i];
    }
    if (!detail::restore_definition(record.qualified, record.definition, record.previous,
                                    record.changes)) {
      hand_over(context, record);
    }
  }
}

// Every library whose initializers ran inside the failed load fails with it: loading one again
// raises the error instead of succeeding with its ops rolled back.
void mark_failed(const LoadContext& context, void* handle, const std::set<FileId>& files_before,
                 const std::string& text) {
  std::set<std::string> origins;
  {
    std::lock_guard<std::mutex> lock(g_loads_mutex);
    for (const auto& record : context.published) {
      // A rebuild for a new device type keeps the declaration, and its origin is not this load.
      if (record.definition && !detail::same_declaration(record.definition, record.previous)) {
        origins.insert(detail::origin_of_definition(record.definition));
      }
    }
  }
  // A library that defined nothing, but asked for a device type or undefined an op (seen: one
  // loaded as another's DT_NEEDED loaded again later without error, with its effect gone).
  for (const void* caller : context.callers) {
    Dl_info info;
    if (dladdr(caller, &info) != 0 && info.dli_fname != nullptr) origins.insert(info.dli_fname);
  }
  const auto own_file = file_of_handle(handle);
  std::map<FileId, std::string> brought_in;
  for (const auto& origin : origins) {
    const auto file = file_id(origin.c_str());
    if (file && file != own_file && files_before.count(*file) == 0) {
      brought_in.emplace(*file, origin);
    }
  }
  std::lock_guard<std::mutex> lock(g_failed_mutex);
  failed_loads()[handle] = text;
  for (const auto& [file, origin] : brought_in) {
    failed_files()[file] = detail::valid_utf8(
        "opreg::load_library: '" + origin + "' was loaded with '" + context.path +
        "' (a library it needs, or one its initializers opened), whose load failed, and its "
        "ops were rolled back with that library's: " +
        text);
  }
  for (const auto& [nested, nested_path] : context.nested) {
    failed_loads()[nested] = detail::valid_utf8(
        "opreg::load_library: '" + nested_path + "' was loaded by '" + context.path +
        "', whose load failed, and its ops were rolled back with that library's: " + text);
  }
}

void load_once(const std::string& path) {
  load_unwinder();
  // dlopen("") opens the program itself.
  TORCH_CHECK_VALUE(!path.empty(),
                    "opreg::load_library: 'path' is empty; pass the path of a library");
  // A name without a '/' that is not loaded yet is looked up here (find_library_file), so that
  // the checks below read the file dlopen maps.
  std::string file = path;
  bool mapped_already = false;
  if (path.find('/') == std::string::npos) {
    if (const auto found = find_library_file(path)) {
      file = *found;
    } else if (mapped_file(path)) {  // mapped already: nothing to check
      mapped_already = true;
    } else {
      TORCH_CHECK_VALUE(false, "opreg::load_library: cannot load '", detail::readable_message(path),
                        "': no file of that name in LD_LIBRARY_PATH or the system's library "
                        "directories (/etc/ld.so.conf), and no library of that name is loaded; "
                        "pass the library's path");
    }
  }
  // A FIFO or a device would block the reads below and dlopen's, without end.
  struct stat status{};
  TORCH_CHECK_VALUE(mapped_already || stat(file.c_str(), &status) != 0 || S_ISREG(status.st_mode),
                    "opreg::load_library: cannot load '", detail::readable_message(file),
                    "': it is not a regular file");
  const std::string truncated = mapped_already ? "" : truncated_elf(file);
  TORCH_CHECK_VALUE(truncated.empty(), "opreg::load_library: cannot load '",
                    detail::readable_message(file), "': the file is a truncated shared library (",
                    truncated, ")");
  std::optional<FileStamp> stamp;
  const bool mapped_before = !mapped_already && check_not_rebuilt(path, file, &stamp);
  LoadContext context(path, t_load);
  const bool outermost = context.outer == nullptr;
  // Inside another load this thread holds the dynamic loader's lock, so nothing loads meanwhile.
  bool loaded_before = false;
  if (!outermost) {
    if (void* loaded = dlopen(file.c_str(), RTLD_NOW | RTLD_LOCAL | RTLD_NOLOAD)) {
      loaded_before = true;
      dlclose(loaded);
    }
  }
  const std::set<FileId> files_before = loaded_files();
  ActiveLoad active(context);
  t_load = &context;
  ++g_dlopens;
  ++t_dlopens;
  void* handle = dlopen(file.c_str(), RTLD_NOW | RTLD_LOCAL);
  --t_dlopens;
  --g_dlopens;
  t_load = context.outer;
  const std::set<uint64_t> unsettled_then = active.unsettled_others();
  if (!detail::library_loading_elsewhere()) run_deferred();
  if (handle == nullptr) {
    const char* why = dlerror();
    TORCH_CHECK(false, "opreg::load_library: cannot load '", detail::readable_message(path),
                "': ", detail::valid_utf8(why != nullptr ? why : "unknown error"));
  }
  // The file it was mapped from, unless it changed while dlopen read it (then it is not known).
  if (!mapped_already && !mapped_before && stamp && stamp_of(file) == stamp) {
    std::lock_guard<std::mutex> lock(g_failed_mutex);
    mapped_stamps().emplace(handle, *stamp);
  }
  record_mapped_since(files_before, handle);
  if (context.failures.empty() && outermost) {
    size_t committed = 0;
    for (; committed < context.on_success.size(); ++committed) {
      try {
        context.on_success[committed].run();
      } catch (const c10::Error& error) {
        context.failures.emplace_back("(registering what waits for success)",
                                      error.what_without_backtrace());
        break;
      } catch (const std::exception& error) {
        context.failures.emplace_back("(registering what waits for success)",
                                      detail::what_of(error));
        break;
      }
    }
    if (!context.failures.empty()) {
      while (committed > 0) context.on_success[--committed].undo();
    }
  }
  if (context.failures.empty()) {
    if (outermost) {
      active.settle();
      wait_until_settled(unsettled_then);
    }
    check_not_failed(handle);
    check_defines_again(handle, path, context, files_before);
    // A library loaded from inside another one's initializers belongs to the outer load.
    if (!outermost) {
      auto& outer = *context.outer;
      {
        std::lock_guard<std::mutex> lock(g_loads_mutex);
        for (auto& published : context.published) outer.published.push_back(published);
      }
      for (auto& type : context.device_types) outer.device_types.push_back(type);
      for (const void* caller : context.callers) outer.callers.push_back(caller);
      for (auto& commit : context.on_success) outer.on_success.push_back(std::move(commit));
      if (!loaded_before) outer.nested.emplace_back(handle, path);
      for (auto& nested : context.nested) outer.nested.push_back(nested);
    }
    return;
  }
  roll_back(context);
  std::ostringstream failures;
  failures << "opreg::load_library: '" << path << "' defines ops that failed ("
           << context.failures.size() << "); none of its ops is defined:";
  for (const auto& [op, message] : context.failures) failures << "\n  " << op << ": " << message;
  const std::string text = detail::valid_utf8(failures.str());  // a name may hold any bytes
  mark_failed(context, handle, files_before, text);
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
    outer->failures.emplace_back(what, detail::what_of(error));
  }
}

}  // namespace opreg
