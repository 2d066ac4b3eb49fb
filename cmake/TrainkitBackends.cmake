# Finds the optional backends and creates one INTERFACE target per backend found, each carrying
# its TRAINKIT_WITH_<X>=1 definition and its libraries together (macro and link flags always
# travel together), on top of the CPU target `trainkit`:
#   trainkit_cuda (trainkit::cuda)          CUDA runtime          TRAINKIT_WITH_CUDA=1
#   trainkit_cublaslt (trainkit::cublaslt)  + cuBLASLt            TRAINKIT_WITH_CUBLASLT=1
#   trainkit_nccl (trainkit::nccl)          + NCCL                TRAINKIT_WITH_NCCL=1
#   trainkit_mpi (trainkit::mpi)            MPI                   TRAINKIT_WITH_MPI=1
#   trainkit_blas (trainkit::blas)          CBLAS                 TRAINKIT_WITH_CBLAS=1
#   trainkit_openmp (trainkit::openmp)      OpenMP                TRAINKIT_WITH_OPENMP=1
#   trainkit_all (trainkit::all)            every backend above that was found
# A consumer links trainkit::trainkit for the CPU tier and adds the backends it wants.
# TRAINKIT_ENABLE_<X> = AUTO (create the target when found), ON (fail when missing) or OFF.
# Sets TRAINKIT_HAS_<X> (TRUE/FALSE) and TRAINKIT_BACKEND_TARGETS (the backend targets created,
# for install/export; trainkit_all is not among them: an installed package assembles it from the
# backends usable on the consumer's machine) in the caller's scope.

function(_trainkit_backend_wanted name out_wanted out_required)
  string(TOUPPER "${TRAINKIT_ENABLE_${name}}" value)
  if(value MATCHES "^(OFF|FALSE|0|NO|N)$")
    set(${out_wanted} FALSE PARENT_SCOPE)
    set(${out_required} FALSE PARENT_SCOPE)
  elseif(value MATCHES "^(ON|TRUE|1|YES|Y)$")
    set(${out_wanted} TRUE PARENT_SCOPE)
    set(${out_required} TRUE PARENT_SCOPE)
  elseif(value STREQUAL "AUTO" OR value STREQUAL "")
    set(${out_wanted} TRUE PARENT_SCOPE)
    set(${out_required} FALSE PARENT_SCOPE)
  else()
    message(FATAL_ERROR "TRAINKIT_ENABLE_${name}='${TRAINKIT_ENABLE_${name}}': use AUTO, ON or OFF")
  endif()
endfunction()

# One backend target `trainkit_<name>` (alias trainkit::<name>) over `base`, with its libraries
# and its TRAINKIT_WITH_<MACRO>=1.
function(_trainkit_backend_target name base macro)
  add_library(trainkit_${name} INTERFACE)
  add_library(trainkit::${name} ALIAS trainkit_${name})
  set_target_properties(trainkit_${name} PROPERTIES EXPORT_NAME ${name})
  target_link_libraries(trainkit_${name} INTERFACE ${base} ${ARGN})
  target_compile_definitions(trainkit_${name} INTERFACE TRAINKIT_WITH_${macro}=1)
endfunction()

