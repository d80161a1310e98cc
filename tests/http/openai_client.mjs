// k3pd's OpenAI-compatible HTTP API driven by the official OpenAI client library for Node
// (the `openai` package, pinned in node/package-lock.json). Started by test_openai_node.py,
// which runs the cluster and computes reference results through the gRPC API
// (refs.json): every deterministic request here must give the gRPC API's tokens.
//
// Usage: node openai_client.mjs BASE_URL REFS_JSON
// Prints "ok - ..." / "NOT OK - ..." lines, then "done: P passed, F failed"; exits 1 on any
// failure. Every call has a timeout (the client's), retries are off so statuses are seen as sent.
import fs from 'node:fs';
import { createRequire } from 'node:module';

const require = createRequire(process.env.K3PD_NODE_DIR + '/');
const OpenAI = require('openai');

const [base, refsPath] = process.argv.slice(2);
const refs = JSON.parse(fs.readFileSync(refsPath, 'utf8'));
const model = refs.model;
const client = new OpenAI({ baseURL: `${base}/v1`, apiKey: 'k3pd-test', maxRetries: 0, timeout: 120000 });
let passed = 0;
const failed = [];

function check(cond, what) {
  if (cond) {
    passed++;
    console.log(`ok - ${what}`);
  } else {
    failed.push(what);
    console.log(`NOT OK - ${what}`);
  }
}

const eq = (a, b) => JSON.stringify(a) === JSON.stringify(b);
const now = () => Math.floor(Date.now() / 1000);
const hasMarkers = (s) => /<\|(open|close|sep)\|>/.test(s);

async function expectError(what, fn, status, param) {
  try {
    await fn();
    check(false, `${what}: expected HTTP ${status}, the call succeeded`);
  } catch (e) {
    const ok = e instanceof OpenAI.APIError && e.status === status && (param === undefined || e.param === param);
    check(ok && typeof e.message === 'string' && e.error && typeof e.error.type === 'string',
      `${what} -> ${status}${param ? ` naming ${param}` : ''} (got ${e.status} ${e.param ?? ''}: ${e.message})`);
    return e;
  }
}

async function collect(stream) {
  const chunks = [];
  for await (const c of stream) chunks.push(c);
  return chunks;
}

function checkChunkShapes(what, chunks, object, withUsage) {
  const choiceChunks = chunks.filter((c) => c.choices.length > 0);
  const last = choiceChunks[choiceChunks.length - 1];
  let ok = chunks.length > 1 && chunks.every((c) => c.object === object && c.id === chunks[0].id &&
    c.created === chunks[0].created && c.model === model && typeof c.system_fingerprint === 'string');
  ok = ok && choiceChunks.slice(0, -1).every((c) => c.choices[0].finish_reason === null && c.choices[0].index === 0);
  ok = ok && last && last.choices[0].finish_reason !== null;
  check(ok, `${what}: every chunk is ${object} with one id/created/model, finish_reason null until the last`);
  if (withUsage) {
    const u = chunks[chunks.length - 1];
    check(u.choices.length === 0 && u.usage && u.usage.total_tokens === u.usage.prompt_tokens + u.usage.completion_tokens &&
      chunks.slice(0, -1).every((c) => c.usage === null),
    `${what}: include_usage -> a last chunk with empty choices and usage, "usage": null before`);
    return u.usage;
  }
  check(chunks.every((c) => c.usage === undefined || c.usage === null), `${what}: no usage without include_usage`);
  return null;
}

const R = refs.cases;

async function testModels() {
  const list = await client.models.list();
  const ids = list.data.map((m) => m.id);
  check(eq(ids, [model]) && list.data[0].object === 'model' && list.data[0].owned_by === 'k3pd' &&
    Number.isInteger(list.data[0].created), `models.list() -> [${model}] (${JSON.stringify(list.data[0])})`);
  const m = await client.models.retrieve(model);
  check(m.id === model && m.object === 'model', 'models.retrieve(model)');
  await expectError('models.retrieve(unknown)', () => client.models.retrieve('no-such-model'), 404);
}

