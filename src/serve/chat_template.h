// Chat templates: a conversation (system / user / assistant messages) rendered as the prompt text a
// chat model was trained on. Hugging Face ships each model's template as Jinja in
// tokenizer_config.json; no C++ Jinja engine is packaged for Debian, so the template families of
// the models jtok imports are recognised from the template's text and rendered here, each checked
// against Hugging Face's own Jinja (tests/test_chat_template.sh):
//   chatml  <|im_start|>ROLE\nCONTENT<|im_end|>\n ... <|im_start|>assistant\n   (Qwen2 style)
//   qwen3   ChatML with Qwen3's thinking: earlier turns' <think> blocks dropped, and with
//           enable_thinking false an empty <think>\n\n</think>\n\n after the generation prompt
//   llama3  BOS<|start_header_id|>ROLE<|end_header_id|>\n\nCONTENT(trimmed)<|eot_id|> ...
//           <|start_header_id|>assistant<|end_header_id|>\n\n   (Llama 3 Instruct)
//   llama3.1  BOS, a system turn always, headed "Cutting Knowledge Date: December 2023\nToday Date:
//           DATE\n\n" before the system message (trimmed; none: empty), then Llama 3's turns
//           (Llama 3.1 / 3.3 Instruct: the template's fixed date; 3.2: today's, strftime_now)
#pragma once
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json_fwd.hpp>

namespace jtok {

enum class ChatFamily { chatml, qwen3, llama3, llama31 };
const char* chat_family_name(ChatFamily f);
// "chatml" | "qwen3" | "llama3" | "llama3.1", else a jtok::Error naming the value and the known ones.
ChatFamily parse_chat_family(const std::string& name);

struct ChatMessage {
  std::string role;     // "system", "user" or "assistant"
  std::string content;
};

struct ChatTemplate {
  ChatFamily family = ChatFamily::chatml;
  std::string bos;      // llama3, llama3.1: the text of the BOS token (tokenizer_config.json's bos_token)
  // llama3.1: the system header's "Today Date" (the template's date_string, "26 Jul 2024" in 3.1's);
  // empty: today's date at each rendering ("%d %b %Y", local time), as 3.2's strftime_now
  std::string date = "26 Jul 2024";
  std::string end_of_turn() const;  // "<|im_end|>" or "<|eot_id|>": generation stops there too
};

// The family a Jinja template's text belongs to, or nullopt when it is none of them.
std::optional<ChatFamily> detect_chat_family(const std::string& jinja);
// The chat template of a tokenizer directory's tokenizer_config.json (its chat_template, bos_token);
// `override_family` ("" = detect) names the family instead. Errors: no file or no template (naming
// the file and the --chat-template flag), an unrecognised template (showing its first line).
ChatTemplate load_chat_template(const std::string& tokenizer_dir, const std::string& override_family = "");

// An OpenAI-style messages array: objects with a string "role" and a "content" that is a string
// or a list of {"type": "text", "text": ...} parts (joined). Errors name the index and field
// ("messages[2].content: ..."); roles are checked by render_chat.
std::vector<ChatMessage> parse_chat_messages(const nlohmann::json& messages);

// The template variables a caller may set beside the messages (a request's chat_template_kwargs,
// `jtok chat-template --template-kwargs`). enable_thinking (qwen3 only): false adds the empty think
// block, as Qwen3's `enable_thinking is false` test.
struct ChatTemplateArgs {
  bool enable_thinking = true;
};
// The arguments of a JSON object of template variables (null: the defaults). Variables no family
// reads are ignored, as Jinja ignores variables a template does not use. Errors name the field
// `what` (e.g. "chat_template_kwargs"): not an object, enable_thinking not a boolean.
ChatTemplateArgs parse_chat_template_args(const nlohmann::json& kwargs, const std::string& what);

// The prompt text of messages (roles checked: system, user, assistant; a system message only
// first, except in qwen3 and llama3.1). add_generation_prompt: end with the assistant's header.
std::string render_chat(const ChatTemplate& t, const std::vector<ChatMessage>& messages, bool add_generation_prompt = true,
                        const ChatTemplateArgs& args = {});

}  // namespace jtok
