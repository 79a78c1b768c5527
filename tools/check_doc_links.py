#!/usr/bin/env python3
"""Checks the relative links of the repository's Markdown pages.

Every `](path)` and `](path#anchor)` outside code blocks must name an existing file, and an
anchor must match a heading of the target page (GitHub's slugs: lowercase, punctuation other
than `-` and `_` dropped, spaces as `-`, `-N` for repeats). Links with a scheme are skipped.
Usage: tools/check_doc_links.py [FILE.md ...]   (default: README.md, ARCHITECTURE.md,
BENCHMARKS.md and docs/*.md, from the repository root). Exits 1 when a link is broken.
"""
import glob
import os
import re
import sys


def slug(heading):
    h = re.sub(r"[^\w\- ]", "", heading.strip().lower())
    return h.replace(" ", "-")


def anchors(path):
    out, seen, fence = set(), {}, False
    for line in open(path, encoding="utf-8"):
        if line.startswith("```"):
            fence = not fence
            continue
        m = None if fence else re.match(r"^#{1,6}\s+(.*)$", line)
        if m:
            s = slug(m.group(1))
            n = seen.get(s, 0)
            seen[s] = n + 1
            out.add(s if n == 0 else f"{s}-{n}")
    return out


def main():
    os.chdir(os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
    files = sys.argv[1:] or ["README.md", "ARCHITECTURE.md", "BENCHMARKS.md"] + sorted(
        glob.glob("docs/*.md")
    )
    total = bad = 0
    for f in files:
        text = re.sub(r"```.*?```", "", open(f, encoding="utf-8").read(), flags=re.S)
        for m in re.finditer(r"\]\(([^)\s]+)\)", text):
            link = m.group(1)
            if re.match(r"^[a-z]+:", link):
                continue
            total += 1
            path, _, anchor = link.partition("#")
            target = os.path.normpath(os.path.join(os.path.dirname(f), path)) if path else f
            if not os.path.exists(target):
                print(f"{f}: {link}: no file {target}")
                bad += 1
            elif anchor and anchor not in anchors(target):
                print(f"{f}: {link}: no heading #{anchor} in {target}")
                bad += 1
    print(f"{total} relative links checked, {bad} broken")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
