// Shared command-line plumbing of the commands that read configs and checkpoints.
#pragma once
#include <CLI/CLI.hpp>
#include <map>
#include <string>
#include <vector>

#include "model/config.h"

namespace jtok {

// Adds --<field> for every config field (strings; parsed by the field's type later) to `sub`.
// Returned map is filled by CLI11 when parsing.
std::map<std::string, std::string>& add_config_field_options(CLI::App* sub);
// "name=value" overrides from the --<field> options that were given, plus --set ones.
std::vector<std::string> collect_overrides(CLI::App* sub, const std::map<std::string, std::string>& fields,
                                           const std::vector<std::string>& sets);
// A checkpoint directory, or a run directory (then its newest complete checkpoint).
std::string resolve_checkpoint(const std::string& path);

}  // namespace jtok
