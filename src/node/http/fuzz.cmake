# libFuzzer target of the HTTP stack, included by the top-level
# CMakeLists.txt when TROUPE_BUILD_FUZZ=ON. Like src/cluster/tcp/fuzz.cmake
# it needs clang with its libFuzzer runtime; scripts/fuzz installs those,
# configures build/fuzz and runs the targets.
#
# http_parser_fuzz: the request and response parsers on arbitrary bytes,
# under ASan and UBSan. It links parser.cpp and message.cpp alone, so no
# socket, thread or Asio code is involved.

if(NOT CMAKE_CXX_COMPILER_ID MATCHES "Clang")
  message(WARNING "TROUPE_BUILD_FUZZ: libFuzzer needs clang, the compiler is ${CMAKE_CXX_COMPILER_ID}; "
                  "no HTTP fuzz target (configure with -DCMAKE_CXX_COMPILER=clang++)")
  return()
endif()

include(CheckCXXSourceCompiles)
set(CMAKE_REQUIRED_FLAGS "-fsanitize=fuzzer")
set(CMAKE_REQUIRED_LINK_OPTIONS "-fsanitize=fuzzer")
check_cxx_source_compiles([[
#include <cstddef>
#include <cstdint>
extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t*, std::size_t) { return 0; }
]] TROUPE_HAVE_LIBFUZZER)
unset(CMAKE_REQUIRED_FLAGS)
unset(CMAKE_REQUIRED_LINK_OPTIONS)
if(NOT TROUPE_HAVE_LIBFUZZER)
  message(WARNING "TROUPE_BUILD_FUZZ: ${CMAKE_CXX_COMPILER} cannot link -fsanitize=fuzzer "
                  "(Debian: install libclang-rt-14-dev); no HTTP fuzz target")
  return()
endif()

set(TROUPE_HTTP_FUZZ_FLAGS -fsanitize=fuzzer,address,undefined -fno-sanitize-recover=undefined -fno-omit-frame-pointer)

add_executable(http_parser_fuzz
  ${CMAKE_CURRENT_SOURCE_DIR}/src/node/http/http_parser_fuzz.cpp
  ${CMAKE_CURRENT_SOURCE_DIR}/src/node/http/parser.cpp
  ${CMAKE_CURRENT_SOURCE_DIR}/src/node/http/message.cpp)
target_include_directories(http_parser_fuzz PRIVATE ${CMAKE_CURRENT_SOURCE_DIR}/include)
target_compile_options(http_parser_fuzz PRIVATE -g ${TROUPE_HTTP_FUZZ_FLAGS})
target_link_options(http_parser_fuzz PRIVATE ${TROUPE_HTTP_FUZZ_FLAGS})
target_link_libraries(http_parser_fuzz PRIVATE nlohmann_json::nlohmann_json troupe_warnings)
