// car-inferenced's Ollama API (/api/*), driven by the official `ollama` npm client as the tools written
// for Ollama drive it (run.sh starts the daemon and passes its address and key). Models: `text`
// (stories260K, or a synthetic model; no chat template), `chatty` (synthetic, ChatML template), `slow`
// (a larger synthetic model for the aborted stream).
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { execFileSync } from 'node:child_process';
import { readFileSync } from 'node:fs';
import { Ollama } from 'ollama';

const host = process.env.CAR_HTTP_BASE.replace(/\/v1$/, '');
const key = process.env.CAR_HTTP_KEY;
const ollama = new Ollama({ host, headers: { Authorization: `Bearer ${key}` } });
const prompt = 'Once upon a time';
const chat = [{ role: 'user', content: 'Tell me a story.' }];
const greedy = { temperature: 0, num_predict: 24 };

function offline(n) {
  return execFileSync(process.env.CAR_BIN,
    ['run', `${process.env.CAR_MODELS}/text.gguf`, prompt, '-n', String(n), '--temperature', '0'],
    { encoding: 'utf8', stdio: ['ignore', 'pipe', 'ignore'] }).replace(/\n$/, '');
}

async function rejectsWith(promise, status, pattern) {
  await assert.rejects(promise, (e) => {
    assert.equal(e.name, 'ResponseError', String(e));
    assert.equal(e.status_code, status, e.message);
    assert.match(e.message, pattern);
    return true;
  });
}

test('version and the models directory, with details from each file', async () => {
  const v = await ollama.version();
  assert.equal(typeof v.version, 'string');
  const list = await ollama.list();
  const names = list.models.map((m) => m.name).sort();
  assert.deepEqual(names, ['chatty', 'slow', 'text']);
  for (const m of list.models) {
    assert.equal(m.model, m.name);
    assert.ok(m.size > 0);
    assert.match(m.digest, /^[0-9a-f]{64}$/);
    assert.ok(!Number.isNaN(Date.parse(m.modified_at)));
    assert.equal(m.details.format, 'gguf');
    assert.equal(m.details.family, 'llama');
    assert.ok(m.details.parameter_size.length > 0);
    assert.ok(m.details.quantization_level.length > 0);
  }
});

test('show: the chat template, details and the file metadata', async () => {
  const s = await ollama.show({ model: 'chatty' });
  assert.match(s.template, /im_start/);
  assert.equal(s.details.family, 'llama');
  assert.equal(s.model_info['general.architecture'], 'llama');
  assert.ok(s.model_info['general.parameter_count'] > 0);
  assert.ok(s.capabilities.includes('completion'));
  // A tag Ollama's tools add finds the same file.
  assert.equal((await ollama.show({ model: 'chatty:latest' })).template, s.template);
  await rejectsWith(ollama.show({ model: 'no-such-model' }), 404, /not found/);
});

test('generate: greedy text equals `car run`, with counts, durations and done_reason', async () => {
  const r = await ollama.generate({ model: 'text', prompt, options: greedy });
  assert.equal(r.model, 'text');
  assert.equal(r.done, true);
  assert.ok(['stop', 'length'].includes(r.done_reason), r.done_reason);
  assert.equal(r.response, offline(24));
  assert.ok(r.prompt_eval_count > 0);
  assert.ok(r.eval_count > 0 && r.eval_count <= 24);
  for (const d of ['total_duration', 'load_duration', 'prompt_eval_duration', 'eval_duration']) {
    assert.equal(typeof r[d], 'number', d);
  }
  assert.ok(r.total_duration >= r.eval_duration);
  // `raw` gives the same for a model without a chat template; the same request answers the same.
  assert.equal((await ollama.generate({ model: 'text', prompt, raw: true, options: greedy })).response, r.response);
});

test('generate streamed: the lines concatenate to the non-streamed text, the last one done', async () => {
  const plain = await ollama.generate({ model: 'text', prompt, options: greedy });
  let text = '';
  let last = null;
  for await (const part of await ollama.generate({ model: 'text', prompt, options: greedy, stream: true })) {
    text += part.response;
    last = part;
  }
  assert.equal(text, plain.response);
  assert.equal(last.done, true);
  assert.equal(last.done_reason, plain.done_reason);
  assert.equal(last.eval_count, plain.eval_count);
  assert.equal(last.prompt_eval_count, plain.prompt_eval_count);
});

test('chat renders with the model template; streamed equals plain equals the OpenAI front', async () => {
  const opts = { temperature: 0, num_predict: 16 };
  const plain = await ollama.chat({ model: 'chatty', messages: chat, options: opts });
  assert.equal(plain.message.role, 'assistant');
  assert.equal(typeof plain.message.content, 'string');
  assert.ok(plain.prompt_eval_count > 5, 'the rendered template is longer than the message');
  let text = '';
  let last = null;
  for await (const part of await ollama.chat({ model: 'chatty', messages: chat, options: opts, stream: true })) {
    assert.equal(part.message.role, 'assistant');
    text += part.message.content;
    last = part;
  }
  assert.equal(text, plain.message.content);
  assert.equal(last.done, true);
  // The same handler behind both APIs: the same conversation gives the same answer.
  const oa = await (await fetch(`${host}/v1/chat/completions`, {
    method: 'POST',
    headers: { Authorization: `Bearer ${key}`, 'Content-Type': 'application/json' },
    body: JSON.stringify({ model: 'chatty', messages: chat, max_tokens: 16, temperature: 0 }),
  })).json();
  assert.equal(oa.choices[0].message.content, plain.message.content);
});