async function testChat() {
  const ref = R.chat_off;
  const req = { model, messages: refs.chat, max_tokens: ref.ids.length, temperature: 0, ignore_eos: true,
    reasoning_effort: 'none', return_token_ids: true };
  const { data: r, response } = await client.chat.completions.create(req).withResponse();
  const c = r.choices[0];
  check(eq(c.token_ids, ref.ids), `chat, thinking off: tokens == gRPC Generate's (${c.token_ids})`);
  check(r.object === 'chat.completion' && r.id.startsWith('chatcmpl-') && Math.abs(r.created - now()) < 120 &&
    r.model === model && /^fp_[0-9a-f]+$/.test(r.system_fingerprint) && r.choices.length === 1 && c.index === 0,
  `chat: object, id, created, model, system_fingerprint (${r.id}, ${r.system_fingerprint})`);
  check(c.message.role === 'assistant' && typeof c.message.content === 'string' && c.message.reasoning_content === null &&
    c.message.tool_calls === undefined && c.finish_reason === 'length' && c.logprobs === null,
  `chat: message role/content, no reasoning with thinking off, finish_reason length (${c.finish_reason})`);
  if (!hasMarkers(ref.text)) check(c.message.content === ref.text, 'chat: content == the gRPC API\'s text');
  check(r.usage.prompt_tokens === ref.prompt_tokens && r.usage.completion_tokens === ref.ids.length &&
    r.usage.total_tokens === ref.prompt_tokens + ref.ids.length,
  `chat: usage ${JSON.stringify(r.usage)} == gRPC's ${ref.prompt_tokens}/${ref.ids.length}`);
  check(response.headers.get('x-request-id') && r.id === `chatcmpl-${response.headers.get('x-request-id')}`,
    'chat: X-Request-Id header names the request, id = chatcmpl-<request id>');
  // max_completion_tokens is the newer name of the same limit
  const r2 = await client.chat.completions.create({ ...req, max_tokens: undefined, max_completion_tokens: 3 });
  check(eq(r2.choices[0].token_ids, ref.ids.slice(0, 3)), 'chat: max_completion_tokens limits the same tokens');

  // streaming with usage
  const stream = await client.chat.completions.create({ ...req, stream: true, stream_options: { include_usage: true } });
  const chunks = await collect(stream);
  const usage = checkChunkShapes('chat stream', chunks, 'chat.completion.chunk', true);
  const ids = chunks.flatMap((x) => (x.choices[0] && x.choices[0].token_ids) || []);
  check(eq(ids, ref.ids), 'chat stream: tokens == gRPC Generate\'s');
  const first = chunks[0].choices[0].delta;
  check(first.role === 'assistant' && first.content === '', 'chat stream: first delta {role: assistant, content: ""}');
  const text = chunks.map((x) => (x.choices[0] && x.choices[0].delta.content) || '').join('');
  check(text === c.message.content, 'chat stream: content deltas == the non-streaming content');
  check(chunks.filter((x) => x.choices.length).slice(-1)[0].choices[0].finish_reason === 'length',
    'chat stream: finish_reason length on the last choice chunk');
  check(usage && usage.prompt_tokens === ref.prompt_tokens && usage.completion_tokens === ref.ids.length,
    'chat stream: usage == gRPC\'s');
}

async function testThinking() {
  const ref = R.chat_on;
  const r = await client.chat.completions.create({ model, messages: refs.chat, max_tokens: ref.ids.length,
    temperature: 0, ignore_eos: true, return_token_ids: true });
  const c = r.choices[0];
  check(eq(c.token_ids, ref.ids), 'chat, thinking on (default effort max): tokens == gRPC Generate\'s');
  check(r.usage.prompt_tokens === ref.prompt_tokens, `chat, thinking on: prompt tokens == gRPC's (${ref.prompt_tokens})`);
  if (!hasMarkers(ref.text))
    check(c.message.reasoning_content === ref.text && c.message.content === '',
      'chat, thinking on: the output before </think> is reasoning_content, content empty');
  const chunks = await collect(await client.chat.completions.create({ model, messages: refs.chat,
    max_tokens: ref.ids.length, temperature: 0, ignore_eos: true, stream: true }));
  checkChunkShapes('chat stream, thinking on', chunks, 'chat.completion.chunk', false);
  const reasoning = chunks.map((x) => (x.choices[0] && x.choices[0].delta.reasoning_content) || '').join('');
  check(reasoning === (c.message.reasoning_content || ''), 'chat stream, thinking on: reasoning_content deltas == whole');
  // the same switch through chat_template_kwargs, as vLLM and SGLang accept it
  const off = await client.chat.completions.create({ model, messages: refs.chat, max_tokens: R.chat_off.ids.length,
    temperature: 0, ignore_eos: true, chat_template_kwargs: { thinking: false }, return_token_ids: true });
  check(eq(off.choices[0].token_ids, R.chat_off.ids), 'chat_template_kwargs {thinking: false} == reasoning_effort none');
  const low = await client.chat.completions.create({ model, messages: refs.chat, max_tokens: 2, temperature: 0,
    ignore_eos: true, reasoning_effort: 'low' });
  check(low.usage.prompt_tokens === R.chat_low.prompt_tokens,
    `reasoning_effort low renders the effort message of gRPC's thinking_effort low (${low.usage.prompt_tokens} tokens)`);
}

