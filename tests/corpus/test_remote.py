"""Fast checks of the remote-code family of the test bed (ordinary CI: no network, no downloads).

The cases themselves (`pytest -m corpus`, GRAPHMODE_CORPUS=remote) need the mirrored Hub files in a
cache that a one-time step fills from GitHub; these check that step against a local git repository,
the target folder it leads to, and that a case without its files is skipped with that step's command.
"""
from __future__ import annotations

import ast
import json
import subprocess
from pathlib import Path

import pytest

from corpus import core, remote

CONFIGURATION = '''from transformers import PretrainedConfig


class ToyConfig(PretrainedConfig):
    model_type = "toy"

    def __init__(self, hidden_size=4096, vocab_size=50000, **kwargs):
        self.hidden_size = hidden_size
        self.vocab_size = vocab_size
        super().__init__(**kwargs)
'''
MODELING = '''"""A toy modeling file with the Hub's relative import."""
import torch

from .configuration_toy import ToyConfig


class ToyForCausalLM(torch.nn.Module):
    config_class = ToyConfig
'''


def test_the_remote_set_names_each_model_once_under_its_release_and_joins_the_testbed():
    cases = core.parse_corpus("remote")
    assert sorted(c.id for c in cases) == sorted(f"remote=={m.release}:{name}" for name, m in remote.MODELS.items())
    assert all(c.error is None for c in cases)
    testbed = {c.id for c in core.parse_corpus("testbed")}
    assert {c.id for c in cases} <= testbed


def test_a_case_whose_files_are_not_cached_is_skipped_with_the_fill_command(tmp_path, monkeypatch):
    monkeypatch.setenv(remote.CACHE_ENV, str(tmp_path / "empty-cache"))
    case = core.parse_corpus("remote==4.39.3:deepseek_v2_lite")[0]
    root = tmp_path / "corpus-root"
    root.mkdir()
    with pytest.raises(core.CaseSkipped) as raised:
        core.build_target(case, root, tmp_path / "targets")
    assert "cakeng/CS262_moe@c294b7f71d59" in str(raised.value)
    assert "python -m corpus.remote fill" in str(raised.value)
    # said before anything is downloaded or built
    assert list(root.iterdir()) == [] and not (tmp_path / "targets").exists()


def _git(*args: str, cwd: Path) -> str:
    done = subprocess.run(["git", "-c", "user.name=corpus", "-c", "user.email=corpus@example.com", *args],
                          cwd=cwd, capture_output=True, text=True, check=True)
    return done.stdout.strip()


@pytest.fixture()
def toy_mirror(tmp_path, monkeypatch):
    """A local bare mirror MIRRORS/corpus+toy-hub/repo whose first commit holds a Hub folder `hub/` and
    whose second edits its modeling file; MODELS gets a "toy" entry pinned to the first commit."""
    work = tmp_path / "work"
    (work / "hub").mkdir(parents=True)
    (work / "hub" / "config.json").write_text(json.dumps({
        "auto_map": {"AutoConfig": "configuration_toy.ToyConfig",
                     "AutoModelForCausalLM": "modeling_toy.ToyForCausalLM"},
        "architectures": ["ToyForCausalLM"], "transformers_version": "4.44.0", "hidden_size": 4096,
        "vocab_size": 50000, "bos_token_id": 9}))
    (work / "hub" / "generation_config.json").write_text("{}")
    (work / "hub" / "configuration_toy.py").write_text(CONFIGURATION)
    (work / "hub" / "modeling_toy.py").write_text(MODELING)
    _git("init", "-q", cwd=work)
    _git("add", ".", cwd=work)
    _git("commit", "-q", "-m", "the Hub files", cwd=work)
    pinned = _git("rev-parse", "HEAD", cwd=work)
    (work / "hub" / "modeling_toy.py").write_text(MODELING + "\n# edited after the pinned commit\n")
    _git("commit", "-q", "-am", "an edit", cwd=work)
    mirrors = tmp_path / "mirrors"
    _git("clone", "-q", "--bare", str(work), str(mirrors / "corpus+toy-hub" / "repo"), cwd=tmp_path)
    model = remote.RemoteModel(hub="corpus/toy", mirror="corpus/toy-hub", commit=pinned, folder="hub",
                               files=("configuration_toy.py", "modeling_toy.py"), release="4.44.2",
                               tiny={"hidden_size": 64, "bos_token_id": 1})
    monkeypatch.setitem(remote.MODELS, "toy", model)
    monkeypatch.setenv(remote.CACHE_ENV, str(tmp_path / "cache"))
    return mirrors, model


