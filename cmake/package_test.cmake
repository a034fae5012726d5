# The test package_deb (cmake -P, from cmake/install.cmake): cpack makes the
# .deb from the build, and dpkg-deb must show its name, version and Depends
# and list the CMake package, a header, a pkg-config file and a library.
# zstd only makes the check quicker than the package's gzip; the files are
# the same. Everything happens under WORK_DIR, removed at the end.
#
# -D inputs: BUILD_DIR, WORK_DIR, VERSION, DEPENDS, DPKG_DEB.

cmake_minimum_required(VERSION 3.25)

set(TEST_NAME package_deb)
include(${CMAKE_CURRENT_LIST_DIR}/script_test_support.cmake)
require_defined(BUILD_DIR WORK_DIR VERSION DEPENDS DPKG_DEB)

file(REMOVE_RECURSE "${WORK_DIR}")
run(out "cpack -G DEB" ${CMAKE_CPACK_COMMAND} -G DEB -D CPACK_DEBIAN_COMPRESSION_TYPE=zstd
    --config "${BUILD_DIR}/CPackConfig.cmake" -B "${WORK_DIR}")
file(GLOB debs "${WORK_DIR}/*.deb")
list(LENGTH debs n)
if(NOT n EQUAL 1)
  fail("cpack made ${n} .deb files: ${debs}")
endif()

foreach(field_value "Package=libtroupe-dev" "Version=${VERSION}" "Depends=${DEPENDS}")
  string(REPLACE "=" ";" fv "${field_value}")
  list(GET fv 0 field)
  list(GET fv 1 expected)
  run(value "dpkg-deb --field ${field}" ${DPKG_DEB} --field ${debs} ${field})
  string(STRIP "${value}" value)
  if(NOT value STREQUAL expected)
    fail("the .deb's ${field} is '${value}', not '${expected}'")
  endif()
endforeach()

run(contents "dpkg-deb --contents" ${DPKG_DEB} --contents ${debs})
foreach(path ./usr/lib/cmake/troupe/troupeConfig.cmake ./usr/lib/cmake/troupe/troupeConfigVersion.cmake
        ./usr/lib/cmake/troupe/troupeTargets.cmake ./usr/include/troupe/core.hpp ./usr/include/troupe/version.hpp
        ./usr/lib/pkgconfig/troupe.pc ./usr/lib/libtroupe_core ./usr/bin/troupectl)
  string(FIND "${contents}" " ${path}" at)
  if(at EQUAL -1)
    fail("the .deb holds no ${path}:\n${contents}")
  endif()
endforeach()

file(REMOVE_RECURSE "${WORK_DIR}")
message(STATUS "package_deb: ${debs} has the expected fields and files")
