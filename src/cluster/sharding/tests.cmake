# The multi-process cluster tests run node processes (cluster_test_node) on
# 127.0.0.1 against a redis-server they start themselves and the PostgreSQL
# server of the troupe_postgres fixture.
add_executable(cluster_test_node src/cluster/sharding/cluster_test_node_main.cpp)
target_link_libraries(cluster_test_node PRIVATE troupe::cluster troupe_warnings)
add_dependencies(cluster_tests cluster_test_node)
target_compile_definitions(cluster_tests PRIVATE TROUPE_CLUSTER_TEST_NODE="$<TARGET_FILE:cluster_test_node>")
target_link_libraries(cluster_tests PRIVATE PkgConfig::LIBPQ)
list(APPEND TROUPE_CLUSTER_TEST_FIXTURES troupe_postgres)
list(APPEND TROUPE_CLUSTER_TEST_ENV "TROUPE_TEST_POSTGRES_STATE=${TROUPE_PG_STATE}")

# The crash tests (SPEC V2) SIGKILL crash_test_node processes: a lock node
# mid-hold (lock_crash.test.cpp), a gateway with asks in flight
# (process_manager_crash.test.cpp). They run alone, with room for the
# liveness threshold and leases they wait out.
add_executable(crash_test_node src/cluster/sharding/crash_test_node_main.cpp)
target_link_libraries(crash_test_node PRIVATE troupe::cluster troupe_warnings)
add_dependencies(cluster_tests crash_test_node)
target_compile_definitions(cluster_tests PRIVATE TROUPE_CRASH_TEST_NODE="$<TARGET_FILE:crash_test_node>")
set(_crash_tests
  ClusterLockCrash.AHolderKilledMidHoldKeepsItsKeyUntilItsLeaseEndsThenTheWaiterGetsIt
  ClusterLockCrash.AnOwnerKilledHoldingAKeyIsTakenOverAndTheKeyStaysHeldUntilTheDeadHoldersLeaseEnds
  ProcessManagerCrash.ProcessesInFlightWhenTheirPeerIsKilledAllEndAndFreeTheirSlots)
# Discovered tests exist only in the file gtest_discover_tests adds to
# TEST_INCLUDE_FILES; this one is added after it (deferred to the end of the
# directory) and sets their properties by name.
set(_crash_props ${CMAKE_CURRENT_BINARY_DIR}/cluster_crash_tests_properties.cmake)
file(WRITE ${_crash_props} "set_tests_properties(${_crash_tests} PROPERTIES RUN_SERIAL TRUE TIMEOUT 600)\n")
cmake_language(DEFER CALL set_property DIRECTORY APPEND PROPERTY TEST_INCLUDE_FILES ${_crash_props})
