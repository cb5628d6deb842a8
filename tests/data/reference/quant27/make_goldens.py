#!/usr/bin/env python3
"""Regenerates goldens.json: llama.cpp's greedy ids and top log-probabilities for small synthetic models in
the 4-bit table formats of issue #27 (IQ4_NL, IQ4_XS, MXFP4), checked by tests/engine/quant_goldens_test.cpp.

The fixtures are not committed: `car gguf synth` is deterministic (seeded weights, same bytes on any
machine), so the test writes each one again from the spec recorded here and checks its size and FNV-1a
hash before comparing. The goldens come from the reference harness (tests/reference/golden.mjs, llama.cpp
through node-llama-cpp 3.22.1's prebuilt CPU build; see tests/reference/README.md).

Usage (from the repository root, after building `car`):
    tests/data/reference/quant27/make_goldens.py [--car build/tools/car] [--harness tests/reference]
"""
import argparse
import json
import os
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))

# name -> `car gguf synth` options (the test builds the same SynthSpec from these).
FIXTURES = [
    ("llama-iq4_nl", {"arch": "llama", "layers": 2, "embd": 256, "ff": 512, "heads": 4, "kv-heads": 2,
                      "vocab": 512, "seed": 27, "type": "iq4_nl"}),
    ("llama-iq4_xs", {"arch": "llama", "layers": 2, "embd": 256, "ff": 512, "heads": 4, "kv-heads": 2,
                      "vocab": 512, "seed": 27, "type": "iq4_xs"}),
    ("llama-mxfp4", {"arch": "llama", "layers": 2, "embd": 256, "ff": 512, "heads": 4, "kv-heads": 2,
                     "vocab": 512, "seed": 27, "type": "mxfp4"}),
    ("moe-llama-mxfp4", {"arch": "llama", "layers": 2, "embd": 256, "ff": 256, "heads": 4, "kv-heads": 2,
                         "experts": 4, "experts-used": 2, "vocab": 512, "seed": 28, "type": "mxfp4"}),
    ("llama-iq2_xxs", {"arch": "llama", "layers": 2, "embd": 256, "ff": 512, "heads": 4, "kv-heads": 2,
                       "vocab": 512, "seed": 27, "type": "iq2_xxs"}),
    ("moe-qwen3-iq4_xs", {"arch": "qwen3moe", "layers": 2, "embd": 256, "ff": 512, "ff-expert": 256,
                          "heads": 4, "kv-heads": 2, "head-dim": 64, "experts": 4, "experts-used": 2,
                          "vocab": 512, "seed": 29, "type": "iq4_xs"}),
]
PROMPTS = ["1,300,301,302,400", "1,50,60,70,80,90,100,110,120,130"]
# Tolerance on |logprob - llama.cpp| per weight type: issue #27's 1e-4 for all. MXFP4, IQ2_XXS and IQ4_NL (since
# their products follow llama.cpp's repacked order, kernel_table.h repacked(): 2.0e-2 before) see < 2e-6.
# IQ4_XS deviated by up to 2.7e-2 while our products followed ggml_vec_dot alone: llama.cpp multiplies batches
# of 8 or more vectors by IQ4_XS (and the IQ2/IQ3/IQ1 types) with its IQ panel gemm (ggml-cpu/iqp.cpp), another
# order, which the engine now takes for the same batches (core/tensor/iq_panel.h): within 1.2e-6. With the
# panel off in both, the models agree too (../iq_panel_off).
TOLERANCE = {"mxfp4": 1e-4, "iq2_xxs": 1e-4, "iq4_nl": 1e-4, "iq4_xs": 1e-4}


def fnv1a64(path):
    h = 0xcbf29ce484222325
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            for b in chunk:
                h = ((h ^ b) * 0x100000001b3) & 0xffffffffffffffff
    return "%016x" % h


def arguments():
    ap = argparse.ArgumentParser()
    ap.add_argument("--car", default="build/tools/car")
    ap.add_argument("--harness", default="tests/reference")
    ap.add_argument("--threads", default="4")
    return ap.parse_args()


def make(a, fixtures, prompts, tolerance_of, about, out_path, env=None):
    """Write each fixture with `car gguf synth`, run the harness on it (with `env` added to the environment)
    and write {about, files} to out_path; tolerance_of(name, opts) gives each file's tolerance."""
    files = []
    with tempfile.TemporaryDirectory() as tmp:
        for name, opts in fixtures:
            gguf = os.path.join(tmp, name + ".gguf")
            args = [a.car, "gguf", "synth", "-o", gguf]
            for k, v in opts.items():
                args += ["--" + k, str(v)]
            subprocess.run(args, check=True, stdout=subprocess.DEVNULL)
            out = os.path.join(tmp, name + ".json")
            cmd = ["node", os.path.join(a.harness, "golden.mjs"), gguf, "--n-predict", "16", "--top-k", "5",
                   "--threads", a.threads, "--out", out]
            for p in prompts:
                cmd += ["--prompt-ids", p]
            subprocess.run(cmd, check=True, env=dict(os.environ, **(env or {})))
            with open(out) as f:
                g = json.load(f)
            g["synth"] = opts
            g["fnv1a64"] = fnv1a64(gguf)
            g["tolerance"] = tolerance_of(name, opts)
            files.append(g)
            print(f"{name}: {g['size']} bytes, cases {[c['generated_ids'][:4] for c in g['cases']]}",
                  file=sys.stderr)
    doc = {"about": about, "files": files}
    with open(out_path, "w") as f:
        json.dump(doc, f, indent=1)
        f.write("\n")


def main():
    make(arguments(), FIXTURES, PROMPTS, lambda name, opts: TOLERANCE[opts["type"]],
         "llama.cpp goldens for synthetic IQ4_NL / IQ4_XS / MXFP4 models (issue #27); regenerate with "
         "make_goldens.py", os.path.join(HERE, "goldens.json"))


if __name__ == "__main__":
    main()
