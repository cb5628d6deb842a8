// car-inferenced's OpenAI-compatible HTTP front, driven by the official `openai` npm client (run.sh starts
// the daemon and passes its address and key). Models: `text` (stories260K, or a synthetic model), `chatty`
// (synthetic, ChatML template), `slow` (a larger synthetic model for the aborted stream).
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { execFileSync } from 'node:child_process';
import { readFileSync } from 'node:fs';
import OpenAI from 'openai';

const baseURL = process.env.CAR_HTTP_BASE;
const apiKey = process.env.CAR_HTTP_KEY;
const client = new OpenAI({ baseURL, apiKey, maxRetries: 0, timeout: 120_000 });
const prompt = 'Once upon a time';
const chat = [{ role: 'user', content: 'Tell me a story.' }];

async function greedy(extra = {}) {
  return client.completions.create({ model: 'text', prompt, max_tokens: 24, temperature: 0, ...extra });
}

test('lists the models directory with owned_by and whether each is loaded', async () => {
  const page = await client.models.list();
  const ids = page.data.map((m) => m.id).sort();
  assert.deepEqual(ids, ['chatty', 'slow', 'text']);
  for (const m of page.data) {
    assert.equal(m.object, 'model');
    assert.equal(m.owned_by, 'car-inference');
    assert.equal(typeof m.loaded, 'boolean');
    assert.equal(typeof m.created, 'number');
  }
  const one = await client.models.retrieve('text');
  assert.equal(one.id, 'text');
});

test('completion: text, finish reason, usage; greedy output equals `car run`', async () => {
  const r = await greedy();
  assert.equal(r.object, 'text_completion');
  assert.equal(r.model, 'text');
  assert.equal(r.choices.length, 1);
  const c = r.choices[0];
  assert.equal(typeof c.text, 'string');
  assert.ok(['stop', 'length'].includes(c.finish_reason), c.finish_reason);
  assert.ok(r.usage.prompt_tokens > 0);
  assert.ok(r.usage.completion_tokens > 0 && r.usage.completion_tokens <= 24);
  assert.equal(r.usage.total_tokens, r.usage.prompt_tokens + r.usage.completion_tokens);
  const offline = execFileSync(process.env.CAR_BIN,
    ['run', `${process.env.CAR_MODELS}/text.gguf`, prompt, '-n', '24', '--temperature', '0'],
    { encoding: 'utf8', stdio: ['ignore', 'pipe', 'ignore'] });
  assert.equal(c.text, offline.replace(/\n$/, ''));
  // The same request again answers the same (temperature 0).
  assert.equal((await greedy()).choices[0].text, c.text);
});

test('chat completion renders messages with the model template', async () => {
  const r = await client.chat.completions.create({ model: 'chatty', messages: chat, max_tokens: 16, temperature: 0 });
  assert.equal(r.object, 'chat.completion');
  const c = r.choices[0];
  assert.equal(c.message.role, 'assistant');
  assert.equal(typeof c.message.content, 'string');
  assert.ok(['stop', 'length'].includes(c.finish_reason));
  assert.ok(r.usage.prompt_tokens > 5, 'the rendered template is longer than the message');
});

test('streamed chat: role first, chunks concatenate to the non-streamed text, usage last', async () => {
  const plain = await client.chat.completions.create({ model: 'chatty', messages: chat, max_tokens: 16, temperature: 0 });
  const stream = await client.chat.completions.create({
    model: 'chatty', messages: chat, max_tokens: 16, temperature: 0, stream: true,
    stream_options: { include_usage: true },
  });
  let text = '';
  let first = true;
  let finish = null;
  let usage = null;
  for await (const chunk of stream) {
    assert.equal(chunk.object, 'chat.completion.chunk');
    if (first) {
      assert.equal(chunk.choices[0].delta.role, 'assistant');
      first = false;
    }
    if (chunk.usage) usage = chunk.usage;
    for (const ch of chunk.choices) {
      text += ch.delta.content ?? '';
      if (ch.finish_reason) finish = ch.finish_reason;
    }
  }
  assert.equal(text, plain.choices[0].message.content);
  assert.equal(finish, plain.choices[0].finish_reason);
  assert.deepEqual(usage, plain.usage);
});

