# troupectl, the command line of a running node (doc/troupectl.md), and its
# tests. Included from the top-level CMakeLists.txt after troupe_node.
add_executable(troupectl apps/troupectl/main.cpp apps/troupectl/commands.cpp apps/troupectl/views.cpp)
target_link_libraries(troupectl PRIVATE troupe::node troupe_warnings troupe_cli)

if(TROUPE_BUILD_TESTS)
  # The top-level file does these later, for every layer; both are idempotent.
  enable_testing()
  find_package(GTest REQUIRED)
  include(GoogleTest)
  # The commands run in-process against a real node started by each test.
  add_executable(troupectl_tests apps/troupectl/commands.cpp apps/troupectl/views.cpp apps/troupectl/troupectl.test.cpp)
  target_include_directories(troupectl_tests PRIVATE ${CMAKE_CURRENT_SOURCE_DIR}/apps/troupectl)
  target_link_libraries(troupectl_tests PRIVATE troupe::node troupe_warnings troupe_cli
                        GTest::gtest GTest::gtest_main)
  gtest_discover_tests(troupectl_tests DISCOVERY_TIMEOUT 60 PROPERTIES LABELS node TIMEOUT 300)
endif()
