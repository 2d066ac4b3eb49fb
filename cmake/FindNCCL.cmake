# FindNCCL: NCCL ships a CMake config only since 2.29.7 and Debian/CUDA-toolkit installs carry no
# .pc file, so after trying NCCLConfig.cmake this looks for nccl.h and libnccl under NCCL_ROOT,
# then next to the CUDA toolkit (find_package(CUDAToolkit) first to get those hints), then in the
# system paths (Debian's libnccl-dev).
# Provides NCCL::nccl, NCCL_FOUND, NCCL_VERSION, NCCL_INCLUDE_DIR, NCCL_LIBRARY.
include(FindPackageHandleStandardArgs)
find_package(NCCL CONFIG QUIET)
if(NCCL_FOUND AND TARGET NCCL::nccl)
  find_package_handle_standard_args(NCCL CONFIG_MODE)
  return()
endif()

set(_nccl_hints ${NCCL_ROOT} $ENV{NCCL_ROOT} $ENV{NCCL_HOME} ${CUDAToolkit_LIBRARY_ROOT}
  ${CUDAToolkit_TARGET_DIR})
if(CUDAToolkit_BIN_DIR)
  get_filename_component(_nccl_cuda_root "${CUDAToolkit_BIN_DIR}" DIRECTORY)
  list(APPEND _nccl_hints "${_nccl_cuda_root}")
endif()
find_path(NCCL_INCLUDE_DIR nccl.h HINTS ${_nccl_hints} ${CUDAToolkit_INCLUDE_DIRS}
  PATH_SUFFIXES include)
find_library(NCCL_LIBRARY nccl HINTS ${_nccl_hints} ${CUDAToolkit_LIBRARY_DIR}
  PATH_SUFFIXES lib lib64 lib/x64 targets/x86_64-linux/lib)

unset(NCCL_VERSION)
if(NCCL_INCLUDE_DIR AND EXISTS "${NCCL_INCLUDE_DIR}/nccl.h")
  file(STRINGS "${NCCL_INCLUDE_DIR}/nccl.h" _nccl_lines REGEX "#define NCCL_(MAJOR|MINOR|PATCH) ")
  foreach(_nccl_line IN LISTS _nccl_lines)
    if(_nccl_line MATCHES "#define NCCL_(MAJOR|MINOR|PATCH) +([0-9]+)")
      set(_nccl_${CMAKE_MATCH_1} ${CMAKE_MATCH_2})
    endif()
  endforeach()
  if(DEFINED _nccl_MAJOR AND DEFINED _nccl_MINOR AND DEFINED _nccl_PATCH)
    set(NCCL_VERSION "${_nccl_MAJOR}.${_nccl_MINOR}.${_nccl_PATCH}")
  endif()
endif()

find_package_handle_standard_args(NCCL REQUIRED_VARS NCCL_LIBRARY NCCL_INCLUDE_DIR
  VERSION_VAR NCCL_VERSION)
if(NCCL_FOUND AND NOT TARGET NCCL::nccl)
  add_library(NCCL::nccl UNKNOWN IMPORTED)
  set_target_properties(NCCL::nccl PROPERTIES
    IMPORTED_LOCATION "${NCCL_LIBRARY}"
    INTERFACE_INCLUDE_DIRECTORIES "${NCCL_INCLUDE_DIR}")
endif()
mark_as_advanced(NCCL_INCLUDE_DIR NCCL_LIBRARY)
unset(_nccl_hints)
unset(_nccl_cuda_root)
unset(_nccl_lines)
