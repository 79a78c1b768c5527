#!/bin/bash
# The host emulation of the MLA and KDA kernels (mla_kda.cpp): needs g++ with C++20
# (std::barrier). One OS thread per CUDA thread, so slow (3 to 6 minutes on 2 busy cores); prints
# each case's error against the CPU's formulas and ends with `ok` or `FAILED` (exit status 1).
set -eu
cd "$(dirname "$0")"
out=${TMPDIR:-/tmp}/deltafin-cuda-emu
g++ -std=c++20 -O2 -ffp-contract=off -pthread mla_kda.cpp -o "$out"
"$out"