test('generate without raw renders the prompt and system text as a chat turn', async () => {
  const r = await ollama.generate({ model: 'chatty', prompt: 'Hello', system: 'Be brief.', options: greedy });
  const c = await ollama.chat({
    model: 'chatty', options: greedy,
    messages: [{ role: 'system', content: 'Be brief.' }, { role: 'user', content: 'Hello' }],
  });
  assert.equal(r.response, c.message.content);
  assert.equal(r.prompt_eval_count, c.prompt_eval_count);
});

test('options: stop strings, num_predict and seeds', async () => {
  const full = (await ollama.generate({ model: 'text', prompt, options: greedy })).response;
  assert.ok(full.length >= 4, `need some text to cut: ${JSON.stringify(full)}`);
  const stop = full.slice(Math.floor(full.length / 2), Math.floor(full.length / 2) + 2);
  const cut = await ollama.generate({ model: 'text', prompt, options: { ...greedy, stop: [stop] } });
  assert.equal(cut.response, full.slice(0, full.indexOf(stop)));
  assert.equal(cut.done_reason, 'stop');
  const three = await ollama.generate({ model: 'text', prompt, options: { temperature: 0, num_predict: 3 } });
  assert.equal(three.eval_count, 3);
  assert.equal(three.done_reason, 'length');
  const sampled = { temperature: 1.0, seed: 42, num_predict: 16 };
  const a = await ollama.generate({ model: 'text', prompt, options: sampled });
  const b = await ollama.generate({ model: 'text', prompt, options: sampled });
  assert.equal(a.response, b.response);
});

test('keep_alive: an empty prompt loads, 0 unloads, ps shows what is loaded and until when', async () => {
  const loaded = await ollama.generate({ model: 'chatty', prompt: '', keep_alive: '10m' });
  assert.equal(loaded.done, true);
  assert.equal(loaded.done_reason, 'load');
  let ps = await ollama.ps();
  const entry = ps.models.find((m) => m.name === 'chatty');
  assert.ok(entry, JSON.stringify(ps));
  assert.ok(entry.size > 0);
  const left = Date.parse(entry.expires_at) - Date.now();
  assert.ok(left > 9 * 60_000 && left <= 10 * 60_000 + 5_000, `expires in ${left} ms`);
  const unloaded = await ollama.chat({ model: 'chatty', messages: [], keep_alive: 0 });
  assert.equal(unloaded.done_reason, 'unload');
  ps = await ollama.ps();
  assert.equal(ps.models.find((m) => m.name === 'chatty'), undefined, JSON.stringify(ps));
  // A request's keep_alive applies after it: -1 keeps the model for as long as the daemon allows
  // (CAR_INFERENCE_MAX_KEEP_ALIVE_SECS, an hour by default).
  await ollama.generate({ model: 'chatty', prompt: 'Hi', keep_alive: -1, options: { num_predict: 1 } });
  ps = await ollama.ps();
  const kept = ps.models.find((m) => m.name === 'chatty');
  assert.ok(Date.parse(kept.expires_at) - Date.now() > 3590_000, kept.expires_at);
});

test('errors: unknown model 404, unknown or unsupported options 400 naming them, a wrong key 401', async () => {
  await rejectsWith(ollama.generate({ model: 'no-such-model', prompt }), 404, /not found/);
  await rejectsWith(ollama.generate({ model: 'text', prompt, options: { tempreature: 0.5 } }), 400,
    /unknown option "tempreature" \(did you mean 'temperature'\?\)/);
  await rejectsWith(ollama.generate({ model: 'text', prompt, format: 'json' }), 400, /format/);
  await rejectsWith(ollama.generate({ model: 'text', prompt, options: { mirostat: 2 } }), 400, /mirostat/);
  await rejectsWith(ollama.chat({ model: 'text', messages: chat }), 400,
    /no chat template.*\/api\/generate/);
  const wrong = new Ollama({ host, headers: { Authorization: 'Bearer not-the-key' } });
  await rejectsWith(wrong.list(), 401, /API key/);
});

test('an aborted stream cancels the generation', async () => {
  const cancelled = /op="?infer"? model="?slow"? outcome=(cancelled|ok\(cancelled)/g;
  const before = (readFileSync(process.env.CAR_DAEMON_LOG, 'utf8').match(cancelled) ?? []).length;
  const s = await ollama.generate({ model: 'slow', prompt, stream: true, options: { temperature: 0, num_predict: 3000 } });
  let parts = 0;
  await assert.rejects((async () => {
    for await (const _ of s) {
      if (++parts === 3) s.abort();
    }
  })(), (e) => e.name === 'AbortError' || /abort/i.test(String(e)));
  const deadline = Date.now() + 30_000;
  let after = before;
  while (Date.now() < deadline) {
    after = (readFileSync(process.env.CAR_DAEMON_LOG, 'utf8').match(cancelled) ?? []).length;
    if (after > before) break;
    await new Promise((r) => setTimeout(r, 100));
  }
  assert.ok(after > before, 'the daemon cancelled the aborted generation');
});
