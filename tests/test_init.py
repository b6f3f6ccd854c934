"""`graphmode init`: calling-convention detection, and harnesses written from it that really run.

Each fixture in tests/fixtures/conventions/<style>/model.py is a tiny model in one convention, with a config
dataclass whose defaults let the template fill everything in. The written harness is imported in a fresh process
(real torch), and its Prefill and two Decode steps must give the greedy tokens and logits of running the whole
sequence again through the same model.
"""
from __future__ import annotations

import ast
import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from graphmode.transforms.conventions import detect

ROOT = Path(__file__).resolve().parents[1]
FIXTURES = Path(__file__).parent / "fixtures" / "conventions"
MARK = "TODO(graphmode)"

# style folder -> (convention, model class, config class, what the reason must name)
EXPECTED = {
    "hf": ("hf", "ToyForCausalLM", "ToyConfig", ["past_key_values and cache_position", "model.py:72"]),
    "start_pos": ("start_pos", "Transformer", "ModelArgs",
                  ["start_pos", "Attention.cache_k (model.py:27)", "written at start_pos (model.py:33)"]),
    "input_pos": ("input_pos", "Transformer", "ModelArgs", ["input_pos", "Transformer.setup_caches (model.py:74)"]),
    "full_sequence": ("full-sequence", "GPT", "GPTConfig", ["GPT.forward(idx, targets) (model.py:57)",
                                                            "recomputes the whole sequence"]),
}
# The same greedy step without the harness: the whole sequence through forward, no cache carried.
RECOMPUTE = {
    "hf": "model(input_ids=seq).logits",
    "start_pos": "model(seq, 0)",  # from position 0: every cached entry is written again
    "input_pos": "model(seq, torch.arange(seq.shape[1]))",
    "full_sequence": "model(seq)[0]",
}
# Loads the harness with graphmode's own check, runs Prefill and two Decode steps, and the same three greedy steps
# by recomputing the whole sequence with a second build of the model (same seed, same weights).
RUN = """
import json, sys
import torch
from graphmode.runners.harness import load_harness, max_seq_len, sources

harness = load_harness(sys.argv[1])
model, reference = harness.build_model(), harness.build_model()
same_weights = all(torch.equal(a, b) for a, b in zip(model.state_dict().values(), reference.state_dict().values()))
prompt = harness.make_prompt()
with torch.no_grad():
    logits, state = harness.prefill(model, prompt)
    got, got_logits = [], []
    for _ in range(3):
        got_logits.append(logits)
        token = logits.argmax(-1, keepdim=True)
        got.append(token.item())
        logits, state = harness.decode(model, token, state)
    seq, want, diff = prompt, [], 0.0
    model = reference
    for step in range(3):
        logits = (%s)[:, -1, :]
        diff = max(diff, (logits - got_logits[step]).abs().max().item())
        token = logits.argmax(-1, keepdim=True)
        want.append(token.item())
        seq = torch.cat([seq, token], dim=1)
print(json.dumps({"got": got, "want": want, "diff": diff, "same_weights": same_weights,
                  "prompt": list(prompt.shape), "max_seq_len": max_seq_len(harness),
                  "sources": sources(harness, sys.argv[1])}))
"""


def init(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "graphmode.agent.cli", "init", *map(str, args)],
                          capture_output=True, text=True, timeout=120)


def copy_fixture(style: str, tmp_path: Path) -> Path:
    folder = tmp_path / style
    shutil.copytree(FIXTURES / style, folder, ignore=shutil.ignore_patterns("__pycache__", "harness.py*"))
    return folder


def run_harness(folder: Path, recompute: str) -> dict:
    done = subprocess.run([sys.executable, "-c", RUN % recompute, str(folder)], capture_output=True, text=True,
                          timeout=300, cwd=folder)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize("style", sorted(EXPECTED))
def test_detection_names_the_convention_and_its_evidence(style):
    convention, model_class, config_class, evidence = EXPECTED[style]
    found = detect(FIXTURES / style)
    assert (found.convention, found.model_class, found.config_class, found.file) == \
        (convention, model_class, config_class, "model.py")
    assert found.named is False and found.forward_params[0].name in ("input_ids", "tokens", "idx")
    for text in evidence:
        assert text in found.reason, found.reason


@pytest.mark.parametrize("style", sorted(EXPECTED))
def test_init_writes_a_harness_that_matches_full_recomputation(style, tmp_path):
    folder = copy_fixture(style, tmp_path)
    done = init(folder)
    assert done.returncode == 0, done.stderr
    text = (folder / "harness.py").read_text()
    convention = EXPECTED[style][0]
    assert f"Calling convention: {convention} (detected)." in text
    assert "Nothing was left to fill in" in text and MARK not in text  # the fixtures leave nothing TODO
    assert all(len(line) <= 120 for line in text.splitlines())
    result = run_harness(folder, RECOMPUTE[style])
    assert result["same_weights"], "build_model() must be seeded"
    assert result["got"] == result["want"] and result["diff"] < 1e-4, result
    assert result["prompt"] == [1, 8] and result["max_seq_len"] == 64 and result["sources"] == ["model.py"]


