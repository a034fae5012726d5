#pragma once
// The tests' way to run troupectl: its command line in-process, with what
// it printed and its exit code.

#include <sstream>
#include <string>
#include <vector>

#include "commands.hpp"

namespace troupe::ctl::test {

struct Ran {
  int code = -1;
  std::string out;
  std::string err;
};

inline Ran troupectl(std::vector<std::string> args) {
  std::vector<const char*> argv{"troupectl"};
  for (const auto& a : args) argv.push_back(a.c_str());
  std::ostringstream out, err;
  Ran r;
  r.code = run_command_line(static_cast<int>(argv.size()), argv.data(), out, err);
  r.out = out.str();
  r.err = err.str();
  return r;
}

}  // namespace troupe::ctl::test
