# cmake/OpregTriton.cmake: opreg_add_triton_kernels(<target> SPEC <kernels.toml>) compiles the
# Triton kernels a spec lists ahead of time (python -m opreg.aot, at build time, no GPU needed)
# and adds a generated source that embeds the binaries to <target>. Recompiles when the spec or a
# Python file beside it changes; unchanged variants come from a content-hashed cache.
include_guard(GLOBAL)

# Compiled variants are cached by content; builds of one tree may share the folder.
set(OPREG_AOT_CACHE_DIR "${CMAKE_BINARY_DIR}/opreg_aot_cache" CACHE PATH
    "Where opreg_add_triton_kernels caches compiled Triton variants")

if(NOT OPREG_AOT_COMPILER)
  set(OPREG_AOT_COMPILER "${CMAKE_CURRENT_LIST_DIR}/../../../aot/compile.py")
endif()

function(opreg_add_triton_kernels target)
  cmake_parse_arguments(PARSE_ARGV 1 ARG "" "SPEC" "")
  if(NOT ARG_SPEC)
    message(FATAL_ERROR "opreg_add_triton_kernels(${target}): SPEC <kernels.toml> is required")
  endif()
  get_filename_component(spec "${ARG_SPEC}" ABSOLUTE)
  get_filename_component(spec_dir "${spec}" DIRECTORY)
  get_filename_component(spec_name "${spec}" NAME_WE)
  file(GLOB kernel_sources CONFIGURE_DEPENDS "${spec_dir}/*.py")
  set(out "${CMAKE_CURRENT_BINARY_DIR}/opreg_aot/${target}_${spec_name}")
  set(generated "${out}/${spec_name}_embedded.cpp")
  add_custom_command(
    OUTPUT "${generated}"
    COMMAND "${Python3_EXECUTABLE}" "${OPREG_AOT_COMPILER}" "${spec}" --out "${out}"
            --cache "${OPREG_AOT_CACHE_DIR}" --emit-cpp "${generated}"
    DEPENDS "${spec}" ${kernel_sources} "${OPREG_AOT_COMPILER}"
    COMMENT "opreg: compiling Triton kernels of ${spec_name} ahead of time"
    VERBATIM)
  target_sources(${target} PRIVATE "${generated}")
endfunction()
