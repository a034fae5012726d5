// troupectl: the command line of a running troupe node (doc/troupectl.md).
// Everything but the process boundary lives in commands.cpp and views.cpp.

#include <iostream>

#include "commands.hpp"

int main(int argc, char** argv) { return troupe::ctl::run_command_line(argc, argv, std::cout, std::cerr); }
