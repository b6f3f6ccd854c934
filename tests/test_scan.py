"""`graphmode scan`: formats, exit status, per-file errors, many files, and no torch import."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from graphmode.transforms.scan import may_fix

EXAMPLE = Path(__file__).parents[1] / "examples" / "legacy_llm"
HAZARD = "from torch import nn\n\nclass M(nn.Module):\n    def forward(self, x):\n        return x.sum().item()\n"
HARNESS_PREFILL = ("import torch\n\ndef prefill(model, tokens):\n"
                   "    return model(tokens, torch.arange(tokens.shape[1]))\n")
CLEAN = "from torch import nn\n\nclass M(nn.Module):\n    def forward(self, x):\n        return x * 2\n"


def scan(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "graphmode.agent.cli", "scan", *args], capture_output=True, text=True,
                          timeout=300)


def test_json_lists_findings_with_locations_and_exits_1():
    done = scan("--json", str(EXAMPLE))
    assert done.returncode == 1
    findings = json.loads(done.stdout)
    assert {"code", "path", "line", "column", "message", "autofix", "may_fix", "fixed_by"} <= set(findings[0])
    # Without --check-fixes no codemod ran, so none is claimed to fix anything; each names its candidates.
    assert all(not f["autofix"] and f["fixed_by"] is None and not f["fix_checked"] for f in findings)
    assert all(f["may_fix"] == list(may_fix(f["code"])) for f in findings)
    lines = (EXAMPLE / "model.py").read_text().splitlines()
    for f in findings:
        assert f["path"].endswith("model.py") and 1 <= f["line"] <= len(lines)
    assert {f["code"] for f in findings} >= {"GM101", "GM201", "GM301", "GM401", "GM501"}


def test_sarif_names_every_rule_and_result(tmp_path):
    (tmp_path / "m.py").write_text(HAZARD)
    sarif = json.loads(scan("--format", "sarif", str(tmp_path)).stdout)
    run = sarif["runs"][0]
    assert sarif["version"] == "2.1.0"
    rule_ids = {r["id"] for r in run["tool"]["driver"]["rules"]}
    assert [r["ruleId"] for r in run["results"]] == ["GM101"] and "GM101" in rule_ids
    region = run["results"][0]["locations"][0]["physicalLocation"]["region"]
    assert region == {"startLine": 5, "startColumn": 16}
    rule = next(r for r in run["tool"]["driver"]["rules"] if r["id"] == "GM101")
    properties = run["results"][0]["properties"]
    assert properties["mayBeFixedBy"] == rule["properties"]["codemods"] and properties["mayBeFixedBy"]
    assert properties["autofix"] is False and properties["fixChecked"] is False and properties["fixedBy"] is None


def test_check_fixes_marks_exactly_what_the_codemods_fix(tmp_path):
    """The example's model is adapted whole (tests/test_codemods.py); a harness's prefill is no code the
    codemods rewrite, though its GM201 is of a kind they handle elsewhere."""
    harness = tmp_path / "harness.py"
    harness.write_text(HARNESS_PREFILL)
    model = EXAMPLE / "model.py"
    plain = json.loads(scan("--json", str(model), str(harness)).stdout)
    done = scan("--json", "--check-fixes", "--entry-class", "Transformer", str(model), str(harness))
    checked = json.loads(done.stdout)
    assert done.returncode == 1 and all(f["fix_checked"] for f in checked)
    # The same findings, only marked.
    keep = ("code", "path", "line", "column", "message")
    assert [[f[k] for k in keep] for f in checked] == [[f[k] for k in keep] for f in plain]
    in_model = [f for f in checked if f["path"] == str(model)]
    in_harness = [f for f in checked if f["path"] == str(harness)]
    assert in_model and in_harness and all(f["may_fix"] for f in in_harness)
    assert all(f["autofix"] and f["fixed_by"] in f["may_fix"] for f in in_model)
    assert not any(f["autofix"] or f["fixed_by"] for f in in_harness)
    text = scan("--check-fixes", str(harness)).stdout
    assert text.count("(no codemod fixes it here)") == len(in_harness) and "autofix" not in text


def test_clean_code_exits_0_and_text_output_summarises(tmp_path):
    (tmp_path / "m.py").write_text(CLEAN)
    done = scan(str(tmp_path))
    assert done.returncode == 0 and "0 findings" in done.stdout


def test_bad_files_get_one_error_each_and_the_rest_is_scanned(tmp_path):
    (tmp_path / "good.py").write_text(HAZARD)
    (tmp_path / "broken.py").write_text(HAZARD.replace("def forward(self, x):", "def forward(self, x)"))
    (tmp_path / "latin1.py").write_bytes(HAZARD.encode() + b"# caf\xe9\n")
    done = scan("--json", str(tmp_path))
    assert done.returncode == 1
    assert [f["path"] for f in json.loads(done.stdout)] == [str(tmp_path / "good.py")]
    errors = done.stderr.strip().splitlines()
    assert len(errors) == 2 and "Traceback" not in done.stderr
    assert any("broken.py: error: 4:" in e and "syntax error" in e for e in errors)
    assert any("latin1.py: error: not utf-8" in e for e in errors)


def test_a_file_that_does_not_parse_is_an_error_even_without_a_model_step(tmp_path):
    """The pre-filter spares the rules files with no `def forward`; it must not call them clean unread."""
    (tmp_path / "noise.py").write_bytes(bytes(range(256)) * 4)
    (tmp_path / "half.py").write_text("x = (1,\n")
    (tmp_path / "plain.py").write_text("x = 1\n")
    done = scan(str(tmp_path))
    assert done.returncode == 2, done.stdout
    errors = done.stderr.strip().splitlines()
    assert (len(errors) == 2 and any("noise.py: error:" in e for e in errors)
            and any("half.py: error:" in e for e in errors))
    assert "3 files: 0 checked by the rules, 1 with no model step" in done.stdout
    assert "2 could not be scanned" in done.stdout


def test_a_coding_line_is_honoured_and_a_fifo_is_skipped_unread(tmp_path):
    """A latin-1 file that says so is read as Python reads it; a FIFO named x.py is reported, not opened (opening
    it would wait forever for a writer)."""
    import os

    (tmp_path / "latin1.py").write_bytes(b"# -*- coding: latin-1 -*-\n" + HAZARD.encode() + b"# caf\xe9\n")
    os.mkfifo(tmp_path / "pipe.py")
    done = scan("--json", str(tmp_path))
    assert done.returncode == 1
    assert [f["path"] for f in json.loads(done.stdout)] == [str(tmp_path / "latin1.py")]
    assert "pipe.py: error: not a regular file" in done.stderr
    direct = scan(str(tmp_path / "pipe.py"))
    assert direct.returncode == 2 and "not a regular file" in direct.stderr


def test_only_errors_exit_2_and_missing_path_is_one_line(tmp_path):
    (tmp_path / "broken.py").write_text("def forward(:\n")
    assert scan(str(tmp_path)).returncode == 2
    missing = scan(str(tmp_path / "nowhere"))
    assert missing.returncode == 2 and "no such file or folder" in missing.stderr


def test_thousands_of_files_in_workers(tmp_path):
    for i in range(2000):
        folder = tmp_path / f"pkg{i // 100}"
        folder.mkdir(exist_ok=True)
        (folder / f"m{i}.py").write_text(HAZARD if i % 10 == 0 else "x = 1\n")
    (tmp_path / "pkg0" / "__pycache__").mkdir()
    (tmp_path / "pkg0" / "__pycache__" / "m0.py").write_text(HAZARD)  # never scanned
    done = scan("--json", "--jobs", "2", str(tmp_path))
    assert len(json.loads(done.stdout)) == 200


def test_training_code_is_not_reported(tmp_path):
    (tmp_path / "train.py").write_text(
        "import torch\n\ndef train(model, batches):\n    for b in batches:\n        print(model(b).sum().item())\n"
        "\nclass M(torch.nn.Module):\n    def forward(self, x):\n        return x\n"
    )
    assert scan(str(tmp_path)).returncode == 0


def test_scanning_imports_neither_torch_nor_libcst():
    code = ("import sys; from graphmode.agent.cli import main; main(['scan', '--json', %r]); "
            "sys.stderr.write(repr(sorted(m for m in ('torch', 'libcst', 'langgraph') if m in sys.modules)))"
            ) % str(EXAMPLE)
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.stderr.strip().endswith("[]")
