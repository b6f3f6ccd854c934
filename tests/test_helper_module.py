"""graphmode's helper code sits in graphmode_static.py beside the adapted file, which imports the names it uses
(transforms/output/helper_module.py): from a plain folder whose harness puts it on sys.path, and relatively from a
package. The adapted folder is run as written, with a real tiny model, in a fresh Python: its static path
(`setup_caches`,
`prefill`, a compiled `decode`) gives the tokens the original gives."""
from __future__ import annotations

import ast
import json
import subprocess
import sys
from pathlib import Path

import libcst as cst

from graphmode.agent.output import write_adapted_tree
from graphmode.transforms.codemods import Options
from graphmode.transforms.codemods.lib.helper_code import helper_module_text, helper_names, helper_source
from graphmode.transforms.output.helper_module import FILE_NAME, helper_module_diffs, imports_helper_module, \
    move_helpers_out
from graphmode.transforms.pipeline import adapt_source

ROOT = Path(__file__).resolve().parents[1]
EXAMPLE = ROOT / "examples" / "legacy_llm"
LENGTH = 32  # the static path's positions (setup_caches); the model's own limit is 64
OPTIONS = Options(entry_class="Transformer", max_seq_len=LENGTH)

# Greedy tokens three ways, printed as JSON: the model's own forward, the static path with `decode` compiled whole,
# and what `setup_caches` says to more positions than the model's own limit (its args.max_seq_len).
RUN = """
import json, sys, torch
{imports}
torch.manual_seed(0)
model = Transformer(ModelArgs(max_seq_len=64)).eval()
prompt = torch.randint(0, ModelArgs.vocab_size, (1, 8), generator=torch.Generator().manual_seed(1))
steps, printed = 12, {{}}
with torch.inference_mode():
    logits, cache = model(prompt, 0)
    own = []
    for pos in range(8, 8 + steps):
        own.append(int(logits[0, -1].argmax()))
        logits, cache = model(torch.tensor([[own[-1]]]), pos, cache)
    printed["own"] = own
    if hasattr(model, "decode"):
        try:
            model.setup_caches(max_batch_size=1, max_seq_length=64 + 1)
        except ValueError as error:
            printed["refused"] = str(error)
        model.setup_caches(max_batch_size=1, max_seq_length={length})
        decode = torch.compile(model.decode, backend="eager", fullgraph=True)
        logits = model.prefill(prompt, torch.arange(8))
        static = []
        for pos in range(8, 8 + steps):
            logits = logits[0] if isinstance(logits, tuple) else logits  # what the model's forward returns
            static.append(int(logits.reshape(-1, logits.shape[-1])[-1].argmax()))
            logits = decode(torch.tensor([[static[-1]]]), torch.tensor([pos]))
        printed["static"] = static
print(json.dumps(printed))
"""


def _run(folder: Path, imports: str) -> dict:
    script = RUN.format(imports=imports, length=LENGTH)
    done = subprocess.run([sys.executable, "-c", script], cwd=folder, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.splitlines()[-1])


def _uses_the_module(adapted: str, dots: str) -> None:
    """One import of the helper module, with the file's imports, and no helper defined in the file."""
    tree = ast.parse(adapted)
    defined = {s.name for s in tree.body if isinstance(s, (ast.ClassDef, ast.FunctionDef))}
    assert not defined & helper_names()
    [statement] = [s for s in tree.body if isinstance(s, ast.ImportFrom) and s.module == "graphmode_static"]
    assert statement.level == len(dots) and "GraphmodeStaticPath" in {a.name for a in statement.names}
    first_definition = next(i for i, s in enumerate(tree.body) if isinstance(s, (ast.ClassDef, ast.FunctionDef)))
    assert tree.body.index(statement) < first_definition


def test_a_plain_folder_gets_the_module_and_runs_its_static_path_from_the_written_folder(tmp_path):
    adaptation = adapt_source((EXAMPLE / "model.py").read_text(), "model.py", None, OPTIONS)
    _uses_the_module(adaptation.adapted, "")
    out = tmp_path / "adapted"
    write_adapted_tree(EXAMPLE, out, {"model.py": adaptation.adapted})
    assert (out / FILE_NAME).read_text() == helper_module_text()
    assert not imports_helper_module(helper_module_text()) and _imported(helper_module_text()) == {"torch"}
    ran = _run(out, "sys.path.insert(0, '.')\nfrom model import ModelArgs, Transformer")
    assert ran["static"] == ran["own"] == _run(EXAMPLE, "sys.path.insert(0, '.')\nfrom model import *")["own"]
    # GraphmodeStaticPath.setup runs in graphmode_static, and reads the limit from the model's arguments.
    assert "at most 64 positions (args.max_seq_len)" in ran["refused"]


