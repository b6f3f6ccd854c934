"""How much longer graphmode's adaptation makes a model file, and what ruff finds in it that the original lacks.

    python bench/adapted_lines.py [FILE ...]

Adapts, with the whole chain as `graphmode fix` does (transforms.fix.fix_file, no runtime evidence), the bundled
examples' model files, the installed transformers' modeling_llama.py, modeling_qwen2.py, modeling_gpt2.py and
modeling_mixtral.py, and any FILE given (a modeling file of another transformers release, say). The entry class is
the one the example's harness builds, else the file's causal-LM class (`graphmode fix`'s choice). Prints, per file,
the original's lines, the adapted file's lines (graphmode_static.py beside it not counted: it is the same for every
file; its own length is printed once at the end), their ratio, and ruff's findings the adapted file adds: ruff's
pyflakes and pycodestyle checks (F, E, W) run over both texts at the original's own line limit (its longest line,
at least 79, what transforms.output.line_wrap wraps to), a finding counted as new where the adapted text has more of it
than the original. Issue 36's goal is a ratio of at most 1.25 with no new finding.
"""
from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:  # `python bench/adapted_lines.py` from anywhere
    sys.path.insert(0, str(ROOT))

from graphmode.transforms.codemods.lib.helper_code import helper_module_text  # noqa: E402
from graphmode.transforms.fix import fix_file  # noqa: E402

EXAMPLES = {  # the model files of the bundled examples, with the class their harness builds
    "legacy_llm/model.py": "Transformer",
    "meta_llama/model.py": "Transformer",
    "hf_cache_api/model.py": "ForCausalLM",
    "hf_cache_api/masks.py": "ForCausalLM",
    "hf_cache_api/cache.py": "ForCausalLM",
}
TRANSFORMERS_MODELS = ("llama", "qwen2", "gpt2", "mixtral")


def _ruff() -> list[str]:
    try:
        import ruff  # noqa: F401  (only whether the module is there)
        return [sys.executable, "-m", "ruff"]
    except ImportError:
        found = shutil.which("ruff")
        if found is None:
            raise SystemExit("ruff is not installed (pip install -e '.[dev]')") from None
        return [found]


def findings(text: str, limit: int) -> Counter:
    """ruff's F, E and W findings in `text` by (code, message); a long line by its code alone, as its message
    names its length, which a rewrite changes."""
    done = subprocess.run([*_ruff(), "check", "--isolated", "--no-cache", "--select", "F,E,W", "--line-length",
                           str(limit), "--output-format", "json", "--stdin-filename", "model.py", "-"],
                          input=text, capture_output=True, text=True, timeout=300)
    if done.returncode not in (0, 1):
        raise SystemExit(f"ruff failed: {done.stderr}")
    return Counter((f["code"], "" if f["code"] == "E501" else f["message"]) for f in json.loads(done.stdout))


def files(extra: list[Path]) -> list[tuple[str, Path, str | None]]:
    """(label, path, entry class or None for `graphmode fix`'s choice)."""
    chosen = [(f"examples/{name}", ROOT / "examples" / name, entry) for name, entry in EXAMPLES.items()]
    try:
        import transformers
        models = Path(transformers.__file__).parent / "models"
        chosen += [(f"transformers {transformers.__version__} {m}", models / m / f"modeling_{m}.py", None)
                   for m in TRANSFORMERS_MODELS if (models / m / f"modeling_{m}.py").is_file()]
    except ImportError:
        print("transformers is not installed: its modeling files are left out", file=sys.stderr)
    return chosen + [(str(path), path, None) for path in extra]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("paths", nargs="*", type=Path, help="more files to adapt")
    args = parser.parse_args()
    chosen = files(args.paths)
    width = max(len(label) for label, _, _ in chosen)
    print(f"{'file':<{width}} {'original':>8} {'adapted':>8} {'ratio':>6}  new ruff findings")
    over = 0
    for label, path, entry in chosen:
        original = path.read_text(encoding="utf-8")
        result = fix_file(path, path.name, entry)
        if result.status not in ("rewritten", "unchanged"):
            print(f"{label:<{width}} {result.status}: {result.error}")
            over += 1
            continue
        adapted = result.adapted or original
        limit = max([79, *(len(line) for line in original.splitlines())])
        new = findings(adapted, limit) - findings(original, limit)
        before, after = original.count("\n"), adapted.count("\n")
        said = ", ".join(f"{code} {message}".strip() + (f" x{n}" if n > 1 else "")
                         for (code, message), n in sorted(new.items())) or "none"
        print(f"{label:<{width}} {before:>8} {after:>8} {after / before:>6.2f}  {said}")
        over += after > 1.25 * before or bool(new)
    print(f"graphmode_static.py (beside each adapted folder, not counted above): "
          f"{helper_module_text().count(chr(10))} lines")
    print(f"{over} file(s) past a ratio of 1.25 or with a new finding")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
