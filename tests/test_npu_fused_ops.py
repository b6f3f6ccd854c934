"""The torch_npu fused operators the fusions write (transforms/codemods/lib/npu_ops.py, NPU_OPS).

On CPU, always: every `torch_npu.<op>(...)` call in the codemod fixtures' outputs (and in any adapted output committed
under examples/) binds to the signature NPU_OPS gives the operator, and the binder refuses wrong calls with a clear
message. Opt-in (`pytest -m npu_api`): NPU_OPS itself is held to the torch_npu 2.13.0 wheel's meta functions and
documentation, read with `ast` from the extracted sources (tests/torch_npu_wheel.py), never imported: they import
torch_npu.
"""
from __future__ import annotations

import ast
import re
import warnings
from dataclasses import dataclass
from pathlib import Path

import pytest

from graphmode.transforms.codemods.lib.npu_ops import NPU_OPS, NpuOp, bind_problems, npu_op_called
from torch_npu_wheel import torch_npu_tree

PROJECT_ROOT = Path(__file__).resolve().parents[1]
# Where graphmode's NPU output is committed: the codemod fixtures' outputs, and adapted trees under examples/.
SCANNED = ("tests/fixtures/codemods/**/*.out.py", "examples/**/adapted/**/*.py")


def _scanned_files() -> list[Path]:
    return sorted({path for pattern in SCANNED for path in PROJECT_ROOT.glob(pattern)})


def _npu_calls(path: Path) -> list[ast.Call]:
    return [node for node in ast.walk(ast.parse(path.read_text(), str(path)))
            if isinstance(node, ast.Call) and npu_op_called(node) is not None]


FILES = _scanned_files()
FILES_WITH_CALLS = [path for path in FILES if _npu_calls(path)]


# --- on CPU: the calls graphmode writes bind -----------------------------------------------------------------------

def test_the_scan_finds_the_committed_outputs():
    assert len([path for path in FILES if path.name.endswith(".out.py")]) >= 50, "the codemod fixtures moved?"
    calls = sum(len(_npu_calls(path)) for path in FILES)
    print(f"torch_npu calls: {calls} in {len(FILES_WITH_CALLS)} of {len(FILES)} scanned files")
    # No fusion fixture writes NPU output yet: then nothing is parametrized below, and that is not yet a failure.


@pytest.mark.parametrize("path", FILES_WITH_CALLS, ids=lambda path: str(path.relative_to(PROJECT_ROOT)))
def test_every_torch_npu_call_in_the_outputs_binds(path):
    problems = [f"{path.relative_to(PROJECT_ROOT)}:{call.lineno}: {problem}"
                for call in _npu_calls(path) for problem in bind_problems(call)]
    assert problems == []


def _call(source: str) -> ast.Call:
    node = ast.parse(source, mode="eval").body
    assert isinstance(node, ast.Call)
    return node


@pytest.mark.parametrize("source", [
    "torch_npu.npu_rms_norm(h, self.weight, self.eps)",
    "torch_npu.npu_rms_norm(h, self.weight, epsilon=1e-5)",
    "torch_npu.npu_rms_norm(self=h, gamma=w)",
    "torch_npu.npu_add_rms_norm(residual, h, w, 1e-6)",
    "torch_npu.npu_add_rms_norm(residual, h, gamma=w)",
    "torch_npu.npu_swiglu(gate_up)",
    "torch_npu.npu_swiglu(gate_up, dim=-1)",
    "torch_npu.npu_swiglu(gate_up, -1)",
    "torch_npu.npu_rotary_mul(q, cos, sin)",
    "torch_npu.npu_rotary_mul(q, cos, sin, 'half')",
    "torch_npu.npu_rotary_mul(q, cos, sin, 'interleave', rotate=r)",
    "torch_npu.npu_fused_infer_attention_score(q, k, v)",
    "torch_npu.npu_fused_infer_attention_score(q, k, v, atten_mask=mask, num_heads=8, num_key_value_heads=2,"
    " scale=0.125, input_layout='BNSD', sparse_mode=0, actual_seq_lengths_kv=lengths, softmax_lse_flag=False)",
    "torch_npu.npu_fused_infer_attention_score(query=q, key=k, value=v, pse_shift=None, actual_seq_lengths=None)",
])
def test_a_right_call_binds(source):
    assert bind_problems(_call(source)) == []


