// include/opreg/aot_launch.h: an AOT-compiled Triton kernel attached to an op by declaration:
// the grid, the kernel's arguments and the outputs are expressions over the op's arguments,
// parsed against the schema (names, and which are tensors) when the op is defined and evaluated in
// C++ on every call (no Python, even for ops defined from Python).
//
//   opreg::op("mylib::add(Tensor x, Tensor y) -> Tensor")
//       .fallback(add_reference)
//       .kernel(opreg::triton::aot({"mylib_add_f32", {"cdiv(numel(x), 1024)"},
//                                   {"x", "y", "out0", "numel(x)"}, "like:x"}),
//               opreg::on({"cuda"}).name("triton"))
//
// Expressions: an argument's name (tensor, int or float), out<i> (output i), numel(a),
// size(a, d), stride(a, d), cdiv(e, n), an integer or a float literal. Outputs: "fake" (allocated
// with the metadata the op's fake gives on meta tensors) or "like:<arg>" (contiguous, the
// argument's shape, dtype and device). The kernel declines calls it cannot take (not CUDA, a
// tensor of another dtype than the kernel's parameter, no binary for the GPU): the fallback
// serves them.
#pragma once

#include <string>
#include <vector>

namespace opreg {

struct AotLaunch {
  std::string kernel;                  // the name given to python -m opreg.aot
  std::vector<std::string> grid;       // 1 to 3 expressions
  std::vector<std::string> arguments;  // one expression per kernel parameter
  std::string outputs = "fake";        // "fake" or "like:<argument>"
};

}  // namespace opreg
