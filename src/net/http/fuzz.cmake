# libFuzzer target of the HTTP stack, included by the top-level
# CMakeLists.txt (see troupe_add_fuzz there); scripts/fuzz installs clang,
# configures build/fuzz and runs the targets.
#
# http_parser_fuzz: Boost.Beast's request and response parsers as troupe
# drives them (beast_messages.cpp), on arbitrary bytes, under ASan and
# UBSan. No socket or thread is involved. Beast's headers carry Asio's
# ssl error category (tls.hpp), hence OpenSSL.

troupe_add_fuzz(http_parser_fuzz
  SOURCES ${CMAKE_CURRENT_SOURCE_DIR}/src/net/http/http_parser_fuzz.cpp
          ${CMAKE_CURRENT_SOURCE_DIR}/src/net/http/beast_messages.cpp
          ${CMAKE_CURRENT_SOURCE_DIR}/src/net/http/chunk_framing.cpp
          ${CMAKE_CURRENT_SOURCE_DIR}/src/net/http/syntax.cpp
          ${CMAKE_CURRENT_SOURCE_DIR}/src/net/http/message.cpp
  CORPUS src/net/http/fuzz_corpus
  LIBS Boost::headers nlohmann_json::nlohmann_json OpenSSL::SSL OpenSSL::Crypto)
