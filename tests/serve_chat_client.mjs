// The official OpenAI SDK (npm openai@7.55.0) against `jtok serve`'s /v1/chat/completions:
//  1. a conversation's reply (greedy) equals /v1/completions on the prompt `jtok chat-template`
//     renders for it (text and prompt token count): the server renders with the model's template;
//  2. streamed: the first delta carries the role, the deltas make up the whole reply, the last
//     choice chunk its finish_reason, and with include_usage a final chunk of no choices the usage;
//  3. n = 3 with a seed: choice i equals a single request with seed + i; max_completion_tokens holds;
//  3b. logprobs: true with top_logprobs 3, whole and streamed: choices[0].logprobs.content equals
//     /v1/completions' logprobs (logprobs 3) of the rendered prompt token by token (text, log-prob,
//     bytes, the top 3 with theirs), streamed equals whole;
//  4. bad input: each a 400 with the OpenAI error body naming the field, and the server still serves;
//  5. a server without a chat template answers 400 (code no_chat_template) naming --chat-template.
// Usage: node serve_chat_client.mjs ROOT PORT PORT_NO_TEMPLATE MESSAGES_JSON RENDERED_TXT
import { createRequire } from 'node:module';
import assert from 'node:assert/strict';
import fs from 'node:fs';
import path from 'node:path';

const [root, port, portNone, messagesPath, renderedPath] = process.argv.slice(2);
const require = createRequire(import.meta.url);
const OpenAI = require(path.join(root, '.cache/npm/openai-7.55.0'));
const client = new OpenAI({ baseURL: `http://127.0.0.1:${port}/v1`, apiKey: 'none', maxRetries: 0, timeout: 60000 });
const messages = JSON.parse(fs.readFileSync(messagesPath, 'utf8'));
const rendered = fs.readFileSync(renderedPath, 'utf8');

// 1. The reply equals a completion of the rendered prompt.
const r1 = await client.chat.completions.create({ model: 'jtok', messages, temperature: 0, max_tokens: 12 });
assert.equal(r1.object, 'chat.completion');
assert.ok(r1.id.startsWith('chatcmpl-'));
assert.equal(r1.choices.length, 1);
assert.equal(r1.choices[0].message.role, 'assistant');
const c1 = await client.completions.create({ model: 'jtok', prompt: rendered, temperature: 0, max_tokens: 12 });
assert.equal(r1.choices[0].message.content, c1.choices[0].text, 'chat reply = completion of the rendered prompt');
assert.equal(r1.choices[0].finish_reason, c1.choices[0].finish_reason);
// The token counts; prompt_tokens_details.cached_tokens is what prefix reuse found stored (the
// completion reuses the chat request's blocks: the same prompt).
const counts = (u) => ({ prompt: u.prompt_tokens, completion: u.completion_tokens, total: u.total_tokens });
assert.deepEqual(counts(r1.usage), counts(c1.usage));
assert.equal(r1.usage.prompt_tokens_details.cached_tokens, 0, 'the first request reuses nothing');
const block = 64;  // the server's default --prefix-block
assert.equal(c1.usage.prompt_tokens_details.cached_tokens, block * Math.floor((r1.usage.prompt_tokens - 1) / block));
console.log(`ok: chat reply = completion of the rendered prompt (${r1.usage.prompt_tokens} prompt tokens): ${JSON.stringify(r1.choices[0].message.content)}`);

// 2. Streamed.
const stream = await client.chat.completions.create({ model: 'jtok', messages, temperature: 0, max_tokens: 12, stream: true,
                                                      stream_options: { include_usage: true } });
let text = '', first = true, finish = null, usage = null, chunks = 0;
for await (const ch of stream) {
  assert.equal(ch.object, 'chat.completion.chunk');
  chunks++;
  if (ch.usage) { assert.equal(ch.choices.length, 0, 'the usage chunk has no choices'); usage = ch.usage; continue; }
  const c = ch.choices[0];
  if (first) { assert.equal(c.delta.role, 'assistant', 'the first delta carries the role'); first = false; }
  if (c.delta.content) text += c.delta.content;
  if (c.finish_reason) finish = c.finish_reason;
}
assert.equal(text, r1.choices[0].message.content, 'streamed deltas = the whole reply');
assert.equal(finish, r1.choices[0].finish_reason);
assert.deepEqual(counts(usage), counts(r1.usage));
console.log(`ok: streamed reply identical in ${chunks} chunks, role first, usage last`);

// 3. n choices, each a single request with seed + i; max_completion_tokens.
const multi = await client.chat.completions.create({ model: 'jtok', messages, n: 3, seed: 7, temperature: 1, max_tokens: 8 });
assert.equal(multi.choices.length, 3);
for (let i = 0; i < 3; i++) {
  const one = await client.chat.completions.create({ model: 'jtok', messages, seed: 7 + i, temperature: 1, max_tokens: 8 });
  assert.equal(multi.choices[i].index, i);
  assert.equal(multi.choices[i].message.content, one.choices[0].message.content, `choice ${i} = seed ${7 + i} alone`);
}
const short = await client.chat.completions.create({ model: 'jtok', messages, temperature: 0, max_completion_tokens: 3 });
assert.ok(short.usage.completion_tokens <= 3, `max_completion_tokens 3 gave ${short.usage.completion_tokens}`);
console.log('ok: n = 3 with seed 7 = single requests with seeds 7, 8, 9; max_completion_tokens holds');

