"""Lines graphmode writes are wrapped to the file's own limit; the model's own lines stay as they are."""
from __future__ import annotations

import textwrap

import libcst as cst

from graphmode.transforms.output.line_wrap import wrap_long_lines

# The original: its longest line (the model's own) sets the limit, 89 columns.
ORIGINAL = textwrap.dedent('''\
    class Attention:
        def forward(self, x, mask):
            return self.output(self.attend(self.project(x), mask=mask, dropout=self.dropout))
    ''')


def wrapped(adapted: str) -> str:
    text = wrap_long_lines(cst.parse_module(textwrap.dedent(adapted)), ORIGINAL).code
    compile(text, "adapted.py", "exec")  # still Python
    return text


def test_a_long_call_gets_its_arguments_on_a_line_or_one_per_line_and_a_long_comment_is_refilled():
    adapted = '''\
        class Attention:
            def forward(self, x, mask):
                return self.output(self.attend(self.project(x), mask=mask, dropout=self.dropout))

            def forward_static(self, x, mask):
                # graphmode: attention reads every slot of the static cache, written in place at the positions.
                return self.output(graphmode_hide_unwritten(self, self.attend(self.project(x), mask=mask)))

            def decode(self, x, mask):
                return self.output(graphmode_hide_unwritten(self, x), graphmode_written_slots(self, mask), x + self.b)
        '''
    text = wrapped(adapted)
    assert max(len(line) for line in text.splitlines()) <= 89
    assert "        # graphmode: attention reads every slot of the static cache, written in place at\n" \
           "        # the positions.\n" in text
    # Arguments that fit on one line inside the brackets go there, as a formatter hugs them; else one per line.
    assert ("        return self.output(\n"
            "            graphmode_hide_unwritten(self, self.attend(self.project(x), mask=mask))\n"
            "        )\n") in text
    assert ("        return self.output(\n"
            "            graphmode_hide_unwritten(self, x),\n"
            "            graphmode_written_slots(self, mask),\n"
            "            x + self.b,\n"
            "        )\n") in text
    # The model's own line, 89 columns, is the limit and is left alone.
    assert "        return self.output(self.attend(self.project(x), mask=mask, dropout=self.dropout))\n" in text


def test_a_long_signature_and_a_bare_tuple_of_values_are_bracketed_one_item_per_line():
    adapted = '''\
        def forward_static(self, hidden_states, attention_mask=None, position_ids=None, past_key_value=None):
            keys, values = self.cache.zeros_like(hidden_states, 1), self.cache.zeros_like(hidden_states, 2)
            return keys, values
        '''
    text = wrapped(adapted)
    assert text.startswith("def forward_static(\n    self,\n    hidden_states,\n")
    assert ("    keys, values = (\n"
            "        self.cache.zeros_like(hidden_states, 1), self.cache.zeros_like(hidden_states, 2)\n"
            "    )\n") in text


def test_an_f_string_is_never_broken_and_short_files_are_left_alone():
    # A break inside an f-string's braces is a syntax error before Python 3.12: such a line stays long.
    adapted = 'message = f"{describe(first_argument_of_the_call, second_argument_of_the_call, third_one)}"\n'
    assert wrapped(adapted) == adapted
    assert wrapped(ORIGINAL) == ORIGINAL


def test_a_docstrings_prose_is_refilled_and_its_list_its_marker_and_its_code_spans_kept_whole():
    adapted = '''\
        class Attention:
            def forward(self, x, mask):
                return self.output(self.attend(self.project(x), mask=mask, dropout=self.dropout))

            def forward_static(self, x, mask):
                """{long}

                - a list item that stays as it is, however long the line that holds it happens to be
                """
                return x
        '''.replace("{long}", "`forward` on the static path, written for the entries alone by the rewrite "
                                "(added by graphmode): `self.attend(x, mask)` reads every slot.")
    text = wrapped(adapted)
    docstring = text[text.index('        """`forward`'):text.index('        return x')]
    lines = docstring.splitlines()
    assert "(added by graphmode)" in docstring and "`self.attend(x, mask)`" in docstring
    assert all(len(line) <= 89 for line in lines[:-3]) and len(lines[0]) > 60  # filled, not one word per line
    assert "        - a list item that stays as it is, however long the line that holds it happens to be" in lines
    assert " ".join(" ".join(lines[:-3]).split()).startswith('"""`forward` on the static path, written for')


def test_a_long_test_of_ands_gets_one_operand_per_line_and_keeps_its_comment():
    adapted = '''\
        class Attention:
            def forward(self, x, mask):
                return self.output(self.attend(self.project(x), mask=mask, dropout=self.dropout))

            def forward_static(self, x, mask):
                if graphmode_position_limit(self) >= self.trained_length and x.shape[1] >= self.trained_length:  # why
                    raise ValueError("past the trained length")
                return x
        '''
    assert ("        if (\n"
            "            graphmode_position_limit(self) >= self.trained_length\n"
            "            and x.shape[1] >= self.trained_length\n"
            "        ):  # why\n") in wrapped(adapted)
