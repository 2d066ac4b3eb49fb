# Install and export rules: the headers, the exported INTERFACE target, a relocatable package
# config that re-finds exactly the backends this build enabled (FindNCCL/FindCBLAS ship next to
# it), a version file, and the same package usable from the build tree (trainkit_DIR=<build>).
include(CMakePackageConfigHelpers)

set(TRAINKIT_INSTALL_CMAKEDIR "${CMAKE_INSTALL_DATADIR}/cmake/trainkit" CACHE STRING
    "Where trainkitConfig.cmake is installed, relative to the prefix")
mark_as_advanced(TRAINKIT_INSTALL_CMAKEDIR)
set(_trainkit_modules "${PROJECT_SOURCE_DIR}/cmake/FindNCCL.cmake"
                      "${PROJECT_SOURCE_DIR}/cmake/FindCBLAS.cmake")

# The headers (from single_include/ when TRAINKIT_USE_SINGLE_HEADER is ON).
install(DIRECTORY "${TRAINKIT_INCLUDE_DIR}/trainkit" DESTINATION "${CMAKE_INSTALL_INCLUDEDIR}"
        FILES_MATCHING PATTERN "*.hpp" PATTERN "*.h" PATTERN "*.cuh")
# One export file per target: the config includes a backend's file only when its dependency is
# found on the consumer's machine (trainkit::all is assembled there from what is usable).
install(TARGETS trainkit EXPORT trainkitTargets)
install(EXPORT trainkitTargets NAMESPACE trainkit:: DESTINATION "${TRAINKIT_INSTALL_CMAKEDIR}")
foreach(_trainkit_t IN LISTS TRAINKIT_BACKEND_TARGETS)
  install(TARGETS ${_trainkit_t} EXPORT ${_trainkit_t}Targets)
  install(EXPORT ${_trainkit_t}Targets NAMESPACE trainkit:: DESTINATION "${TRAINKIT_INSTALL_CMAKEDIR}")
  export(EXPORT ${_trainkit_t}Targets NAMESPACE trainkit::
         FILE "${PROJECT_BINARY_DIR}/${_trainkit_t}Targets.cmake")
endforeach()
unset(_trainkit_t)

# pkg-config: the CPU tier (headers, C++20, threads). The backends are a compiler definition and
# a library each (TRAINKIT_WITH_MPI=1 with MPI's flags, ...), added by the consumer.
configure_file("${PROJECT_SOURCE_DIR}/cmake/trainkit.pc.in" "${PROJECT_BINARY_DIR}/trainkit.pc" @ONLY)
install(FILES "${PROJECT_BINARY_DIR}/trainkit.pc" DESTINATION "${CMAKE_INSTALL_DATADIR}/pkgconfig")

# Header-only and no compiled code: one package serves every architecture.
write_basic_package_version_file("${PROJECT_BINARY_DIR}/trainkitConfigVersion.cmake"
  COMPATIBILITY SameMinorVersion ARCH_INDEPENDENT)

configure_package_config_file("${PROJECT_SOURCE_DIR}/cmake/trainkitConfig.cmake.in"
  "${PROJECT_BINARY_DIR}/trainkit-install/trainkitConfig.cmake"
  INSTALL_DESTINATION "${TRAINKIT_INSTALL_CMAKEDIR}")
install(FILES "${PROJECT_BINARY_DIR}/trainkit-install/trainkitConfig.cmake"
              "${PROJECT_BINARY_DIR}/trainkitConfigVersion.cmake" ${_trainkit_modules}
        DESTINATION "${TRAINKIT_INSTALL_CMAKEDIR}")

# Build tree: find_package(trainkit) with trainkit_DIR=${PROJECT_BINARY_DIR}, no install needed.
export(EXPORT trainkitTargets NAMESPACE trainkit:: FILE "${PROJECT_BINARY_DIR}/trainkitTargets.cmake")
configure_package_config_file("${PROJECT_SOURCE_DIR}/cmake/trainkitConfig.cmake.in"
  "${PROJECT_BINARY_DIR}/trainkitConfig.cmake"
  INSTALL_DESTINATION "${PROJECT_BINARY_DIR}" INSTALL_PREFIX "${PROJECT_BINARY_DIR}")
foreach(_trainkit_module IN LISTS _trainkit_modules)
  configure_file("${_trainkit_module}" "${PROJECT_BINARY_DIR}" COPYONLY)
endforeach()
unset(_trainkit_module)
unset(_trainkit_modules)
