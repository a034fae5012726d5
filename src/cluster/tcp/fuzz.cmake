# libFuzzer targets of the TCP transport, included by the top-level
# CMakeLists.txt when TROUPE_BUILD_FUZZ=ON. They need clang with its
# libFuzzer runtime (Debian: clang, libclang-rt-14-dev); scripts/fuzz
# installs those, configures build/fuzz and runs the targets.
#
# frame_decoder_fuzz: the frame decoder on arbitrary bytes, under ASan and
# UBSan. It links frame.cpp alone, so no socket or thread code is involved.

if(NOT CMAKE_CXX_COMPILER_ID MATCHES "Clang")
  message(WARNING "TROUPE_BUILD_FUZZ: libFuzzer needs clang, the compiler is ${CMAKE_CXX_COMPILER_ID}; "
                  "no fuzz targets (configure with -DCMAKE_CXX_COMPILER=clang++)")
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
                  "(Debian: install libclang-rt-14-dev); no fuzz targets")
  return()
endif()

set(TROUPE_FUZZ_FLAGS -fsanitize=fuzzer,address,undefined -fno-sanitize-recover=undefined -fno-omit-frame-pointer)

add_executable(frame_decoder_fuzz
  ${CMAKE_CURRENT_SOURCE_DIR}/src/cluster/tcp/frame_decoder_fuzz.cpp
  ${CMAKE_CURRENT_SOURCE_DIR}/src/cluster/tcp/frame.cpp)
target_include_directories(frame_decoder_fuzz PRIVATE ${CMAKE_CURRENT_SOURCE_DIR}/include)
target_compile_options(frame_decoder_fuzz PRIVATE -g ${TROUPE_FUZZ_FLAGS})
target_link_options(frame_decoder_fuzz PRIVATE ${TROUPE_FUZZ_FLAGS})
target_link_libraries(frame_decoder_fuzz PRIVATE troupe_warnings)
