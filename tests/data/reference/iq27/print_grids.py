#!/usr/bin/env python3
"""Prints the IQ3_XXS / IQ3_S / IQ2_XS / IQ2_S grids as C++ arrays, read back through llama.cpp's own
dequantizers (issue #27, slice 2). core/tensor/iq{1,2,3}_grids.cpp hold the output.

Each grid point is recovered from ggml's dequantize_row_* (libggml-base of node-llama-cpp 3.22.1, llama.cpp
de3ff81, the reference harness's build): one block with d = 1, the smallest group scale and no signs, whose
first group names the point; the values it yields are the grid bytes times a power of two (exact). The
first entries agree with ggml-common.h's listing (iq3xxs_grid starts 0x04040404, 0x04040414, ...).

Usage (from the repository root):
    tests/data/reference/iq27/print_grids.py [--lib-dir ...] > /tmp/grids.inc
"""
import argparse
import ctypes
import os
import struct

ONE = struct.pack("<e", 1.0)


def dequant(base, name, block, n=256):
    out = (ctypes.c_float * n)()
    getattr(base, "dequantize_row_" + name)(ctypes.create_string_buffer(bytes(block), len(block)), out,
                                           ctypes.c_int64(n))
    return list(out)


def point(values, scale, width):
    v = 0
    for j in range(width):
        q = values[j] / scale
        assert q == int(q) and 0 < q < 256, (values[:width], scale)
        v |= int(q) << (8 * j)
    return v


def iq3_xxs(base, k):
    b = bytearray(98)
    b[0:2] = ONE
    b[2] = k  # qs[0]: grid index of elements 0..3; scales_and_signs word 0 stays 0 -> db = 0.25
    return point(dequant(base, "iq3_xxs", b), 0.25, 4)


def iq3_s(base, k):
    b = bytearray(110)
    b[0:2] = ONE
    b[2] = k & 255             # qs[0]
    b[2 + 64] = k >> 8         # qh[0] bit 0: bit 8 of index 0; scales 0 -> db = 1
    return point(dequant(base, "iq3_s", b), 1.0, 4)


def iq2_xs(base, k):
    b = bytearray(74)
    b[0:2] = ONE
    b[2:4] = struct.pack("<H", k)  # qs[0]: 9-bit index, sign code 0; scale 0 -> db = 0.125
    return point(dequant(base, "iq2_xs", b), 0.125, 8)


def iq2_s(base, k):
    b = bytearray(82)
    b[0:2] = ONE
    b[2] = k & 255         # qs[0]
    b[2 + 64] = k >> 8     # qh[0] bits 0..1: bits 8..9 of index 0; signs (qs[32..]) 0; scale 0 -> 0.125
    return point(dequant(base, "iq2_s", b), 0.125, 8)


def emit(ctype, name, values, per_line, digits):
    print("alignas(64) const %s %s[%d] = {" % (ctype, name, len(values)))
    for i in range(0, len(values), per_line):
        print("    " + " ".join("0x%0*x," % (digits, v) for v in values[i:i + per_line]))
    print("};\n")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--lib-dir",
                    default="tests/reference/node_modules/@node-llama-cpp/linux-x64/bins/linux-x64")
    a = ap.parse_args()
    base = ctypes.CDLL(os.path.join(a.lib_dir, "libggml-base.so"))
    grids = [("uint32_t", "iq3xxs_grid", [iq3_xxs(base, k) for k in range(256)], 8, 8),
             ("uint32_t", "iq3s_grid", [iq3_s(base, k) for k in range(512)], 8, 8),
             ("uint64_t", "iq2xs_grid", [iq2_xs(base, k) for k in range(512)], 4, 16),
             ("uint64_t", "iq2s_grid", [iq2_s(base, k) for k in range(1024)], 4, 16)]
    assert grids[0][2][:4] == [0x04040404, 0x04040414, 0x04040424, 0x04040c0c]
    for g in grids:
        assert len(set(g[2])) == len(g[2]), g[1] + " has repeated points"
        emit(*g)


if __name__ == "__main__":
    main()
