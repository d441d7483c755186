// src/triton/cuda_driver.h: the few CUDA driver API entry points the launcher uses, resolved from
// libcuda.so.1 with dlopen at first use. The types are declared here (layouts from the CUDA
// driver API, checked with static_asserts) so that building opreg needs no CUDA headers.
#pragma once

#include <cstddef>
#include <string>

#include "opreg/export.h"

namespace opreg::triton::cuda {

using CUresult = int;
using CUdevice = int;
using CUmodule = struct CUmod_st*;
using CUfunction = struct CUfunc_st*;
using CUstream = struct CUstream_st*;
using CUcontext = struct CUctx_st*;

constexpr CUresult kSuccess = 0;
constexpr int kAttrComputeCapabilityMajor = 75;
constexpr int kAttrComputeCapabilityMinor = 76;
constexpr int kFuncAttrMaxDynamicSharedSizeBytes = 8;
constexpr int kFuncCachePreferShared = 1;
constexpr int kLaunchAttrCooperative = 2;
constexpr int kLaunchAttrClusterDimension = 4;
constexpr int kLaunchAttrProgrammaticStreamSerialization = 6;

union LaunchAttributeValue {
  char pad[64];
  int cooperative;
  struct {
    unsigned x, y, z;
  } cluster_dim;
  int programmatic_stream_serialization_allowed;
};
struct LaunchAttribute {
  int id;
  char pad[8 - sizeof(int)];
  LaunchAttributeValue value;
};
struct LaunchConfig {
  unsigned grid_x, grid_y, grid_z;
  unsigned block_x, block_y, block_z;
  unsigned shared_mem_bytes;
  CUstream stream;
  LaunchAttribute* attrs;
  unsigned num_attrs;
};
static_assert(sizeof(LaunchAttribute) == 72, "CUlaunchAttribute layout");
static_assert(offsetof(LaunchConfig, stream) == 32, "CUlaunchConfig layout");
static_assert(sizeof(LaunchConfig) == 56, "CUlaunchConfig layout");

struct Driver {
  CUresult (*cuInit)(unsigned);
  CUresult (*cuDeviceGet)(CUdevice*, int);
  CUresult (*cuDeviceGetAttribute)(int*, int, CUdevice);
  CUresult (*cuCtxGetCurrent)(CUcontext*);
  CUresult (*cuCtxGetDevice)(CUdevice*);
  CUresult (*cuCtxSetCurrent)(CUcontext);
  CUresult (*cuDevicePrimaryCtxRetain)(CUcontext*, CUdevice);
  CUresult (*cuModuleLoadData)(CUmodule*, const void*);
  CUresult (*cuModuleGetFunction)(CUfunction*, CUmodule, const char*);
  CUresult (*cuFuncSetAttribute)(CUfunction, int, int);
  CUresult (*cuFuncSetCacheConfig)(CUfunction, int);
  CUresult (*cuLaunchKernel)(CUfunction, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned,
                             unsigned, CUstream, void**, void**);
  CUresult (*cuLaunchKernelEx)(const LaunchConfig*, CUfunction, void**, void**);
  CUresult (*cuGetErrorName)(CUresult, const char**);
  CUresult (*cuGetErrorString)(CUresult, const char**);
};

// The driver, or nullptr when libcuda.so.1 cannot be opened (then `why_not` says why).
OPREG_API const Driver* driver(std::string* why_not = nullptr);

// Makes `device`'s primary context current on this thread when no context is (a thread where
// PyTorch has not touched CUDA yet), as the CUDA runtime does; raises when it cannot.
OPREG_API void make_context_current(const Driver& d, int device);

// "CUDA_ERROR_INVALID_VALUE (invalid argument)"
OPREG_API std::string error_text(CUresult result);

}  // namespace opreg::triton::cuda
