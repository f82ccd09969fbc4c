// JSON helpers shared by the HTTP routes: the OpenAI error body and a dump that never throws.
#pragma once
#include <string>

#include <nlohmann/json.hpp>

#include "serve/completion_request.h"

namespace jtok {

// {"error": {"message", "type", "param", "code"}}, param and code null when empty.
nlohmann::json error_body(const ApiError& e);
// Compact JSON; invalid UTF-8 in strings (a token holding part of a character) becomes U+FFFD.
std::string dump_json(const nlohmann::json& j);
// s with every invalid UTF-8 sequence replaced by U+FFFD (what dump_json would write).
std::string valid_utf8(const std::string& s);

}  // namespace jtok