async function testCompletions() {
  const ref = R.comp_text;
  const r = await client.completions.create({ model, prompt: refs.text, max_tokens: ref.ids.length, temperature: 0,
    ignore_eos: true, return_token_ids: true });
  const c = r.choices[0];
  check(eq(c.token_ids, ref.ids) && c.text === ref.text, 'completions: tokens and text == gRPC Generate\'s (text)');
  check(r.object === 'text_completion' && r.id.startsWith('cmpl-') && c.finish_reason === 'length' && c.index === 0 &&
    c.logprobs === null && r.usage.prompt_tokens === ref.prompt_tokens && r.usage.completion_tokens === ref.ids.length,
  'completions: object, id, finish_reason, usage');
  const chunks = await collect(await client.completions.create({ model, prompt: refs.text,
    max_tokens: ref.ids.length, temperature: 0, ignore_eos: true, stream: true, stream_options: { include_usage: true },
    return_token_ids: true }));
  checkChunkShapes('completions stream', chunks, 'text_completion', true);
  check(chunks.map((x) => (x.choices[0] && x.choices[0].text) || '').join('') === ref.text &&
    eq(chunks.flatMap((x) => (x.choices[0] && x.choices[0].token_ids) || []), ref.ids),
  'completions stream: text and tokens == gRPC\'s');
  const ids = await client.completions.create({ model, prompt: R.comp_ids.prompt, max_tokens: R.comp_ids.ids.length,
    temperature: 0, ignore_eos: true, return_token_ids: true });
  check(eq(ids.choices[0].token_ids, R.comp_ids.ids) && ids.usage.prompt_tokens === R.comp_ids.prompt.length,
    'completions with a token-id prompt == gRPC token_ids');
  const def = await client.completions.create({ model, prompt: refs.text, temperature: 0, ignore_eos: true });
  check(def.usage.completion_tokens === 16, `completions: max_tokens defaults to 16 (${def.usage.completion_tokens})`);
}

async function testSamplingStop() {
  const s = R.sampled;
  const r = await client.completions.create({ model, prompt: refs.text, max_tokens: s.ids.length, temperature: 0.8,
    top_p: 0.9, top_k: 20, seed: s.seed, ignore_eos: true, return_token_ids: true });
  check(eq(r.choices[0].token_ids, s.ids), `seeded sampling (temperature 0.8, top_p 0.9, top_k 20, seed ${s.seed}) == gRPC`);
  const st = R.stop;
  const r2 = await client.completions.create({ model, prompt: refs.text, max_tokens: 24, temperature: 0,
    ignore_eos: true, stop: [st.stop], return_token_ids: true });
  const c = r2.choices[0];
  check(c.finish_reason === 'stop' && c.text === st.text && eq(c.token_ids, st.ids) && !c.text.includes(st.stop),
    `stop string ${JSON.stringify(st.stop)}: text cut before it, finish_reason stop, tokens == gRPC (${JSON.stringify(c.text)})`);
  const chunks = await collect(await client.completions.create({ model, prompt: refs.text, max_tokens: 24,
    temperature: 0, ignore_eos: true, stop: st.stop, stream: true }));
  check(chunks.map((x) => x.choices[0].text).join('') === st.text &&
    chunks[chunks.length - 1].choices[0].finish_reason === 'stop', 'stop string while streaming: the same text');
  const chat = await client.chat.completions.create({ model, messages: refs.chat, max_tokens: 12, temperature: 0,
    ignore_eos: true, reasoning_effort: 'none', seed: 7, stop: [] });
  check(chat.choices[0].finish_reason === 'length', 'chat: an empty stop list is accepted');
}

