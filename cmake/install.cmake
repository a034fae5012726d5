# What `cmake --install` puts under the prefix, and the .deb CPack makes of
# it: the public headers (the layers' HEADERS file sets), the libraries,
# troupectl, a CMake package (find_package(troupe): troupeConfig.cmake,
# troupeConfigVersion.cmake and the targets troupe::core ... troupe::node)
# and one pkg-config file per layer plus troupe.pc for all of them.
# Included by the top CMakeLists.txt once the layers are defined.
# Headers under src/ are internal and never installed; the test
# install_consumer (below) checks that every installed header compiles
# against the prefix alone.

include(GNUInstallDirs)
include(CMakePackageConfigHelpers)

# The installed libraries: troupe_<name>, exported as troupe::<name> (the
# name the tree uses through its aliases). A new library is one word here
# and one troupe_pkg_config() line below.
set(TROUPE_INSTALLED_LIBRARIES core net persist patterns cluster node protobuf)
set(TROUPE_CMAKE_DIR ${CMAKE_INSTALL_LIBDIR}/cmake/troupe)

foreach(name IN LISTS TROUPE_INSTALLED_LIBRARIES)
  set(lib troupe_${name})
  set_target_properties(${lib} PROPERTIES EXPORT_NAME ${name})
  # The headers are C++20: a program that links troupe compiles as C++20.
  target_compile_features(${lib} PUBLIC cxx_std_20)
  if(BUILD_SHARED_LIBS)
    # 0.x: every minor release may break the ABI.
    set_target_properties(${lib} PROPERTIES VERSION ${PROJECT_VERSION}
                                            SOVERSION ${PROJECT_VERSION_MAJOR}.${PROJECT_VERSION_MINOR})
  endif()
  # troupe_warnings is this tree's compiler flags, linked privately. A
  # static library still names its private links in its interface (as
  # $<LINK_ONLY:...>), which would make the flags part of the installed
  # package; they are not a usage requirement, so they are left out of it.
  get_target_property(interface ${lib} INTERFACE_LINK_LIBRARIES)
  if(interface)
    list(REMOVE_ITEM interface "$<LINK_ONLY:troupe_warnings>")
    set_target_properties(${lib} PROPERTIES INTERFACE_LINK_LIBRARIES "${interface}")
  endif()
endforeach()

list(TRANSFORM TROUPE_INSTALLED_LIBRARIES PREPEND troupe_ OUTPUT_VARIABLE _troupe_libs)
install(TARGETS ${_troupe_libs} EXPORT troupeTargets
        ARCHIVE DESTINATION ${CMAKE_INSTALL_LIBDIR}
        LIBRARY DESTINATION ${CMAKE_INSTALL_LIBDIR}
        FILE_SET HEADERS DESTINATION ${CMAKE_INSTALL_INCLUDEDIR})
if(BUILD_SHARED_LIBS)
  set_target_properties(troupectl PROPERTIES INSTALL_RPATH "$ORIGIN/../${CMAKE_INSTALL_LIBDIR}")
endif()
install(TARGETS troupectl RUNTIME DESTINATION ${CMAKE_INSTALL_BINDIR})
# The option a user's .proto imports (`import "troupe/protobuf/options.proto"`,
# protoc -I <prefix>/include); its generated header is in troupe::protobuf's
# header set.
install(FILES ${PROJECT_SOURCE_DIR}/include/troupe/protobuf/options.proto
        DESTINATION ${CMAKE_INSTALL_INCLUDEDIR}/troupe/protobuf)

install(EXPORT troupeTargets NAMESPACE troupe:: DESTINATION ${TROUPE_CMAKE_DIR})
configure_package_config_file(${CMAKE_CURRENT_LIST_DIR}/troupeConfig.cmake.in
                              ${PROJECT_BINARY_DIR}/troupeConfig.cmake INSTALL_DESTINATION ${TROUPE_CMAKE_DIR})
# 0.x: a minor release may break the API, so only the same minor matches.
write_basic_package_version_file(${PROJECT_BINARY_DIR}/troupeConfigVersion.cmake COMPATIBILITY SameMinorVersion)
install(FILES ${PROJECT_BINARY_DIR}/troupeConfig.cmake ${PROJECT_BINARY_DIR}/troupeConfigVersion.cmake
        DESTINATION ${TROUPE_CMAKE_DIR})

