# libFuzzer target of the journals' row decoding, included by the top-level
# CMakeLists.txt (see troupe_add_fuzz there); scripts/fuzz runs it on
# src/persist/journal_rows_fuzz_corpus.
#
# journal_rows_fuzz: rows written straight into a real SqliteJournal's
# file, PostgreSQL result sets built with libpq (no server), and the
# durable job service's events, read back through their decoders under
# ASan and UBSan. The journals' sources it needs and the job service's row
# reader (job_rows.cpp) are compiled in with the fuzz flags, so the fuzz
# build compiles neither library whole. journal_rows_fuzz_seeds.py writes
# its seeds.

troupe_add_fuzz(journal_rows_fuzz
  SOURCES ${CMAKE_CURRENT_SOURCE_DIR}/src/persist/journal_rows_fuzz.cpp
          ${CMAKE_CURRENT_SOURCE_DIR}/src/persist/sqlite/sqlite_journal.cpp
          ${CMAKE_CURRENT_SOURCE_DIR}/src/persist/sqlite/sqlite_outbox.cpp
          ${CMAKE_CURRENT_SOURCE_DIR}/src/persist/sqlite/sqlite_reader.cpp
          ${CMAKE_CURRENT_SOURCE_DIR}/src/persist/sqlite/sqlite_schema.cpp
          ${CMAKE_CURRENT_SOURCE_DIR}/src/persist/sqlite/sqlite_support.cpp
          ${CMAKE_CURRENT_SOURCE_DIR}/src/persist/sqlite/sqlite_writer.cpp
          ${CMAKE_CURRENT_SOURCE_DIR}/src/persist/postgres/pg_outbox.cpp
          ${CMAKE_CURRENT_SOURCE_DIR}/src/persist/postgres/pg_query.cpp
          ${CMAKE_CURRENT_SOURCE_DIR}/src/persist/postgres/pg_support.cpp
          ${CMAKE_CURRENT_SOURCE_DIR}/src/persist/event_query.cpp
          ${CMAKE_CURRENT_SOURCE_DIR}/src/persist/journal.cpp
          ${CMAKE_CURRENT_SOURCE_DIR}/src/persist/outbox.cpp
          ${CMAKE_CURRENT_SOURCE_DIR}/src/persist/journal_engine.cpp
          ${CMAKE_CURRENT_SOURCE_DIR}/src/patterns/job_rows.cpp
  CORPUS src/persist/journal_rows_fuzz_corpus
  LIBS troupe::core SQLite::SQLite3 PkgConfig::LIBPQ)
