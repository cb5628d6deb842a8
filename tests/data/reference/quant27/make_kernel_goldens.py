#!/usr/bin/env python3
"""Regenerates kernel_goldens.json: llama.cpp's own IQ4_NL / IQ4_XS / MXFP4 / IQ2_XXS / IQ1_S kernels on fixed data, for
tests/tensor/iq4_llama_cpp_test.cpp, which requires our kernels to give the same bits.

It calls the libraries node-llama-cpp 3.22.1 ships (llama.cpp de3ff81, the reference harness's build; see
tests/reference/README.md) through ctypes: ggml's reference quantizers (libggml-base) make the weight rows
(plus rows of random bytes, so every nibble and sub-block scale occurs), ggml's dequantizers give their
values, the CPU backend's quantize_row_q8_0 / _q8_K round seeded activations, and ggml_vec_dot_* gives every
row x activation product. Each CPU variant listed is run and must agree bit for bit (else the script stops).

Usage (from the repository root):
    tests/data/reference/quant27/make_kernel_goldens.py \
        [--lib-dir tests/reference/node_modules/@node-llama-cpp/linux-x64/bins/linux-x64]
"""
import argparse
import ctypes
import json
import os
import random
import struct

HERE = os.path.dirname(os.path.abspath(__file__))
N = 512          # elements per row (two IQ4_XS super-blocks, 16 blocks of 32)
N_QUANT_ROWS = 2  # rows from ggml's quantizer
N_RANDOM_ROWS = 2  # rows of random bytes with the quantizer's scales
N_ACTS = 3
CPU_VARIANTS = ["haswell", "icelake"]  # AVX2, AVX-512 builds of ggml-cpu

# type -> (block elements, block bytes, bytes at the start of a block that hold the scale, activation type,
#          whether ggml has a reference quantizer for it without an importance matrix)
TYPES = {
    "iq4_nl": (32, 18, 2, "q8_0", True),
    "iq4_xs": (256, 136, 2, "q8_K", True),
    "mxfp4": (32, 17, 1, "q8_0", True),
    "iq2_xxs": (256, 66, 2, "q8_K", False),  # every row random bytes under a random fp16 scale
    "iq1_s": (256, 50, 2, "q8_K", False),
}
ACT_BYTES = {"q8_0": (32, 34), "q8_K": (256, 292)}
VEC_DOT = {"iq4_nl": "ggml_vec_dot_iq4_nl_q8_0", "iq4_xs": "ggml_vec_dot_iq4_xs_q8_K",
           "mxfp4": "ggml_vec_dot_mxfp4_q8_0", "iq2_xxs": "ggml_vec_dot_iq2_xxs_q8_K",
           "iq1_s": "ggml_vec_dot_iq1_s_q8_K"}


def f32_bits(x):
    return "%08x" % struct.unpack("<I", struct.pack("<f", x))[0]


def open_libs(argv=None):
    """ggml's base library and the CPU variants' libraries from --lib-dir (shared with ../iq27)."""
    ap = argparse.ArgumentParser()
    ap.add_argument("--lib-dir",
                    default="tests/reference/node_modules/@node-llama-cpp/linux-x64/bins/linux-x64")
    a = ap.parse_args(argv)
    base = ctypes.CDLL(os.path.join(a.lib_dir, "libggml-base.so"), mode=ctypes.RTLD_GLOBAL)
    cpus = {}
    for v in CPU_VARIANTS:
        lib = ctypes.CDLL(os.path.join(a.lib_dir, "libggml-cpu-%s.so" % v))
        lib.ggml_cpu_init()
        cpus[v] = lib
    return base, cpus


