// Text input files of the commands that read a corpus (`jtok prepare`, `jtok tokenizer train`):
// whole files as bytes, and --list files of paths. Errors name the command (`what`) and the path.
#pragma once
#include <string>
#include <vector>

namespace jtok {

// The whole file, bytes as they are; fails "WHAT: cannot open input PATH".
std::string read_input_file(const std::string& path, const std::string& what);

// The non-empty lines of list_file: one input path each.
std::vector<std::string> read_path_list(const std::string& list_file, const std::string& what);

}  // namespace jtok
