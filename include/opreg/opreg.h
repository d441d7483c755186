// include/opreg/opreg.h: everything a C++ user of opreg includes.
#pragma once

#include "opreg/definition.h"
#include "opreg/device_types.h"
#include "opreg/op.h"
#include "opreg/registry.h"
#include "opreg/testing.h"
#include "opreg/trace.h"