def type_entry(rng, base, cpus, name, rows, act, vec_dot):
    """The goldens of weight type `name` on `rows`: N_ACTS seeded activations rounded to `act` by every CPU
    variant, ggml's dequantization of each row, and every row x activation product by `vec_dot` (the
    variants must agree bit for bit)."""
    acts_x, acts_q = [], []
    abs_, abb = ACT_BYTES[act]
    act_bytes = N // abs_ * abb
    for i in range(N_ACTS):
        x = [rng.gauss(0.0, 1.0) * (30.0 if i == 2 else 1.0) for _ in range(N)]
        x = [struct.unpack("<f", struct.pack("<f", v))[0] for v in x]  # as float32
        acts_x.append(x)
        qa = None
        for v, lib in cpus.items():
            buf = ctypes.create_string_buffer(act_bytes)
            getattr(lib, "quantize_row_" + act)((ctypes.c_float * N)(*x), buf, ctypes.c_int64(N))
            assert qa is None or qa == buf.raw, "CPU variants disagree on quantize_row_" + act
            qa = buf.raw
        acts_q.append(qa)
    deq = []
    for b in rows:
        o = (ctypes.c_float * N)()
        getattr(base, "dequantize_row_" + name)(ctypes.create_string_buffer(b, len(b)), o, ctypes.c_int64(N))
        deq.append([f32_bits(v) for v in o])
    dots = []
    for b in rows:
        wb = ctypes.create_string_buffer(b, len(b))
        row = []
        for qa in acts_q:
            ab = ctypes.create_string_buffer(qa, len(qa))
            got = None
            for v, lib in cpus.items():
                s = ctypes.c_float()
                getattr(lib, vec_dot)(ctypes.c_int(N), ctypes.byref(s), ctypes.c_size_t(0), wb,
                                      ctypes.c_size_t(0), ab, ctypes.c_size_t(0), ctypes.c_int(1))
                assert got is None or got == f32_bits(s.value), "CPU variants disagree on " + vec_dot
                got = f32_bits(s.value)
            row.append(got)
        dots.append(row)
    return {
        "type": name.upper(), "activation_type": act.upper(),
        "rows": [b.hex() for b in rows],
        "dequantized": deq,  # float32 bit patterns, per row
        "activations": [[f32_bits(v) for v in x] for x in acts_x],
        "activations_rounded": [q.hex() for q in acts_q],
        "dots": dots,  # [row][activation] float32 bit patterns
    }


def write_goldens(here, out):
    with open(os.path.join(here, "kernel_goldens.json"), "w") as f:
        json.dump(out, f, indent=1)
        f.write("\n")


def main():
    base, cpus = open_libs()
    rng = random.Random(27)
    out = {"about": "llama.cpp's IQ4_NL / IQ4_XS / MXFP4 / IQ2_XXS / IQ1_S kernels on fixed data (issue #27); regenerate with "
                    "make_kernel_goldens.py", "llama_cpp": "de3ff815ea7d559ee917f063901b8986f038abc6 "
                    "(node-llama-cpp 3.22.1 prebuilt; ggml-cpu variants %s agree)" % ", ".join(CPU_VARIANTS),
           "n": N, "types": []}
    for name, (bs, bb, scale_bytes, act, has_quantizer) in TYPES.items():
        row_bytes = N // bs * bb
        rows = []
        for r in range(N_QUANT_ROWS + N_RANDOM_ROWS):
            x = [rng.gauss(0.0, 1.0) * (0.02 if r == 1 else 1.0) for _ in range(N)]
            xb = (ctypes.c_float * N)(*x)
            q = ctypes.create_string_buffer(row_bytes)
            if has_quantizer:
                getattr(base, "quantize_row_%s_ref" % name)(xb, q, ctypes.c_int64(N))
            else:
                for blk in range(N // bs):
                    q[blk * bb: blk * bb + 2] = struct.pack("<e", rng.uniform(0.001, 0.1))
            b = bytearray(q.raw)
            if r >= N_QUANT_ROWS or not has_quantizer:  # keep each block's scale, randomize the rest
                for blk in range(N // bs):
                    for k in range(scale_bytes, bb):
                        b[blk * bb + k] = rng.randrange(256)
            rows.append(bytes(b))
        out["types"].append(type_entry(rng, base, cpus, name, rows, act, VEC_DOT[name]))
    write_goldens(HERE, out)

if __name__ == "__main__":
    main()
