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
