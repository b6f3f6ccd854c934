"""The Hugging Face zoo table: `graphmode adapt --hf TYPE --tiny` over the common decoder families.

    python bench/hf_zoo.py [--backend inductor] [--runs 3] [--out graphmode-out/zoo] [TYPE ...]
    python bench/hf_zoo.py --all-decoders --backend eager --runs 1 --skip-done [--limit N]
    python bench/hf_zoo.py --rewrite|--retry-rewrite --backend eager --runs 1 biogpt ctrl dbrx ...

`--all-decoders` sweeps every decoder-only model type of the installed transformers that has a causal LM class (its
AutoModelForCausalLM mapping, encoder-decoders left out), which is how a type the project's zoo does not list is
checked; each row is kept in OUT/rows/TYPE.json (a refusal writes no report.json), and `--skip-done` takes the
rows of types already run, so a sweep of many types runs in parts.

Each model type is built tiny (2 layers, hidden size 64) from the installed transformers' own config class, driven on
transformers' own static-cache path with Decode compiled, and compared with its default dynamic cache run eagerly.
`--rewrite` takes the other path for every type: `adapt --hf TYPE --rewrite`, which copies the installed release's
modeling file into the run folder and rewrites and verifies the copy (its runs under OUT/rewrite/); `--retry-rewrite`
takes it only for a type that did not verify on the static path, and keeps what stopped that first run in the row.
The table's first column says which path a row took.
Every row comes from that run's report.json (a refusal's, from the command's last line); nothing here is measured
twice or edited. The table (markdown) is
printed and written to OUT/zoo.md, each run's report under OUT/hf-TYPE-tiny/. On a 2-core CPU with inductor it takes
about 2 minutes a model.
"""
from __future__ import annotations

import argparse
import json
import re
import subprocess
import sys
import time
from pathlib import Path

# Llama, Qwen2, Qwen3, Mistral, Gemma 2 and 3, Phi-3, GPT-2, OPT, Falcon and GPT-NeoX: the families most checkpoints
# on the Hub descend from, with both cache layouts (per-layer sliding windows in Mistral and Gemma) and both position
# schemes (rotary, learned) among them.
ZOO = ("llama", "qwen2", "qwen3", "mistral", "gemma2", "gemma3_text", "phi3", "gpt2", "opt", "falcon", "gpt_neox")


def run_one(model_type: str, backend: str, runs: int, out: Path, timeout_s: float, rewrite: bool = False) -> dict:
    started = time.perf_counter()
    out = out / "rewrite" if rewrite else out  # the two paths' runs of one type have the same folder name
    command = [sys.executable, "-m", "graphmode.agent.cli", "adapt", "--hf", model_type, "--tiny", "--yes",
               "--backend", backend, "--runs", str(runs), "--out", str(out), *(["--rewrite"] if rewrite else [])]
    try:
        done = subprocess.run(command, capture_output=True, text=True, timeout=timeout_s)
        status, tail = done.returncode, (done.stdout + done.stderr).strip().splitlines()[-1:]
    except subprocess.TimeoutExpired:
        status, tail = None, [f"stopped after {timeout_s:.0f} s"]
    row = read_row(model_type, out, status, tail, "rewrite" if rewrite else "static")
    row["seconds"] = round(time.perf_counter() - started, 1)
    return row


def run_type(model_type: str, args: argparse.Namespace) -> dict:
    """The row of one type: on the path asked for, or (--retry-rewrite) on the rewrite where the static path did not
    verify, with what stopped the static run kept under `static`."""
    row = run_one(model_type, args.backend, args.runs, args.out, args.timeout, rewrite=args.rewrite)
    if args.retry_rewrite and not args.rewrite and row.get("passed") is not True:
        first = row
        row = run_one(model_type, args.backend, args.runs, args.out, args.timeout, rewrite=True)
        row["static"] = {key: first.get(key) for key in ("exit", "graph_breaks", "recompiles", "problems")}
        row["seconds"] = round(first["seconds"] + row["seconds"], 1)
    return row


