// The official OpenAI SDK (npm openai@7.55.0, from .cache/npm) against `jtok serve`: completions
// (whole and streamed) equal the expected text, models list, and the SDK's typed errors for an
// unknown model (404), a wrong key (401) and a bad parameter (400).
// Usage: node serve_openai_client.mjs ROOT PORT API_KEY PROMPT EXPECTED_TEXT_JSON MAX_TOKENS
import { createRequire } from 'node:module';
import assert from 'node:assert/strict';
import path from 'node:path';

const [root, port, key, prompt, expectedJson, maxTokens] = process.argv.slice(2);
const require = createRequire(import.meta.url);
const OpenAI = require(path.join(root, '.cache/npm/openai-7.55.0'));
const expected = JSON.parse(expectedJson);
const baseURL = `http://127.0.0.1:${port}/v1`;
const client = new OpenAI({ baseURL, apiKey: key, maxRetries: 0, timeout: 60000 });
const req = { model: 'jtok', prompt, max_tokens: Number(maxTokens), temperature: 0 };

const whole = await client.completions.create(req);
assert.equal(whole.object, 'text_completion');
assert.equal(whole.choices.length, 1);
assert.equal(whole.choices[0].text, expected, 'non-streamed text');
assert.ok(['length', 'stop'].includes(whole.choices[0].finish_reason));
assert.equal(whole.usage.total_tokens, whole.usage.prompt_tokens + whole.usage.completion_tokens);

const stream = await client.completions.create({ ...req, stream: true, stream_options: { include_usage: true } });
let text = '', finish = null, usage = null, chunks = 0;
for await (const chunk of stream) {
  chunks++;
  if (chunk.choices[0]) { text += chunk.choices[0].text; finish = chunk.choices[0].finish_reason ?? finish; }
  if (chunk.usage) usage = chunk.usage;
}
assert.equal(text, expected, 'streamed text');
assert.equal(finish, whole.choices[0].finish_reason);
assert.deepEqual(usage, whole.usage);
assert.ok(chunks >= 2);

const models = await client.models.list();
assert.deepEqual(models.data.map((m) => m.id), ['jtok']);

async function expectError(promise, Cls, status) {
  try { await promise; } catch (e) {
    assert.ok(e instanceof Cls, `expected ${Cls.name}, got ${e.constructor.name}: ${e.message}`);
    assert.equal(e.status, status);
    assert.ok(e.error && typeof e.error.message === 'string' && e.error.message.length > 0, 'error body');
    return;
  }
  assert.fail(`expected ${Cls.name}`);
}
await expectError(client.completions.create({ ...req, model: 'gpt-4' }), OpenAI.NotFoundError, 404);
await expectError(client.completions.create({ ...req, max_tokens: 0 }), OpenAI.BadRequestError, 400);
await expectError(new OpenAI({ baseURL, apiKey: 'wrong', maxRetries: 0 }).completions.create(req),
                  OpenAI.AuthenticationError, 401);
// Still serving after the errors.
assert.equal((await client.completions.create(req)).choices[0].text, expected);
console.log(`ok: openai SDK ${require(path.join(root, '.cache/npm/openai-7.55.0/package.json')).version}: completions, streaming (${chunks} chunks), models, typed 4xx errors`);
