# libFuzzer target of the HTTP stack, included by the top-level
# CMakeLists.txt (see troupe_add_fuzz there); scripts/fuzz installs clang,
# configures build/fuzz and runs the targets.
#
# http_parser_fuzz: the request and response parsers on arbitrary bytes,
# under ASan and UBSan. It links parser.cpp and message.cpp alone, so no
# socket, thread or Asio code is involved.

troupe_add_fuzz(http_parser_fuzz
  SOURCES ${CMAKE_CURRENT_SOURCE_DIR}/src/net/http/http_parser_fuzz.cpp
          ${CMAKE_CURRENT_SOURCE_DIR}/src/net/http/parser.cpp
          ${CMAKE_CURRENT_SOURCE_DIR}/src/net/http/message.cpp
  CORPUS src/net/http/fuzz_corpus
  LIBS nlohmann_json::nlohmann_json)