# A macro (not a function) so the find modules' result variables (CUDAToolkit_INCLUDE_DIRS,
# MPI_CXX_INCLUDE_DIRS, ...) stay visible to the tests that compile headers per tier.
macro(trainkit_configure_backends target)
  foreach(_tk_b CUDA CUBLASLT NCCL MPI BLAS OPENMP)
    set(TRAINKIT_HAS_${_tk_b} FALSE)
  endforeach()
  set(TRAINKIT_BACKEND_TARGETS)

  # CUDA runtime: host code in .cpp files may call cudart. Kernels additionally need the CUDA
  # language, which only the consumer (or our tests) enables.
  _trainkit_backend_wanted(CUDA _tk_want _tk_req)
  if(_tk_want)
    if(_tk_req)
      find_package(CUDAToolkit REQUIRED)
    else()
      find_package(CUDAToolkit QUIET)
    endif()
    if(CUDAToolkit_FOUND)
      set(TRAINKIT_HAS_CUDA TRUE)
      _trainkit_backend_target(cuda ${target} CUDA CUDA::cudart)
      list(APPEND TRAINKIT_BACKEND_TARGETS trainkit_cuda)
    endif()
  endif()

  _trainkit_backend_wanted(CUBLASLT _tk_want _tk_req)
  if(_tk_want AND TRAINKIT_HAS_CUDA AND TARGET CUDA::cublasLt)
    set(TRAINKIT_HAS_CUBLASLT TRUE)
    _trainkit_backend_target(cublaslt trainkit_cuda CUBLASLT CUDA::cublasLt)
    list(APPEND TRAINKIT_BACKEND_TARGETS trainkit_cublaslt)
  elseif(_tk_req)
    message(FATAL_ERROR "TRAINKIT_ENABLE_CUBLASLT=ON but cuBLASLt was not found "
                        "(it needs the CUDA toolkit and TRAINKIT_ENABLE_CUDA not OFF)")
  endif()

  _trainkit_backend_wanted(NCCL _tk_want _tk_req)
  if(_tk_want AND TRAINKIT_HAS_CUDA)
    if(_tk_req)
      find_package(NCCL REQUIRED)
    else()
      find_package(NCCL QUIET)
    endif()
    if(NCCL_FOUND)
      set(TRAINKIT_HAS_NCCL TRUE)
      _trainkit_backend_target(nccl trainkit_cuda NCCL NCCL::nccl)
      list(APPEND TRAINKIT_BACKEND_TARGETS trainkit_nccl)
    endif()
  elseif(_tk_req)
    message(FATAL_ERROR "TRAINKIT_ENABLE_NCCL=ON needs the CUDA toolkit (and TRAINKIT_ENABLE_CUDA "
                        "not OFF), which was not found")
  endif()

  _trainkit_backend_wanted(MPI _tk_want _tk_req)
  if(_tk_want)
    if(_tk_req)
      find_package(MPI REQUIRED COMPONENTS CXX)
    else()
      find_package(MPI QUIET COMPONENTS CXX)
    endif()
    if(MPI_CXX_FOUND)
      set(TRAINKIT_HAS_MPI TRUE)
      _trainkit_backend_target(mpi ${target} MPI MPI::MPI_CXX)
      list(APPEND TRAINKIT_BACKEND_TARGETS trainkit_mpi)
    endif()
  endif()

  # CBLAS (the C interface; Debian's libopenblas-dev provides header and library).
  _trainkit_backend_wanted(BLAS _tk_want _tk_req)
  if(_tk_want)
    if(_tk_req)
      find_package(CBLAS REQUIRED)
    else()
      find_package(CBLAS QUIET)
    endif()
    if(CBLAS_FOUND)
      set(TRAINKIT_HAS_BLAS TRUE)
      _trainkit_backend_target(blas ${target} CBLAS CBLAS::CBLAS)
      list(APPEND TRAINKIT_BACKEND_TARGETS trainkit_blas)
    endif()
  endif()

  _trainkit_backend_wanted(OPENMP _tk_want _tk_req)
  if(_tk_want)
    if(_tk_req)
      find_package(OpenMP REQUIRED COMPONENTS CXX)
    else()
      find_package(OpenMP QUIET COMPONENTS CXX)
    endif()
    if(OpenMP_CXX_FOUND)
      set(TRAINKIT_HAS_OPENMP TRUE)
      _trainkit_backend_target(openmp ${target} OPENMP OpenMP::OpenMP_CXX)
      list(APPEND TRAINKIT_BACKEND_TARGETS trainkit_openmp)
      # OpenMP::OpenMP_CXX adds -fopenmp for CXX sources only; the host half of a consumer's .cu
      # files sees TRAINKIT_WITH_OPENMP=1 as well and must get the flag through nvcc.
      if(OpenMP_CXX_FLAGS)
        string(REPLACE ";" "," _tk_omp_flags "${OpenMP_CXX_FLAGS}")
        target_compile_options(trainkit_openmp INTERFACE
          "$<$<COMPILE_LANG_AND_ID:CUDA,NVIDIA>:-Xcompiler=${_tk_omp_flags}>")
      endif()
    endif()
  endif()

  # Everything found, for our own tests and examples and for consumers who want it all.
  add_library(trainkit_all INTERFACE)
  add_library(trainkit::all ALIAS trainkit_all)
  set_target_properties(trainkit_all PROPERTIES EXPORT_NAME all)
  target_link_libraries(trainkit_all INTERFACE ${target} ${TRAINKIT_BACKEND_TARGETS})

  set(_tk_summary)
  foreach(_tk_b CUDA CUBLASLT NCCL MPI BLAS OPENMP)
    if(TRAINKIT_HAS_${_tk_b})
      list(APPEND _tk_summary "${_tk_b}=on")
    else()
      list(APPEND _tk_summary "${_tk_b}=off")
    endif()
  endforeach()
  list(JOIN _tk_summary " " _tk_summary)
  message(STATUS "trainkit ${PROJECT_VERSION} backends: ${_tk_summary}")
  unset(_tk_summary)
  unset(_tk_want)
  unset(_tk_req)
  unset(_tk_omp_flags)
endmacro()
