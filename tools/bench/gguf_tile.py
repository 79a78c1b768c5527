#!/usr/bin/env python3
"""Write a copy of a GGUF whose tensor data repeats each tensor's first rows, so that the file
compresses to a few MB and can be carried to a machine with no registry (the device benches).

    python3 tools/bench/gguf_tile.py IN.gguf OUT.gguf [PERIOD_BYTES]

Header, metadata (tokenizer included), tensor shapes, encodings and offsets are kept byte for
byte; each tensor's data becomes its first k rows repeated, k = max(1, PERIOD // row bytes)
(PERIOD default 16384, inside gzip's 32 KiB window). The weights stay real values of the right
encoding, so products take the time they take on the real file; the text it generates is not
the model's. Format: GGUF v3 (github.com/ggml-org/ggml, docs/gguf.md).
"""
import struct
import sys

# ggml type id -> (elements per block, bytes per block); ggml.h / ggml.c type traits
BLOCK = {0: (1, 4), 1: (1, 2), 2: (32, 18), 3: (32, 20), 6: (32, 22), 7: (32, 24), 8: (32, 34),
         10: (256, 84), 11: (256, 110), 12: (256, 144), 13: (256, 176), 14: (256, 210),
         30: (1, 2)}


def main():
    src, dst = sys.argv[1], sys.argv[2]
    period = int(sys.argv[3]) if len(sys.argv) > 3 else 16384
    data = bytearray(open(src, "rb").read())
    pos = 0

    def take(fmt):
        nonlocal pos
        v = struct.unpack_from("<" + fmt, data, pos)
        pos += struct.calcsize("<" + fmt)
        return v[0]

    def string():
        nonlocal pos
        n = take("Q")
        s = bytes(data[pos:pos + n])
        pos += n
        return s.decode("utf-8", "replace")

    scalar = {0: "B", 1: "b", 2: "H", 3: "h", 4: "I", 5: "i", 6: "f", 7: "?", 10: "Q", 11: "q", 12: "d"}

    def value(t):
        if t == 8:
            return string()
        if t == 9:
            et, n = take("I"), take("Q")
            return [value(et) for _ in range(n)]
        return take(scalar[t])

    assert data[:4] == b"GGUF", "not a GGUF file"
    pos = 4
    take("I")
    n_tensors, n_kv = take("Q"), take("Q")
    align = 32
    for _ in range(n_kv):
        k = string()
        v = value(take("I"))
        if k == "general.alignment":
            align = v
    infos = []
    for _ in range(n_tensors):
        name = string()
        dims = [take("Q") for _ in range(take("I"))]
        ty, off = take("I"), take("Q")
        infos.append((off, name, dims, ty))
    base = (pos + align - 1) // align * align
    infos.sort()
    for i, (off, name, dims, ty) in enumerate(infos):
        if ty not in BLOCK:
            sys.exit(f"{name}: ggml type {ty} not in this script's table")
        per, nb = BLOCK[ty]
        n = 1
        for d in dims:
            n *= d
        size = n // per * nb
        row = dims[0] // per * nb
        k = max(1, period // row) * row
        start = base + off
        if size <= k:
            continue
        pat = bytes(data[start:start + k])
        reps = size // k
        data[start:start + reps * k] = pat * reps
        tail = size - reps * k
        data[start + reps * k:start + size] = pat[:tail]
    open(dst, "wb").write(data)


if __name__ == "__main__":
    main()
