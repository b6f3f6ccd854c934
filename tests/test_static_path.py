"""transforms/static_path.py: the codemods' rewrite goes beside the original, never in its place.

Each case is an original and a rewrite as the chain could leave it; the pass must give back a module whose every
original function runs as written unless the switch is on, and whose twins run the rewrite when it is.
"""
from __future__ import annotations

import textwrap
from types import ModuleType

import libcst as cst
import torch

from graphmode.transforms.codemods._helper_code import helper_source
from graphmode.transforms.codemods.split_decode import STATIC_PATH
from graphmode.transforms.static_path import already_adapted, keep_original_path

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
    # Functions with no module to ask get twins called by name; methods ask the switch first.
    assert "def scale_static(x):" in split and "def shift_static(x):" in split
    assert "return self.shift_static(scale_static(x)) * self.weight + self.table[input_pos]" in split
    assert split.count("if graphmode_static_path(self):") == 3  # Block.forward, Block.unchanged, Model.forward
    assert "return self.unchanged_static(x)" in split and "def unchanged_static(self, x):" in split
    # The dispatcher keeps the original's parameter names; the twins' keyword calls follow them.
    assert "def forward(self, x, start_pos: int):" in split and "return self.forward_static(x, start_pos)" in split
    assert "def forward_static(self, x, input_pos: torch.Tensor):" in split
    assert "return self.block(x, start_pos=input_pos) + 2.0" in split
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
