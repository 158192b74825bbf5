# Finds tessera's dependencies and sets TESSERA_HAVE_* / TESSERA_TORCH_CUDA.

find_package(Threads REQUIRED)
find_package(Torch REQUIRED)
find_package(fmt REQUIRED)

# nlohmann-json (header-only; src/hf's JSON): Debian's nlohmann-json3-dev, else the copy that
# scripts/vendor-headers puts under .deps/include (images without the package). PATHS, not HINTS:
# the system's copy wins where there is one.
find_path(NLOHMANN_JSON_INCLUDE_DIR nlohmann/json.hpp PATHS ${PROJECT_SOURCE_DIR}/.deps/include)
if(NOT NLOHMANN_JSON_INCLUDE_DIR)
  message(FATAL_ERROR "tessera: nlohmann/json.hpp not found: install the Debian package nlohmann-json3-dev "
                      "(scripts/setup does) or copy the headers into ${PROJECT_SOURCE_DIR}/.deps/include")
endif()

# LibTorch's own CUDA (torch_cuda) decides whether tessera can read the caller's current stream.
set(TESSERA_TORCH_CUDA OFF)
if(TARGET torch_cuda OR TORCH_CUDA_LIBRARIES)
  set(TESSERA_TORCH_CUDA ON)
endif()

# Gloo: Debian's libgloo (CPU machines); PyTorch wheels embed it without headers, so on the
# GPU image it may be absent and the Gloo backend is left out.
find_path(GLOO_INCLUDE_DIR gloo/allreduce.h)
find_library(GLOO_LIBRARY gloo)
set(TESSERA_HAVE_GLOO OFF)
if(GLOO_INCLUDE_DIR AND GLOO_LIBRARY)
  set(TESSERA_HAVE_GLOO ON)
endif()

set(TESSERA_HAVE_CUDA OFF)
set(TESSERA_HAVE_NCCL OFF)
if(TESSERA_WITH_CUDA)
  if(NOT CMAKE_CUDA_COMPILER AND EXISTS /usr/local/cuda/bin/nvcc)
    set(CMAKE_CUDA_COMPILER /usr/local/cuda/bin/nvcc)
  endif()
  find_package(CUDAToolkit QUIET)
  if(CUDAToolkit_FOUND)
    include(CheckLanguage)
    check_language(CUDA)
    if(CMAKE_CUDA_COMPILER)
      if(NOT DEFINED CMAKE_CUDA_ARCHITECTURES)
        set(CMAKE_CUDA_ARCHITECTURES 90)
      endif()
      enable_language(CUDA)
      set(TESSERA_HAVE_CUDA ON)
    endif()
    find_path(NCCL_INCLUDE_DIR nccl.h
      HINTS ${NCCL_ROOT} ENV NCCL_ROOT ${CUDAToolkit_INCLUDE_DIRS} PATH_SUFFIXES include)
    # NAMES_PER_DIR: NCCL_ROOT's libnccl.so.2 (PyTorch's nvidia/nccl wheel has no libnccl.so)
    # wins over a libnccl.so in a later directory, so tessera and torch share one libnccl.
    find_library(NCCL_LIBRARY NAMES nccl libnccl.so.2 NAMES_PER_DIR
      HINTS ${NCCL_ROOT} ENV NCCL_ROOT ${CUDAToolkit_LIBRARY_DIR} PATH_SUFFIXES lib lib64)
    if(TESSERA_HAVE_CUDA AND NCCL_INCLUDE_DIR AND NCCL_LIBRARY)
      set(TESSERA_HAVE_NCCL ON)
      message(STATUS "tessera: NCCL ${NCCL_LIBRARY} (headers ${NCCL_INCLUDE_DIR})")
    endif()
  endif()
endif()

set(TESSERA_HAVE_PMIX OFF)
if(TESSERA_WITH_PMIX)
  find_package(PkgConfig QUIET)
  if(PkgConfig_FOUND)
    pkg_check_modules(PMIX IMPORTED_TARGET pmix)
    if(PMIX_FOUND)
      set(TESSERA_HAVE_PMIX ON)
    endif()
  endif()
endif()

# CLI11 (header-only; train_gpt's command line): Debian's libcli11-dev, else the copy that
# scripts/vendor-headers puts in .deps/include (git-ignored) for machines without the package.
find_path(CLI11_INCLUDE_DIR CLI/CLI.hpp PATHS ${PROJECT_SOURCE_DIR}/.deps/include)
