# libFuzzer target of the values the Redis coordinator reads, included by
# the top-level CMakeLists.txt (see troupe_add_fuzz there); scripts/fuzz
# runs it on src/cluster/redis/placement_fuzz_corpus.
#
# placement_values_fuzz: desired sets, desired-set URLs (the network
# layer's parser, linked from troupe::net) and Redis replies (assignments,
# member views) read through hiredis' RESP reader, under ASan and UBSan.
# The parsers' sources are compiled in with the fuzz flags; no socket,
# thread or Redis is involved.

troupe_add_fuzz(placement_values_fuzz
  SOURCES ${CMAKE_CURRENT_SOURCE_DIR}/src/cluster/redis/placement_values_fuzz.cpp
          ${CMAKE_CURRENT_SOURCE_DIR}/src/cluster/redis/redis_values.cpp
          ${CMAKE_CURRENT_SOURCE_DIR}/src/cluster/redis/redis_connection.cpp
          ${CMAKE_CURRENT_SOURCE_DIR}/src/cluster/redis/placement_source.cpp
          ${CMAKE_CURRENT_SOURCE_DIR}/src/cluster/node_id.cpp
  CORPUS src/cluster/redis/placement_fuzz_corpus
  LIBS troupe::net troupe::core PkgConfig::HIREDIS
  ASIO)