def test_fill_copies_the_pinned_commit_from_a_local_mirror(toy_mirror, tmp_path):
    mirrors, model = toy_mirror
    said = remote.fill(remote.cache_root(), mirrors, ["toy"])
    folder = remote.cached_folder(model)
    assert said == [f"toy: corpus/toy-hub@{model.commit[:12]} -> {folder}"]
    assert sorted(p.name for p in folder.iterdir()) == [
        "config.json", "configuration_toy.py", "generation_config.json", "modeling_toy.py"]
    assert (folder / "modeling_toy.py").read_text() == MODELING  # the pinned commit, not the later edit


def test_the_target_keeps_lines_makes_imports_local_and_shrinks_the_hub_config(toy_mirror, tmp_path):
    mirrors, model = toy_mirror
    remote.fill(remote.cache_root(), mirrors, ["toy"])
    case = core.Case("remote", "4.44.2", "toy")
    target = remote.build_target(case, tmp_path / "site", tmp_path / "targets")

    modeling = (target / "modeling_toy.py").read_text().splitlines()
    assert modeling.index("from configuration_toy import ToyConfig") == MODELING.splitlines().index(
        "from .configuration_toy import ToyConfig")
    harness = (target / "harness.py").read_text()
    tree = ast.parse(harness)
    config = next(ast.literal_eval(node.value) for node in tree.body if isinstance(node, ast.Assign)
                  and any(getattr(t, "id", None) == "CONFIG" for t in node.targets))
    # the Hub config.json, checkpoint fields dropped, the tiny sizes and vocabulary in
    assert config == {"hidden_size": 64, "vocab_size": core.VOCAB_SIZE, "bos_token_id": 1,
                      "tie_word_embeddings": False}
    assert "from modeling_toy import ToyForCausalLM" in harness
    assert "from configuration_toy import ToyConfig" in harness
    # one make_prompt: the convention's own (bos first), not the epilogue's
    prompts = [node for node in tree.body if isinstance(node, ast.FunctionDef) and node.name == "make_prompt"]
    assert len(prompts) == 1 and "bos_token_id" in ast.get_source_segment(harness, prompts[0])
    assert {"build_model", "prefill", "decode", "generate"} <= {
        node.name for node in tree.body if isinstance(node, ast.FunctionDef)}


def test_a_model_whose_prompts_end_with_its_own_tokens_gets_them_last_and_no_generation_config(toy_mirror, tmp_path,
                                                                                                monkeypatch):
    """ChatGLM-6B's generation finds its positions from `[gMASK] <sop>` at the prompt's end, and its Hub folder
    has no generation_config.json: the case says both, and the harness's prompt ends with those ids."""
    import dataclasses

    import torch

    from corpus import harness_support

    mirrors, model = toy_mirror
    model = dataclasses.replace(model, tiny={"hidden_size": 64, "gmask_token_id": 7, "bos_token_id": 9},
                                prompt_end=("gmask_token_id", "bos_token_id"), generation_config=False)
    monkeypatch.setitem(remote.MODELS, "toy", model)
    remote.fill(remote.cache_root(), mirrors, ["toy"])
    assert not (remote.cached_folder(model) / "generation_config.json").exists()
    target = remote.build_target(core.Case("remote", "4.44.2", "toy"), tmp_path / "site", tmp_path / "targets")
    harness = (target / "harness.py").read_text()
    tree = ast.parse(harness)
    prompts = [node for node in tree.body if isinstance(node, ast.FunctionDef) and node.name == "make_prompt"]
    assert len(prompts) == 1
    namespace = {"torch": torch, "corpus_support": harness_support, "VOCAB_SIZE": core.VOCAB_SIZE,
                 "PROMPT_LEN": 8, "CONFIG": {"gmask_token_id": 7, "bos_token_id": 9},
                 "PROMPT_END": ("gmask_token_id", "bos_token_id")}
    exec(ast.get_source_segment(harness, prompts[0]), namespace)
    tokens = namespace["make_prompt"]()
    assert tokens.shape == (1, 8) and tokens[0, -2:].tolist() == [7, 9]
    assert tokens[0, :-2].tolist() == harness_support.make_prompt(core.VOCAB_SIZE, 8)[0, :-2].tolist()
