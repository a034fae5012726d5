# The durable job service's crash tests (SPEC J6, V2) SIGKILL this node
# mid-job and between a job's work and its stored outcome. They run alone.
add_executable(job_crash_node src/patterns/job_crash_node_main.cpp)
target_link_libraries(job_crash_node PRIVATE troupe::patterns troupe_warnings)
add_dependencies(patterns_tests job_crash_node)
target_compile_definitions(patterns_tests PRIVATE TROUPE_JOB_CRASH_NODE="$<TARGET_FILE:job_crash_node>")
# Discovered tests exist only once the file gtest_discover_tests added to
# TEST_INCLUDE_FILES (above) has run; this one comes after it.
set(_job_crash_props ${CMAKE_CURRENT_BINARY_DIR}/job_crash_tests_properties.cmake)
file(WRITE ${_job_crash_props} "set_tests_properties(\
JobCrash.AServiceKilledWhileAJobRunsLosesNoAcceptedJobAndRunsNoFinishedJobAgain \
JobCrash.AServiceKilledAfterAJobsWorkButBeforeItsOutcomeIsStoredRunsThatJobAgainAndNoStoredJob \
PROPERTIES RUN_SERIAL TRUE TIMEOUT 600)\n")
set_property(DIRECTORY APPEND PROPERTY TEST_INCLUDE_FILES ${_job_crash_props})
