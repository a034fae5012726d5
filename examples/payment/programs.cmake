# The payment example's programs, included by the top-level CMakeLists.txt:
#   payment_gateway  the simulated settlement gateway as an HTTP process
#   payment_loadgen  the load generator for the payment service's HTTP API
# Both on troupe::node (the HTTP stack) and CLI11. The gateway waits on Asio
# timers of its own, so it sees the standalone Asio headers too.

add_executable(payment_gateway ${CMAKE_CURRENT_LIST_DIR}/gateway_main.cpp)
target_include_directories(payment_gateway SYSTEM PRIVATE ${ASIO_INCLUDE_DIR})
target_compile_definitions(payment_gateway PRIVATE ASIO_STANDALONE ASIO_NO_DEPRECATED)
target_link_libraries(payment_gateway PRIVATE troupe::node troupe_warnings troupe_cli)

add_executable(payment_loadgen ${CMAKE_CURRENT_LIST_DIR}/loadgen_main.cpp ${CMAKE_CURRENT_LIST_DIR}/loadgen_driver.cpp
                               ${CMAKE_CURRENT_LIST_DIR}/loadgen_report.cpp)
target_link_libraries(payment_loadgen PRIVATE troupe::node troupe_warnings troupe_cli)

# The main demo (payment_demo, defined in the top-level CMakeLists.txt with
# main.cpp): the parts main.cpp wires together.
target_sources(payment_demo PRIVATE ${CMAKE_CURRENT_LIST_DIR}/demo_options.cpp ${CMAKE_CURRENT_LIST_DIR}/demo_service.cpp
                                    ${CMAKE_CURRENT_LIST_DIR}/demo_checkout.cpp ${CMAKE_CURRENT_LIST_DIR}/demo_output.cpp)
