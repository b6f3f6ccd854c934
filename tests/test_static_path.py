"""transforms/output/static_path.py: the codemods' rewrite goes beside the original, never in its place.

Each case is an original and a rewrite as the chain could leave it; the pass must give back a module whose every
original function runs as written unless the switch is on, and whose twins run the rewrite when it is.
"""
from __future__ import annotations

import textwrap
from types import ModuleType

import libcst as cst
import torch

from graphmode.transforms.codemods.entries.split_decode import STATIC_PATH
from graphmode.transforms.codemods.lib.helper_code import helper_source
from graphmode.transforms.output.static_path import already_adapted, keep_original_path

# The entries' switch, as split_decode inserts it beside the test the pass puts in the originals.
SWITCH = "\n\n" + helper_source(STATIC_PATH)


def _split(original: str, adapted: str) -> str:
    return keep_original_path(cst.parse_module(textwrap.dedent(original)),
                              cst.parse_module(textwrap.dedent(adapted))).code


def _run(source: str) -> ModuleType:
    module = ModuleType("case")
    exec(compile(source + SWITCH, "case", "exec"), module.__dict__)
    return module


ORIGINAL = '''
import math
import torch


def scale(x):
    return x * 2


class Block(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.weight = torch.nn.Parameter(torch.ones(4))

    @staticmethod
    def shift(x):
        return x + 1

    def forward(self, x, start_pos: int):
        """The block's own docstring."""
        return self.shift(scale(x)) * self.weight + start_pos

    def unchanged(self, x):
        return scale(x)


class Model(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.block = Block()

    def forward(self, x, start_pos: int = 0):
        return self.block(x, start_pos=start_pos) + math.sqrt(4)
'''

# What a chain could write: the position renamed and a tensor now, `scale` and `shift` changed, a buffer added in
# `__init__`, and `math` no longer used (so the chain dropped its import).
ADAPTED = '''
import torch


def scale(x):
    return x * 3


class Block(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.weight = torch.nn.Parameter(torch.ones(4))
        self.register_buffer("table", torch.arange(8.0), persistent=False)

    @staticmethod
    def shift(x):
        return x + 10

    def forward(self, x, input_pos: torch.Tensor):
        """The block's own docstring."""
        return self.shift(scale(x)) * self.weight + self.table[input_pos]

    def unchanged(self, x):
        return scale(x)


class Model(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.block = Block()

    def forward(self, x, input_pos: torch.Tensor = None):
        return self.block(x, input_pos=input_pos) + 2.0
'''


def test_the_original_runs_unless_the_switch_is_on_and_the_twins_when_it_is():
    split = _split(ORIGINAL, ADAPTED)
    original, both = _run(textwrap.dedent(ORIGINAL)), _run(split)
    x = torch.arange(4.0)
    expected = original.Model()(x, 3)
    got = both.Model()(x, 3)  # an int position, as the original's callers pass
    assert torch.equal(got, expected)
    model = both.Model()
    with both.GraphmodeStaticPath(model):
        static = model(x, torch.tensor([3]))
    assert torch.equal(static, (x * 3 + 10) + 3.0 + 2.0)
    assert torch.equal(model(x, 3), expected), "leaving the entries turns the switch off again"
    assert torch.equal(model.block.unchanged(x), x * 2), "an unchanged method's original calls the original"


def test_what_each_function_became():
    split = _split(ORIGINAL, ADAPTED)
    assert "import math\n" in split, "an import the original bodies use is put back"
    # Functions with no module to ask get twins called by name; methods fork on the switch where they changed.
    assert "def scale_static(x):" in split and "def shift_static(x):" in split
    assert "_static(self" not in split, "a method whose rewrite is one statement forks that statement, no twin"
    assert split.count("if graphmode_static_path(self):") == 3  # Block.forward, Block.unchanged, Model.forward
    # The method keeps the original's parameter names; its static statements call them so too.
    assert ("    def forward(self, x, start_pos: int):\n"
            '        """The block\'s own docstring."""\n'
            "        if graphmode_static_path(self):\n"
            "            return self.shift_static(scale_static(x)) * self.weight + self.table[start_pos]\n"
            "        return self.shift(scale(x)) * self.weight + start_pos\n") in split
    assert ("        if graphmode_static_path(self):\n"
            "            return scale_static(x)\n"
            "        return scale(x)\n") in split
    assert "return self.block(x, start_pos=start_pos) + 2.0" in split
    # `__init__` runs once: it keeps the rewrite, which only adds the buffer.
    assert split.count("def __init__(") == 2 and 'self.register_buffer("table"' in split
    assert split.count('"""The block\'s own docstring."""') == 1
    assert already_adapted(split + "\n\ndef graphmode_static_path(module):\n    return False\n")
    assert not already_adapted(textwrap.dedent(ORIGINAL))