# Hub folders (config.json with an auto_map, files that import each other relatively), and the same greedy steps by
# recomputing the whole sequence.
HUB_FOLDERS = {
    "hub_remote_code": ("model(input_ids=seq).logits", "modeling_tinylm.py"),
    "hub_glm_style": ("model(input_ids=seq, position_ids=torch.arange(seq.shape[1])[None], "
                      "attention_mask=torch.ones_like(seq)).logits", "modeling_glmstyle.py"),
}


@pytest.mark.parametrize("name", sorted(HUB_FOLDERS))
def test_init_on_a_hub_folder_imports_it_as_a_package_and_the_harness_runs(name, tmp_path):
    recompute, modeling = HUB_FOLDERS[name]
    folder = tmp_path / name
    shutil.copytree(FIXTURES.parent / name, folder, ignore=shutil.ignore_patterns("__pycache__", "harness.py*"))
    done = init(folder)
    assert done.returncode == 0, done.stderr
    assert "the folder imported as a package" in done.stdout
    text = (folder / "harness.py").read_text()
    assert "folder_package(HERE)" in text and f"from {Path(modeling).stem}" not in text
    result = run_harness(folder, recompute)
    assert result["same_weights"] and result["got"] == result["want"] and result["diff"] < 1e-4, result
    assert result["sources"] == [modeling] and result["prompt"] == [1, 8]


def test_each_convention_is_driven_its_own_way(tmp_path):
    """The calls the template writes: a carried cache with positions, an int position advanced by the token
    count, setup_caches then position tensors, and the whole sequence again."""
    texts = {}
    for style in EXPECTED:
        folder = copy_fixture(style, tmp_path)
        assert init(folder).returncode == 0
        texts[style] = (folder / "harness.py").read_text()
    hf = texts["hf"]
    assert "past_key_values=None" in hf and 'past_key_values=state["past_key_values"]' in hf
    assert "cache_position=positions" in hf and "position_ids=positions.unsqueeze(0)" in hf and "use_cache=True" in hf
    assert "model(tokens, 0)" in texts["start_pos"] and 'state["pos"] + token.shape[1]' in texts["start_pos"]
    assert "model.setup_caches(max_batch_size=1, max_seq_length=MAX_SEQ_LEN)" in texts["input_pos"]
    assert "model(tokens, input_pos)" in texts["input_pos"]
    assert "torch.cat([sequence, token], dim=1)" in texts["full_sequence"]
    for style, text in texts.items():
        assert "torch.manual_seed(0)" in text and "model.eval()" in text, style
        assert "MAX_SEQ_LEN" in text.split("CONFIG = dict(")[1].split(")")[0], style  # the buffers' length


def test_bundled_examples_are_detected():
    targets = ROOT / "tests" / "fixtures" / "targets"
    cases = {ROOT / "examples" / "meta_llama": ("start_pos", "Transformer", "ModelArgs"),
             ROOT / "examples" / "hf_cache_api": ("hf", "ForCausalLM", "Config"),
             targets / "static_ready": ("input_pos", "Transformer", "ModelArgs"),
             targets / "no_cache": ("full-sequence", "GPT", "GPTConfig")}
    for folder, expected in cases.items():
        found = detect(folder)
        assert (found.convention, found.model_class, found.config_class) == expected, (folder, found.reason)


UNKNOWN_MODEL = '''import torch
from torch import nn


class Recurrent(nn.Module):
    def __init__(self, vocab_size: int = 64, dim: int = 16):
        super().__init__()
        self.embed = nn.Embedding(vocab_size, dim)
        self.head = nn.Linear(dim, vocab_size)

    def forward(self, tokens, state=None):
        # `state` is never used here, but its name says it could carry something between steps.
        return self.head(self.embed(tokens).cumsum(1))
'''


def test_unknown_convention_is_refused_until_one_is_named(tmp_path):
    (tmp_path / "model.py").write_text(UNKNOWN_MODEL)
    found = detect(tmp_path)
    assert found.convention == "unknown" and "takes state" in found.reason and "model.py:11" in found.reason
    done = init(tmp_path)
    assert done.returncode == 2 and not (tmp_path / "harness.py").exists()
    assert len(done.stderr.strip().splitlines()) == 1 and "--convention" in done.stderr
    named = init(tmp_path, "--convention", "full-sequence")
    assert named.returncode == 0, named.stderr
    text = (tmp_path / "harness.py").read_text()
    assert "Calling convention: full-sequence (named by the user)." in text and "detection alone says unknown" in text
    assert "model = Recurrent(**CONFIG)" in text and "vocab_size=64," in text
    result = run_harness(tmp_path, "model(seq)")
    assert result["got"] == result["want"] and result["diff"] < 1e-4


