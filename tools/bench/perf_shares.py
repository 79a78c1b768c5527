#!/usr/bin/env python3
"""Where decode time goes: groups the self-time shares of a `perf record` file (from
`perf report --no-children --sort sym`) into matvec kernels, thread-pool wake-ups
(rayon / futex / sched_yield / scheduler), allocation (malloc, free, memset, page faults),
norm / RoPE / softmax / attention, and the rest, and prints the top symbols.

    tools/bench/perf_shares.py PERF_DATA [TOP]
"""
import re
import subprocess
import sys

GROUPS = [
    ("matvec kernels", r"quant::|kernels::fused|kernels::small_batch|kernels::gemm|matvec|tile"),
    ("pool wake-ups (rayon/futex/sched)",
     r"rayon|crossbeam|futex|sched|finish_task_switch|_raw_spin|try_to_wake|syscall|lock_contended|schedule|wake_up|irqentry|rseq"),
    ("allocation", r"malloc|calloc|free|memset|clear_page|page_fault|alloc|do_anonymous_page|realloc"),
    ("norm/RoPE/softmax/attention", r"attn::|norm|rope|softmax|expf|sincos|gelu|geglu|silu|attention"),
]


def main():
    data = sys.argv[1]
    top = int(sys.argv[2]) if len(sys.argv) > 2 else 12
    out = subprocess.run(
        ["perf", "report", "-i", data, "--no-children", "--sort", "sym", "-g", "none"],
        capture_output=True, text=True, check=True).stdout
    rows = []
    for line in out.splitlines():
        m = re.match(r"\s*([\d.]+)%\s+\[[.k]\]\s+(.*)", line)
        if m:
            rows.append((float(m.group(1)), m.group(2).strip()))
    shares = {g: 0.0 for g, _ in GROUPS}
    shares["other"] = 0.0
    for pct, sym in rows:
        for g, pat in GROUPS:
            if re.search(pat, sym):
                shares[g] += pct
                break
        else:
            shares["other"] += pct
    for g, v in shares.items():
        print(f"{v:6.1f}%  {g}")
    print("top symbols:")
    for pct, sym in rows[:top]:
        print(f"  {pct:6.2f}%  {sym[:110]}")


if __name__ == "__main__":
    main()