def test_nothing_changed_means_nothing_added():
    assert _split(ORIGINAL, ORIGINAL) == textwrap.dedent(ORIGINAL)


def test_an_import_the_chain_trimmed_goes_back_whole_in_its_place_not_beside_it():
    original = '''
        from torch.nn.functional import gelu, silu


        def act(x):
            return gelu(x) + silu(x)
        '''
    adapted = '''
        from torch.nn.functional import silu


        def act(x):
            return silu(x) * 2
        '''
    split = _split(original, adapted)
    assert split.count("import") == 1 and "from torch.nn.functional import gelu, silu\n" in split
    assert "def act_static(x):" in split and "return gelu(x) + silu(x)" in split


# A rewrite that only renamed a parameter, one that changed two runs of statements, and one that changed four.
RENAMED_ORIGINAL = '''
import torch


class Norm(torch.nn.Module):
    def forward(self, x, past=None):
        a = x.pow(2)
        a1 = a + 0
        b = a1.mean(-1, keepdim=True)
        b1 = b + 0
        c = torch.rsqrt(b1 + 1e-5)
        c1 = c + 0
        return x * c1 * 2 if past is None else past


class Layer(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.norm = Norm()
        self.table = torch.nn.Parameter(torch.arange(8.0))

    def forward(self, x, start_pos: int):
        h = self.norm(x)
        return h + self.table[start_pos]


class Model(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.layer = Layer()
        self.extra = Norm()

    def forward(self, x, start_pos: int):
        a = x + 1
        b = a * 2

        c = self.layer(b, start_pos)
        d = c - 1
        e = d * 3
        return e
'''

RENAMED_ADAPTED = '''
import torch


class Norm(torch.nn.Module):
    def forward(self, x, past=None):
        a = x.pow(3)
        a1 = a + 0
        b = a1.mean(-1, keepdim=True) * 1.5
        b1 = b + 0
        c = torch.rsqrt(b1 + 1e-6)
        c1 = c + 0
        return x * c1 * 4


class Layer(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.norm = Norm()
        self.table = torch.nn.Parameter(torch.arange(8.0))

    def forward(self, x, input_pos: torch.Tensor):
        h = self.norm(x)
        return h + self.table[input_pos]


class Model(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.layer = Layer()
        self.extra = Norm()

    def forward(self, x, input_pos: torch.Tensor):
        # graphmode: a changed first run.
        a = x + 2
        b = a * 2

        c = self.layer(b, input_pos)
        d = c - 5
        e = d * 3
        return e
'''


def test_a_rename_is_no_twin_and_a_few_changed_statements_fork_in_place():
    split = _split(RENAMED_ORIGINAL, RENAMED_ADAPTED)
    # Only the parameter's name changed: the original runs on both paths, handed a tensor on the static one.
    assert ("    def forward(self, x, start_pos: int):\n"
            "        h = self.norm(x)\n"
            "        return h + self.table[start_pos]\n") in split
    # Two runs changed: each forks, one assignment as a conditional expression (graphmode's note on the static
    # statement above it); the rest is shared.
    assert ("    def forward(self, x, start_pos: int):\n"
            "        # graphmode: a changed first run.\n"
            "        a = x + 2 if graphmode_static_path(self) else x + 1\n"
            "        b = a * 2\n"
            "\n"
            "        c = self.layer(b, start_pos)\n"
            "        d = c - 5 if graphmode_static_path(self) else c - 1\n"
            "        e = d * 3\n") in split
    # Four runs: a twin, which reads as one piece; it takes no parameter it never reads (`past`, the model's own).
    assert "    def forward_static(self, x):\n" in split and "return self.forward_static(x)" in split
    assert "    def forward(self, x, past=None):\n" in split
    original, both = _run(textwrap.dedent(RENAMED_ORIGINAL)), _run(split)
    x = torch.arange(1.0, 5.0)
    model = both.Model()
    assert torch.equal(model(x, 3), original.Model()(x, 3))
    with both.GraphmodeStaticPath(model):
        static = model(x, torch.tensor([3]))
        # The switch is a constant of the module's state to Dynamo: the compiled graph holds the static branches
        # alone, in one graph.
        compiled = torch.compile(model, backend="eager", fullgraph=True)(x, torch.tensor([3]))
    a = x + 2
    b = a * 2
    h = b * torch.rsqrt(b.pow(3).mean(-1, keepdim=True) * 1.5 + 1e-6) * 4
    assert torch.equal(static, (h + 3.0 - 5) * 3) and torch.equal(compiled, static)


