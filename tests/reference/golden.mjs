// llama.cpp's greedy ids and per-position top log-probabilities for a GGUF file, in the form of the
// shared conformance manifest's cases (/work/shared/conformance/README.md), through node-llama-cpp's
// prebuilt CPU build of llama.cpp. A development tool and test-data maker: the project's tests read the
// goldens this writes and never run it.
//
// Usage:
//   node golden.mjs MODEL.gguf --prompt-ids 1,2,3 [--prompt-ids 1,5,9 ...] [--prompt-text TEXT ...]
//                   [--n-predict 16] [--top-k 5] [--threads 4] [--out FILE.json]
// --prompt-text is tokenized by llama.cpp as llama-simple does (add_special and parse_special true); the case
// then records `prompt` (the text) beside llama.cpp's `prompt_ids`.
//
// Per case (as the manifest's goldens were made, see README.md):
//   1. generation: one batch of the prompt (n_batch = n_prompt, n_ctx = n_prompt + n_predict - 1), then
//      one token at a time, greedy (argmax of the raw logits), stopping early at an end-of-generation token;
//   2. teacher forcing: a fresh sequence evaluates prompt + generated ids in one batch with logits at the
//      last n_generated positions; position j's distribution is the one that predicted generated_ids[j].
//      logprob = log-softmax over the whole vocabulary in float64 of llama.cpp's float32 logits, rounded to
//      6 decimals (the manifest's rule); `logits_top` keeps the float32 logits of the same ids unrounded.
// Context: F16 K/V cache, flash attention on (libllama's `auto` picks it on CPU), as the manifest's runs.
import { createHash } from "node:crypto";
import { readFileSync, writeFileSync } from "node:fs";
import { basename } from "node:path";
import { getLlama, LlamaLogLevel } from "node-llama-cpp";

function usage(msg) {
  if (msg) console.error(`golden.mjs: ${msg}`);
  console.error("usage: node golden.mjs MODEL.gguf --prompt-ids 1,2,3 [--prompt-ids ...] [--prompt-text TEXT ...] [--n-predict 16] " +
                "[--top-k 5] [--threads 4] [--out FILE.json]");
  process.exit(2);
}

function parse_args(argv) {
  const args = { model: null, prompts: [], n_predict: 16, top_k: 5, threads: 4, out: null };
  for (let i = 0; i < argv.length; ++i) {
    const a = argv[i];
    const value = () => {
      if (i + 1 >= argv.length) usage(`${a} needs a value`);
      return argv[++i];
    };
    const count = (name, text, min) => {
      const n = Number(text);
      if (!Number.isInteger(n) || n < min) usage(`${name} must be an integer >= ${min}, not '${text}'`);
      return n;
    };
    if (a === "--prompt-text") {
      args.prompts.push(value());
    } else if (a === "--prompt-ids") {
      const text = value();
      const ids = text.split(",").map((s) => count("--prompt-ids", s.trim(), 0));
      if (ids.length === 0) usage("--prompt-ids is empty");
      args.prompts.push(ids);
    } else if (a === "--n-predict") args.n_predict = count(a, value(), 1);
    else if (a === "--top-k") args.top_k = count(a, value(), 1);
    else if (a === "--threads") args.threads = count(a, value(), 1);
    else if (a === "--out") args.out = value();
    else if (a.startsWith("--")) usage(`unknown option ${a}`);
    else if (args.model === null) args.model = a;
    else usage(`unexpected argument ${a}`);
  }
  if (args.model === null) usage("no model file");
  if (args.prompts.length === 0) usage("no --prompt-ids or --prompt-text");
  return args;
}

// log-softmax over the whole vocabulary in float64; `logits` is a Map token -> float32 logit.
function log_softmax(logits, n_vocab) {
  if (logits.size !== n_vocab) throw new Error(`got ${logits.size} logits, the vocabulary has ${n_vocab}`);
  let max = -Infinity;
  for (const v of logits.values()) max = Math.max(max, v);
  let sum = 0;
  for (const v of logits.values()) sum += Math.exp(v - max);
  const log_z = max + Math.log(sum);
  return (v) => v - log_z;
}

// Ties break to the lower id, as an argmax over the id-ordered logit array does.
function ranked(logits) {
  return [...logits.entries()].sort((a, b) => (b[1] - a[1]) || (a[0] - b[0]));
}

// The vocabulary size: the length of tokenizer.ggml.tokens (the logits' length in libllama).
function vocab_size(model) {
  const tokens = model.fileInfo.metadata?.tokenizer?.ggml?.tokens;
  if (!Array.isArray(tokens)) throw new Error("the file has no tokenizer.ggml.tokens array");
  return tokens.length;
}

const round6 = (x) => Math.round(x * 1e6) / 1e6;

