# libFuzzer target of the HTTP stack, included by the top-level
# CMakeLists.txt when TROUPE_BUILD_FUZZ=ON and the compiler links
# libFuzzer (it sets TROUPE_FUZZ_FLAGS); scripts/fuzz installs clang,
# configures build/fuzz and runs the targets.
#
# http_parser_fuzz: the request and response parsers on arbitrary bytes,
# under ASan and UBSan. It links parser.cpp and message.cpp alone, so no
# socket, thread or Asio code is involved.

add_executable(http_parser_fuzz
  ${CMAKE_CURRENT_SOURCE_DIR}/src/node/http/http_parser_fuzz.cpp
  ${CMAKE_CURRENT_SOURCE_DIR}/src/node/http/parser.cpp
  ${CMAKE_CURRENT_SOURCE_DIR}/src/node/http/message.cpp)
target_include_directories(http_parser_fuzz PRIVATE ${CMAKE_CURRENT_SOURCE_DIR}/include)
target_compile_options(http_parser_fuzz PRIVATE -g ${TROUPE_FUZZ_FLAGS})
target_link_options(http_parser_fuzz PRIVATE ${TROUPE_FUZZ_FLAGS})
target_link_libraries(http_parser_fuzz PRIVATE nlohmann_json::nlohmann_json troupe_warnings)
