// include/opreg/export.h: OPREG_API marks what libopreg exports. The library is built with hidden
// visibility, so everything else in it stays internal and can change without an ABI break.
#pragma once

#define OPREG_API __attribute__((visibility("default")))
