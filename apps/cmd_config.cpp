// `jtok config`: prints the resolved configuration (file + overrides) as JSON.
#include <cstdio>
#include "commands.h"
#include "train/config.h"

namespace cmd_config {
void setup(CLI::App* sub) {
  static std::string path;
  static std::vector<std::string> sets;
  sub->add_option("--config", path, "config JSON file")->required();
  sub->add_option("--set", sets, "override a field: name=value (repeatable)");
  sub->callback([] {
    jtok::Config cfg = jtok::load_config(path, sets);
    std::printf("%s\n", jtok::to_json(cfg).dump(2).c_str());
  });
}
const bool registered = jtok::register_command({"config", "validate a config file and print it resolved", setup});
}  // namespace cmd_config
