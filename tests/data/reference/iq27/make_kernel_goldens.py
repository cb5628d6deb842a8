#!/usr/bin/env python3
"""Regenerates kernel_goldens.json: llama.cpp's own IQ3_XXS / IQ3_S / IQ2_XS / IQ2_S / IQ1_M / TQ1_0 / TQ2_0 kernels on fixed
data (issue #27, second slice of quant types), for tests/tensor/iq_slice2_llama_cpp_test.cpp, which requires
our dequantizers and every ISA's dot kernel to give the same bits.

As ../quant27/make_kernel_goldens.py: it calls the libraries node-llama-cpp 3.22.1 ships (llama.cpp de3ff81,
the reference harness's build; see tests/reference/README.md) through ctypes. ggml's quantizers (libggml-base,
after ggml_quantize_init; a uniform importance matrix for the types that require one) make two weight rows
per type, two more are random bytes under a sane fp16 scale (so every grid index, sign, scale and delta
occurs), ggml's dequantizers give their values, the CPU backend's quantize_row_q8_K rounds seeded
activations, and ggml_vec_dot_*_q8_K gives every row x activation product. The AVX2 (haswell) and AVX-512
(icelake) builds of ggml-cpu must agree bit for bit (else the script stops).

Usage (from the repository root):
    tests/data/reference/iq27/make_kernel_goldens.py \
        [--lib-dir tests/reference/node_modules/@node-llama-cpp/linux-x64/bins/linux-x64]
"""
import ctypes
import importlib.util
import os
import random
import struct

HERE = os.path.dirname(os.path.abspath(__file__))
_spec = importlib.util.spec_from_file_location("quant27_kernel_goldens",
                                               os.path.join(HERE, "..", "quant27", "make_kernel_goldens.py"))
quant27 = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(quant27)
N = quant27.N  # elements per row (two super-blocks)
N_QUANT_ROWS = 2  # rows from ggml's quantizer
N_RANDOM_ROWS = 2
CPU_VARIANTS = quant27.CPU_VARIANTS

# type -> (ggml type id, block bytes)
TYPES = {
    "iq3_xxs": (18, 98),
    "iq3_s": (21, 110),
    "iq2_xs": (17, 74),
    "iq2_s": (22, 82),
    "iq1_m": (29, 56),
    "tq1_0": (34, 54),
    "tq2_0": (35, 66),
}


def set_scale(name, block, rng):
    """A random fp16 scale in [0.001, 0.1) where the block keeps its scale."""
    h = struct.unpack("<H", struct.pack("<e", rng.uniform(0.001, 0.1)))[0]
    if name.startswith("tq"):  # the scale is the block's last two bytes
        block[-2:] = struct.pack("<H", h)
    elif name == "iq1_m":  # the fp16's nibbles are the top nibbles of the four u16 scale words (bytes 48..55)
        for k in range(4):
            off = 48 + 2 * k + 1
            block[off] = (block[off] & 0x0f) | (((h >> (4 * k)) & 15) << 4)
    else:
        block[0:2] = struct.pack("<H", h)


def main():
    base, cpus = quant27.open_libs()
    rng = random.Random(272)
    out = {"about": "llama.cpp's IQ3_XXS / IQ3_S / IQ2_XS / IQ2_S / IQ1_M / TQ1_0 / TQ2_0 kernels on fixed data (issue #27); "
                    "regenerate with make_kernel_goldens.py",
           "llama_cpp": "de3ff815ea7d559ee917f063901b8986f038abc6 (node-llama-cpp 3.22.1 prebuilt; ggml-cpu "
                        "variants %s agree)" % ", ".join(CPU_VARIANTS),
           "n": N, "types": []}
    for name, (type_id, bb) in TYPES.items():
        base.ggml_quantize_init(ctypes.c_int(type_id))
        row_bytes = N // 256 * bb
        rows = []
        for r in range(N_QUANT_ROWS + N_RANDOM_ROWS):
            if r < N_QUANT_ROWS:
                x = [rng.gauss(0.0, 1.0) * (0.02 if r == 1 else 1.0) for _ in range(N)]
                q = ctypes.create_string_buffer(row_bytes)
                imatrix = (ctypes.c_float * N)(*([1.0] * N))
                fn = getattr(base, "quantize_" + name)
                fn.restype = ctypes.c_size_t
                got = fn((ctypes.c_float * N)(*x), q, ctypes.c_int64(1), ctypes.c_int64(N), imatrix)
                assert got == row_bytes, (name, got)
                rows.append(q.raw)
            else:
                b = bytearray(rng.randrange(256) for _ in range(row_bytes))
                for blk in range(N // 256):
                    sub = b[blk * bb:(blk + 1) * bb]
                    set_scale(name, sub, rng)
                    b[blk * bb:(blk + 1) * bb] = sub
                rows.append(bytes(b))
        out["types"].append(quant27.type_entry(rng, base, cpus, name, rows, "q8_K", "ggml_vec_dot_%s_q8_K" % name))
    quant27.write_goldens(HERE, out)

if __name__ == "__main__":
    main()
