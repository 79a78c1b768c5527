#!/usr/bin/env python3
"""Writes the dequantization fixture checked by `src/quant/tests.rs`.

Expected values come from the `gguf` Python package (`gguf.quants.dequantize`), which is
independent of our Rust code. Blocks are random (fixed seed, finite f16 scales) plus a few
taken from real tensors of a GGUF file.

Usage:
  quant_fixture.py GGUF OUT            # small fixture (committed: src/quant/testdata/quant_fixture.bin)
  quant_fixture.py --full GGUF OUT     # one whole real tensor per type (large; not committed;
                                       # checked by the ignored test with DELTAFIN_QUANT_FULL=OUT)
  quant_fixture.py --mxfp4 OUT         # 256 random MXFP4 blocks, one per E8M0 scale byte
                                       # (committed: src/quant/testdata/mxfp4_fixture.bin)

File format (little-endian): b"DFQF", u32 record count, then per record: u32 ggml type id,
u32 element count, u32 byte count, the encoded bytes, then element count × f32 expected.
"""
import struct
import sys

import numpy as np
import gguf
from gguf import GGMLQuantizationType as T

# (type, bytes per block, elements per block, byte offsets of f16 scales in a block)
LAYOUT = {
    T.F32: (4, 1, []),
    T.F16: (2, 1, []),
    T.BF16: (2, 1, []),
    T.Q8_0: (34, 32, [0]),
    T.Q4_0: (18, 32, [0]),
    T.Q5_0: (22, 32, [0]),
    T.Q4_K: (144, 256, [0, 2]),
    T.Q6_K: (210, 256, [208]),
}


def record(ty, raw):
    raw = np.ascontiguousarray(raw, dtype=np.uint8).reshape(-1)
    bb, be, _ = LAYOUT[ty] if ty in LAYOUT else (17, 32, [])
    n = raw.size // bb * be
    exp = gguf.quants.dequantize(raw, ty).astype(np.float32).reshape(-1)
    assert exp.size == n
    return struct.pack("<III", int(ty), n, raw.size) + raw.tobytes() + exp.astype("<f4").tobytes()


def random_blocks(rng, ty, nblocks):
    bb, be, scales = LAYOUT[ty]
    if ty == T.F32:
        v = (rng.standard_normal(nblocks) * 10.0 ** rng.integers(-6, 6, nblocks)).astype("<f4")
        return v.view(np.uint8)
    if ty == T.F16:
        v = rng.standard_normal(nblocks) * 10.0 ** rng.integers(-7, 4, nblocks)
        return v.astype("<f2").view(np.uint8)  # includes f16 subnormals, no NaN
    if ty == T.BF16:
        bits = rng.integers(0, 1 << 16, nblocks, dtype=np.uint32).astype("<u2")
        exp = (bits >> 7) & 0xFF
        bits[exp == 0xFF] &= 0x807F  # no inf/NaN
        return bits.view(np.uint8)
    raw = rng.integers(0, 256, (nblocks, bb), dtype=np.uint8)
    for off in scales:
        d = (rng.standard_normal(nblocks) * 10.0 ** rng.integers(-6, 1, nblocks)).astype("<f2")
        raw[:, off:off + 2] = d.view(np.uint8).reshape(nblocks, 2)
    return raw


def real_tensors(path):
    reader = gguf.GGUFReader(path)
    by_type = {}
    for t in reader.tensors:
        by_type.setdefault(t.tensor_type, []).append(t)
    return by_type


def write(out, recs):
    with open(out, "wb") as f:
        f.write(b"DFQF" + struct.pack("<I", len(recs)))
        for r in recs:
            f.write(r)


def mxfp4_main(out):
    """One record of 256 MXFP4 blocks (17 bytes: E8M0 scale, 16 nibble bytes), the scale
    bytes a shuffled 0..=255 (subnormal 2^-128/2^-127, normal, and 255 = 2^127 with inf
    products), the nibbles random."""
    rng = np.random.default_rng(20261130)
    raw = rng.integers(0, 256, (256, 17), dtype=np.uint8)
    raw[:, 0] = rng.permutation(256).astype(np.uint8)
    write(out, [record(T.MXFP4, raw)])


def main():
    args = sys.argv[1:]
    if args and args[0] == "--mxfp4":
        return mxfp4_main(args[1])
    full = args and args[0] == "--full"
    if full:
        args = args[1:]
    path, out = args
    rng = np.random.default_rng(20261129)
    recs = []
    real = real_tensors(path)
    if full:
        for ty, ts in real.items():
            if ty not in LAYOUT:
                continue
            t = min(ts, key=lambda t: abs(t.data.nbytes - 2_000_000))
            recs.append(record(ty, np.asarray(t.data).view(np.uint8)))
            print(f"{t.name}: {ty.name}, {t.data.nbytes} bytes", file=sys.stderr)
    else:
        for ty in LAYOUT:
            recs.append(record(ty, random_blocks(rng, ty, 3 if LAYOUT[ty][1] > 1 else 67)))
            if ty in real:
                t = real[ty][0]
                flat = np.asarray(t.data).view(np.uint8).reshape(-1)
                bb, be, _ = LAYOUT[ty]
                nb = flat.size // bb
                take = 2 if be > 1 else 40
                for start in (0, nb // 2):
                    recs.append(record(ty, flat[start * bb:(start + take) * bb]))
    with open(out, "wb") as f:
        f.write(b"DFQF" + struct.pack("<I", len(recs)))
        for r in recs:
            f.write(r)


if __name__ == "__main__":
    main()
