// src/core/op_internal.h: registration steps that define() runs for every op, one per dispatch
// key family, each in its own file (autograd.cpp, vmap.cpp).
#pragma once

#include <string>

#include <torch/library.h>

#include "opreg/op.h"

namespace opreg::detail {

void register_autograd(torch::Library& library, const std::string& op_name, const OpSpec& spec);
std::string describe_autograd(const OpSpec& spec);

void register_vmap(torch::Library& library, const std::string& op_name, const OpSpec& spec);
std::string describe_vmap(const OpSpec& spec);

}  // namespace opreg::detail
