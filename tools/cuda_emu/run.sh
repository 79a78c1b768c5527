#!/bin/bash
# The host emulations of the CUDA kernels: mla_kda.cpp (the MLA and KDA-scan kernels) and
# family_ops.cpp (the other family ops: family_ops.cu). Needs g++ with C++20 (std::barrier).
# One OS thread per CUDA thread, so slow (mla_kda: 3 to 6 minutes on 2 busy cores;
# family_ops: seconds); prints each case's error against the CPU's formulas and ends each
# program with `ok` or `FAILED` (exit status 1). `run.sh family_ops` runs one of them.
set -eu
cd "$(dirname "$0")"
progs=${1:-mla_kda family_ops}
for p in $progs; do
    out=${TMPDIR:-/tmp}/deltafin-cuda-emu-$p
    g++ -std=c++20 -O2 -ffp-contract=off -pthread "$p.cpp" -o "$out"
    echo "== $p"
    "$out"
done
