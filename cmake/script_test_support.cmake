# Helpers of the tests written as CMake scripts (install_test.cmake,
# package_test.cmake). Before including it, set TEST_NAME (for messages)
# and WORK_DIR (the directory the test works in, removed when it fails).

# Fails the test with `what`, after removing WORK_DIR.
function(fail what)
  file(REMOVE_RECURSE "${WORK_DIR}")
  message(FATAL_ERROR "${TEST_NAME}: ${what}")
endfunction()

# Runs a command; fails the test with its output unless it exits 0. The
# standard output is left in `<out>`.
function(run out what)
  execute_process(COMMAND ${ARGN} RESULT_VARIABLE rc OUTPUT_VARIABLE stdout ERROR_VARIABLE stderr)
  if(NOT rc EQUAL 0)
    fail("${what} failed (${rc}):\n${stdout}\n${stderr}")
  endif()
  set(${out} "${stdout}" PARENT_SCOPE)
endfunction()

# Fails unless each variable named is defined (-D<name>=... before -P).
function(require_defined)
  foreach(var IN LISTS ARGN)
    if(NOT DEFINED ${var})
      message(FATAL_ERROR "${TEST_NAME}: ${var} is not set")
    endif()
  endforeach()
endfunction()
