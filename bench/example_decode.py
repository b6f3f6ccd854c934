"""Decode speed of the bundled example, eager original vs graphmode-adapted, over fresh processes.

    python bench/example_decode.py [--backend inductor] [--runs 3] [--steps 32]

Adapts examples/legacy_llm into a temporary folder (all changes approved), then runs the
verification N times; each run starts both sides in fresh processes. Prints the median with
[min, max] of each figure. Timings live here, not in tests.
"""
from __future__ import annotations

import argparse
import statistics
import tempfile
from pathlib import Path

from graphmode.agent.output import write_adapted_tree
from graphmode.agent.workflow.adaptation import fused_ops_for
from graphmode.runners.verify.verify import verify
from graphmode.transforms.codemods import Options
from graphmode.transforms.pipeline import adapt_source

EXAMPLE = Path(__file__).resolve().parents[1] / "examples" / "legacy_llm"


def adapt_example(dest: Path, backend: str) -> Path:
    source = (EXAMPLE / "model.py").read_text()
    # The fused operators `graphmode adapt --backend` writes for this backend's hardware.
    options = Options(max_seq_len=64, entry_class="Transformer", fused_ops=fused_ops_for(backend))
    adapted = adapt_source(source, "model.py", None, options)
    write_adapted_tree(EXAMPLE, dest, {"model.py": adapted.adapted})
    return dest


def spread(values: list[float], unit: str) -> str:
    return f"{statistics.median(values):.3f} {unit} [{min(values):.3f}, {max(values):.3f}]"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--backend", default="inductor")
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--steps", type=int, default=32)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        adapted = adapt_example(Path(tmp) / "adapted", args.backend)
        results = [verify(EXAMPLE, adapted, args.backend, steps=args.steps) for _ in range(args.runs)]
    assert all(r.passed for r in results), [r.problems for r in results]
    print(f"backend {args.backend}, {args.runs} runs x {args.steps} Decode steps, batch 1")
    print("eager  Decode ms/token:", spread([r.eager.decode_ms_per_token for r in results], "ms"))
    print("graph  Decode ms/token:", spread([r.graph.decode_ms_per_token for r in results], "ms"))
    print("speed-up              :", spread([r.decode_speedup for r in results], "x"))
    print("eager  Prefill        :", spread([r.eager.prefill_ms for r in results], "ms"))
    print("graph  warm-up        :", spread([r.graph.warmup_s for r in results], "s"))


if __name__ == "__main__":
    main()
