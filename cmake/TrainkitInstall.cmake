# Install rules: headers, the exported INTERFACE target and a relocatable package config that
# re-finds exactly the backends this build enabled (FindNCCL.cmake ships next to it).
include(CMakePackageConfigHelpers)

set(TRAINKIT_INSTALL_CMAKEDIR "${CMAKE_INSTALL_DATADIR}/cmake/trainkit" CACHE STRING
    "Where trainkitConfig.cmake is installed, relative to the prefix")

install(DIRECTORY "${_trainkit_include_dir}/trainkit" DESTINATION "${CMAKE_INSTALL_INCLUDEDIR}")
install(TARGETS trainkit EXPORT trainkitTargets)
install(EXPORT trainkitTargets NAMESPACE trainkit:: DESTINATION "${TRAINKIT_INSTALL_CMAKEDIR}")
export(EXPORT trainkitTargets NAMESPACE trainkit:: FILE "${PROJECT_BINARY_DIR}/trainkitTargets.cmake")

configure_package_config_file("${CMAKE_CURRENT_LIST_DIR}/trainkitConfig.cmake.in"
  "${PROJECT_BINARY_DIR}/trainkitConfig.cmake" INSTALL_DESTINATION "${TRAINKIT_INSTALL_CMAKEDIR}")
write_basic_package_version_file("${PROJECT_BINARY_DIR}/trainkitConfigVersion.cmake"
  COMPATIBILITY SameMinorVersion ARCH_INDEPENDENT)
install(FILES "${PROJECT_BINARY_DIR}/trainkitConfig.cmake"
              "${PROJECT_BINARY_DIR}/trainkitConfigVersion.cmake"
              "${CMAKE_CURRENT_LIST_DIR}/FindNCCL.cmake"
        DESTINATION "${TRAINKIT_INSTALL_CMAKEDIR}")