async function run_case(llama, model, prompt_ids, args) {
  const n_vocab = vocab_size(model);
  for (const id of prompt_ids) {
    if (id >= n_vocab) throw new Error(`prompt id ${id} is not below the vocabulary size ${n_vocab}`);
  }
  const n_prompt = prompt_ids.length;
  const want_logits = { generateNext: { logits: true } };

  // 1. Greedy generation: the prompt in one batch, then token by token.
  const gen_ctx = await model.createContext({
    contextSize: n_prompt + args.n_predict, batchSize: n_prompt, threads: args.threads, sequences: 1,
    flashAttention: true,
  });
  const generated = [];
  let finish = "length";
  {
    const seq = gen_ctx.getSequence();
    let input = prompt_ids.map((id, i) => (i + 1 === n_prompt ? [id, want_logits] : id));
    for (let step = 0; step < args.n_predict; ++step) {
      const out = await seq.controlledEvaluate(input);
      const logits = out[input.length - 1]?.next?.logits;
      if (!logits) throw new Error("llama.cpp returned no logits");
      const [next] = ranked(logits)[0];
      generated.push(next);
      if (model.isEogToken(next)) {
        finish = "eog";
        break;
      }
      if (step + 1 < args.n_predict) input = [[next, want_logits]];
    }
  }
  await gen_ctx.dispose();

  // 2. Teacher forcing: prompt + generated in one batch, logits where each generated id was predicted.
  const all = [...prompt_ids, ...generated];
  const tf_ctx = await model.createContext({
    contextSize: all.length, batchSize: all.length, threads: args.threads, sequences: 1, flashAttention: true,
  });
  const seq = tf_ctx.getSequence();
  const input = all.map((id, i) => (i >= n_prompt - 1 && i < all.length - 1 ? [id, want_logits] : id));
  const out = await seq.controlledEvaluate(input);
  const top_logprobs = [];
  const logits_top = [];
  const top1_margin = [];
  let teacher_forced_argmax_is_generated = true;
  for (let j = 0; j < generated.length; ++j) {
    const logits = out[n_prompt - 1 + j]?.next?.logits;
    if (!logits) throw new Error(`llama.cpp returned no logits at position ${n_prompt - 1 + j}`);
    const lp = log_softmax(logits, n_vocab);
    const top = ranked(logits).slice(0, args.top_k);
    if (top[0][0] !== generated[j]) teacher_forced_argmax_is_generated = false;
    top_logprobs.push(top.map(([id, v]) => ({ id, logprob: round6(lp(v)) })));
    logits_top.push(top.map(([, v]) => v));
    top1_margin.push(top.length > 1 ? round6(lp(top[0][1]) - lp(top[1][1])) : null);
  }
  await tf_ctx.dispose();
  const margins = top1_margin.filter((m) => m !== null);
  return {
    prompt_ids,
    generated_ids: generated,
    finish,
    top_logprobs,
    top1_margin,
    min_top1_margin: margins.length ? Math.min(...margins) : null,
    teacher_forced_argmax_is_generated,
    logits_top,
  };
}

const args = parse_args(process.argv.slice(2));
const bytes = readFileSync(args.model);
const llama = await getLlama({ gpu: false, build: "never", logLevel: LlamaLogLevel.error });
const model = await llama.loadModel({ modelPath: args.model, gpuLayers: 0 });
const pkg = JSON.parse(readFileSync(new URL("./node_modules/node-llama-cpp/package.json", import.meta.url)));
const release = llama.llamaCppRelease;
const result = {
  llama_cpp: {
    via: `node-llama-cpp ${pkg.version} (${llama.buildType} build, CPU)`,
    repository: release.repo,
    release: release.release,
    commit: JSON.parse(readFileSync(new URL("./llama-cpp-commit.json", import.meta.url))).commit,
    backend: "CPU",
    threads: args.threads,
    kv_cache: "F16",
    flash_attention: true,
  },
  file: basename(args.model),
  sha256: createHash("sha256").update(bytes).digest("hex"),
  size: bytes.length,
  arch: model.fileInfo.metadata?.general?.architecture ?? null,
  n_vocab: vocab_size(model),
  n_predict: args.n_predict,
  top_k: args.top_k,
  cases: [],
};
for (const p of args.prompts) {
  if (typeof p === "string") {
    // llama_tokenize(add_special = true, parse_special = true): BOS when the vocabulary adds one.
    const ids = [...model.tokenize(p, true)];
    if (model.tokens.shouldPrependBosToken && model.tokens.bos !== null && ids[0] !== model.tokens.bos) {
      ids.unshift(model.tokens.bos);
    }
    result.cases.push({ prompt: p, ...(await run_case(llama, model, ids, args)) });
  } else {
    result.cases.push(await run_case(llama, model, p, args));
  }
}
await model.dispose();
const text = JSON.stringify(result, null, 1) + "\n";
if (args.out) writeFileSync(args.out, text);
else process.stdout.write(text);
process.exit(0);
