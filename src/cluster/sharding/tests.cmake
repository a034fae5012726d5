# The multi-process cluster tests run node processes (cluster_test_node) on
# 127.0.0.1 against a redis-server they start themselves and the PostgreSQL
# server of the troupe_postgres fixture.
add_executable(cluster_test_node src/cluster/sharding/cluster_test_node_main.cpp)
target_link_libraries(cluster_test_node PRIVATE troupe::cluster troupe_warnings)
# The same node without the journal fence and self-fencing (test-only, SPEC
# V1): the history checker must see its two live incarnations.
add_executable(cluster_test_node_unfenced src/cluster/sharding/cluster_test_node_main.cpp)
target_link_libraries(cluster_test_node_unfenced PRIVATE troupe::cluster troupe_warnings)
target_compile_definitions(cluster_test_node_unfenced PRIVATE TROUPE_TEST_UNFENCED=1)
add_dependencies(cluster_tests cluster_test_node cluster_test_node_unfenced)
target_compile_definitions(cluster_tests PRIVATE TROUPE_CLUSTER_TEST_NODE="$<TARGET_FILE:cluster_test_node>"
                           TROUPE_CLUSTER_TEST_NODE_UNFENCED="$<TARGET_FILE:cluster_test_node_unfenced>")
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

# The node-process tests (ClusterProcesses.*) run alone: each drives three
# node processes, a redis-server and PostgreSQL against real-time bounds,
# and takes up to minutes. gtest_discover_tests names the tests at build
# time in the CTest file, so their properties are set by a script included
# after its list (deferred to the end of this directory's configuration).
# The script also gives every cluster test the whole environment list: the
# ENVIRONMENT of gtest_discover_tests keeps only its first entry, and
# without TROUPE_TEST_POSTGRES_STATE a test process starts a PostgreSQL
# server of its own instead of the fixture's.
set(_troupe_cluster_serial ${CMAKE_CURRENT_BINARY_DIR}/cluster_processes_serial.cmake)
file(WRITE ${_troupe_cluster_serial} "set(_env [==[${TROUPE_CLUSTER_TEST_ENV}]==])\n" [=[
foreach(t IN LISTS cluster_tests_TESTS)
  set_tests_properties(${t} PROPERTIES ENVIRONMENT "${_env}")
  if(t MATCHES "^ClusterProcesses\\.")
    set_tests_properties(${t} PROPERTIES RUN_SERIAL TRUE TIMEOUT 1200)
  endif()
endforeach()
]=])
cmake_language(EVAL CODE "cmake_language(DEFER CALL set_property DIRECTORY APPEND PROPERTY TEST_INCLUDE_FILES [[${_troupe_cluster_serial}]])")
