#include "serve/api_json.h"

namespace jtok {

using json = nlohmann::json;

json error_body(const ApiError& e) {
  return {{"error",
           {{"message", e.message},
            {"type", e.type},
            {"param", e.param.empty() ? json(nullptr) : json(e.param)},
            {"code", e.code.empty() ? json(nullptr) : json(e.code)}}}};
}

std::string dump_json(const json& j) { return j.dump(-1, ' ', false, json::error_handler_t::replace); }

std::string valid_utf8(const std::string& s) { return json::parse(dump_json(json(s))).get<std::string>(); }

}  // namespace jtok
