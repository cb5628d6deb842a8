#!/usr/bin/env python3
"""Regenerates goldens.json: the IQ models of ../quant27 and ../iq27 that deviate from llama.cpp by 5e-3 to
3e-2, run by the same harness with llama.cpp's IQ panel turned off (GGML_NO_IQ_PANEL=1), checked by
tests/engine/quant_goldens_test.cpp at issue #27's 1e-4 with the engine's panel off too.

Why: llama.cpp de3ff81 multiplies batches of at least 8 vectors by IQ2_XXS, IQ2_XS, IQ2_S, IQ3_XXS, IQ3_S,
IQ1_S, IQ1_M and IQ4_XS matrices (and experts with at least 8 rows) with its "IQ panel" gemm
(ggml-cpu/iqp.cpp): each super-block of 8 rows decoded to int8 values and sub-block scales, one exact
integer per super-block, times dfac * y.d by FMA. That order is not ggml_vec_dot's, which our kernels
follow; the harness's teacher-forced pass (prompt + generated ids in one batch) and its prompt batches take
the panel, its one-token decode steps do not. The difference is a rounding in the last bit that, once it moves
an activation across a Q8_K rounding step, grows along the sequence. GGML_NO_IQ_PANEL is llama.cpp's own
switch back to ggml_vec_dot; with it every one of these models agrees with ours within 5e-7 - the deviation
is that order alone. (IQ2_XXS and IQ1_S models agree either way: for them the panel's arithmetic and
ggml_vec_dot's give the same bits.) The engine now takes the panel's order for the same batches
(core/tensor/iq_panel.h), so the default goldens hold at 1e-4 too; these are checked with the engine's panel
turned off as well (tensor::set_iq_panel_enabled(false)): the dot-order products stay llama.cpp's.

Usage (from the repository root, after building `car`):
    tests/data/reference/iq_panel_off/make_goldens.py [--car build/tools/car] [--harness tests/reference]
"""
import importlib.util
import os

HERE = os.path.dirname(os.path.abspath(__file__))


def load(name):
    spec = importlib.util.spec_from_file_location(name + "_goldens", os.path.join(HERE, "..", name, "make_goldens.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


quant27 = load("quant27")
iq27 = load("iq27")
NAMES = ["llama-iq4_xs", "moe-qwen3-iq4_xs", "llama-iq3_xxs", "llama-iq3_s", "llama-iq2_xs", "moe-llama-iq2_s"]
FIXTURES = [f for f in quant27.FIXTURES + iq27.FIXTURES if f[0] in NAMES]
assert len(FIXTURES) == len(NAMES)


def main():
    quant27.make(quant27.arguments(), FIXTURES, quant27.PROMPTS, lambda name, opts: 1e-4,
                 "llama.cpp goldens with its IQ panel off (GGML_NO_IQ_PANEL=1) for the IQ4_XS / IQ3_XXS / IQ3_S / "
                 "IQ2_XS / IQ2_S models of ../quant27 and ../iq27 (issue #27); regenerate with make_goldens.py",
                 os.path.join(HERE, "goldens.json"), env={"GGML_NO_IQ_PANEL": "1"})


if __name__ == "__main__":
    main()
