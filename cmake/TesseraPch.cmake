# One precompiled header for every C++ target of the build that links libtessera.
#
# What goes in is what nearly every translation unit parses anyway: <ATen/ATen.h>, autograd's custom
# Function and fmt. Not <torch/torch.h>: twice ATen's size (a 600 MB header image that costs more to
# load than a file that does not need it saves), so the few files that use torch::nn or torch::optim
# include those module headers themselves. Not GoogleTest either: a test header with it saved about
# 0.4 s per test file, no more than building a second header costs.
# Measured on our 2-core CI machine, one core, -O3 (docs/testing.md, the CI budget): a DDP source
# 18.1 s of CPU without, 11.9 s with; a watchdog test 15.9 s without, 9.6 s with.
#
# tessera_pch (a stub library with exactly libtessera's public compile definitions and LibTorch's)
# builds the header; libtessera and every other target in this tree reuse it (REUSE_FROM). GCC
# accepts a precompiled header only where every macro defined when it was built is defined alike (a
# target may define more) and the code model matches: it is built -fPIC, so executables compile
# -fPIC instead of -fPIE (they still link as PIE). -Winvalid-pch makes a rejected header visible in
# the build log instead of silently slow. TESSERA_PCH=OFF compiles without.
option(TESSERA_PCH "Precompile LibTorch's headers once for every C++ target" ON)

function(_tessera_targets_under dir out)
  get_property(targets DIRECTORY ${dir} PROPERTY BUILDSYSTEM_TARGETS)
  get_property(subdirs DIRECTORY ${dir} PROPERTY SUBDIRECTORIES)
  foreach(sub ${subdirs})
    _tessera_targets_under(${sub} more)
    list(APPEND targets ${more})
  endforeach()
  set(${out} ${targets} PARENT_SCOPE)
endfunction()

# _tessera_links_tessera(<target> <out>): TRUE when libtessera is in the target's link closure (so
# it compiles with libtessera's public definitions, which the header was built with).
function(_tessera_links_tessera t out)
  set(${out} FALSE PARENT_SCOPE)
  get_target_property(libs ${t} LINK_LIBRARIES)
  foreach(l ${libs})
    if(l STREQUAL "tessera" OR l STREQUAL "tessera::tessera")
      set(${out} TRUE PARENT_SCOPE)
      return()
    endif()
    if(TARGET ${l} AND NOT l MATCHES "::")
      _tessera_links_tessera(${l} via)
      if(via)
        set(${out} TRUE PARENT_SCOPE)
        return()
      endif()
    endif()
  endforeach()
endfunction()

# tessera_precompile_headers(): call once, after every target is declared.
function(tessera_precompile_headers)
  if(NOT TESSERA_PCH OR NOT TARGET tessera)
    return()
  endif()
  file(WRITE ${CMAKE_BINARY_DIR}/tessera_pch.cpp "// The precompiled header's host (cmake/TesseraPch.cmake).\n")
  add_library(tessera_pch STATIC ${CMAKE_BINARY_DIR}/tessera_pch.cpp)
  get_target_property(libs tessera INTERFACE_LINK_LIBRARIES)
  target_link_libraries(tessera_pch PRIVATE ${libs})
  target_compile_definitions(tessera_pch PRIVATE $<TARGET_PROPERTY:tessera,INTERFACE_COMPILE_DEFINITIONS>)
  target_precompile_headers(tessera_pch PRIVATE "$<$<COMPILE_LANGUAGE:CXX>:<ATen/ATen.h>>"
                                                "$<$<COMPILE_LANGUAGE:CXX>:<torch/csrc/autograd/custom_function.h>>"
                                                "$<$<COMPILE_LANGUAGE:CXX>:<fmt/format.h>>")
  _tessera_targets_under(${CMAKE_SOURCE_DIR} targets)
  set(count 0)
  foreach(t ${targets})
    get_target_property(type ${t} TYPE)
    if(t STREQUAL "tessera_pch" OR NOT type MATCHES "^(EXECUTABLE|STATIC_LIBRARY|MODULE_LIBRARY|SHARED_LIBRARY|OBJECT_LIBRARY)$")
      continue()
    endif()
    get_target_property(sources ${t} SOURCES)
    list(FILTER sources INCLUDE REGEX "\\.(cpp|cc|cxx)$")
    _tessera_links_tessera(${t} links)
    if(NOT sources OR (NOT links AND NOT t STREQUAL "tessera"))
      continue()
    endif()
    target_precompile_headers(${t} REUSE_FROM tessera_pch)
    target_compile_options(${t} PRIVATE $<$<COMPILE_LANGUAGE:CXX>:-Winvalid-pch>)
    if(type STREQUAL "EXECUTABLE")
      set_target_properties(${t} PROPERTIES POSITION_INDEPENDENT_CODE OFF)
      target_compile_options(${t} PRIVATE $<$<COMPILE_LANGUAGE:CXX>:-fPIC>)
    endif()
    math(EXPR count "${count} + 1")
  endforeach()
  message(STATUS "tessera: precompiled ATen/fmt headers for ${count} targets (TESSERA_PCH)")
endfunction()
