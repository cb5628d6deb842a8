// Compares two golden files case by case: generated ids, and the largest |logprob difference| over the
// top_logprobs entries of each position (matched by id). Usage:
//   node compare.mjs A.json B.json [--file NAME]
// A or B may be the shared manifest (models/manifest.json): --file picks its entry (default: B's file name).
import { readFileSync } from "node:fs";

const [a_path, b_path, ...rest] = process.argv.slice(2);
if (!a_path || !b_path) {
  console.error("usage: node compare.mjs A.json B.json [--file NAME]");
  process.exit(2);
}
const file_flag = rest.indexOf("--file");
const load = (path, name) => {
  const doc = JSON.parse(readFileSync(path, "utf8"));
  if (!Array.isArray(doc.files)) return doc;
  const entry = doc.files.find((f) => f.file === name);
  if (!entry) throw new Error(`${path} has no entry for ${name}`);
  return entry;
};
const b0 = JSON.parse(readFileSync(b_path, "utf8"));
const a0 = JSON.parse(readFileSync(a_path, "utf8"));
const name = file_flag >= 0 ? rest[file_flag + 1] : (b0.file ?? a0.file);
const a = load(a_path, name), b = load(b_path, name);
let worst = 0, ok = true;
for (const ca of a.cases) {
  const cb = b.cases.find((c) => JSON.stringify(c.prompt_ids) === JSON.stringify(ca.prompt_ids));
  if (!cb) { console.log(`case ${ca.prompt_ids}: missing in B`); ok = false; continue; }
  const same_ids = JSON.stringify(ca.generated_ids) === JSON.stringify(cb.generated_ids);
  if (!same_ids) ok = false;
  let case_worst = 0, missing = 0;
  const n = Math.min(ca.top_logprobs.length, cb.top_logprobs.length);
  for (let j = 0; j < n; ++j) {
    const bm = new Map(cb.top_logprobs[j].map((e) => [e.id, e.logprob]));
    for (const e of ca.top_logprobs[j]) {
      if (!bm.has(e.id)) { ++missing; continue; }
      case_worst = Math.max(case_worst, Math.abs(e.logprob - bm.get(e.id)));
    }
  }
  worst = Math.max(worst, case_worst);
  console.log(`case [${ca.prompt_ids.join(",")}]: ids ${same_ids ? "equal" : "DIFFER"}, max |dlogprob| ${case_worst.toExponential(2)}` +
              (missing ? `, ${missing} top ids not in B's top` : ""));
}
console.log(`${name}: ${ok ? "ids equal" : "ids DIFFER"}, max |dlogprob| ${worst.toExponential(2)}`);
process.exit(ok ? 0 : 1);
