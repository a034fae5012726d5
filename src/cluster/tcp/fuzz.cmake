# libFuzzer target of the TCP transport, included by the top-level
# CMakeLists.txt (see troupe_add_fuzz there); scripts/fuzz installs clang
# and its libFuzzer runtime, configures build/fuzz and runs the targets.
#
# frame_decoder_fuzz: the frame decoder on arbitrary bytes, under ASan and
# UBSan. It links frame.cpp alone, so no socket or thread code is involved.

troupe_add_fuzz(frame_decoder_fuzz
  SOURCES ${CMAKE_CURRENT_SOURCE_DIR}/src/cluster/tcp/frame_decoder_fuzz.cpp
          ${CMAKE_CURRENT_SOURCE_DIR}/src/cluster/tcp/frame.cpp
  CORPUS src/cluster/tcp/fuzz_corpus)
