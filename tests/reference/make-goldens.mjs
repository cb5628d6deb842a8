// Regenerates the goldens of tests/data/reference/: for each fixture in fixtures.json, writes the GGUF with
// `car gguf synth` (into a temporary folder: the tests write the same bytes themselves and check them by
// sha256), runs golden.mjs on it with the listed prompts and writes NAME.golden.json beside fixtures.json,
// the harness's output plus the fixture's spec and the tolerance the test applies.
//
// Usage: node make-goldens.mjs CAR_BINARY [--fixtures FILE] [--out DIR] [NAME ...]
//   default: every fixture of tests/data/reference/fixtures.json, goldens written beside it. Goldens of
//   another folder are checked by `CAR_REFERENCE_DATA_DIR=DIR engine_reference_conformance_test`.
import { execFileSync } from "node:child_process";
import { mkdtempSync, readFileSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { dirname, join } from "node:path";
import { fileURLToPath } from "node:url";

const here = dirname(fileURLToPath(import.meta.url));
const [car, ...rest] = process.argv.slice(2);
if (!car) {
  console.error("usage: node make-goldens.mjs CAR_BINARY [--fixtures FILE] [--out DIR] [NAME ...]");
  process.exit(2);
}
let fixtures_file = join(here, "..", "data", "reference", "fixtures.json");
let data = null;
const only = [];
for (let i = 0; i < rest.length; ++i) {
  if (rest[i] === "--fixtures") fixtures_file = rest[++i];
  else if (rest[i] === "--out") data = rest[++i];
  else only.push(rest[i]);
}
data ??= dirname(fixtures_file);
const { prompts, fixtures } = JSON.parse(readFileSync(fixtures_file, "utf8"));
// SynthSpec field -> car gguf synth flag.
const flags = {
  arch: "--arch", n_layer: "--layers", n_embd: "--embd", n_ff: "--ff", n_ff_expert: "--ff-expert",
  n_ff_shared: "--ff-shared", n_head: "--heads", n_head_kv: "--kv-heads", head_dim: "--head-dim",
  n_expert: "--experts", n_expert_used: "--experts-used", n_vocab: "--vocab", n_ctx: "--ctx", seed: "--seed",
  weight_type: "--type", vocab_file: "--vocab-from", tied_embeddings: "--tied",
  sliding_window: "--sliding-window", final_logit_softcap: "--final-softcap", attn_logit_softcap: "--attn-softcap",
  rope_scaling_factor: "--yarn-factor", rope_orig_ctx: "--yarn-orig-ctx",
  yarn_log_multiplier: "--yarn-log-mul", q_lora_rank: "--q-lora-rank", kv_lora_rank: "--kv-lora-rank",
  rope_dim: "--rope-dim", v_head_dim: "--v-head-dim", n_dense_lead: "--dense-lead",
  n_expert_shared: "--shared-experts", n_expert_groups: "--expert-groups", n_group_used: "--expert-groups-used",
  expert_weights_scale: "--expert-weights-scale",
};
// "conformance:PATH" names a file of the shared conformance folder ($CAR_CONFORMANCE_DIR, else
// ../shared/conformance beside the checkout), as the test resolves it.
const conformance = process.env.CAR_CONFORMANCE_DIR || join(here, "..", "..", "..", "shared", "conformance");
const resolve_value = (v) => (typeof v === "string" && v.startsWith("conformance:") ? join(conformance, v.slice(12)) : String(v));
const tmp = mkdtempSync(join(tmpdir(), "car-goldens-"));
try {
  for (const fx of fixtures) {
    if (only.length && !only.includes(fx.name)) continue;
    const gguf = join(tmp, `${fx.name}.gguf`);
    const args = ["gguf", "synth", "-o", gguf];
    for (const [k, v] of Object.entries(fx.spec)) {
      if (!(k in flags)) throw new Error(`${fx.name}: no synth flag for spec field ${k}`);
      if (v === true) args.push(flags[k]);
      else if (v !== false) args.push(flags[k], resolve_value(v));
    }
    execFileSync(car, args, { stdio: ["ignore", "ignore", "inherit"] });
    const out = join(tmp, `${fx.name}.json`);
    const golden_args = [join(here, "golden.mjs"), gguf, "--out", out];
    for (const p of fx.prompt_texts ?? []) golden_args.push("--prompt-text", p);
    if (!fx.prompt_texts) for (const p of prompts) golden_args.push("--prompt-ids", p.join(","));
    execFileSync(process.execPath, golden_args, { stdio: "inherit" });
    const golden = JSON.parse(readFileSync(out, "utf8"));
    const doc = { name: fx.name, synth: fx.spec, tolerance: fx.tolerance ?? 1e-4, ...golden };
    writeFileSync(join(data, `${fx.name}.golden.json`), JSON.stringify(doc, null, 1) + "\n");
    console.log(`${fx.name}: ${golden.cases.map((c) => c.generated_ids.length).join("+")} tokens, sha256 ${golden.sha256.slice(0, 12)}`);
  }
} finally {
  rmSync(tmp, { recursive: true, force: true });
}
