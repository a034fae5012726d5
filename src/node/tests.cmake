# node_tests' cluster test uses the PostgreSQL server the persist layer's
# fixture starts for the whole run (a journal both nodes share).
list(APPEND TROUPE_NODE_TEST_FIXTURES troupe_postgres)
list(APPEND TROUPE_NODE_TEST_ENV "TROUPE_TEST_POSTGRES_STATE=${TROUPE_PG_STATE}")
target_link_libraries(node_tests PRIVATE PkgConfig::LIBPQ)

# The node layer's extra tests, included by the top-level CMakeLists.txt
# inside its tests section.
#
# dashboard_e2e: the dashboard in headless Chromium against a running
# payment node (src/node/dashboard/e2e.sh); the screenshot is kept in
# <build>/artifacts/dashboard.png. Skipped (77) without chromium.
if(TARGET payment_service AND TARGET payment_gateway)
  add_test(NAME dashboard_e2e
           COMMAND ${CMAKE_CURRENT_SOURCE_DIR}/src/node/dashboard/e2e.sh $<TARGET_FILE_DIR:payment_service>
                   ${CMAKE_CURRENT_BINARY_DIR}/artifacts)
  set_tests_properties(dashboard_e2e PROPERTIES LABELS "node;e2e" TIMEOUT 300 SKIP_RETURN_CODE 77)
endif()

# payment_service_api: the payment service and its gateway as processes,
# driven through the payment API (examples/payment/service_test.py).
if(TARGET payment_service AND TARGET payment_gateway)
  add_test(NAME payment_service_api
           COMMAND python3 ${CMAKE_CURRENT_SOURCE_DIR}/examples/payment/service_test.py
                   $<TARGET_FILE_DIR:payment_service>)
  set_tests_properties(payment_service_api PROPERTIES LABELS "node;e2e" TIMEOUT 300)
  # payment_refunds_cluster: refunds in the 3-node payment cluster
  # (examples/payment/refunds_cluster_test.py), with the Redis and
  # PostgreSQL servers it starts on free ports: every refund acknowledged
  # reaches the gateway, also across a node's kill -9, and one job service
  # per node on a shared journal is loud. Skipped (77) without redis-server
  # or the PostgreSQL server binaries.
  add_test(NAME payment_refunds_cluster
           COMMAND python3 ${CMAKE_CURRENT_SOURCE_DIR}/examples/payment/refunds_cluster_test.py
                   $<TARGET_FILE_DIR:payment_service>)
  set_tests_properties(payment_refunds_cluster PROPERTIES LABELS "node;e2e" RUN_SERIAL TRUE TIMEOUT 600
                                                          SKIP_RETURN_CODE 77)
endif()
