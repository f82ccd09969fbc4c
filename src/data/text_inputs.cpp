#include "data/text_inputs.h"

#include <fstream>
#include <sstream>

#include "core/error.h"

namespace jtok {

std::string read_input_file(const std::string& path, const std::string& what) {
  std::ifstream f(path, std::ios::binary);
  if (!f) fail(what, ": cannot open input ", path);
  std::ostringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

std::vector<std::string> read_path_list(const std::string& list_file, const std::string& what) {
  std::vector<std::string> paths;
  std::istringstream in(read_input_file(list_file, what));
  for (std::string line; std::getline(in, line);)
    if (!line.empty()) paths.push_back(line);
  return paths;
}

}  // namespace jtok
