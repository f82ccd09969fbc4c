#include "serve/chat_template.h"

#include <ctime>
#include <filesystem>

#include <nlohmann/json.hpp>

#include "core/atomic_file.h"
#include "core/error.h"

namespace jtok {

const char* chat_family_name(ChatFamily f) {
  switch (f) {
    case ChatFamily::chatml: return "chatml";
    case ChatFamily::qwen3: return "qwen3";
    case ChatFamily::llama3: return "llama3";
    case ChatFamily::llama31: return "llama3.1";
  }
  return "?";
}

ChatFamily parse_chat_family(const std::string& name) {
  if (name == "chatml") return ChatFamily::chatml;
  if (name == "qwen3") return ChatFamily::qwen3;
  if (name == "llama3") return ChatFamily::llama3;
  if (name == "llama3.1") return ChatFamily::llama31;
  fail("unknown chat template '", name, "' (known: chatml, qwen3, llama3, llama3.1)");
}

std::string ChatTemplate::end_of_turn() const {
  return family == ChatFamily::llama3 || family == ChatFamily::llama31 ? "<|eot_id|>" : "<|im_end|>";
}

std::optional<ChatFamily> detect_chat_family(const std::string& jinja) {
  const auto has = [&](const char* s) { return jinja.find(s) != std::string::npos; };
  if (has("<|im_start|>")) return has("<think>") || has("enable_thinking") ? ChatFamily::qwen3 : ChatFamily::chatml;
  // Llama 3.1 and later: a system turn with a dated header ("Cutting Knowledge Date") always.
  if (has("<|start_header_id|>")) return has("Cutting Knowledge Date") ? ChatFamily::llama31 : ChatFamily::llama3;
  return std::nullopt;
}

namespace {

// Llama 3.1's date rule, from the template's text: strftime_now (3.2: today, "" here), else the
// literal its `set date_string = "..."` gives (3.1, 3.3: "26 Jul 2024"); nullopt when it has neither.
std::optional<std::string> llama31_date(const std::string& jinja) {
  if (jinja.find("strftime_now") != std::string::npos) return "";
  const std::string key = "set date_string = \"";
  const size_t at = jinja.find(key);
  if (at == std::string::npos) return std::nullopt;
  const size_t end = jinja.find('"', at + key.size());
  if (end == std::string::npos) return std::nullopt;
  return jinja.substr(at + key.size(), end - at - key.size());
}

}  // namespace

ChatTemplate load_chat_template(const std::string& tokenizer_dir, const std::string& override_family) {
  const std::string path = (std::filesystem::path(tokenizer_dir) / "tokenizer_config.json").string();
  ChatTemplate t;
  nlohmann::json cfg = nlohmann::json::object();
  if (std::filesystem::exists(path)) {
    try {
      cfg = nlohmann::json::parse(read_file(path));
    } catch (const nlohmann::json::exception& e) {
      fail("chat template: ", path, " is not valid JSON: ", e.what());
    }
  }
  if (cfg.contains("bos_token") && cfg["bos_token"].is_string()) t.bos = cfg["bos_token"].get<std::string>();
  if (!override_family.empty()) {
    t.family = parse_chat_family(override_family);
    return t;
  }
  if (!cfg.contains("chat_template") || !cfg["chat_template"].is_string())
    fail("chat template: ", path, " has no chat_template (a base model?); name one with --chat-template chatml|qwen3|llama3|llama3.1");
  const std::string jinja = cfg["chat_template"].get<std::string>();
  const std::optional<ChatFamily> f = detect_chat_family(jinja);
  const std::optional<std::string> date = f == ChatFamily::llama31 ? llama31_date(jinja) : std::optional<std::string>("");
  if (!f || !date)
    fail("chat template: the template of ", path, " is not one jtok renders (chatml, qwen3, llama3, llama3.1",
         f ? ": a dated Llama header without a date_string or strftime_now" : "", "); it begins '",
         jinja.substr(0, jinja.find('\n')).substr(0, 120), "'; name a family with --chat-template");
  t.family = *f;
  if (t.family == ChatFamily::llama31) t.date = *date;
  return t;
}

std::vector<ChatMessage> parse_chat_messages(const nlohmann::json& j) {
  if (!j.is_array()) fail("messages: expected a list of messages, got ", j.type_name());
  std::vector<ChatMessage> out;
  for (size_t i = 0; i < j.size(); ++i) {
    const nlohmann::json& m = j[i];
    const std::string at = "messages[" + std::to_string(i) + "]";
    if (!m.is_object()) fail(at, ": expected an object with role and content, got ", m.type_name());
    if (!m.contains("role") || !m["role"].is_string()) fail(at, ".role: expected a string");
    ChatMessage cm{m["role"].get<std::string>(), ""};
    const nlohmann::json* c = m.contains("content") ? &m["content"] : nullptr;
    if (!c || !(c->is_string() || c->is_array())) fail(at, ".content: expected a string or a list of text parts");
    if (c->is_string()) cm.content = c->get<std::string>();
    for (size_t k = 0; c->is_array() && k < c->size(); ++k) {
      const nlohmann::json& part = (*c)[k];
      if (!part.is_object() || part.value("type", "") != "text" || !part.contains("text") || !part["text"].is_string())
        fail(at, ".content[", k, "]: only {\"type\": \"text\", \"text\": ...} parts are taken");
      cm.content += part["text"].get<std::string>();
    }
    out.push_back(std::move(cm));
  }
  return out;
}

namespace {

std::string strip_chars(const std::string& s, const char* chars, bool left, bool right) {
  size_t a = 0, b = s.size();
  if (left) a = s.find_first_not_of(chars);
  if (a == std::string::npos) return "";
  if (right) b = s.find_last_not_of(chars) + 1;
  return s.substr(a, b - a);
}

void check_roles(const std::vector<ChatMessage>& msgs, bool system_anywhere) {
  if (msgs.empty()) fail("chat: messages is empty");
  for (size_t i = 0; i < msgs.size(); ++i) {
    const std::string& r = msgs[i].role;
    if (r != "system" && r != "user" && r != "assistant")
      fail("chat: messages[", i, "].role '", r, "' is not one of system, user, assistant");
    if (r == "system" && i > 0 && !system_anywhere) fail("chat: messages[", i, "] is a system message after the first");
  }
}

std::string render_chatml(const std::vector<ChatMessage>& msgs, bool gen) {
  std::string out;
  for (const auto& m : msgs) out += "<|im_start|>" + m.role + "\n" + m.content + "<|im_end|>\n";
  if (gen) out += "<|im_start|>assistant\n";
  return out;
}

// Qwen3's template: an assistant turn after the last user message keeps its reasoning in a
// <think> block (always when it is the last message); earlier turns keep only the answer.
std::string qwen3_assistant(const std::string& content, bool after_last_query, bool last) {
  std::string answer = content, reasoning;
  if (const size_t end = content.find("</think>"); end != std::string::npos) {
    answer = strip_chars(content.substr(content.rfind("</think>") + 8), "\n", true, false);
    std::string before = strip_chars(content.substr(0, end), "\n", false, true);
    if (const size_t open = before.rfind("<think>"); open != std::string::npos) before = before.substr(open + 7);
    reasoning = strip_chars(before, "\n", true, false);
  }
  if (after_last_query && (last || !reasoning.empty()))
    return "<|im_start|>assistant\n<think>\n" + strip_chars(reasoning, "\n", true, true) + "\n</think>\n\n" +
           strip_chars(answer, "\n", true, false) + "<|im_end|>\n";
  return "<|im_start|>assistant\n" + answer + "<|im_end|>\n";
}

std::string render_qwen3(const std::vector<ChatMessage>& msgs, bool gen, bool thinking) {
  std::string out;
  if (msgs[0].role == "system") out += "<|im_start|>system\n" + msgs[0].content + "<|im_end|>\n";
  size_t last_query = msgs.size() - 1;
  for (size_t i = msgs.size(); i-- > 0;)
    if (msgs[i].role == "user") { last_query = i; break; }
  for (size_t i = 0; i < msgs.size(); ++i) {
    const ChatMessage& m = msgs[i];
    if (m.role == "user" || (m.role == "system" && i > 0))
      out += "<|im_start|>" + m.role + "\n" + m.content + "<|im_end|>\n";
    else if (m.role == "assistant")
      out += qwen3_assistant(m.content, i > last_query, i + 1 == msgs.size());
  }
  if (gen) out += thinking ? "<|im_start|>assistant\n" : "<|im_start|>assistant\n<think>\n\n</think>\n\n";
  return out;
}

const char* const kSpace = " \t\n\r\v\f";

std::string llama3_turn(const std::string& role, const std::string& content) {
  return "<|start_header_id|>" + role + "<|end_header_id|>\n\n" + strip_chars(content, kSpace, true, true) + "<|eot_id|>";
}

// Llama 3 Instruct's template adds the assistant header whether or not one is asked for.
std::string render_llama3(const std::vector<ChatMessage>& msgs, const std::string& bos) {
  std::string out = bos;
  for (const auto& m : msgs) out += llama3_turn(m.role, m.content);
  return out + "<|start_header_id|>assistant<|end_header_id|>\n\n";
}

// Today as Python's strftime("%d %b %Y") in the C locale, local time ("25 Nov 2026").
std::string today_date() {
  const std::time_t now = std::time(nullptr);
  std::tm tm{};
  localtime_r(&now, &tm);
  char buf[32];
  std::strftime(buf, sizeof buf, "%d %b %Y", &tm);
  return buf;
}

// Llama 3.1 / 3.2 / 3.3 Instruct (no tools): the first message, when a system one, goes into the
// dated system turn that is always there; later system messages are ordinary turns.
std::string render_llama31(const std::vector<ChatMessage>& msgs, const ChatTemplate& t, bool gen) {
  const bool sys = msgs[0].role == "system";
  std::string out = t.bos + "<|start_header_id|>system<|end_header_id|>\n\nCutting Knowledge Date: December 2023\nToday Date: " +
                    (t.date.empty() ? today_date() : t.date) + "\n\n" +
                    (sys ? strip_chars(msgs[0].content, kSpace, true, true) : std::string()) + "<|eot_id|>";
  for (size_t i = sys ? 1 : 0; i < msgs.size(); ++i) out += llama3_turn(msgs[i].role, msgs[i].content);
  if (gen) out += "<|start_header_id|>assistant<|end_header_id|>\n\n";
  return out;
}

}  // namespace

ChatTemplateArgs parse_chat_template_args(const nlohmann::json& kwargs, const std::string& what) {
  ChatTemplateArgs a;
  if (kwargs.is_null()) return a;
  if (!kwargs.is_object()) fail(what, " must be an object of template variables, got ", kwargs.dump());
  if (const auto it = kwargs.find("enable_thinking"); it != kwargs.end() && !it->is_null()) {
    if (!it->is_boolean()) fail(what, ".enable_thinking must be a boolean, got ", it->dump());
    a.enable_thinking = it->get<bool>();
  }
  return a;
}

std::string render_chat(const ChatTemplate& t, const std::vector<ChatMessage>& messages, bool add_generation_prompt,
                        const ChatTemplateArgs& args) {
  check_roles(messages, t.family == ChatFamily::qwen3 || t.family == ChatFamily::llama31);
  switch (t.family) {
    case ChatFamily::chatml: return render_chatml(messages, add_generation_prompt);
    case ChatFamily::qwen3: return render_qwen3(messages, add_generation_prompt, args.enable_thinking);
    case ChatFamily::llama3: return render_llama3(messages, t.bos);
    case ChatFamily::llama31: return render_llama31(messages, t, add_generation_prompt);
  }
  return "";
}

}  // namespace jtok