test('streamed completion concatenates to the non-streamed text', async () => {
  const plain = await greedy();
  const stream = await client.completions.create({ model: 'text', prompt, max_tokens: 24, temperature: 0, stream: true });
  let text = '';
  for await (const chunk of stream) text += chunk.choices.map((c) => c.text).join('');
  assert.equal(text, plain.choices[0].text);
});

test('stop strings end the text before the stop string', async () => {
  const full = (await greedy()).choices[0].text;
  assert.ok(full.length >= 4, `need some text to cut: ${JSON.stringify(full)}`);
  const stop = full.slice(Math.floor(full.length / 2), Math.floor(full.length / 2) + 2);
  const r = await greedy({ stop: [stop] });
  assert.equal(r.choices[0].text, full.slice(0, full.indexOf(stop)));
  assert.equal(r.choices[0].finish_reason, 'stop');
});

test('chat logprobs: one entry per generated token with top_logprobs, streamed too', async () => {
  const req = { model: 'chatty', messages: chat, max_tokens: 8, temperature: 0, logprobs: true, top_logprobs: 2 };
  const r = await client.chat.completions.create(req);
  const content = r.choices[0].logprobs.content;
  assert.equal(content.length, r.usage.completion_tokens);
  for (const t of content) {
    assert.ok(t.logprob <= 0);
    assert.equal(t.top_logprobs.length, 2);
    assert.ok(t.top_logprobs[0].logprob >= t.top_logprobs[1].logprob);
    // Greedy: the chosen token is the most likely one.
    assert.equal(t.logprob, t.top_logprobs[0].logprob);
  }
  const streamed = [];
  for await (const chunk of await client.chat.completions.create({ ...req, stream: true })) {
    const lp = chunk.choices[0]?.logprobs?.content;
    if (lp) streamed.push(...lp);
  }
  assert.deepEqual(streamed.map((t) => t.logprob), content.map((t) => t.logprob));
});

test('an unknown model is a NotFoundError', async () => {
  await assert.rejects(greedy({ model: 'no-such-model' }), (e) => e instanceof OpenAI.NotFoundError);
});

test('bad or unsupported parameters are BadRequestErrors naming the parameter', async () => {
  await assert.rejects(client.chat.completions.create({ model: 'chatty', messages: chat, n: 2 }),
    (e) => e instanceof OpenAI.BadRequestError && e.param === 'n');
  await assert.rejects(greedy({ temperature: 500 }),
    (e) => e instanceof OpenAI.BadRequestError && /temperature/.test(e.message));
});

test('chat with a model without a template says how this API gets one', async () => {
  await assert.rejects(client.chat.completions.create({ model: 'text', messages: chat }),
    (e) => e instanceof OpenAI.BadRequestError && /no chat template/.test(e.message) &&
      /\/v1\/completions/.test(e.message) && !/chat_template" field/.test(e.message));
});

test('a wrong API key is an AuthenticationError', async () => {
  const wrong = new OpenAI({ baseURL, apiKey: 'not-the-key', maxRetries: 0 });
  await assert.rejects(wrong.models.list(), (e) => e instanceof OpenAI.AuthenticationError);
});

test('an aborted stream cancels the generation', async () => {
  const s = await client.completions.create({ model: 'slow', prompt, max_tokens: 3000, temperature: 0, stream: true });
  let chunks = 0;
  for await (const _ of s) {
    if (++chunks === 3) break;  // leaving the loop aborts the request: the client closes the connection
  }
  const deadline = Date.now() + 30_000;
  let log = '';
  while (Date.now() < deadline) {
    log = readFileSync(process.env.CAR_DAEMON_LOG, 'utf8');
    if (/op="?infer"? model="?slow"? outcome=(cancelled|ok\(cancelled)/.test(log)) break;
    await new Promise((r) => setTimeout(r, 100));
  }
  assert.match(log, /op="?infer"? model="?slow"? outcome=(cancelled|ok\(cancelled)/);
  assert.match(log, /the client closed the connection: cancelling its completion/);
  // The metrics page counts it as a cancelled generation.
  const page = await (await fetch(baseURL.replace(/\/v1$/, '') + '/metrics',
    { headers: { Authorization: `Bearer ${apiKey}` } })).text();
  assert.match(page, /car_inference_generations_total\{finish_reason="cancelled"\} [1-9]/);
});
