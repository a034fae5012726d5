# The test install_consumer (cmake -P, from cmake/install.cmake): installs
# the build into a prefix whose name has a space, then, against that prefix
# alone,
#  - compiles every installed header in one translation unit with the flags
#    of troupe.pc, and checks that each troupe header it read came from the
#    prefix (none from the source tree, none from another install);
#  - checks that find_package(troupe) defines every target in TARGETS and
#    that their links resolve;
#  - configures examples/consumer with find_package(troupe), builds and runs
#    it, and checks what it prints;
#  - builds the same program with the flags of troupe-persist.pc and runs it.
# Everything happens under WORK_DIR, removed at the end, pass or fail.
#
# -D inputs: BUILD_DIR, SOURCE_DIR, WORK_DIR, VERSION, GENERATOR, CXX,
# LAUNCHER (the compiler launcher, e.g. ccache, or empty), PKG_CONFIG,
# TARGETS (the installed libraries' names: troupe::<name>).

cmake_minimum_required(VERSION 3.25)

set(TEST_NAME install_consumer)
include(${CMAKE_CURRENT_LIST_DIR}/script_test_support.cmake)
require_defined(BUILD_DIR SOURCE_DIR WORK_DIR VERSION GENERATOR CXX PKG_CONFIG TARGETS)

set(prefix "${WORK_DIR}/prefix with space")
set(consumer_build "${WORK_DIR}/consumer build")

file(REMOVE_RECURSE "${WORK_DIR}")
file(MAKE_DIRECTORY "${WORK_DIR}")
string(TIMESTAMP t0 "%s")

run(out "cmake --install" ${CMAKE_COMMAND} --install "${BUILD_DIR}" --prefix "${prefix}")

# --- the installed headers, against the prefix and the system alone ----------------
file(GLOB_RECURSE headers RELATIVE "${prefix}/include" "${prefix}/include/*")
set(all "")
foreach(h IN LISTS headers)
  if(NOT h MATCHES "^troupe/.*\\.hpp$")
    fail("installed outside include/troupe/ or not a .hpp: include/${h}")
  endif()
  string(APPEND all "#include \"${h}\"\n")
endforeach()
list(LENGTH headers header_count)
if(header_count LESS 10 OR NOT "troupe/version.hpp" IN_LIST headers)
  fail("only ${header_count} headers installed, or no troupe/version.hpp: ${headers}")
endif()
file(WRITE "${WORK_DIR}/all_headers.cpp" "${all}")

set(ENV{PKG_CONFIG_PATH} "${prefix}/lib/pkgconfig")
run(cflags "pkg-config --cflags troupe" ${PKG_CONFIG} --cflags troupe)
# pkg-config escapes the space in the prefix with a backslash, as a shell would.
separate_arguments(cflags UNIX_COMMAND "${cflags}")
run(out "compiling every installed header" ${LAUNCHER} ${CXX} -std=c++20 -fsyntax-only -MD -MF "${WORK_DIR}/all_headers.d"
    ${cflags} "${WORK_DIR}/all_headers.cpp")
file(READ "${WORK_DIR}/all_headers.d" deps)
string(REPLACE "\\ " "<space>" deps "${deps}")
string(REGEX REPLACE "[ \\\\\n]+" ";" deps "${deps}")
foreach(d IN LISTS deps)
  string(REPLACE "<space>" " " d "${d}")
  if(d MATCHES "/include/troupe/")
    file(REAL_PATH "${d}" real)
    file(REAL_PATH "${prefix}/include" inc)
    cmake_path(IS_PREFIX inc "${real}" inside)
    if(NOT inside)
      fail("an installed header includes ${real}, which is not under the prefix")
    endif()
  endif()
endforeach()

set(launcher_arg "")
if(LAUNCHER)
  set(launcher_arg "-DCMAKE_CXX_COMPILER_LAUNCHER=${LAUNCHER}")
endif()

# --- the package: every target, with usage requirements that resolve --------------
# Configured (not built) as a project of its own: find_package(troupe) must
# define every target, and generating a target that links them all resolves
# every link (a dependency the config failed to find again is an error here).
file(WRITE "${WORK_DIR}/package/CMakeLists.txt" "
cmake_minimum_required(VERSION 3.25)
project(troupe_package_check LANGUAGES CXX)
find_package(troupe ${VERSION} EXACT REQUIRED)
add_library(all_headers OBJECT \"${WORK_DIR}/all_headers.cpp\")
foreach(name ${TARGETS})
  if(NOT TARGET troupe::\${name})
    message(FATAL_ERROR \"find_package(troupe) defines no troupe::\${name}\")
  endif()
  target_link_libraries(all_headers PRIVATE troupe::\${name})
endforeach()
")
run(out "find_package(troupe) with every target" ${CMAKE_COMMAND} -S "${WORK_DIR}/package" -B "${WORK_DIR}/package/build"
    -G "${GENERATOR}" "-DCMAKE_CXX_COMPILER=${CXX}" "-DCMAKE_PREFIX_PATH=${prefix}" -DCMAKE_FIND_USE_PACKAGE_REGISTRY=OFF)

# --- examples/consumer: find_package(troupe), build, run ---------------------------
run(configured "configuring examples/consumer" ${CMAKE_COMMAND} -S "${SOURCE_DIR}/examples/consumer" -B "${consumer_build}"
    -G "${GENERATOR}" -DCMAKE_BUILD_TYPE=Debug "-DCMAKE_CXX_COMPILER=${CXX}" ${launcher_arg}
    "-DCMAKE_PREFIX_PATH=${prefix}" -DCMAKE_FIND_USE_PACKAGE_REGISTRY=OFF)
string(FIND "${configured}" "troupe ${VERSION} from ${prefix}/lib/cmake/troupe" at)
if(at EQUAL -1)
  fail("examples/consumer did not find troupe ${VERSION} in the prefix:\n${configured}")
endif()
run(out "building examples/consumer" ${CMAKE_COMMAND} --build "${consumer_build}" --parallel 2)

set(expected "troupe ${VERSION}
apples + 3 = 3
apples + 4 = 7
pears + 10 = 10
pears + -1 refused: add a positive amount
-- started again on the same journal --
apples = 7
pears + 2 = 12
")
run(printed "running the counter" "${consumer_build}/counter")
if(NOT printed STREQUAL expected)
  fail("the counter printed\n${printed}\ninstead of\n${expected}")
endif()

# --- the same program through pkg-config -------------------------------------------
run(flags "pkg-config --cflags --libs troupe-persist" ${PKG_CONFIG} --cflags --libs troupe-persist)
separate_arguments(flags UNIX_COMMAND "${flags}")
run(out "building the counter with pkg-config's flags" ${LAUNCHER} ${CXX} -std=c++20
    "${SOURCE_DIR}/examples/consumer/main.cpp" -o "${WORK_DIR}/counter-pc" ${flags})
run(printed "running the counter built with pkg-config's flags" "${WORK_DIR}/counter-pc")
if(NOT printed STREQUAL expected)
  fail("the counter built with pkg-config's flags printed\n${printed}")
endif()

string(TIMESTAMP t1 "%s")
math(EXPR seconds "${t1} - ${t0}")
file(REMOVE_RECURSE "${WORK_DIR}")
message(STATUS "install_consumer: ${header_count} headers, examples/consumer built with CMake and with pkg-config, "
               "both ran (${seconds} s)")