@pytest.mark.parametrize(("source", "message"), [
    ("torch_npu.npu_rms_norm(h, w, eps=1e-6)",
     r"^torch_npu\.npu_rms_norm \(NPU_OPS: npu_rms_norm\(self, gamma, epsilon=\.\.\.\)\): unknown keyword 'eps'$"),
    ("torch_npu.npu_rms_norm(h)", r"npu_rms_norm .*: missing required 'gamma'$"),
    ("torch_npu.npu_add_rms_norm(h)", r"npu_add_rms_norm .*: missing required 'x2', 'gamma'$"),
    ("torch_npu.npu_rms_norm(h, w, 1e-6, 1)", r"npu_rms_norm .*: 4 positional arguments, at most 3$"),
    ("torch_npu.npu_fused_infer_attention_score(q, k, v, mask)",
     r"npu_fused_infer_attention_score .*: 4 positional arguments, at most 3$"),
    ("torch_npu.npu_fused_infer_attention_score(q, k, v, mask_=m)", r"unknown keyword 'mask_'$"),
    ("torch_npu.npu_fused_infer_attention_score(q, k, v, actual_seq_qlen=n)",  # the _v2 operator's keyword
     r"unknown keyword 'actual_seq_qlen'$"),
    ("torch_npu.npu_rms_norm(h, w, gamma=w)", r"'gamma' is given twice$"),
    ("torch_npu.npu_rotary_mul(q, cos, sin, mode='half')",
     r"^torch_npu\.npu_rotary_mul \(NPU_OPS: npu_rotary_mul\(embedding, cosine, sine, mode=\.\.\., /, "
     r"rotate=\.\.\.\)\): 'mode' is passed by keyword; pass it by position .*parameter 4"),
    ("torch_npu.npu_rotary_mul(q, cos, sin, rotary_mode='half')", r"unknown keyword 'rotary_mode'$"),
    ("torch_npu.npu_swiglu(x=gate_up)", r"'x' is passed by keyword; pass it by position"),
    ("torch_npu.npu_swiglu(*args)", r"npu_swiglu .*: \*args or \*\*kwargs cannot be bound"),
    ("torch_npu.npu_fused_infer_attention_score(q, k, v, **extra)", r"\*args or \*\*kwargs cannot be bound"),
    ("torch_npu.npu_prompt_flash_attention(q, k, v)",
     r"^torch_npu\.npu_prompt_flash_attention is not in NPU_OPS .*: graphmode writes only npu_add_rms_norm, "),
    ("torch.rms_norm(h, (4,), w)", r"^`torch\.rms_norm\(\.\.\.\)` is not a torch_npu\.<operator>\(\.\.\.\) call$"),
])
def test_a_wrong_call_is_refused_with_a_clear_message(source, message):
    problems = bind_problems(_call(source))
    assert problems and any(re.search(message, problem) for problem in problems), problems
    assert all("\n" not in problem for problem in problems)


def test_every_problem_of_a_call_is_reported():
    problems = bind_problems(_call("torch_npu.npu_rms_norm(h, w, 1e-6, 2, gamma=w, eps=1)"))
    assert [problem.split("): ", 1)[1] for problem in problems] == [
        "4 positional arguments, at most 3", "'gamma' is given twice", "unknown keyword 'eps'"]


def test_the_table_is_well_formed():
    for name, op in NPU_OPS.items():
        assert name == op.name and name.startswith("npu_")
        assert 0 <= op.required <= len(op.positional) and op.by_position <= len(op.positional)
        assert len({*op.positional, *op.keyword_only}) == len(op.positional) + len(op.keyword_only), name
        # Every operator can be written with its required arguments, positionally and (where safe) by keyword.
        args = ", ".join(op.positional[:op.required])
        assert bind_problems(_call(f"torch_npu.{name}({args})")) == [], name
        by_keyword = [*op.positional[:op.by_position][:op.required],
                      *(f"{p}={p}" for p in op.positional[op.by_position:op.required])]
        assert bind_problems(_call(f"torch_npu.{name}({', '.join(by_keyword)})")) == [], name


# --- against the torch_npu 2.13.0 wheel (opt-in: pytest -m npu_api) --------------------------------------------------

@dataclass(frozen=True)
class WheelSignature:
    """A signature in the wheel: a meta function's, parsed with ast, or one the documentation writes."""
    name: str
    positional: tuple[str, ...]
    required: int
    keyword_only: tuple[str, ...]
    required_keyword_only: tuple[str, ...] = ()
    returns: tuple[int, ...] = ()  # the length of each tuple the function returns (1: not a tuple literal)
    text: str = ""

    def __str__(self) -> str:
        return self.text


@pytest.fixture(scope="module")
def torch_npu_src(tmp_path_factory) -> Path:
    """The extracted wheel's torch_npu/ folder (tests/torch_npu_wheel.py)."""
    return torch_npu_tree(tmp_path_factory) / "torch_npu"


def _returns(node: ast.FunctionDef) -> tuple[int, ...]:
    found, todo = [], list(node.body)
    while todo:
        child = todo.pop()
        if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda, ast.ClassDef)):
            continue  # a nested function's returns are its own
        if isinstance(child, ast.Return) and child.value is not None:
            found.append(len(child.value.elts) if isinstance(child.value, ast.Tuple) else 1)
        todo.extend(ast.iter_child_nodes(child))
    return tuple(sorted(set(found)))


