// Starts or stops the PostgreSQL server the persist tests share under ctest
// (the troupe_postgres fixture in CMakeLists.txt): one server per test run
// instead of one per test process.
//   postgres_test_server start <state file>   writes "<conninfo>\n<dir>\n"
//   postgres_test_server stop <state file>    stops it, removes its directory

#include <cstdio>
#include <exception>
#include <fstream>
#include <string>

#include "postgres_test_server.hpp"

int main(int argc, char** argv) {
  if (argc != 3) {
    std::fprintf(stderr, "usage: %s start|stop <state file>\n", argv[0]);
    return 2;
  }
  const std::string cmd = argv[1], state = argv[2];
  try {
    if (cmd == "start") {
      troupe::test::PostgresTestServer server;
      std::ofstream out(state, std::ios::trunc);
      out << server.conninfo() << '\n' << server.dir() << '\n';
      if (!out.flush()) throw std::runtime_error("cannot write " + state);
      server.keep_running();
      return 0;
    }
    if (cmd == "stop") {
      std::ifstream in(state);
      std::string conninfo, dir;
      if (std::getline(in, conninfo) && std::getline(in, dir) && !dir.empty())
        troupe::test::PostgresTestServer::stop_and_remove(dir);
      std::remove(state.c_str());
      return 0;
    }
  } catch (const std::exception& e) {
    std::fprintf(stderr, "%s\n", e.what());
    return 1;
  }
  std::fprintf(stderr, "unknown command %s\n", cmd.c_str());
  return 2;
}
