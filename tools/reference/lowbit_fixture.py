#!/usr/bin/env python3
"""Writes the low-bit dequantization fixtures checked by `src/quant/tests_lowbit.rs`.

Expected values come from the `gguf` Python package (`gguf.quants.dequantize`, gguf 0.19.0 with
numpy 2.4.6, as pinned in requirements.txt), which is independent of our Rust code.

Usage: lowbit_fixture.py OUT_DIR   # writes lowbit_fixture.bin and lowbit_edges.bin

- lowbit_fixture.bin (the DFQF format of quant_fixture.py: full expected values): per type,
  random blocks (one 256-element super-block, or eight 32-element blocks) with finite f16 scales.
- lowbit_edges.bin (format below): per type, blocks that together hold every value of every
  scale byte (or scale field), every codebook (grid) index, every sign index / sign byte, and
  special f16 scales (smallest subnormal, largest normal, -0, negative), with random elsewhere;
  the expected values are stored as a 64-bit FNV-1a hash of their little-endian f32 bytes.

lowbit_edges.bin (little-endian): b"DFQE", u32 record count, then per record: u32 ggml type id,
u32 element count, u32 byte count, the encoded bytes, u64 FNV-1a of the expected f32 bytes.
"""
import os
import struct
import sys

import numpy as np
import gguf
from gguf import GGMLQuantizationType as T

# type: (bytes per block, elements per block, byte offsets of f16 scales)
LAYOUT = {
    T.Q4_1: (20, 32, [0, 2]),
    T.Q5_1: (24, 32, [0, 2]),
    T.Q2_K: (84, 256, [80, 82]),
    T.Q3_K: (110, 256, [108]),
    T.Q5_K: (176, 256, [0, 2]),
    T.IQ1_S: (50, 256, [0]),
    T.IQ1_M: (56, 256, []),  # f16 scale spread over the top nibbles of bytes 49, 51, 53, 55
    T.IQ2_XXS: (66, 256, [0]),
    T.IQ2_XS: (74, 256, [0]),
    T.IQ2_S: (82, 256, [0]),
    T.IQ3_XXS: (98, 256, [0]),
    T.IQ3_S: (110, 256, [0]),
    T.IQ4_NL: (18, 32, [0]),
    T.IQ4_XS: (136, 256, [0]),
    T.TQ1_0: (54, 256, [52]),
    T.TQ2_0: (66, 256, [64]),
}

SPECIAL_F16 = np.array([0x0001, 0x7BFF, 0x8000, 0xFBFF, 0x3C00, 0x8400], dtype="<u2")


def fnv1a(data):
    h = 0xCBF29CE484222325
    for b in data:
        h = ((h ^ b) * 0x100000001B3) & 0xFFFFFFFFFFFFFFFF
    return h


def expected(ty, raw):
    raw = np.ascontiguousarray(raw, dtype=np.uint8).reshape(-1)
    exp = gguf.quants.dequantize(raw, ty).astype("<f4").reshape(-1)
    bb, be, _ = LAYOUT[ty]
    assert exp.size == raw.size // bb * be
    return raw, exp


def set_f16(raw, ty, rng, special=False):
    n = raw.shape[0]
    d = (rng.standard_normal(n) * 10.0 ** rng.integers(-6, 1, n)).astype("<f2").view("<u2")
    if special:
        d[: len(SPECIAL_F16)] = SPECIAL_F16[: n]
    _, _, offs = LAYOUT[ty]
    for off in offs:
        raw[:, off:off + 2] = d.view(np.uint8).reshape(n, 2)
        d = np.roll(d, 1)
    if ty == T.IQ1_M:
        sc = raw[:, 48:56].copy().view("<u2").reshape(n, 4)
        for i in range(4):
            sc[:, i] = (sc[:, i] & 0x0FFF) | (((d >> (4 * i)) & 0xF) << 12)
        raw[:, 48:56] = sc.view(np.uint8).reshape(n, 8)


def cover(raw, lo, hi, t0=0):
    """Byte range lo..hi of the blocks gets consecutive values mod 256 across the blocks."""
    n = raw.shape[0]
    w = hi - lo
    raw[:, lo:hi] = ((np.arange(n * w).reshape(n, w) + t0) & 255).astype(np.uint8)


