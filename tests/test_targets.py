"""agent.targets.resolve: every form of target resolved in one place, checked before anything is written, and written
(materialize) under the run folder only."""
from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from graphmode.agent.errors import UserError
from graphmode.agent.targets import target_file
from graphmode.agent.targets.resolve import CONVENTION, HARNESS, HF, TargetSpec, resolve
from graphmode.runners.interpreter import own_interpreter

EXAMPLES = Path(__file__).resolve().parents[1] / "examples"


def spec(tmp_path: Path, path: Path | None = None, **given) -> TargetSpec:
    return TargetSpec(path=path, hf=given.get("hf"), tiny=given.get("tiny", False), steps=given.get("steps", 32),
                      out=tmp_path / "out", file=given.get("file"))


def test_a_harness_folder_or_its_harness_file_is_the_folder_itself(tmp_path):
    said = []
    for named in (EXAMPLES / "legacy_llm", EXAMPLES / "legacy_llm" / "harness.py"):
        target = resolve(spec(tmp_path, named), own_interpreter(), said.append)
        assert (target.kind, target.folder, target.run_dir) == (HARNESS, EXAMPLES / "legacy_llm",
                                                                (tmp_path / "out" / "legacy_llm").resolve())
        assert target.materialize(said.append) == EXAMPLES / "legacy_llm" and target.hf_summary() is None
    assert said == [] and not (tmp_path / "out").exists()


def test_a_harness_whose_max_seq_len_cannot_hold_the_steps_is_refused(tmp_path):
    folder = tmp_path / "short"
    shutil.copytree(EXAMPLES / "legacy_llm", folder)
    harness = folder / "harness.py"
    harness.write_text("MAX_SEQ_LEN = 40\n" + harness.read_text())
    with pytest.raises(UserError, match="MAX_SEQ_LEN is 40"):
        resolve(spec(tmp_path, folder, steps=40), own_interpreter(), print)
    assert resolve(spec(tmp_path, folder, steps=32), own_interpreter(), print).kind == HARNESS


def test_a_folder_without_a_harness_or_a_convention_says_what_a_target_is(tmp_path):
    (tmp_path / "bare").mkdir()
    with pytest.raises(UserError, match="no harness.py there"):
        resolve(spec(tmp_path, tmp_path / "bare"), own_interpreter(), print)
    with pytest.raises(UserError, match="no such file or folder"):
        resolve(spec(tmp_path, tmp_path / "missing"), own_interpreter(), print)


def test_a_convention_named_by_the_target_file_gets_a_harness_in_the_run_folder_only(tmp_path):
    folder = tmp_path / "sources"
    folder.mkdir()
    shutil.copyfile(EXAMPLES / "legacy_llm" / "model.py", folder / "model.py")
    (folder / "graphmode.toml").write_text("[target]\nconvention = 'auto'\n")
    said = []
    target = resolve(spec(tmp_path, folder, file=target_file.load(folder / "graphmode.toml")), own_interpreter(),
                     said.append)
    assert target.kind == CONVENTION and "graphmode writes one for convention" in said[0]
    assert not (tmp_path / "out").exists()  # nothing written while resolving
    written = target.materialize(said.append)
    assert written == target.run_dir / "target" and (written / "harness.py").is_file()
    assert (written / "model.py").read_text() == (folder / "model.py").read_text()
    assert sorted(p.name for p in folder.iterdir()) == ["graphmode.toml", "model.py"]  # the user's folder as it was


def test_a_hugging_face_model_type_becomes_a_target_written_under_the_run_folder(tmp_path):
    pytest.importorskip("transformers")
    said = []
    target = resolve(spec(tmp_path, hf="llama", tiny=True), own_interpreter(), said.append)
    assert target.kind == HF and target.run_dir == (tmp_path / "out" / target.hf.name).resolve()
    assert target.hf_summary()["model_type"] == "llama" and not target.folder.exists()
    assert target.materialize(said.append) == target.folder and (target.folder / "harness.py").is_file()
    assert any("tiny random weights" in line for line in said)
