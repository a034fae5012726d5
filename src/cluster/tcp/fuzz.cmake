# libFuzzer targets of the TCP transport, included by the top-level
# CMakeLists.txt when TROUPE_BUILD_FUZZ=ON and the compiler links
# libFuzzer (it sets TROUPE_FUZZ_FLAGS); scripts/fuzz installs clang and
# its libFuzzer runtime, configures build/fuzz and runs the targets.
#
# frame_decoder_fuzz: the frame decoder on arbitrary bytes, under ASan and
# UBSan. It links frame.cpp alone, so no socket or thread code is involved.

add_executable(frame_decoder_fuzz
  ${CMAKE_CURRENT_SOURCE_DIR}/src/cluster/tcp/frame_decoder_fuzz.cpp
  ${CMAKE_CURRENT_SOURCE_DIR}/src/cluster/tcp/frame.cpp)
target_include_directories(frame_decoder_fuzz PRIVATE ${CMAKE_CURRENT_SOURCE_DIR}/include)
target_compile_options(frame_decoder_fuzz PRIVATE -g ${TROUPE_FUZZ_FLAGS})
target_link_options(frame_decoder_fuzz PRIVATE ${TROUPE_FUZZ_FLAGS})
target_link_libraries(frame_decoder_fuzz PRIVATE troupe_warnings)
