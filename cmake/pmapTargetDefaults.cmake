# Per-target build settings shared by every target pmap builds (library, tests,
# benchmarks, examples). Nothing here touches directory or global state: each setting
# is attached to the one target it is called on and never propagates to consumers.

include_guard(GLOBAL)

# pmap_target_defaults(<target>)
#
# Applies the project's warning set (with -Werror under PMAP_WARNINGS_AS_ERRORS) and
# the sanitizers named in PMAP_SANITIZE to <target>, privately.
function(pmap_target_defaults target)
  set_target_properties(${target} PROPERTIES CXX_EXTENSIONS OFF)

  if(CMAKE_CXX_COMPILER_ID MATCHES "GNU|Clang")
    # GCC 12 flags designated initializers that leave members at their defaults, which is
    # how SPEC.md passes pmap::Options ({.axis_name = "i"}); that is intended, not a bug.
    target_compile_options(${target} PRIVATE -Wall -Wextra -Wpedantic -Wshadow
                                             -Wno-missing-field-initializers)
    # GCC 12 at -O3 has two false positives that would fail every -Werror build: std::string
    # concatenation seen as an overlapping memcpy (-Wrestrict, GCC bug 105651), and Eigen's
    # runtime-dimension chip() seen indexing its DSizes at -1 (-Warray-bounds, reported from
    # Eigen's headers after inlining, so -isystem does not hide it).
    if(CMAKE_CXX_COMPILER_ID STREQUAL "GNU" AND CMAKE_CXX_COMPILER_VERSION VERSION_LESS 13)
      target_compile_options(${target} PRIVATE -Wno-restrict -Wno-array-bounds)
    endif()
    if(PMAP_WARNINGS_AS_ERRORS)
      target_compile_options(${target} PRIVATE -Werror)
    endif()
  elseif(MSVC)
    target_compile_options(${target} PRIVATE /W4 /permissive-)
    if(PMAP_WARNINGS_AS_ERRORS)
      target_compile_options(${target} PRIVATE /WX)
    endif()
  endif()

  if(PMAP_SANITIZE)
    # Unrecoverable, so a finding fails the test even when UBSAN_OPTIONS is not set.
    set(flags -fsanitize=${PMAP_SANITIZE} -fno-sanitize-recover=all -fno-omit-frame-pointer)
    target_compile_options(${target} PRIVATE ${flags})
    target_link_options(${target} PRIVATE ${flags})
  endif()
endfunction()