def read_row(model_type: str, out: Path, status: int | None = 0, tail: list[str] | None = None,
             path: str = "static") -> dict:
    """A row from the run's report.json (or the command's last line when it wrote none); `path`: "static"
    (transformers' static-cache path driven) or "rewrite" (the copy of its modeling file rewritten)."""
    row = {"model_type": model_type, "path": path, "exit": status}
    report = out / f"hf-{model_type}-tiny" / "report.json"
    if status in (0, 1) and report.is_file():
        data = json.loads(report.read_text(encoding="utf-8"))
        row.update({key: data.get(key) for key in ("graph_breaks", "recompiles", "tokens_equal", "decode_speedup",
                                                   "decode_ms_per_token", "passed", "problems")})
        row["transformers"] = (data.get("hf") or {}).get("transformers")
        # Equal tokens prove little when the model repeats one token: how many distinct ones eager chose.
        eager = (data.get("tokens") or {}).get("eager") or [[]]
        row["distinct_tokens"] = f"{len(set(eager[0]))}/{len(eager[0])}"
        row["baseline"] = (data.get("baseline") or {}).get("headline")
        row["unstable"] = any("decode" in figure for figure in data.get("unstable_figures") or [])
        # A run split_decode gave no entries (its item says so) was not run: its problem is that consequence. The
        # verdict names the cause (the cache item, then the entries'); where it does not, the first item left on
        # Decode's path (a cache not made static, most often) is the cause to name.
        no_entries = data.get("ran") is False and any(
            item.get("code") == "split_decode" for item in data.get("manual_items_detail") or []) and not any(
            "has no prefill or decode entry points" in problem for problem in row.get("problems") or [])
        first = data.get("first_decode_item")
        if no_entries and first:
            row["problems"] = [f"no entry points; first on Decode's path: {first['at']} {first['code']}: "
                               f"{first['reason']}", *(row.get("problems") or [])]
    else:
        row["problems"] = tail or ["no report.json"]
    return row


def decoder_types() -> list[str]:
    """Every model type of the installed transformers with a causal LM class whose config is not an
    encoder-decoder's, sorted."""
    from transformers import CONFIG_MAPPING
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES

    found = []
    for model_type in sorted(MODEL_FOR_CAUSAL_LM_MAPPING_NAMES):
        try:
            config = CONFIG_MAPPING[model_type]()
        except Exception:  # noqa: BLE001 - a config that cannot be built with its defaults: `adapt` says why
            found.append(model_type)
            continue
        if not getattr(config, "is_encoder_decoder", False):
            found.append(model_type)
    return found


def _cell(value) -> str:
    if value is None:
        return "n/a"
    if isinstance(value, bool):
        return "yes" if value else "**no**"
    return str(value)


def table(rows: list[dict]) -> str:
    lines = ["| Model type | Graph breaks | Recompiles | Tokens equal (distinct) | Decode ms/step eager → graph | "
             "Speed-up | Verified | What stops it |",
             "|---|---|---|---|---|---|---|---|"]
    for row in rows:
        ms = row.get("decode_ms_per_token") or {}
        decode = f"{ms['eager']:.2f} → {ms['graph']:.2f}" if ms.get("eager") and ms.get("graph") else "n/a"
        speedup = f"{row['decode_speedup']:.2f}x" if row.get("decode_speedup") else "n/a"
        speedup += " (unstable: the report says why)" if row.get("unstable") else ""
        problems = row.get("problems") or []
        # Paths into site-packages shortened to the package's own: the reader knows where transformers lives.
        why = re.sub(r"/\S*?site-packages/", "", problems[0] if problems else "").replace("|", "\\|")
        # Room for the model's line, its code and what Dynamo said (runners.verify's first problem names all three).
        why = why if len(why) <= 300 else why[:297] + "..."
        name = row["model_type"] + (" (rewrite)" if row.get("path") == "rewrite" else "")
        if row.get("static"):  # --retry-rewrite: what stopped the static path first
            first = (row["static"].get("problems") or ["not verified"])[0]
            first = re.sub(r"/\S*?site-packages/", "", first).replace("|", "\\|")
            why = f"{why} (static path: {first if len(first) <= 200 else first[:197] + '...'})"
        lines.append(f"| {name} | {_cell(row.get('graph_breaks'))} | {_cell(row.get('recompiles'))} | "
                     f"{_cell(row.get('tokens_equal'))} ({row.get('distinct_tokens', 'n/a')}) | {decode} | {speedup} | "
                     f"{_cell(row.get('passed'))} | {why} |")
    return "\n".join(lines) + "\n"


