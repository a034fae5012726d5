# libFuzzer target of the cluster layer's message codecs, included by the
# top-level CMakeLists.txt (see troupe_add_fuzz there); scripts/fuzz runs
# it on src/cluster/wire_fuzz_corpus.
#
# wire_codecs_fuzz: the message codecs troupe registers, those of the
# cluster lock (sharding/cluster_lock_wire.hpp), the cluster job service
# (sharding/cluster_jobs_wire.hpp) and the node's load report
# (src/node/load_wire.hpp), and the envelope of the remoting frames that
# carry them (remote_envelope.hpp), on arbitrary bytes, under ASan and
# UBSan; links troupe::core for the reply targets. wire_fuzz_seeds writes
# its seeds.

troupe_add_fuzz(wire_codecs_fuzz
  SOURCES ${CMAKE_CURRENT_SOURCE_DIR}/src/cluster/wire_codecs_fuzz.cpp
  CORPUS src/cluster/wire_fuzz_corpus
  LIBS troupe::core)
troupe_add_fuzz_seeds(wire_fuzz_seeds
  SOURCES ${CMAKE_CURRENT_SOURCE_DIR}/src/cluster/wire_fuzz_seeds_main.cpp
  LIBS troupe::core)
