# libFuzzer target of the node's configuration, included by the top-level
# CMakeLists.txt (see troupe_add_fuzz there); scripts/fuzz configures
# build/fuzz and runs it on src/node/config_fuzz_corpus.
#
# config_fuzz: NodeConfig::parse on arbitrary text, under ASan and UBSan.
# It links config.cpp (with config_workers.cpp, config_log.cpp and config_admin.cpp), the error type, the log level names
# and the node-id and app-version rules alone: no node, socket or thread.

troupe_add_fuzz(config_fuzz
  SOURCES ${CMAKE_CURRENT_SOURCE_DIR}/src/node/config_fuzz.cpp
          ${CMAKE_CURRENT_SOURCE_DIR}/src/node/config.cpp
          ${CMAKE_CURRENT_SOURCE_DIR}/src/node/config_admin.cpp
          ${CMAKE_CURRENT_SOURCE_DIR}/src/node/config_log.cpp
          ${CMAKE_CURRENT_SOURCE_DIR}/src/node/config_workers.cpp
          ${CMAKE_CURRENT_SOURCE_DIR}/src/core/log_names.cpp
          ${CMAKE_CURRENT_SOURCE_DIR}/src/core/result.cpp
          ${CMAKE_CURRENT_SOURCE_DIR}/src/cluster/node_id.cpp
  CORPUS src/node/config_fuzz_corpus
  LIBS tomlplusplus::tomlplusplus)
