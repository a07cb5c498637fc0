// Drives the front door with the official `openai` npm client, as an application would
// (npm_test.go runs it: node openai_client.cjs <base URL> <model>). Every check throws on a
// mismatch; the last line printed is "ok" when all passed.
'use strict';
const OpenAI = require('openai');
const assert = require('node:assert/strict');

const [base, model] = process.argv.slice(2);
const client = new OpenAI({ baseURL: base + '/v1', apiKey: 'sk-test', maxRetries: 0, timeout: 20000 });

async function expectError(what, promise, status, param, code) {
  try {
    await promise;
  } catch (e) {
    assert.ok(e instanceof OpenAI.APIError, `${what}: ${e}`);
    assert.equal(e.status, status, `${what}: status`);
    assert.equal(e.param ?? null, param, `${what}: param`);
    if (code) assert.equal(e.code, code, `${what}: code`);
    assert.ok(typeof e.message === 'string' && e.message.length > 0, `${what}: message`);
    return e;
  }
  throw new Error(`${what}: no error`);
}

async function main() {
  // Models: list and retrieve.
  const list = await client.models.list();
  const ids = list.data.map((m) => m.id);
  assert.ok(ids.includes(model), `models.list: ${ids}`);
  const m = await client.models.retrieve(model);
  assert.equal(m.id, model);
  assert.equal(m.object, 'model');
  await expectError('models.retrieve unknown', client.models.retrieve('no-such-model'), 404, 'model', 'model_not_found');

  // Completions with a batch of prompts: one choice per prompt, in order, usage summed.
  const batch = await client.completions.create({ model, prompt: ['The quick brown fox', 'jumps over'], max_tokens: 3 });
  assert.equal(batch.choices.length, 2, 'batch choices');
  assert.deepEqual(batch.choices.map((c) => c.index), [0, 1]);
  assert.ok(batch.choices.every((c) => c.text.length > 0), 'batch texts');
  assert.equal(batch.usage.completion_tokens, 6, 'batch usage');
  const ids2 = await client.completions.create({ model, prompt: [[1, 2, 3], [4, 5]], max_tokens: 2 });
  assert.equal(ids2.choices.length, 2);
  assert.equal(ids2.usage.prompt_tokens, 5);

  // Chat.
  const chat = await client.chat.completions.create({ model, messages: [{ role: 'user', content: 'Hello there' }], max_tokens: 4 });
  assert.equal(chat.choices[0].message.role, 'assistant');
  assert.ok(chat.choices[0].message.content.length > 0, 'chat content');
  assert.equal(chat.usage.completion_tokens, 4);

  // Streaming with usage.
  const stream = await client.chat.completions.create({
    model, messages: [{ role: 'user', content: 'Stream please' }], max_tokens: 5, stream: true,
    stream_options: { include_usage: true },
  });
  let text = '';
  let usage = null;
  for await (const chunk of stream) {
    for (const c of chunk.choices) text += c.delta?.content ?? '';
    if (chunk.usage) usage = chunk.usage;
  }
  assert.ok(text.length > 0, 'streamed text');
  assert.ok(usage && usage.completion_tokens === 5, `stream usage ${JSON.stringify(usage)}`);
  assert.ok(usage.prompt_tokens_details && typeof usage.prompt_tokens_details.cached_tokens === 'number');

  // Abort mid-stream: the client stops after the first content chunk.
  const ac = new AbortController();
  const long = await client.completions.create({ model, prompt: 'Talk for a long time', max_tokens: 1000, stream: true }, { signal: ac.signal });
  let got = 0;
  try {
    for await (const chunk of long) {
      if (chunk.choices.some((c) => c.text)) got++;
      if (got === 1) ac.abort();
      if (chunk.choices.some((c) => c.finish_reason)) throw new Error('the aborted stream ran to its end');
    }
  } catch (e) {
    // Depending on timing the client ends the iteration quietly or with its abort error.
    assert.ok(e instanceof OpenAI.APIUserAbortError || e.name === 'AbortError', `abort: ${e}`);
  }
  assert.ok(ac.signal.aborted && got >= 1, 'abort');

  // Error shapes: the field at fault in param, the status as vLLM answers it.
  await expectError('max_tokens 0', client.completions.create({ model, prompt: 'x', max_tokens: 0 }), 400, 'max_tokens', 'invalid_request');
  await expectError('null token id', client.completions.create({ model, prompt: [1, null], max_tokens: 1 }), 400, 'prompt', 'invalid_request');
  await expectError('empty messages', client.chat.completions.create({ model, messages: [] }), 400, 'messages', 'invalid_request');
  await expectError('unknown model', client.completions.create({ model: 'gpt-9', prompt: 'x' }), 404, 'model', 'model_not_found');
  console.log('ok');
}

main().catch((e) => {
  console.error(e && e.stack ? e.stack : e);
  process.exit(1);
});
