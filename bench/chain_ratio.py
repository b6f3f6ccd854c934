"""The codemod chain's CPU time as a multiple of a bare `libcst.parse_module` of the same file.

    python bench/chain_ratio.py FILE... [--rounds N]

A ratio rather than seconds: the machine's own speed drifts from one minute to the next (by about a quarter on a
shared 2-core machine), and a parse measured right beside the chain drifts with it. Each round times one parse and
then one run of the whole chain (`adapt_source` with every codemod, tidy and line-wrap included, as `graphmode fix`
runs it), interleaved in one process; the ratio of a round is chain / parse. Prints per file the median ratio of
the rounds with its spread [min, max], and the median seconds of each.

To time the transformers files the figures in docs/speed.md are of:

    pip download --no-deps transformers==4.36.2 -d /tmp/tw   # and 4.40.2
    unzip -j /tmp/tw/transformers-4.36.2-*.whl transformers/models/llama/modeling_llama.py -d /tmp/llama-4.36.2
"""
from __future__ import annotations

import argparse
import gc
import statistics
import time
from pathlib import Path

import libcst

from graphmode.transforms.codemods import Options
from graphmode.transforms.fix import entry_class_of
from graphmode.transforms.pipeline import adapt_source


def _cpu(run) -> float:
    gc.collect()  # each timing starts without the garbage of the one before
    started = time.process_time()
    run()
    return time.process_time() - started


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("paths", nargs="+", type=Path)
    parser.add_argument("--rounds", type=int, default=7)
    args = parser.parse_args()
    for path in args.paths:
        source = path.read_text(encoding="utf-8")
        options = Options(entry_class=entry_class_of(source))  # the class `graphmode fix` would take
        adapt_source(source, path.name, None, options)  # imports and first-call caches out of the rounds
        parses, chains = [], []
        for _ in range(args.rounds):
            parses.append(_cpu(lambda: libcst.parse_module(source)))
            chains.append(_cpu(lambda: adapt_source(source, path.name, None, options)))
        ratios = [chain / parse for chain, parse in zip(chains, parses)]
        print(f"{statistics.median(ratios):5.1f}x [{min(ratios):.1f}, {max(ratios):.1f}]  "
              f"parse {statistics.median(parses):.3f} s  chain {statistics.median(chains):.3f} s cpu  "
              f"{source.count(chr(10))} lines  {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