def test_a_package_that_imports_relatively_imports_the_module_relatively_and_runs(tmp_path):
    """The model split into a package as a Hub folder or transformers has it: its arguments in a module of their
    own, imported relatively."""
    original = tmp_path / "original" / "tinymodel"
    original.mkdir(parents=True)
    source = (EXAMPLE / "model.py").read_text()
    lines = source.splitlines(keepends=True)
    [args] = [s for s in ast.parse(source).body if isinstance(s, ast.ClassDef) and s.name == "ModelArgs"]
    first = args.decorator_list[0].lineno
    (original / "__init__.py").write_text("")
    (original / "configuration.py").write_text("from dataclasses import dataclass\n\n\n"
                                               + "".join(lines[first - 1:args.end_lineno]))
    modeling = "".join(lines[:first - 1] + lines[args.end_lineno:]).replace(
        "from torch import nn\n", "from torch import nn\n\nfrom .configuration import ModelArgs\n")
    (original / "modeling.py").write_text(modeling)

    adaptation = adapt_source(modeling, "tinymodel/modeling.py", None, OPTIONS)
    _uses_the_module(adaptation.adapted, ".")
    out = tmp_path / "adapted"
    write_adapted_tree(original.parent, out, {"tinymodel/modeling.py": adaptation.adapted})
    assert (out / "tinymodel" / FILE_NAME).read_text() == helper_module_text() and not (out / FILE_NAME).exists()
    imports = "from tinymodel.configuration import ModelArgs\nfrom tinymodel.modeling import Transformer"
    ran = _run(out, imports)
    assert ran["static"] == ran["own"] == _run(original.parent, imports)["own"]
    diff = helper_module_diffs({"tinymodel/modeling.py": adaptation.adapted})
    assert diff.startswith("--- /dev/null\n+++ b/tinymodel/graphmode_static.py\n")


def test_a_second_run_over_graphmodes_output_and_over_the_module_changes_nothing():
    adapted = adapt_source((EXAMPLE / "model.py").read_text(), "model.py", None, OPTIONS).adapted
    for text in (adapted, helper_module_text()):
        again = adapt_source(text, "model.py", None, OPTIONS)
        assert again.adapted == text and not again.edits and not again.changed


def test_the_import_goes_after_the_leading_imports_and_blocks_of_them_before_any_code():
    original = ("import torch\n\nif torch.cuda.is_available():\n    import torch.cuda\n\nlogger = None\n\n\n"
                "def step(model):\n    return model\n")
    inserted = f"\n\n{helper_source('graphmode_static_path')}"
    adapted = original.replace("\n\n\ndef step", inserted + "\n\ndef step").replace(
        "return model", "return graphmode_static_path(model)")
    moved = move_helpers_out(cst.parse_module(adapted), cst.parse_module(original), original).code
    assert moved == original.replace("\nlogger", "\nfrom graphmode_static import graphmode_static_path\n\nlogger") \
        .replace("return model", "return graphmode_static_path(model)")


def _imported(source: str) -> set[str]:
    return {a.name for s in ast.parse(source).body if isinstance(s, ast.Import) for a in s.names} | {
        s.module for s in ast.parse(source).body if isinstance(s, ast.ImportFrom)}


def test_the_in_place_view_defines_every_helper_its_code_and_its_helpers_call():
    """The design's diff and the battery's in-place rewrite read `static_view`, the chain's text with the helpers
    still pasted in: each helper a pasted one calls must be pasted too (graphmode_merged_linear asks the switch)."""
    for example, entry in (("legacy_llm", "Transformer"), ("meta_llama", "Transformer"),
                           ("hf_cache_api", "ForCausalLM")):
        view = adapt_source((ROOT / "examples" / example / "model.py").read_text(), "model.py", None,
                            Options(entry_class=entry)).static_view
        tree = ast.parse(view)
        defined = {s.name for s in tree.body if isinstance(s, (ast.ClassDef, ast.FunctionDef))}
        called = {n.id for n in ast.walk(tree) if isinstance(n, ast.Name) and n.id in helper_names()}
        assert called <= defined, (example, sorted(called - defined))
