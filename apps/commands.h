// Subcommand registry of the jtok binary. Each apps/cmd_<name>.cpp registers itself with
//   static const bool registered = jtok::register_command({"name", "one-line help", setup});
// where setup(CLI::App* sub) adds the options and the callback. Keeps each command in its own file,
// its names in namespace cmd_<name> (the jtok target is built as one unity file: CMakeLists.txt).
#pragma once
#include <CLI/CLI.hpp>
#include <functional>
#include <string>
#include <vector>

namespace jtok {

struct Command {
  std::string name;
  std::string help;
  std::function<void(CLI::App*)> setup;
};

inline std::vector<Command>& command_registry() {
  static std::vector<Command> commands;
  return commands;
}

inline bool register_command(Command c) {
  command_registry().push_back(std::move(c));
  return true;
}

// The command line as typed, for echoing at the start of a run.
std::string command_line_string();

}  // namespace jtok
