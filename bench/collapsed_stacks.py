#!/usr/bin/env python
"""Aggregate py-spy's collapsed stacks (``py-spy record -f raw``) by function.

Each line of the file is ``frame;frame;…;frame count``, outermost first. Prints the top
functions by self samples (the innermost frame) and by inclusive samples (anywhere on the
stack, counted once per stack), as a share of all samples, and each thread's share.

Usage: python bench/collapsed_stacks.py out.txt [--top 25] [--thread vpay-exec]
"""

from __future__ import annotations

import argparse
import re
from collections import Counter

# py-spy frames read "function (path/to/file.py:line)"; the line is dropped so one function
# is one row however many of its lines were sampled.
_LINE = re.compile(r":\d+\)$")


def _function(frame: str) -> str:
    frame = _LINE.sub(")", frame.strip())
    return frame.replace("/work/wt-charges/", "").replace(".venv/lib/python3.11/site-packages/", "")


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("path")
    parser.add_argument("--top", type=int, default=25)
    parser.add_argument("--thread", default="", help="only stacks whose thread name contains this")
    args = parser.parse_args()
    self_, inclusive, threads = Counter(), Counter(), Counter()
    total = 0
    with open(args.path) as fh:
        for line in fh:
            stack, _, count = line.rstrip("\n").rpartition(" ")
            if not stack:
                continue
            frames = stack.split(";")
            if args.thread and not any(args.thread in f for f in frames[:1]):
                continue
            n = int(count)
            total += n
            threads[re.sub(r"\d+", "N", frames[0])] += n
            functions = [_function(f) for f in frames[1:]] or [frames[0]]
            self_[functions[-1]] += n
            for f in set(functions):
                inclusive[f] += n
    print(f"{total} samples")
    for title, counter in (("threads", threads), ("self", self_), ("inclusive", inclusive)):
        print(f"\n## {title}")
        for name, n in counter.most_common(args.top):
            print(f"{100 * n / total:5.1f}%  {name}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