def counts(rows: list[dict], asked: int) -> str:
    """One line: how many types verified, did not, were refused before running (exit 2), stopped at the time limit,
    and were not run (yet)."""
    verified = sum(1 for row in rows if row.get("passed") is True)
    refused = sum(1 for row in rows if row.get("exit") == 2)
    stopped = sum(1 for row in rows if row.get("exit") is None)
    failed = len(rows) - verified - refused - stopped
    return (f"{asked} types: {verified} verified, {failed} not verified, {refused} refused before anything ran (the "
            f"last column says why), {stopped} stopped at the time limit, {asked - len(rows)} not run.\n\n")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("types", nargs="*", default=list(ZOO), help=f"model types (default: {' '.join(ZOO)})")
    parser.add_argument("--backend", default="inductor")
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--out", type=Path, default=Path("graphmode-out/zoo"))
    parser.add_argument("--timeout", type=float, default=1800, help="the most one model may take (s)")
    parser.add_argument("--all-decoders", action="store_true",
                        help="every decoder-only type of the installed transformers with a causal LM class")
    parser.add_argument("--skip-done", action="store_true",
                        help="types with a row or a report.json in OUT are not run again")
    parser.add_argument("--limit", type=int, default=None, help="run at most this many types (with --skip-done: the "
                                                                    "next ones)")
    path = parser.add_mutually_exclusive_group()
    path.add_argument("--rewrite", action="store_true",
                      help="every type on the rewrite path (adapt --hf TYPE --rewrite: a copy of its modeling file "
                           "rewritten), runs under OUT/rewrite/")
    path.add_argument("--retry-rewrite", action="store_true",
                      help="a type that does not verify on transformers' static path is run again with --rewrite; "
                           "the row is the rewrite's, and says what stopped the static run")
    parser.add_argument("--from-reports", action="store_true",
                        help="run nothing: the table from the rows and report.json files already in OUT (after "
                             "rerunning some types, say, on a quieter machine)")
    args = parser.parse_args()
    rows = []
    types = decoder_types() if args.all_decoders else args.types
    ran = 0
    for model_type in types:
        saved = args.out / "rows" / f"{model_type}.json"
        runs_in = args.out / "rewrite" if args.rewrite else args.out
        done = saved.is_file() or (runs_in / f"hf-{model_type}-tiny" / "report.json").is_file()
        if args.from_reports or (args.skip_done and done):
            if done:
                rows.append(json.loads(saved.read_text()) if saved.is_file() else
                            read_row(model_type, runs_in, path="rewrite" if args.rewrite else "static"))
            continue
        if args.limit is not None and ran >= args.limit:
            continue
        ran += 1
        rows.append(run_type(model_type, args))
        # Each row is kept as it ends: a refusal writes no report.json, and its reason is only in the command's output.
        saved.parent.mkdir(parents=True, exist_ok=True)
        saved.write_text(json.dumps(rows[-1], indent=2) + "\n", encoding="utf-8")
        print(f"{model_type}: exit {rows[-1]['exit']} in {rows[-1]['seconds']} s", file=sys.stderr, flush=True)
    import torch

    versions = {r.get("transformers") for r in rows if r.get("transformers")}
    way = (" on the rewrite path (a copy of each modeling file rewritten)" if args.rewrite else
           "; a type that did not verify on the static path, again on the rewrite path" if args.retry_rewrite else "")
    header = (f"transformers {', '.join(sorted(versions)) or 'n/a'}, torch {torch.__version__}, backend "
              f"{args.backend}, {args.runs} run(s) per side, CPU{way}\n\n")
    text = header + counts(rows, len(types)) + table(rows)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "zoo.md").write_text(text, encoding="utf-8")
    (args.out / "zoo.json").write_text(json.dumps(rows, indent=2) + "\n", encoding="utf-8")
    print(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
