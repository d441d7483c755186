// bench/peers/handwritten_add.cu: the peer a C++ extension author writes by hand: a TORCH_LIBRARY
// op with a CUDA kernel launched with <<<>>>, built by torch.utils.cpp_extension in the benchmark.
#include <ATen/cuda/CUDAContext.h>
#include <torch/extension.h>

__global__ void add_kernel(const float* x, const float* y, float* out, int64_t n) {
  for (int64_t i = blockIdx.x * int64_t{1024} + threadIdx.x;
       i < (blockIdx.x + 1) * int64_t{1024} && i < n; i += blockDim.x) {
    out[i] = x[i] + y[i];
  }
}

at::Tensor handwritten_add(const at::Tensor& x, const at::Tensor& y) {
  TORCH_CHECK(x.is_cuda() && x.scalar_type() == at::kFloat && x.is_contiguous() &&
                  y.sizes() == x.sizes() && y.is_contiguous(),
              "handwritten_add: contiguous same-shape float32 CUDA tensors");
  auto out = at::empty_like(x);
  const int64_t n = x.numel();
  const auto blocks = static_cast<unsigned>((n + 1023) / 1024);
  if (blocks > 0) {
    add_kernel<<<blocks, 128, 0, at::cuda::getCurrentCUDAStream()>>>(
        x.data_ptr<float>(), y.data_ptr<float>(), out.data_ptr<float>(), n);
    C10_CUDA_KERNEL_LAUNCH_CHECK();
  }
  return out;
}

TORCH_LIBRARY(opreg_peers_cpp, m) { m.def("handwritten_add(Tensor x, Tensor y) -> Tensor"); }
TORCH_LIBRARY_IMPL(opreg_peers_cpp, CUDA, m) { m.impl("handwritten_add", &handwritten_add); }
