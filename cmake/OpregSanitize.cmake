# cmake/OpregSanitize.cmake: the option OPREG_SANITIZE, for opreg's build and its test suite (which
# includes it from the installed package). ON builds the targets defined after the include with
# AddressSanitizer and UndefinedBehaviorSanitizer, stopping at the first finding; PyTorch itself
# is not sanitized. scripts/sanitize.sh builds this configuration and runs the tests under it.
include_guard(DIRECTORY)

option(OPREG_SANITIZE "Build with AddressSanitizer and UndefinedBehaviorSanitizer" OFF)
if(OPREG_SANITIZE)
  set(_opreg_sanitize_flags -fsanitize=address,undefined -fno-omit-frame-pointer
      -fno-sanitize-recover=undefined)
  add_compile_options(${_opreg_sanitize_flags})
  add_link_options(${_opreg_sanitize_flags})
endif()
