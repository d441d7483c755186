# cmake/OpregTorch.cmake: finds the installed PyTorch through Python and defines imported targets
# opreg::torch (c10 + torch_cpu: no CUDA at link time, whatever the build of PyTorch) and
# opreg::torch_python. Set OPREG_TORCH_DIR to skip asking Python.
include_guard(GLOBAL)

find_package(Python3 COMPONENTS Interpreter REQUIRED)
if(NOT OPREG_TORCH_DIR)
  execute_process(
    COMMAND "${Python3_EXECUTABLE}" -c
            "import os, torch; print(os.path.dirname(torch.__file__), end='')"
    OUTPUT_VARIABLE OPREG_TORCH_DIR
    RESULT_VARIABLE _opreg_torch_result)
  if(NOT _opreg_torch_result EQUAL 0)
    message(FATAL_ERROR "opreg: cannot import torch with ${Python3_EXECUTABLE}; install PyTorch "
                        "first or set OPREG_TORCH_DIR to the folder of the torch package")
  endif()
endif()
set(OPREG_TORCH_DIR "${OPREG_TORCH_DIR}" CACHE PATH "The folder of the installed torch package")

# The C++ ABI PyTorch was built with.
execute_process(
  COMMAND "${Python3_EXECUTABLE}" -c
          "import torch; print(int(torch._C._GLIBCXX_USE_CXX11_ABI), end='')"
  OUTPUT_VARIABLE OPREG_TORCH_CXX11_ABI)

if(NOT TARGET opreg::torch)
  add_library(opreg::torch INTERFACE IMPORTED)
  target_include_directories(opreg::torch SYSTEM INTERFACE
    "${OPREG_TORCH_DIR}/include" "${OPREG_TORCH_DIR}/include/torch/csrc/api/include")
  target_link_libraries(opreg::torch INTERFACE
    "${OPREG_TORCH_DIR}/lib/libc10.so" "${OPREG_TORCH_DIR}/lib/libtorch_cpu.so")
  target_compile_definitions(opreg::torch INTERFACE
    _GLIBCXX_USE_CXX11_ABI=${OPREG_TORCH_CXX11_ABI})
  target_compile_features(opreg::torch INTERFACE cxx_std_17)

  add_library(opreg::torch_python INTERFACE IMPORTED)
  target_link_libraries(opreg::torch_python INTERFACE opreg::torch
    "${OPREG_TORCH_DIR}/lib/libtorch_python.so")
endif()
