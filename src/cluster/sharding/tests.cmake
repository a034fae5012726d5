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