def edge_blocks(ty, rng):
    bb, be, _ = LAYOUT[ty]
    if ty in (T.Q4_1, T.Q5_1, T.IQ4_NL):
        raw = rng.integers(0, 256, (16, bb), dtype=np.uint8)
        cover(raw, bb - 16, bb)
        if ty == T.Q5_1:
            raw[0, 4:8] = 0xFF
            raw[1, 4:8] = 0
    elif ty == T.Q2_K:
        raw = rng.integers(0, 256, (16, bb), dtype=np.uint8)
        cover(raw, 0, 16)
        cover(raw, 16, 80)
    elif ty == T.Q3_K:
        raw = rng.integers(0, 256, (22, bb), dtype=np.uint8)
        cover(raw, 96, 108)
        cover(raw, 32, 96)
        raw[0, 0:32] = 0xFF
        raw[1, 0:32] = 0
    elif ty == T.Q5_K:
        raw = rng.integers(0, 256, (22, bb), dtype=np.uint8)
        cover(raw, 4, 16)
        cover(raw, 48, 176)
        raw[0, 16:48] = 0xFF
        raw[1, 16:48] = 0
    elif ty == T.TQ1_0:
        raw = rng.integers(0, 256, (5, bb), dtype=np.uint8)
        cover(raw, 0, 52)
    elif ty == T.TQ2_0:
        raw = rng.integers(0, 256, (4, bb), dtype=np.uint8)
        cover(raw, 0, 64)
    elif ty == T.IQ2_XXS:
        n = 8
        raw = rng.integers(0, 256, (n, bb), dtype=np.uint8)
        q = raw[:, 2:66].copy().view("<u4").reshape(n, 8, 2)
        g = np.arange(n * 32).reshape(n, 8, 4)
        q[..., 0] = (g[..., 0] | g[..., 1] << 8 | g[..., 2] << 16 | g[..., 3] << 24) & 0xFFFFFFFF
        s = g & 127
        sc = np.arange(n * 8).reshape(n, 8) & 15
        q[..., 1] = s[..., 0] | s[..., 1] << 7 | s[..., 2] << 14 | s[..., 3] << 21 | sc << 28
        raw[:, 2:66] = q.view(np.uint8).reshape(n, 64)
    elif ty == T.IQ2_XS:
        n = 16
        raw = rng.integers(0, 256, (n, bb), dtype=np.uint8)
        g = np.arange(n * 32).reshape(n, 32)
        q = (g & 511) | ((g & 127) << 9)
        raw[:, 2:66] = q.astype("<u2").view(np.uint8).reshape(n, 64)
        cover(raw, 66, 74)
    elif ty == T.IQ2_S:
        n = 32
        raw = rng.integers(0, 256, (n, bb), dtype=np.uint8)
        g = np.arange(n * 32).reshape(n, 32)
        raw[:, 2:34] = g & 255
        hi = (g >> 8) & 3
        raw[:, 66:74] = (hi[:, 0::4] | hi[:, 1::4] << 2 | hi[:, 2::4] << 4 | hi[:, 3::4] << 6)
        cover(raw, 34, 66)
        cover(raw, 74, 82)
    elif ty == T.IQ3_XXS:
        n = 4
        raw = rng.integers(0, 256, (n, bb), dtype=np.uint8)
        cover(raw, 2, 66)
        s = (np.arange(n * 32).reshape(n, 8, 4)) & 127
        sc = np.arange(n * 8).reshape(n, 8) & 15
        v = s[..., 0] | s[..., 1] << 7 | s[..., 2] << 14 | s[..., 3] << 21 | sc << 28
        raw[:, 66:98] = v.astype("<u4").view(np.uint8).reshape(n, 32)
    elif ty == T.IQ3_S:
        n = 8
        raw = rng.integers(0, 256, (n, bb), dtype=np.uint8)
        g = np.arange(n * 64).reshape(n, 64)
        raw[:, 2:66] = g & 255
        hi = (g >> 8) & 1
        raw[:, 66:74] = sum(hi[:, k::8] << k for k in range(8))
        cover(raw, 74, 106)
        cover(raw, 106, 110)
    elif ty == T.IQ1_S:
        n = 64
        raw = rng.integers(0, 256, (n, bb), dtype=np.uint8)
        g = np.arange(n * 32).reshape(n, 32)
        raw[:, 2:34] = g & 255
        hi = (g >> 8) & 7
        top = np.arange(n * 8).reshape(n, 8) & 15
        qh = hi[:, 0::4] | hi[:, 1::4] << 3 | hi[:, 2::4] << 6 | hi[:, 3::4] << 9 | top << 12
        raw[:, 34:50] = qh.astype("<u2").view(np.uint8).reshape(n, 16)
    elif ty == T.IQ1_M:
        n = 64
        raw = rng.integers(0, 256, (n, bb), dtype=np.uint8)
        g = np.arange(n * 32).reshape(n, 32)
        raw[:, 0:32] = g & 255
        hi = (g >> 8) & 7
        delta = rng.integers(0, 2, (n, 32))
        nib = hi | delta << 3
        raw[:, 32:48] = nib[:, 0::2] | nib[:, 1::2] << 4
    elif ty == T.IQ4_XS:
        n = 8  # sub-block i of block t has 6-bit scale 8t + i: every value once
        raw = rng.integers(0, 256, (n, bb), dtype=np.uint8)
        ls = np.arange(n * 8).reshape(n, 8)
        raw[:, 4:8] = (ls[:, 0::2] & 15) | ((ls[:, 1::2] & 15) << 4)
        sh = sum(((ls[:, i] >> 4) & 3) << (2 * i) for i in range(8))
        raw[:, 2:4] = sh.astype("<u2").view(np.uint8).reshape(n, 2)
        cover(raw, 8, 136)
    else:
        raise ValueError(ty)
    set_f16(raw, ty, rng, special=True)
    return raw


def main():
    out = sys.argv[1]
    rng = np.random.default_rng(20261201)
    full, edges = [], []
    for ty, (bb, be, _) in LAYOUT.items():
        nb = 8 if be == 32 else 1
        raw = rng.integers(0, 256, (nb, bb), dtype=np.uint8)
        set_f16(raw, ty, rng)
        raw, exp = expected(ty, raw)
        full.append(struct.pack("<III", int(ty), exp.size, raw.size) + raw.tobytes() + exp.tobytes())
        raw, exp = expected(ty, edge_blocks(ty, rng))
        edges.append(struct.pack("<III", int(ty), exp.size, raw.size) + raw.tobytes()
                     + struct.pack("<Q", fnv1a(exp.tobytes())))
    for name, magic, recs in (("lowbit_fixture.bin", b"DFQF", full), ("lowbit_edges.bin", b"DFQE", edges)):
        with open(os.path.join(out, name), "wb") as f:
            f.write(magic + struct.pack("<I", len(recs)))
            for r in recs:
                f.write(r)


if __name__ == "__main__":
    main()
