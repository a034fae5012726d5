# The Redis coordinator's tests start their own redis-server (each test its
# own, on a free port in a temp directory: tests stop and restart it).
# Tell them where the binary is; RedisTestServer falls back to PATH.
find_program(TROUPE_REDIS_SERVER_BIN redis-server PATHS /usr/bin /usr/local/bin)
if(TROUPE_REDIS_SERVER_BIN)
  list(APPEND TROUPE_CLUSTER_TEST_ENV "TROUPE_REDIS_SERVER=${TROUPE_REDIS_SERVER_BIN}")
endif()
