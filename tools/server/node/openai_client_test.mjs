// The official openai npm package, unchanged, against a running `lgpt serve`:
//   node --preserve-symlinks --preserve-symlinks-main openai_client_test.mjs PORT API_KEY
// A completion, a chat completion, a streamed chat completion (equal to the whole one), the
// model list, and the client's own error classes for 404 and 401. Exits 1 on any failure.
import assert from 'node:assert/strict';
import OpenAI from 'openai';

const [port, apiKey] = process.argv.slice(2);
const baseURL = `http://127.0.0.1:${port}/v1`;
const client = new OpenAI({ baseURL, apiKey, maxRetries: 0, timeout: 60_000 });

const checks = [];
function check(name, run) {
  checks.push({ name, run });
}

let model;
check('models.list', async () => {
  const models = await client.models.list();
  assert.equal(models.data.length, 1);
  model = models.data[0].id;
  assert.ok(model.length > 0);
});

check('completions.create', async () => {
  const completion = await client.completions.create({
    model, prompt: 'And God said', max_tokens: 20, temperature: 0,
  });
  assert.equal(completion.object, 'text_completion');
  assert.ok(completion.choices[0].text.length > 0);
  assert.ok(['stop', 'length'].includes(completion.choices[0].finish_reason));
  assert.equal(completion.usage.total_tokens,
               completion.usage.prompt_tokens + completion.usage.completion_tokens);
});

let chatText;
check('chat.completions.create', async () => {
  const chat = await client.chat.completions.create({
    model, messages: [{ role: 'user', content: 'And God said' }], max_tokens: 24, temperature: 0,
  });
  assert.equal(chat.object, 'chat.completion');
  assert.equal(chat.choices[0].message.role, 'assistant');
  chatText = chat.choices[0].message.content;
  assert.ok(chatText.length > 0);
});

check('chat.completions.create stream', async () => {
  const stream = await client.chat.completions.create({
    model, messages: [{ role: 'user', content: 'And God said' }], max_tokens: 24, temperature: 0,
    stream: true, stream_options: { include_usage: true },
  });
  let text = '';
  let chunks = 0;
  let finish = null;
  let usage = null;
  for await (const chunk of stream) {
    chunks += 1;
    if (chunk.usage) usage = chunk.usage;
    const choice = chunk.choices[0];
    if (!choice) continue;
    text += choice.delta?.content ?? '';
    if (choice.finish_reason) finish = choice.finish_reason;
  }
  assert.equal(text, chatText);
  assert.ok(chunks > 3, `only ${chunks} chunks`);
  assert.ok(['stop', 'length'].includes(finish));
  assert.ok(usage && usage.completion_tokens > 0);
});

check('unknown model is NotFoundError', async () => {
  await assert.rejects(
    client.completions.create({ model: 'gpt-4', prompt: 'x', max_tokens: 2 }),
    (error) => error instanceof OpenAI.NotFoundError && error.status === 404 &&
      /gpt-4/.test(error.message));
});

check('unsupported n is BadRequestError naming the param', async () => {
  await assert.rejects(
    client.chat.completions.create({ model, messages: [{ role: 'user', content: 'x' }], n: 2 }),
    (error) => error instanceof OpenAI.BadRequestError && /not supported/.test(error.message) &&
      error.param === 'n');
});

check('wrong API key is AuthenticationError', async () => {
  const wrong = new OpenAI({ baseURL, apiKey: `${apiKey}x`, maxRetries: 0 });
  await assert.rejects(
    wrong.models.list(),
    (error) => error instanceof OpenAI.AuthenticationError && error.status === 401);
});

let passed = 0;
let failed = 0;
for (const { name, run } of checks) {
  try {
    await run();
    passed += 1;
    console.log(`ok ${name}`);
  } catch (error) {
    failed += 1;
    console.log(`FAIL ${name}: ${error?.stack ?? error}`);
  }
}
console.log(`${passed} passed, ${failed} failed`);
process.exit(failed === 0 && passed === checks.length ? 0 : 1);
