// bench/cpp/launch_bench.cu: launch cost from C++, per call: a raw CUDA <<<>>> launch (the floor),
// opreg's launcher with an AOT Triton kernel doing the same work, and opreg::fused_add called
// through the dispatcher. 1024 float32 elements; median of 7 batches of 2000 launches, with a
// synchronize after each batch. Prints one JSON object.
#include <ATen/ATen.h>
#include <c10/cuda/CUDAStream.h>
#include <cuda_runtime.h>
#include <opreg/ops.h>
#include <opreg/triton.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <vector>

__global__ void add_kernel(const float* x, const float* y, float* out, int64_t n) {
  for (int64_t i = blockIdx.x * int64_t{1024} + threadIdx.x;
       i < (blockIdx.x + 1) * int64_t{1024} && i < n; i += blockDim.x) {
    out[i] = x[i] + y[i];
  }
}

template <class Fn>
double us_per_call(Fn&& fn) {
  for (int i = 0; i < 200; ++i) fn();
  cudaDeviceSynchronize();
  std::vector<double> batches;
  for (int r = 0; r < 7; ++r) {
    auto start = std::chrono::steady_clock::now();
    for (int i = 0; i < 2000; ++i) fn();
    cudaDeviceSynchronize();
    auto end = std::chrono::steady_clock::now();
    batches.push_back(std::chrono::duration<double, std::micro>(end - start).count() / 2000);
  }
  std::sort(batches.begin(), batches.end());
  return batches[3];
}

int main() {
  auto options = at::TensorOptions().device(at::kCUDA).dtype(at::kFloat);
  auto x = at::randn({1024}, options), y = at::randn({1024}, options);
  auto out = at::empty_like(x);
  const int64_t n = 1024;
  cudaStream_t stream = c10::cuda::getCurrentCUDAStream().stream();
  const opreg::triton::Kernel kernel("opreg_fused_add_f32");

  kernel.launch({1}, {x, y, out, n});
  bool ok = at::equal(out, x + y);
  double raw = us_per_call([&] {
    add_kernel<<<1, 128, 0, stream>>>(x.data_ptr<float>(), y.data_ptr<float>(),
                                      out.data_ptr<float>(), n);
  });
  double aot = us_per_call([&] { kernel.launch({1}, {x, y, out, n}); });
  double op = us_per_call([&] { opreg::fused_add(x, y); });
  double aten = us_per_call([&] { at::add(x, y); });
  std::printf(
      "{\"correct\": %s, \"raw_cuda_launch_us\": %.4f, \"opreg_aot_launch_us\": %.4f, "
      "\"opreg_fused_add_dispatcher_us\": %.4f, \"at_add_us\": %.4f, \"variant\": \"%s\"}\n",
      ok ? "true" : "false", raw, aot, op, aten, kernel.variant_for({x, y, out, n}).c_str());
  return ok ? 0 : 1;
}