# --- pkg-config: troupe-<layer>.pc each, troupe.pc for the whole -------------------
# Each file finds the prefix from its own place (${pcfiledir}), so that an
# install moved elsewhere (the .deb's /usr) still works.
# (With absolute install directories the paths are written as they are.)
if(IS_ABSOLUTE ${CMAKE_INSTALL_LIBDIR} OR IS_ABSOLUTE ${CMAKE_INSTALL_INCLUDEDIR})
  set(PC_PREFIX ${CMAKE_INSTALL_PREFIX})
  set(PC_LIBDIR ${CMAKE_INSTALL_FULL_LIBDIR})
  set(PC_INCLUDEDIR ${CMAKE_INSTALL_FULL_INCLUDEDIR})
else()
  file(RELATIVE_PATH up /prefix/${CMAKE_INSTALL_LIBDIR}/pkgconfig /prefix)
  string(REGEX REPLACE "/$" "" up "${up}")
  set(PC_PREFIX "\${pcfiledir}/${up}")
  set(PC_LIBDIR "\${prefix}/${CMAKE_INSTALL_LIBDIR}")
  set(PC_INCLUDEDIR "\${prefix}/${CMAKE_INSTALL_INCLUDEDIR}")
endif()
# troupe_pkg_config(<layer> REQUIRES <modules> PRIVATE <modules> [LIBS <flags>])
# REQUIRES: modules the layer's public headers or public links need;
# PRIVATE: modules only its objects need. With static libraries (the
# default) those are needed at every link, so they go to Requires too and a
# plain `pkg-config --libs` links; with shared ones to Requires.private.
# Boost.Beast and nlohmann-json inside troupe_net are header-only and ship no
# link flags; OpenSSL (TLS) is net's and cluster's private module.
function(troupe_pkg_config layer)
  cmake_parse_arguments(P "" "" "REQUIRES;PRIVATE;LIBS" ${ARGN})
  set(requires ${P_REQUIRES})
  set(requires_private "")
  if(BUILD_SHARED_LIBS)
    set(requires_private ${P_PRIVATE})
  else()
    list(APPEND requires ${P_PRIVATE})
  endif()
  list(JOIN requires " " PC_REQUIRES)
  list(JOIN requires_private " " PC_REQUIRES_PRIVATE)
  list(JOIN P_LIBS " " PC_EXTRA_LIBS)
  set(PC_NAME troupe-${layer})
  set(PC_LIB troupe_${layer})
  set(PC_DESCRIPTION "troupe's ${layer} layer (C++20 actor runtime)")
  configure_file(${PROJECT_SOURCE_DIR}/cmake/troupe-layer.pc.in ${PROJECT_BINARY_DIR}/pkgconfig/${PC_NAME}.pc @ONLY)
  install(FILES ${PROJECT_BINARY_DIR}/pkgconfig/${PC_NAME}.pc DESTINATION ${CMAKE_INSTALL_LIBDIR}/pkgconfig)
endfunction()

# Dependencies of the installed package, as pkg-config modules. A new
# dependency of a layer is one word here (and one line in troupeConfig.cmake.in
# and in TROUPE_DEB_DEPENDS below), e.g. spdlog for core, protobuf for a codec layer.
troupe_pkg_config(core PRIVATE spdlog LIBS -pthread)
troupe_pkg_config(net REQUIRES troupe-core PRIVATE openssl)
troupe_pkg_config(persist REQUIRES troupe-core PRIVATE sqlite3 libpq)
troupe_pkg_config(patterns REQUIRES troupe-core troupe-persist)
troupe_pkg_config(cluster REQUIRES troupe-core troupe-persist troupe-patterns PRIVATE troupe-net hiredis openssl)
troupe_pkg_config(node REQUIRES troupe-net troupe-cluster nlohmann_json tomlplusplus)
troupe_pkg_config(protobuf REQUIRES troupe-persist protobuf)
configure_file(${PROJECT_SOURCE_DIR}/cmake/troupe.pc.in ${PROJECT_BINARY_DIR}/pkgconfig/troupe.pc @ONLY)
install(FILES ${PROJECT_BINARY_DIR}/pkgconfig/troupe.pc DESTINATION ${CMAKE_INSTALL_LIBDIR}/pkgconfig)