async function testLogprobs() {
  const ref = R.chat_off;
  const r = await client.chat.completions.create({ model, messages: refs.chat, max_tokens: ref.ids.length,
    temperature: 0, ignore_eos: true, reasoning_effort: 'none', logprobs: true, top_logprobs: 0 });
  const lp = r.choices[0].logprobs && r.choices[0].logprobs.content;
  check(Array.isArray(lp) && lp.length === ref.ids.length &&
    lp.every((e, i) => Math.abs(e.logprob - ref.logprobs[i]) < 1e-5 && Array.isArray(e.bytes) &&
      typeof e.token === 'string' && eq(e.top_logprobs, [])),
  'chat logprobs: one entry per token, values == gRPC return_logprobs');
  const cr = await client.completions.create({ model, prompt: refs.text, max_tokens: 4, temperature: 0,
    ignore_eos: true, logprobs: 0 });
  const clp = cr.choices[0].logprobs;
  check(clp && clp.tokens.length === 4 && clp.token_logprobs.length === 4 && clp.text_offset.length === 4 &&
    clp.token_logprobs.every((x, i) => Math.abs(x - R.comp_text.logprobs[i]) < 1e-5),
  'completions logprobs 0: tokens, token_logprobs (== gRPC), text_offset');
  const chunks = await collect(await client.chat.completions.create({ model, messages: refs.chat, max_tokens: 5,
    temperature: 0, ignore_eos: true, reasoning_effort: 'none', logprobs: true, stream: true }));
  const n = chunks.reduce((a, x) => a + ((x.choices[0] && x.choices[0].logprobs && x.choices[0].logprobs.content.length) || 0), 0);
  check(n === 5, `chat stream logprobs: 5 entries over the chunks (${n})`);
}

async function testTools() {
  const tools = [{ type: 'function', function: { name: 'get_weather', description: 'Weather in a city',
    parameters: { type: 'object', properties: { city: { type: 'string' } }, required: ['city'] } } }];
  const r = await client.chat.completions.create({ model, messages: [{ role: 'user', content: 'Weather in Paris?' }],
    tools, tool_choice: 'auto', max_tokens: 8, temperature: 0, reasoning_effort: 'none' });
  const c = r.choices[0];
  check(['stop', 'length', 'tool_calls'].includes(c.finish_reason) && c.message.role === 'assistant',
    `tools declared, tool_choice auto: served (finish_reason ${c.finish_reason})`);
  const conv = [
    { role: 'developer', content: 'Use tools.' },
    { role: 'user', content: 'Weather in Paris?' },
    { role: 'assistant', content: null, tool_calls: [{ id: 'call_1', type: 'function',
      function: { name: 'get_weather', arguments: '{"city": "Paris"}' } }] },
    { role: 'tool', tool_call_id: 'call_1', content: '18 C, sunny' },
  ];
  const r2 = await client.chat.completions.create({ model, messages: conv, tools,
    tool_choice: { type: 'function', function: { name: 'get_weather' } }, max_tokens: 4, reasoning_effort: 'none',
    parallel_tool_calls: false });
  check(r2.choices.length === 1 && r2.usage.completion_tokens === 4 || r2.choices[0].finish_reason !== 'length',
    'a tool-call conversation (developer role, assistant tool_calls, tool result, named tool_choice) is served');
  await expectError('tool_choice naming an undeclared tool', () => client.chat.completions.create({ model,
    messages: conv, tools, tool_choice: { type: 'function', function: { name: 'nope' } } }), 400,
  'tool_choice.function.name');
  await expectError('tools[0] without a name', () => client.chat.completions.create({ model, messages: conv,
    tools: [{ type: 'function', function: {} }] }), 400, 'tools[0].function.name');
}

