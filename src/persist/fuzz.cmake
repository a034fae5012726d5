# libFuzzer target of the journals' row decoding, included by the top-level
# CMakeLists.txt (see troupe_add_fuzz there); scripts/fuzz runs it on
# src/persist/journal_rows_fuzz_corpus.
#
# journal_rows_fuzz: rows written straight into a real SqliteJournal's
# file, PostgreSQL result sets built with libpq (no server), and the
# durable job service's events, read back through their decoders under
# ASan and UBSan. sqlite_journal.cpp, pg_support.cpp and job_journal.cpp
# are compiled in with the fuzz flags; the rest of troupe::persist and
# troupe::patterns is linked. journal_rows_fuzz_seeds.py writes its seeds.

troupe_add_fuzz(journal_rows_fuzz
  SOURCES ${CMAKE_CURRENT_SOURCE_DIR}/src/persist/journal_rows_fuzz.cpp
          ${CMAKE_CURRENT_SOURCE_DIR}/src/persist/sqlite/sqlite_journal.cpp
          ${CMAKE_CURRENT_SOURCE_DIR}/src/persist/postgres/pg_support.cpp
          ${CMAKE_CURRENT_SOURCE_DIR}/src/patterns/job_journal.cpp
  CORPUS src/persist/journal_rows_fuzz_corpus
  LIBS troupe::patterns troupe::persist SQLite::SQLite3 PkgConfig::LIBPQ)