# --- the .deb: cpack -G DEB in the build directory ---------------------------------
set(TROUPE_PACKAGE_MAINTAINER "troupe maintainers <troupe@localhost>"
    CACHE STRING "The Maintainer field of the .deb cpack makes")
# The Debian packages an installed troupe builds against (what
# troupeConfig.cmake finds again), and pkg-config, which it uses for libpq
# and hiredis.
set(TROUPE_DEB_DEPENDS
    libspdlog-dev
    libsqlite3-dev
    libpq-dev
    libhiredis-dev
    libssl-dev
    nlohmann-json3-dev
    libtomlplusplus-dev
    libboost-dev
    libprotobuf-dev
    protobuf-compiler
    pkg-config)
list(JOIN TROUPE_DEB_DEPENDS ", " CPACK_DEBIAN_PACKAGE_DEPENDS)
set(CPACK_PACKAGE_NAME libtroupe-dev)
set(CPACK_PACKAGE_VENDOR troupe)
set(CPACK_PACKAGE_VERSION ${PROJECT_VERSION})
set(CPACK_PACKAGE_CONTACT ${TROUPE_PACKAGE_MAINTAINER})
set(CPACK_PACKAGE_DESCRIPTION_SUMMARY
    "C++20 actor runtime: headers, libraries, CMake and pkg-config files, troupectl")
set(CPACK_DEBIAN_PACKAGE_SECTION libdevel)
set(CPACK_DEBIAN_FILE_NAME DEB-DEFAULT)
set(CPACK_PACKAGING_INSTALL_PREFIX /usr)
set(CPACK_GENERATOR DEB)
include(CPack)

# --- tests (label install): the install used as a user would ------------------------
# Not under the sanitizers: a program linking their instrumented libraries
# would need their flags, which are no usage requirement of the package.
if(TROUPE_BUILD_TESTS AND TROUPE_SANITIZE STREQUAL "")
  find_program(TROUPE_PKG_CONFIG NAMES pkg-config pkgconf REQUIRED)
  # install_consumer: cmake --install into a prefix with a space in its name,
  # then examples/consumer built against it (cmake/install_test.cmake).
  add_test(NAME install_consumer
           COMMAND ${CMAKE_COMMAND} -DBUILD_DIR=${PROJECT_BINARY_DIR} -DSOURCE_DIR=${PROJECT_SOURCE_DIR}
                   "-DWORK_DIR=${PROJECT_BINARY_DIR}/install test" -DVERSION=${PROJECT_VERSION}
                   -DGENERATOR=${CMAKE_GENERATOR} -DCXX=${CMAKE_CXX_COMPILER}
                   "-DLAUNCHER=${CMAKE_CXX_COMPILER_LAUNCHER}" -DPKG_CONFIG=${TROUPE_PKG_CONFIG}
                   "-DTARGETS=${TROUPE_INSTALLED_LIBRARIES}"
                   -P ${CMAKE_CURRENT_LIST_DIR}/install_test.cmake)
  set_tests_properties(install_consumer PROPERTIES LABELS install TIMEOUT 300)

  # package_deb: cpack -G DEB, then dpkg-deb reads the package
  # (cmake/package_test.cmake).
  find_program(TROUPE_DPKG_DEB dpkg-deb)
  if(TROUPE_DPKG_DEB)
    add_test(NAME package_deb
             COMMAND ${CMAKE_COMMAND} -DBUILD_DIR=${PROJECT_BINARY_DIR} "-DWORK_DIR=${PROJECT_BINARY_DIR}/package test"
                     -DVERSION=${PROJECT_VERSION} "-DDEPENDS=${CPACK_DEBIAN_PACKAGE_DEPENDS}"
                     -DDPKG_DEB=${TROUPE_DPKG_DEB} -P ${CMAKE_CURRENT_LIST_DIR}/package_test.cmake)
    set_tests_properties(package_deb PROPERTIES LABELS install TIMEOUT 300)
  endif()
endif()