def test_the_scan_reads_only_the_static_branches_of_a_fork_as_step_code():
    from graphmode.transforms.rules import scan_source
    source = textwrap.dedent('''
        import torch


        class Model(torch.nn.Module):
            def forward(self, x, n):
                if graphmode_static_path(self):
                    y = x * 2
                else:
                    y = x * x.sum().item()
                if not graphmode_static_path(self):
                    print(y)
                if graphmode_static_path(self):
                    y = y + 1
                elif n > 0:
                    y = y + x.min().item()
                if not graphmode_static_path(self) and n > 1:
                    y = y + x.mean().item()
                if graphmode_static_path(self):
                    return y + 1
                return y + x.max().item()
        ''')
    assert scan_source(source, "model.py") == []
    assert {f.code for f in scan_source(source.replace("graphmode_static_path", "bool"), "model.py")} >= {"GM101"}


def test_a_forked_line_maps_to_the_statement_the_entries_run_in_its_place():
    from graphmode.transforms.pipeline import original_to_adapted
    original = textwrap.dedent(RENAMED_ORIGINAL)
    split = _split(RENAMED_ORIGINAL, RENAMED_ADAPTED)
    lines = original_to_adapted(original, split)
    old, new = original.splitlines(), split.splitlines()

    def where(text: str, after: str) -> str:
        line = next(n for n, t in enumerate(old, 1) if t.strip() == text and n > old.index(after))
        return new[lines[line] - 1].strip()

    model = "class Model(torch.nn.Module):"
    assert where("a = x + 1", model) == "a = x + 2 if graphmode_static_path(self) else x + 1", \
        "a statement that became a conditional expression under graphmode's note maps to it, not to the note"
    assert where("d = c - 1", model) == "d = c - 5 if graphmode_static_path(self) else c - 1", \
        "a statement that became a conditional expression maps to it"
    assert where("b = a * 2", model) == "b = a * 2" and where("return e", model) == "return e"
    layer = "class Layer(torch.nn.Module):"
    assert where("return h + self.table[start_pos]", layer) == "return h + self.table[start_pos]"
    # Norm became a twin: its unchanged lines map into the twin, which is what the entries run.
    norm_line = next(n for n, t in enumerate(old, 1) if t.strip() == "a1 = a + 0")
    twin = new.index("    def forward_static(self, x):") + 1
    assert lines[norm_line] > twin and new[lines[norm_line] - 1].strip() == "a1 = a + 0"


BRANCH_ORIGINAL = '''
import torch


class Model(torch.nn.Module):
    def forward(self, x, cache=None):
        y = x * 2
        # Grow the cache.
        if cache is not None:
            y = y + cache
        else:
            y = y - 1
        n = y.shape[0]
        if cache is not None:
            n += cache.shape[0]
        half = n // 2
        m = None
        if half > 1:
            m = y.sum()
        return y, n, m
'''

BRANCH_ADAPTED = '''
import torch


class Model(torch.nn.Module):
    def forward(self, x, cache=None):
        y = x * 2
        # graphmode: the static cache.
        y = y + 100
        n = y.shape[0]
        half = n // 2
        m = y.mean()
        return y, n, m
'''


def test_an_original_if_stays_where_it_was_written_after_the_static_statements_or_asking_the_switch():
    split = _split(BRANCH_ORIGINAL, BRANCH_ADAPTED)
    # The original `if` follows the static statements as `elif`, its comment above it, its lines as written; one
    # only the original runs asks the switch in its own test; a default the static statement overwrites stays
    # above the fork.
    assert ("        y = x * 2\n"
            "        if graphmode_static_path(self):  # graphmode: the static cache.\n"
            "            y = y + 100\n"
            "        # Grow the cache.\n"
            "        elif cache is not None:\n"
            "            y = y + cache\n"
            "        else:\n"
            "            y = y - 1\n"
            "        n = y.shape[0]\n"
            "        if not graphmode_static_path(self) and cache is not None:\n"
            "            n += cache.shape[0]\n"
            "        half = n // 2\n"
            "        m = None\n"
            "        if graphmode_static_path(self):\n"
            "            m = y.mean()\n"
            "        elif half > 1:\n"
            "            m = y.sum()\n"
            "        return y, n, m\n") in split
    from graphmode.transforms.pipeline import original_to_adapted
    old, new = textwrap.dedent(BRANCH_ORIGINAL).splitlines(), split.splitlines()
    lines = original_to_adapted(textwrap.dedent(BRANCH_ORIGINAL), split)
    for text in ("y = y + cache", "y = y - 1", "n += cache.shape[0]"):
        line = next(n for n, t in enumerate(old, 1) if t.strip() == text)
        assert new[lines[line] - 1] == old[line - 1], "the original's line maps to itself, where it was written"
    original, both = _run(textwrap.dedent(BRANCH_ORIGINAL)), _run(split)
    x, cache = torch.arange(3.0), torch.ones(2)
    for args in ((x,), (x, torch.ones(3)), (torch.arange(5.0), torch.ones(5))):
        want, got = original.Model()(*args), both.Model()(*args)
        assert torch.equal(got[0], want[0]) and got[1] == want[1]
        assert got[2] is want[2] is None or torch.equal(got[2], want[2])
    model = both.Model()
    with both.GraphmodeStaticPath(model):
        y, n, m = model(x, cache)
    assert torch.equal(y, x * 2 + 100) and n == 3 and torch.equal(m, y.mean())