// 3b. Chat log-probs against the completions endpoint's of the same rendered prompt.
const lpChat = await client.chat.completions.create({ model: 'jtok', messages, temperature: 0, max_tokens: 12,
                                                      logprobs: true, top_logprobs: 3 });
const lpComp = await client.completions.create({ model: 'jtok', prompt: rendered, temperature: 0, max_tokens: 12, logprobs: 3 });
const content = lpChat.choices[0].logprobs.content, legacy = lpComp.choices[0].logprobs;
assert.equal(lpChat.choices[0].message.content, lpComp.choices[0].text);
assert.equal(content.length, legacy.tokens.length, 'one entry per token');
assert.ok(content.length > 0);
const utf8 = (s) => [...Buffer.from(s, 'utf8')];
for (let k = 0; k < content.length; k++) {
  const e = content[k];
  assert.equal(e.token, legacy.tokens[k], `token ${k}`);
  assert.equal(e.logprob, legacy.token_logprobs[k], `token ${k}: log-prob`);
  if (!e.token.includes('\ufffd')) assert.deepEqual(e.bytes, utf8(e.token), `token ${k}: bytes`);
  assert.equal(e.top_logprobs.length, 3, `token ${k}: top 3`);
  for (let j = 0; j < 3; j++) {
    const t = e.top_logprobs[j];
    if (j > 0) assert.ok(t.logprob <= e.top_logprobs[j - 1].logprob, `token ${k}: most likely first`);
    if (!t.token.includes('\ufffd')) assert.deepEqual(t.bytes, utf8(t.token));
    if (t.token in legacy.top_logprobs[k] && !t.token.includes('\ufffd'))  // the legacy map keeps the likelier of equal texts
      assert.ok(legacy.top_logprobs[k][t.token] >= t.logprob, `token ${k}: top ${j}`);
  }
  assert.equal(e.top_logprobs[0].logprob, Math.max(...Object.values(legacy.top_logprobs[k])), `token ${k}: the most likely`);
}
const lpStream = await client.chat.completions.create({ model: 'jtok', messages, temperature: 0, max_tokens: 12,
                                                        logprobs: true, top_logprobs: 3, stream: true });
const streamed = [];
for await (const ch of lpStream) if (ch.choices[0]?.logprobs) streamed.push(...ch.choices[0].logprobs.content);
assert.deepEqual(streamed, content, 'streamed log-probs = whole');
const noLp = await client.chat.completions.create({ model: 'jtok', messages, temperature: 0, max_tokens: 4, logprobs: false });
assert.equal(noLp.choices[0].logprobs, null);
console.log(`ok: chat logprobs (${content.length} tokens, top 3) = /v1/completions logprobs 3 of the rendered prompt; streamed = whole`);

// 4. Bad input: 400 naming the field, and still serving.
async function expect400(body, param, what, base = client) {
  try {
    await base.chat.completions.create({ model: 'jtok', ...body });
  } catch (e) {
    assert.equal(e.status, 400, `${what}: status ${e.status}`);
    assert.equal(e.error?.param ?? e.param, param, `${what}: param`);
    return e.message;
  }
  assert.fail(`${what} was accepted`);
}
const bad = [
  [{ messages: { role: 'user', content: 'hi' } }, 'messages', 'messages that are not a list'],
  [{ messages: [{ role: 'wizard', content: 'hi' }] }, 'messages', 'an unknown role'],
  [{ messages: [{ role: 'user', content: 5 }] }, 'messages', 'content of the wrong type'],
  [{ messages: [] }, 'messages', 'no messages'],
  [{ messages, echo: true }, 'echo', 'echo with a chat request'],
  [{ messages, logprobs: 'yes' }, 'logprobs', 'logprobs not a boolean'],
  [{ messages, logprobs: true, top_logprobs: 21 }, 'top_logprobs', 'top_logprobs 21'],
  [{ messages, top_logprobs: 2 }, 'top_logprobs', 'top_logprobs without logprobs'],
  [{ messages, n: 9 }, 'n', 'n above --max-n'],
  [{ messages, max_tokens: 0 }, 'max_tokens', 'max_tokens 0'],
];
for (const [body, param, what] of bad) console.log(`ok: ${what}: 400: ${await expect400(body, param, what)}`);
const again = await client.chat.completions.create({ model: 'jtok', messages, temperature: 0, max_tokens: 12 });
assert.equal(again.choices[0].message.content, r1.choices[0].message.content, 'still serving, the same reply');

// 5. No template.
const none = new OpenAI({ baseURL: `http://127.0.0.1:${portNone}/v1`, apiKey: 'none', maxRetries: 0, timeout: 60000 });
const msg = await expect400({ messages }, 'messages', 'chat on a model without a template', none);
assert.ok(msg.includes('--chat-template'), msg);
const c2 = await none.completions.create({ model: 'jtok', prompt: rendered, temperature: 0, max_tokens: 12 });
assert.equal(c2.choices[0].text, c1.choices[0].text, 'its /v1/completions still serves');
console.log(`ok: no template: 400: ${msg}`);
console.log('PASS');
