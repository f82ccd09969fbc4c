// A machine-readable run log: one JSON object per line.
#pragma once
#include <fstream>

#include <nlohmann/json.hpp>

namespace jtok {

// Appends one JSON object per line; flushed after each line so a kill loses at most the last.
// Never opened (other ranks than 0): writes go nowhere.
struct JsonlLog {
  std::ofstream out;
  // Text that is not valid UTF-8 (a sample cut inside a byte-level token's character) is written
  // with U+FFFD in place of the bad bytes: a log line never ends the run.
  void write(const nlohmann::json& j) {
    out << j.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace) << '\n';
    out.flush();
  }
};

}  // namespace jtok