@pytest.fixture(scope="module")
def meta_functions(torch_npu_src) -> dict[str, list[WheelSignature]]:
    """Every function of op_plugin/meta/_meta_registrations.py decorated `@impl(m, "<op>")`, by op."""
    path = torch_npu_src / "op_plugin" / "meta" / "_meta_registrations.py"
    found: dict[str, list[WheelSignature]] = {}
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if not isinstance(node, ast.FunctionDef):
            continue
        for decorator in node.decorator_list:
            if (isinstance(decorator, ast.Call) and ast.unparse(decorator.func) == "impl" and len(decorator.args) == 2
                    and ast.unparse(decorator.args[0]) == "m" and isinstance(decorator.args[1], ast.Constant)):
                args = node.args
                positional = tuple(a.arg for a in (*args.posonlyargs, *args.args))
                found.setdefault(decorator.args[1].value, []).append(WheelSignature(
                    node.name, positional, len(positional) - len(args.defaults),
                    tuple(a.arg for a in args.kwonlyargs),
                    tuple(a.arg for a, d in zip(args.kwonlyargs, args.kw_defaults) if d is None), _returns(node),
                    f"{path.name}:{node.lineno} def {node.name}({ast.unparse(args)})"))
    return found


def _documented(path: Path) -> dict[str, WheelSignature]:
    """The schema line of each `_add_torch_npu_docstr("<op>", ...)` of _op_plugin_docs.py for an op of NPU_OPS:
    `torch_npu.npu_swiglu(Tensor self, int dim=-1) -> (Tensor)`."""
    found = {}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", SyntaxWarning)  # its docstrings' invalid escapes ("\_")
        warnings.simplefilter("ignore", DeprecationWarning)
        tree = ast.parse(path.read_text(), str(path))
    for node in ast.walk(tree):
        if not (isinstance(node, ast.Call) and ast.unparse(node.func) == "_add_torch_npu_docstr"
                and len(node.args) == 2 and all(isinstance(a, ast.Constant) for a in node.args)):
            continue
        op, doc = node.args[0].value, node.args[1].value
        line = next((line.strip() for line in doc.splitlines() if line.strip().startswith(f"torch_npu.{op}(")), "")
        if op not in NPU_OPS or ") ->" not in line:
            continue
        params = line[len(f"torch_npu.{op}("):line.index(") ->")]
        positional, keyword_only, required, star = [], [], 0, False
        for param in (p.strip() for p in params.split(",")):
            if param == "*":
                star = True
                continue
            name = param.split("=")[0].split()[-1]
            (keyword_only if star else positional).append(name)
            required += not star and "=" not in param
        found[op] = WheelSignature(op, tuple(positional), required, tuple(keyword_only), text=f"{path.name}: {line}")
    return found


@pytest.mark.npu_api
@pytest.mark.parametrize("name", sorted(NPU_OPS))
def test_npu_ops_signature_is_the_wheels_meta_function(name, meta_functions):
    ours: NpuOp = NPU_OPS[name]
    assert name in meta_functions, f"{name}: no @impl(m, {name!r}) in the wheel's _meta_registrations.py"
    assert len(meta_functions[name]) == 1, f"{name}: registered {len(meta_functions[name])} times"
    wheel = meta_functions[name][0]
    both = f"\n  NPU_OPS: {ours.signature()} (required {ours.required})\n  wheel:   {wheel} (required {wheel.required})"
    assert ours.positional == wheel.positional, f"{name}: positional parameters differ{both}"
    assert ours.required == wheel.required, f"{name}: required parameter counts differ{both}"
    missing = [kw for kw in ours.keyword_only if kw not in wheel.keyword_only]
    assert not missing, f"{name}: {missing} not keyword-only parameters of the wheel's function{both}"
    assert not wheel.required_keyword_only, f"{name}: the wheel requires {wheel.required_keyword_only}{both}"
    arity = len(ours.returns.split(",")) if ours.returns.startswith("(") else 1
    assert wheel.returns in ((), (arity,)), f"{name}: NPU_OPS returns {ours.returns}, the wheel {wheel.returns}{both}"


@pytest.mark.npu_api
@pytest.mark.parametrize("name", sorted(NPU_OPS))
def test_npu_ops_keywords_are_the_documented_ones(name, torch_npu_src):
    """A keyword binds by the name the operator's schema gives it, which its documentation shows: where that differs
    from the meta function's, NPU_OPS passes the parameter by position only (by_position)."""
    documented = _documented(torch_npu_src / "_op_plugin_docs.py")
    assert {"npu_rms_norm", "npu_swiglu", "npu_rotary_mul", "npu_fused_infer_attention_score"} <= set(documented)
    ours = NPU_OPS[name]
    if name not in documented:  # npu_add_rms_norm has no documentation entry in 2.13.0
        assert ours.by_position == 0, f"{name}: by_position {ours.by_position} with no documentation to say so"
        pytest.skip(f"{name} is not documented in the wheel's _op_plugin_docs.py")
    doc = documented[name]
    both = f"\n  NPU_OPS: {ours.signature()}\n  docs:    {doc}"
    assert len(doc.positional) == len(ours.positional) and doc.required == ours.required, f"{name}:{both}"
    differ = [i for i, (a, b) in enumerate(zip(ours.positional, doc.positional)) if a != b]
    assert ours.by_position == (differ[-1] + 1 if differ else 0), (
        f"{name}: by_position is {ours.by_position}, the names differ at positions {[i + 1 for i in differ]}{both}")
    missing = [kw for kw in ours.keyword_only if kw not in doc.keyword_only]
    assert not missing, f"{name}: {missing} not documented keyword-only parameters{both}"