def test_an_if_as_long_as_the_files_longest_line_is_not_made_longer_by_elif():
    original = '''
        import torch


        class Model(torch.nn.Module):
            def forward(self, x, cache=None):
                if cache is not None and cache.shape[0] > 0 and cache.shape[-1] == x.shape[-1] and x.dim() > 0:
                    x = x + cache
                return x
        '''
    adapted = '''
        import torch


        class Model(torch.nn.Module):
            def forward(self, x, cache=None):
                x = x * 2
                return x
        '''
    split = _split(original, adapted)
    # Neither `elif` nor the `if` under `else:` would fit the file's longest line: the rewrite becomes a twin, and
    # the original `if` stays as written.
    assert "elif" not in split and "def forward_static(self, x):" in split
    assert "\n        if cache is not None and cache.shape[0] > 0" in split


def test_a_twin_keeps_a_signature_written_one_parameter_per_line():
    """Qwen-7B's attention writes its parameters one per line, the cache among them. The twin takes none its body
    never reads, and its signature stays one per line (joined, it ran to 174 columns), the bracket where it was."""
    original = '''
    import torch


    class Attention(torch.nn.Module):
        def forward(
            self,
            hidden_states,
            layer_past=None,
            use_cache=False,
        ):
            a = hidden_states + 1
            a1 = a + 0
            b = a1 * 2
            b1 = b + 0
            c = b1 - 3
            c1 = c + 0
            d = c1 / 4
            return d if layer_past is None else layer_past
    '''
    adapted = '''
    import torch


    class Attention(torch.nn.Module):
        def forward(
            self,
            hidden_states,
            layer_past=None,
            use_cache=False,
        ):
            a = hidden_states + 2
            a1 = a + 0
            b = a1 * 3
            b1 = b + 0
            c = b1 - 4
            c1 = c + 0
            d = c1 / 5
            return d
    '''
    split = _split(original, adapted)
    assert ("    def forward_static(\n"
            "        self,\n"
            "        hidden_states,\n"
            "    ):\n") in split
    model = _run(split).Attention()
    x = torch.arange(4.0)
    assert torch.equal(model(x), (((x + 1) * 2) - 3) / 4)


def test_a_twin_keeps_one_parameter_per_line_when_kwargs_follow():
    """Hunyuan-Large's attention writes its parameters one per line and ends with `**kwargs`. The twin drops the
    cache (and `use_cache`) its body never reads and keeps the layout (joined, its signature ran past the file's
    120 columns, and line_wrap wraps no signature with `**`)."""
    original = '''
    import torch


    class Attention(torch.nn.Module):
        def forward(
            self,
            hidden_states,
            past_key_value=None,
            use_cache=False,
            **kwargs,
        ):
            a = hidden_states + 1
            a1 = a + 0
            b = a1 * 2
            b1 = b + 0
            c = b1 - 3
            c1 = c + 0
            d = c1 / 4
            return d if past_key_value is None else past_key_value
    '''
    adapted = original.replace("+ 1", "+ 2").replace("* 2", "* 3").replace("- 3", "- 4").replace("/ 4", "/ 5") \
        .replace("return d if past_key_value is None else past_key_value", "return d")
    split = _split(original, adapted)
    assert ("    def forward_static(\n"
            "        self,\n"
            "        hidden_states,\n"
            "        **kwargs,\n"
            "    ):\n") in split
    model = _run(split).Attention()
    x = torch.arange(4.0)
    assert torch.equal(model(x), (((x + 1) * 2) - 3) / 4)
