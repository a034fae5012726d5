# libFuzzer target of the journals' row decoding, included by the top-level
# CMakeLists.txt when TROUPE_BUILD_FUZZ=ON (see troupe_add_fuzz there);
# scripts/fuzz runs it on src/persist/journal_rows_fuzz_corpus.
#
# journal_rows_fuzz: rows written straight into a real SqliteJournal's
# file, and PostgreSQL result sets built with libpq (no server), read back
# through the journals' decoders under ASan and UBSan. sqlite_journal.cpp
# and pg_support.cpp are compiled in with the fuzz flags; the rest of
# troupe::persist is linked. journal_rows_seeds writes its seed corpus.

troupe_add_fuzz(journal_rows_fuzz
  SOURCES ${CMAKE_CURRENT_SOURCE_DIR}/src/persist/journal_rows_fuzz.cpp
          ${CMAKE_CURRENT_SOURCE_DIR}/src/persist/sqlite/sqlite_journal.cpp
          ${CMAKE_CURRENT_SOURCE_DIR}/src/persist/postgres/pg_support.cpp
  LIBS troupe::persist SQLite::SQLite3 PkgConfig::LIBPQ)
