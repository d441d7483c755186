// src/triton/cuda_driver.cpp: opens libcuda.so.1 once, at first use, and resolves the entry
// points the launcher needs.
#include "cuda_driver.h"

#include <dlfcn.h>

#include <mutex>

#include <c10/util/Exception.h>

namespace opreg::triton::cuda {
namespace {

struct Loaded {
  Driver driver{};
  bool ok = false;
  std::string why_not;
};

template <class Fn>
bool resolve(void* library, const char* name, Fn* target, std::string* why_not) {
  void* symbol = dlsym(library, name);
  if (symbol == nullptr) {
    *why_not = std::string("libcuda.so.1 has no ") + name + " (driver too old?)";
    return false;
  }
  *target = reinterpret_cast<Fn>(symbol);
  return true;
}

Loaded load() {
  Loaded loaded;
  void* library = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
  if (library == nullptr) {
    const char* error = dlerror();
    loaded.why_not = std::string("cannot open libcuda.so.1: ") + (error ? error : "unknown");
    return loaded;
  }
  Driver& d = loaded.driver;
  std::string& why = loaded.why_not;
  loaded.ok = resolve(library, "cuInit", &d.cuInit, &why) &&
              resolve(library, "cuDeviceGet", &d.cuDeviceGet, &why) &&
              resolve(library, "cuDeviceGetAttribute", &d.cuDeviceGetAttribute, &why) &&
              resolve(library, "cuCtxGetCurrent", &d.cuCtxGetCurrent, &why) &&
              resolve(library, "cuCtxGetDevice", &d.cuCtxGetDevice, &why) &&
              resolve(library, "cuCtxSetCurrent", &d.cuCtxSetCurrent, &why) &&
              resolve(library, "cuDevicePrimaryCtxRetain", &d.cuDevicePrimaryCtxRetain, &why) &&
              resolve(library, "cuModuleLoadData", &d.cuModuleLoadData, &why) &&
              resolve(library, "cuModuleGetFunction", &d.cuModuleGetFunction, &why) &&
              resolve(library, "cuFuncSetAttribute", &d.cuFuncSetAttribute, &why) &&
              resolve(library, "cuFuncSetCacheConfig", &d.cuFuncSetCacheConfig, &why) &&
              resolve(library, "cuLaunchKernel", &d.cuLaunchKernel, &why) &&
              resolve(library, "cuLaunchKernelEx", &d.cuLaunchKernelEx, &why) &&
              resolve(library, "cuGetErrorName", &d.cuGetErrorName, &why) &&
              resolve(library, "cuGetErrorString", &d.cuGetErrorString, &why);
  if (loaded.ok) {
    CUresult result = d.cuInit(0);
    if (result != kSuccess) {
      loaded.ok = false;
      loaded.why_not = "cuInit failed with CUDA error " + std::to_string(result);
    }
  }
  return loaded;
}

const Loaded& loaded() {
  static const Loaded instance = load();
  return instance;
}

}  // namespace

const Driver* driver(std::string* why_not) {
  const auto& state = loaded();
  if (!state.ok && why_not != nullptr) *why_not = state.why_not;
  return state.ok ? &state.driver : nullptr;
}

void make_context_current(const Driver& d, int device) {
  CUcontext context = nullptr;
  d.cuCtxGetCurrent(&context);
  if (context != nullptr) return;
  CUdevice handle;
  TORCH_CHECK(d.cuDeviceGet(&handle, device) == kSuccess &&
                  d.cuDevicePrimaryCtxRetain(&context, handle) == kSuccess &&
                  d.cuCtxSetCurrent(context) == kSuccess,
              "opreg: cannot make the primary context of CUDA device ", device, " current");
}

std::string error_text(CUresult result) {
  const Driver* d = driver();
  const char* name = nullptr;
  const char* text = nullptr;
  if (d != nullptr) {
    d->cuGetErrorName(result, &name);
    d->cuGetErrorString(result, &text);
  }
  return std::string(name ? name : "CUDA error " + std::to_string(result)) + " (" +
         (text ? text : "no description") + ")";
}

}  // namespace opreg::triton::cuda