def test_a_named_convention_wins_over_detection(tmp_path):
    found = detect(FIXTURES / "hf", convention="full-sequence")
    assert found.convention == "full-sequence" and found.named and found.model_class == "ToyForCausalLM"
    assert found.reason.startswith("named with --convention full-sequence; detection alone says hf: ")
    folder = copy_fixture("hf", tmp_path)
    assert init(folder, "--convention", "full-sequence").returncode == 0
    text = (folder / "harness.py").read_text()
    assert "past_key_values" not in text.split("def prefill")[1] and "torch.cat([sequence, token]" in text
    # The model recomputes the whole sequence without a cache too, so the named convention's harness runs.
    result = run_harness(folder, RECOMPUTE["hf"])
    assert result["got"] == result["want"]


def test_refuses_a_folder_without_model_files(tmp_path):
    (tmp_path / "README.md").write_text("no code here\n")
    (tmp_path / "harness.py").write_text("# only a harness\n")
    done = init(tmp_path, "--force")
    assert done.returncode == 2 and "no .py model file" in done.stderr
    assert len(done.stderr.strip().splitlines()) == 1
    assert (tmp_path / "harness.py").read_text() == "# only a harness\n" and not (tmp_path / "harness.py.orig").exists()
    assert init(tmp_path / "missing").returncode == 2


def test_an_existing_harness_is_kept_unless_forced(tmp_path):
    folder = copy_fixture("start_pos", tmp_path)
    (folder / "harness.py").write_text("# written by hand\n")
    done = init(folder)
    assert done.returncode == 2 and "--force" in done.stderr and len(done.stderr.strip().splitlines()) == 1
    assert (folder / "harness.py").read_text() == "# written by hand\n"
    assert not (folder / "harness.py.orig").exists()
    forced = init(folder, "--force")
    assert forced.returncode == 0, forced.stderr
    assert (folder / "harness.py.orig").read_text() == "# written by hand\n"
    assert "Calling convention: start_pos" in (folder / "harness.py").read_text()


TODO_MODEL = '''from dataclasses import dataclass

import torch
from torch import nn


@dataclass
class BigArgs:
    rope_scale: float
    vocab_size: int = -1
    dim: int = 4096
    n_layers: int = 32
    n_heads: int = 32
    max_seq_len: int = 2048


class Attention(nn.Module):
    def __init__(self, args: BigArgs):
        super().__init__()
        self.cache_k = torch.zeros((1, args.max_seq_len, args.n_heads, args.dim // args.n_heads))

    def forward(self, x, start_pos: int):
        self.cache_k[:, start_pos : start_pos + x.shape[1]] = x
        return x


class Llama(nn.Module):
    def __init__(self, args: BigArgs, tokenizer):
        super().__init__()
        self.tok_embeddings = nn.Embedding(args.vocab_size, args.dim)
        self.attention = Attention(args)

    def forward(self, tokens, start_pos: int):
        return self.attention(self.tok_embeddings(tokens), start_pos)
'''


def test_what_cannot_be_known_is_marked_todo(tmp_path):
    """Full-size defaults, a vocabulary of -1 (set later from a tokenizer, Meta style), a field without a default
    and a second constructor argument: each is a marked line saying what to put there, and the file still parses."""
    (tmp_path / "model.py").write_text(TODO_MODEL)
    done = init(tmp_path)
    assert done.returncode == 0, done.stderr
    text = (tmp_path / "harness.py").read_text()
    ast.parse(text)
    todo = [line for line in text.splitlines() if MARK in line]
    assert f"{len(todo)} line(s) below need a person" in text and f"{len(todo)} line(s) marked" in done.stdout
    expected = ["vocab_size=128,", "dim=64,", "n_layers=2,", "n_heads=4,", "rope_scale=None,", "tokenizer=None"]
    for start in expected:
        assert any(start in line for line in todo), (start, todo)
    assert any("the default, 4096, is full-size" in line for line in todo)
    assert "max_seq_len=MAX_SEQ_LEN," in text and not any("max_seq_len" in line for line in todo)
    assert all(line.split(MARK + ":", 1)[1].strip() for line in todo)  # each says what to put there


def test_init_starts_without_torch_or_libcst(tmp_path):
    folder = copy_fixture("input_pos", tmp_path)
    code = ("import sys\nfrom graphmode.agent.cli import main\nstatus = main(['init', sys.argv[1]])\n"
            "print(status, 'torch' in sys.modules, 'libcst' in sys.modules)")
    done = subprocess.run([sys.executable, "-c", code, str(folder)], capture_output=True, text=True, timeout=120)
    assert done.stdout.strip().splitlines()[-1] == "0 False False", done.stderr
    help_text = init("--help")
    assert help_text.returncode == 0
    for word in ("--convention", "--force", "hf", "start_pos", "input_pos", "full-sequence", "TODO(graphmode)"):
        assert word in help_text.stdout