async function testErrors() {
  const m = [{ role: 'user', content: 'hi' }];
  await expectError('n: 2', () => client.chat.completions.create({ model, messages: m, n: 2 }), 400, 'n');
  await expectError('max_tokens: 0', () => client.chat.completions.create({ model, messages: m, max_tokens: 0 }), 400,
    'max_tokens');
  await expectError('max_tokens over the limit', () => client.completions.create({ model, prompt: 'x',
    max_tokens: 100000 }), 400, 'max_tokens');
  await expectError('temperature: "hot"', () => client.chat.completions.create({ model, messages: m,
    temperature: 'hot' }), 400, 'temperature');
  await expectError('top_p: 0', () => client.chat.completions.create({ model, messages: m, top_p: 0 }), 400, 'top_p');
  await expectError('messages missing', () => client.chat.completions.create({ model }), 400, 'messages');
  await expectError('messages: []', () => client.chat.completions.create({ model, messages: [] }), 400, 'messages');
  await expectError('unknown role', () => client.chat.completions.create({ model,
    messages: [{ role: 'robot', content: 'x' }] }), 400, 'messages[0].role');
  await expectError('image content part', () => client.chat.completions.create({ model, messages: [{ role: 'user',
    content: [{ type: 'image_url', image_url: { url: 'http://x/y.png' } }] }] }), 400, 'messages[0].content[0]');
  await expectError('unknown model', () => client.chat.completions.create({ model: 'gpt-4o', messages: m }), 404,
    'model');
  await expectError('top_logprobs 3', () => client.chat.completions.create({ model, messages: m, logprobs: true,
    top_logprobs: 3 }), 400, 'top_logprobs');
  await expectError('presence_penalty 0.5', () => client.chat.completions.create({ model, messages: m,
    presence_penalty: 0.5 }), 400, 'presence_penalty');
  await expectError('stop: 17 strings', () => client.completions.create({ model, prompt: 'x',
    stop: Array.from({ length: 17 }, (_, i) => `s${i}`) }), 400, 'stop');
  await expectError('batched prompts', () => client.completions.create({ model, prompt: ['a', 'b'] }), 400, 'prompt');
  await expectError('prompt token id outside the vocabulary', () => client.completions.create({ model,
    prompt: [1, 2, 999999] }), 400, 'prompt[2]');
  await expectError('echo', () => client.completions.create({ model, prompt: 'x', echo: true }), 400, 'echo');
  await expectError('reasoning_effort medium', () => client.chat.completions.create({ model, messages: m,
    reasoning_effort: 'medium' }), 400, 'reasoning_effort');
  const e = await expectError('prompt + max_tokens over the context', () => client.completions.create({ model,
    prompt: refs.text, max_tokens: refs.max_new_limit, ignore_eos: true }), 400, 'prompt');
  check(e && e.code === 'context_length_exceeded', `context overflow: code context_length_exceeded (${e && e.code})`);
  await expectError('stream_options without stream', () => client.chat.completions.create({ model, messages: m,
    stream_options: { include_usage: true } }), 400, 'stream_options');
  await expectError('a streaming request with a bad field fails before the stream', () =>
    client.chat.completions.create({ model, messages: m, n: 3, stream: true }), 400, 'n');
}

// Capacity: the decode pool holds one long request; a second one that cannot fit is 429 at
// once (no queueing in the router), with Retry-After.
async function testCapacity() {
  const big = { model, prompt: refs.text, max_tokens: refs.capacity_max_tokens, temperature: 0, ignore_eos: true };
  const first = await client.completions.create({ ...big, stream: true });
  const it = first[Symbol.asyncIterator]();
  await it.next(); // the first request holds its reservation now
  const e = await expectError('second request while the pool is full', () => client.completions.create(big), 429);
  check(e && e.headers && e.headers['retry-after'] === '1' && e.error.type === 'rate_limit_error',
    '429 carries Retry-After: 1 and type rate_limit_error');
  for (;;) { const x = await it.next(); if (x.done) break; }
}

// The client goes away mid-stream: the router cancels the request in the cluster (the driver
// checks the decode worker's pages and slots through /metrics afterwards).
async function testDisconnect() {
  const stream = await client.completions.create({ model, prompt: refs.text, max_tokens: refs.capacity_max_tokens,
    temperature: 0, ignore_eos: true, stream: true });
  let n = 0;
  try {
    for await (const c of stream) {
      if (c.choices.length && ++n === 3) stream.controller.abort();
    }
  } catch (e) {
    // the abort surfaces as an error of the iteration
  }
  check(n >= 3, `client aborted a stream after ${n} chunks`);
}

const t0 = Date.now();
for (const [name, fn] of [['models', testModels], ['chat', testChat], ['thinking', testThinking],
  ['completions', testCompletions], ['sampling+stop', testSamplingStop], ['logprobs', testLogprobs],
  ['tools', testTools], ['errors', testErrors], ['capacity', testCapacity], ['disconnect', testDisconnect]]) {
  const t1 = Date.now();
  try {
    await fn();
  } catch (e) {
    check(false, `${name}: unexpected ${e && e.constructor && e.constructor.name}: ${e && e.message}`);
  }
  console.log(`# ${name}: ${((Date.now() - t1) / 1000).toFixed(1)} s`);
}
console.log(`done: ${passed} passed, ${failed.length} failed in ${((Date.now() - t0) / 1000).toFixed(1)} s`);
for (const f of failed) console.log(`FAILED: ${f}`);
process.exit(failed.length ? 1 : 0);
