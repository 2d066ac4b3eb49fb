# FindCBLAS: the C interface to BLAS (cblas.h + a library exporting cblas_sgemm), as trainkit's
# host gemm uses it. CMake's FindBLAS finds a Fortran BLAS only and no header, hence this module.
# Looks in CBLAS_ROOT / OpenBLAS_ROOT and the system paths (Debian: libopenblas-dev, whose cblas.h
# is /usr/include/<multiarch>/cblas.h via alternatives).
# Provides CBLAS::CBLAS, CBLAS_FOUND, CBLAS_INCLUDE_DIR, CBLAS_LIBRARY.
set(_cblas_hints ${CBLAS_ROOT} $ENV{CBLAS_ROOT} ${OpenBLAS_ROOT} $ENV{OpenBLAS_ROOT})
find_path(CBLAS_INCLUDE_DIR cblas.h HINTS ${_cblas_hints}
  PATH_SUFFIXES include include/openblas openblas)
find_library(CBLAS_LIBRARY NAMES openblas cblas blas HINTS ${_cblas_hints} PATH_SUFFIXES lib lib64)

if(CBLAS_INCLUDE_DIR AND CBLAS_LIBRARY)
  # A Fortran-only libblas (no cblas_* symbols) must not pass for CBLAS.
  include(CheckSymbolExists)
  include(CMakePushCheckState)
  cmake_push_check_state(RESET)
  set(CMAKE_REQUIRED_QUIET TRUE)
  set(CMAKE_REQUIRED_INCLUDES "${CBLAS_INCLUDE_DIR}")
  set(CMAKE_REQUIRED_LIBRARIES "${CBLAS_LIBRARY}")
  if(CMAKE_CXX_COMPILER_LOADED)
    include(CheckCXXSymbolExists)
    check_cxx_symbol_exists(cblas_sgemm "cblas.h" CBLAS_HAS_SGEMM)
  else()
    check_symbol_exists(cblas_sgemm "cblas.h" CBLAS_HAS_SGEMM)
  endif()
  cmake_pop_check_state()
endif()

include(FindPackageHandleStandardArgs)
find_package_handle_standard_args(CBLAS REQUIRED_VARS CBLAS_LIBRARY CBLAS_INCLUDE_DIR CBLAS_HAS_SGEMM)
if(CBLAS_FOUND AND NOT TARGET CBLAS::CBLAS)
  add_library(CBLAS::CBLAS UNKNOWN IMPORTED)
  set_target_properties(CBLAS::CBLAS PROPERTIES
    IMPORTED_LOCATION "${CBLAS_LIBRARY}"
    INTERFACE_INCLUDE_DIRECTORIES "${CBLAS_INCLUDE_DIR}")
endif()
mark_as_advanced(CBLAS_INCLUDE_DIR CBLAS_LIBRARY)
unset(_cblas_hints)
