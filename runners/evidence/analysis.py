"""The evidence from the trace's records: what changes between the Decode steps, line by line.

runners.evidence.tracer records every op call at each line of the sources in each step; this module compares
the Decode steps' calls and builds the evidence (runners.evidence.model): tensors whose shape grows every step
(and whether the line's own output of the step before is one of the inputs: a carried KV cache), Python ints
that change every step, host syncs, the positions of the tokens and the branches that test them.

Plain Python over the records, no torch: the tracer is imported for its types only.
"""
from __future__ import annotations

import ast
import linecache
import re
from collections import defaultdict
from typing import TYPE_CHECKING

from graphmode.runners.evidence.model import (DECODE, PREFILL, SLICE_OPS, Evidence, FunctionEvidence, Growth,
                                              HostSync, LineEvidence, PositionTest, ScalarChange, SourceLine,
                                              line_ranges)

if TYPE_CHECKING:
    from graphmode.runners.evidence.tracer import EvidenceTracer, OpCall, OpSite

# Comparisons with the tensor on the left that a branch taken once the positions pass a bound tests.
_BOUND_TESTS = frozenset({"gt", "ge"})


def analyse(tracer: EvidenceTracer, steps: int, prompt_shape: list[int], new_tokens: int) -> Evidence:
    """The evidence of a run the tracer recorded: Prefill as step 0, then Decode steps 1..`steps`."""
    return _Analysis(tracer, steps).build(prompt_shape, new_tokens)


def _statement_table(tree: ast.Module) -> dict[int, tuple[int, bool]]:
    """Each line -> (the first line of the innermost statement holding it, whether it is a branch's test)."""
    table: dict[int, tuple[int, bool]] = {}
    statements = sorted((n for n in ast.walk(tree) if isinstance(n, ast.stmt)),
                        key=lambda n: (n.end_lineno or n.lineno) - n.lineno, reverse=True)
    for node in statements:
        for n in range(node.lineno, (node.end_lineno or node.lineno) + 1):
            table[n] = (node.lineno, table.get(n, (0, False))[1])
    for node in ast.walk(tree):
        for first, last in _test_spans(node):
            for n in range(first, last + 1):
                table[n] = (table.get(n, (n, False))[0], True)
    return table


def _test_spans(node: ast.AST) -> list[tuple[int, int]]:
    """The lines of a branch's test. The jump on a condition may carry the line of the `if` or of the test: both
    count."""
    if isinstance(node, (ast.If, ast.While, ast.Assert, ast.IfExp)):
        return [(min(node.lineno, node.test.lineno), node.test.end_lineno or node.test.lineno)]
    if isinstance(node, ast.comprehension):
        return [(test.lineno, test.end_lineno or test.lineno) for test in node.ifs]
    return []


def _steady(shapes: list[tuple[int, ...] | None]) -> tuple[list[int], int] | None:
    """(dims, by) when every step adds the same positive amount along the same dims, else None."""
    if not _comparable(shapes):
        return None
    deltas = {tuple(b - a for a, b in zip(s0, s1)) for s0, s1 in zip(shapes, shapes[1:])}
    delta = deltas.pop() if len(deltas) == 1 else None
    if not _grows(delta):
        return None
    dims = [i for i, d in enumerate(delta) if d]
    return dims, delta[dims[0]]


def _comparable(shapes: list[tuple[int, ...] | None]) -> bool:
    """Two or more shapes, every one known and of one rank."""
    return len(shapes) >= 2 and all(s is not None for s in shapes) and len({len(s) for s in shapes}) == 1


def _grows(delta: tuple[int, ...] | None) -> bool:
    """A step's change of shape adds to some dim and takes from none."""
    return delta is not None and all(d >= 0 for d in delta) and any(delta)


_LAYOUTS = {4: {2: "[b, h, s, d]", 1: "[b, s, h, d]", 0: "[s, b, h, d]", 3: "[b, h, d, s]"},
            3: {1: "[b, s, d]", 0: "[s, b, d]", 2: "[b, d, s]"}}


def _layout(rank: int, seq_dim: int, kv_dim: int | None) -> str | None:
    """The cache layout the growing dim says: dim 2 of 4 is [b, h, s, d], dim 1 [b, s, h, d], dim 0 [s, b, h, d]."""
    if kv_dim is None:
        return _LAYOUTS.get(rank, {}).get(seq_dim)
    inner = _LAYOUTS.get(rank - 1, {}).get(seq_dim - (kv_dim < seq_dim))
    if inner is None:
        return None
    parts = inner.strip("[]").split(", ")
    parts.insert(kv_dim, "2")
    return "[" + ", ".join(parts) + "]"


def _split_dim(op: str, call: OpCall) -> int | None:
    """The dim along which a reader of a tensor splits it in two (k and v): `unbind`, `chunk(2)`, `select` of 0 or
    1, or an index of 0 or 1 (`kv[0]`, `kv[:, 1]`); None for any other reader."""
    ints = dict(call.ints)
    if op == "unbind":
        return ints.get("dim", ints.get("arg1", 0))
    if op == "chunk" and ints.get("arg1", ints.get("chunks")) == 2:
        return ints.get("dim", ints.get("arg2", 0))
    if op == "select" and ints.get("arg2", ints.get("index")) in (0, 1):
        return ints.get("arg1", ints.get("dim"))
    return _index_dim(call) if op == "getitem" else None


def _index_dim(call: OpCall) -> int | None:
    """`kv[0]` splits along dim 0; `kv[:, 1]` along the dim whose index is 0 or 1."""
    if dict(call.ints).get("index") in (0, 1):
        return 0
    return next((int(m[1]) for path, v in call.ints if v in (0, 1) and (m := re.fullmatch(r"index\[(\d+)\]", path))),
                None)


class _Analysis:
    """Compares the Decode steps' records: growth, carried inputs, moving ints, syncs, phases."""

    def __init__(self, tracer: EvidenceTracer, steps: int) -> None:
        self.t = tracer
        self.steps = steps
        self.decode_steps = list(range(1, steps + 1))
        self.by_step: dict[int, dict[int, list[OpCall]]] = {}
        for site in tracer.sites_by_id:
            grouped: dict[int, list[OpCall]] = defaultdict(list)
            for call in site.calls:
                grouped[call.step].append(call)
            self.by_step[site.id] = grouped
        # Growth of each site's outputs first: whether an input grows asks it of the input's producer.
        self.growth: dict[int, tuple[int, tuple[list[int], int]]] = {}
        for site in tracer.sites_by_id:
            for k in range(self._aligned(site)):
                found = _steady([self.by_step[site.id][s][k].out for s in self.decode_steps])
                if found:
                    self.growth[site.id] = (k, found)
                    break
        self._statements: dict[str, dict[int, tuple[int, bool]]] = {}
        self._position_memo: dict[int, int | None] = {}  # site id -> the call holding the positions, or None

    def _aligned(self, site: OpSite) -> int:
        """Calls per Decode step that can be compared step by step (the k-th call of every step)."""
        grouped = self.by_step[site.id]
        return min((len(grouped.get(s, [])) for s in self.decode_steps), default=0)

    def _input_grows(self, site: OpSite, k: int, i: int) -> tuple[bool, bool]:
        """(grows, enters from outside) for input i of the k-th call of every Decode step."""
        calls = [self.by_step[site.id][s][k] for s in self.decode_steps]
        if any(len(c.inputs) <= i for c in calls):
            return False, False
        producers = [c.inputs[i][0] for c in calls]
        if all(p is not None for p in producers):
            return any(p[0] in self.growth for p in producers), False
        if any(p is not None for p in producers):
            return False, False
        return _steady([c.inputs[i][1] for c in calls]) is not None, True

    def _carried(self, site: OpSite, k: int) -> int | None:
        """Index of the input that is this site's own output of the step before, in every step."""
        checked = [s for s in self.decode_steps if s >= 2] or self.decode_steps
        found = None
        for s in checked:
            call = self.by_step[site.id][s][k]
            hit = next((i for i, (p, _, _) in enumerate(call.inputs) if p and p[0] == site.id and p[1] == s - 1),
                       None)
            if hit is None:
                return None
            found = hit
        return found

    def _kv_dim(self, site: OpSite, k: int, carried: int, growth_dims: list[int]) -> int | None:
        """The dim along which k and v sit in one tensor: the new piece is `stack`ed, or readers split it."""
        step = self.decode_steps[-1]
        call = self.by_step[site.id][step][k]
        shape = call.out or ()

        def valid(dim: int | None) -> int | None:
            if dim is None:
                return None
            dim = dim % len(shape) if shape else dim
            return dim if 0 <= dim < len(shape) and shape[dim] == 2 and dim not in growth_dims else None

        found = self._stacked_dim(call, carried, valid)
        if found is not None:
            return found
        for reader in self.t.sites_by_id:
            for c in self.by_step[reader.id].get(step, []):
                if c.inputs and c.inputs[0][0] == (site.id, step, call.index):
                    found = valid(_split_dim(reader.op, c))
                    if found is not None:
                        return found
        return None

    def _stacked_dim(self, call: OpCall, carried: int, valid) -> int | None:
        """The valid dim along which an input other than the carried one was built by `stack`, or None."""
        for i, (producer, _, _) in enumerate(call.inputs):
            maker = self.t.sites_by_id[producer[0]] if i != carried and producer is not None else None
            if maker is not None and maker.op == "stack":
                ints = dict(maker.calls[producer[2]].ints)
                found = valid(ints.get("dim", ints.get("arg1", 0)))
                if found is not None:
                    return found
        return None

    def _growth(self, site: OpSite) -> tuple[Growth | None, bool]:
        """The site's Growth (None if it does not grow) and whether a tensor input grows."""
        n = self._aligned(site)
        if site.id not in self.growth:
            return None, any(self._input_grows(site, k, i)[0]
                             for k in range(n) for i in range(len(self.by_step[site.id][1][k].inputs)))
        k, (dims, by) = self.growth[site.id]
        calls = [self.by_step[site.id][s][k] for s in self.decode_steps]
        prefill = self.by_step[site.id].get(0, [])
        growth = Growth(op=site.op, kind="created", dims=dims, by=by, shapes=[list(c.out) for c in calls],
                        dtype=calls[0].dtype,
                        prefill_shape=list(prefill[0].out) if prefill and prefill[0].out else None,
                        calls=n, via=site.via)
        carried = self._carried(site, k)
        if carried is not None:
            self._describe_carried(growth, site, k, carried, calls[-1])
            return growth, True
        return growth, self._uncarried_kind(growth, site, k, len(calls[0].inputs))

    def _uncarried_kind(self, growth: Growth, site: OpSite, k: int, inputs: int) -> bool:
        """Sets the kind of a growth that carries nothing over: a growing input from outside the step, one derived
        from such an input, a slice with a moving bound, or a tensor created per step; returns whether an input
        grows."""
        grown = [self._input_grows(site, k, i) for i in range(inputs)]
        if any(grows for grows, _ in grown):
            growth.kind = "input" if any(grows and outside for grows, outside in grown) else "derived"
            return True
        if site.op in SLICE_OPS:
            growth.kind = "slice"
        return False

    def _describe_carried(self, growth: Growth, site: OpSite, k: int, carried: int, last_call: OpCall) -> None:
        """A growth whose input `carried` is its own output of the step before: a growing integer input, or a KV
        cache with its piece per step, the dim k and v share (if one tensor holds both) and its layout."""
        growth.carried = True
        integer = last_call.inputs[carried][2]
        growth.kind = "input" if integer else "cache"
        pieces = [shape for i, (_, shape, _) in enumerate(last_call.inputs)
                  if i != carried and len(shape) == len(last_call.out)]
        growth.piece = pieces[0][growth.dims[0]] if pieces else None
        if integer:
            return
        growth.kv_dim = self._kv_dim(site, k, carried, growth.dims)
        growth.layout = _layout(len(last_call.out), growth.dims[0], growth.kv_dim)
        last = self.by_step[site.id][self.decode_steps[-1]]
        growth.call_shapes = [list(c.out) for c in last if c.out is not None]

    def _scalars(self, site: OpSite) -> list[ScalarChange]:
        for k in range(self._aligned(site)):
            calls = [self.by_step[site.id][s][k] for s in self.decode_steps]
            per_step = [dict(c.ints) for c in calls]
            changes = []
            for path in per_step[0]:
                if not all(path in ints for ints in per_step):
                    continue
                values = [ints[path] for ints in per_step]
                changed, delta = _change(values)
                if changed:
                    changes.append(ScalarChange(site.op, path, values, delta, site.via))
            if changes:
                return changes
        return []

    def _statement(self, file: str, line: int) -> tuple[int, bool]:
        """(first line of the innermost statement holding `line`, whether `line` is a branch's test)."""
        if file not in self._statements:
            try:
                tree = ast.parse((self.t.folder / file).read_text())
            except (OSError, SyntaxError, ValueError):
                tree = None
            self._statements[file] = _statement_table(tree) if tree is not None else {}
        return self._statements[file].get(line, (line, False))

    def _entry(self, lines: dict[SourceLine, LineEvidence], file: str, line: int, function: str) -> LineEvidence:
        key = SourceLine(file, line)
        if key not in lines:
            start, _ = self._statement(file, line)
            text = linecache.getline(str(self.t.folder / file), line).strip()
            lines[key] = LineEvidence(function=function, text=text[:100] + ("..." if len(text) > 100 else ""),
                                      phases=[], statement=start if start != line else None)
        return lines[key]

    def build(self, prompt_shape: list[int], new_tokens: int) -> Evidence:
        t = self.t
        lines: dict[SourceLine, LineEvidence] = {}
        first_input = self._record_sites(lines)
        for site in t.sites_by_id:
            if site.via is None and self._positions(site, prompt_shape, new_tokens):
                self._entry(lines, site.file, site.line, site.function).positions = True
        self._record_syncs(lines)
        self._position_tests(lines, prompt_shape, new_tokens)
        for where, entry in lines.items():
            entry.phases = self._phases(where, entry)
        return Evidence(
            folder=str(t.folder), sources=t.sources, steps=self.steps, prompt_shape=list(prompt_shape),
            new_tokens=new_tokens, lines=dict(sorted(lines.items(), key=lambda item: item[0])),
            functions=self._functions(), coverage=self._coverage(),
            recomputes_sequence=first_input[1] if first_input else None,
            unattributed_ops=t.unattributed, trace_errors=list(t.errors))

    def _record_sites(self, lines: dict[SourceLine, LineEvidence]) -> tuple[int, SourceLine] | None:
        """Each op site's growth, Python scalars and reads of a growing input into its line's entry; returns the
        first op (by sequence, and its line) that read a token input which grows: the model recomputing the whole
        sequence."""
        first_input: tuple[int, SourceLine] | None = None
        for site in self.t.sites_by_id:
            growth, scalars, reads = self._site_seen(site)
            if growth is None and not scalars and not reads:
                continue
            entry = self._entry(lines, site.file, site.line, site.function)
            if reads and site.op not in entry.reads_growing:
                entry.reads_growing.append(site.op)
            if growth is not None:
                entry.growing.append(growth)
                first_input = self._earlier_token_input(site, growth, first_input)
            entry.scalars.extend(scalars)
        return first_input

    def _site_seen(self, site: OpSite):
        """(growth or None, Python scalars, whether it reads a growing input) of one op site."""
        growth, growing_input = self._growth(site) if self._aligned(site) else (None, False)
        scalars = [] if growing_input else self._scalars(site)
        return growth, scalars, growth is None and growing_input and site.via is None

    def _earlier_token_input(self, site: OpSite, growth, first: tuple[int, SourceLine] | None
                             ) -> tuple[int, SourceLine] | None:
        """`first`, or this site where it grows a token input and ran before it."""
        if growth.kind != "input" or not self._token_input(site):
            return first
        seq = self.by_step[site.id][1][0].seq
        return (seq, SourceLine(site.file, site.line)) if first is None or seq < first[0] else first

    def _record_syncs(self, lines: dict[SourceLine, LineEvidence]) -> None:
        """Each host sync into its line's entry: a `bool` read that decides a branch counts as a branch."""
        for (file, line, kind, op, via), record in self.t.syncs.items():
            if kind == "bool" and self._statement(file, line)[1]:
                kind = "branch"
            entry = self._entry(lines, file, line, record["function"])
            entry.syncs.append(HostSync(kind, op, record[PREFILL], record[DECODE], via))

    def _phases(self, where: SourceLine, entry: LineEvidence) -> list[str]:
        """The phases that ran a line: its coverage, Decode where anything was seen there in Decode, and the
        phases of its host syncs."""
        ran = {phase for phase, covered in self.t.coverage.get(where.file, {}).items() if where.line in covered}
        seen_in_decode = (entry.growing, entry.scalars, entry.positions, entry.reads_growing, entry.position_tests)
        if any(seen_in_decode):
            ran.add(DECODE)
        ran |= {phase for sync in entry.syncs for phase in (PREFILL, DECODE) if getattr(sync, phase)}
        return [p for p in (PREFILL, DECODE) if p in ran]

    def _position_tests(self, lines: dict[SourceLine, LineEvidence], prompt_shape: list[int], new_tokens: int) -> None:
        """Records the comparisons of the positions with a Python int in the tests of the branches that read the
        device in Decode (`PositionTest`)."""
        branches = {(file, self._statement(file, line)[0])
                    for (file, line, kind, _, _), record in self.t.syncs.items()
                    if kind == "bool" and record[DECODE] and self._statement(file, line)[1]}
        prompt = prompt_shape[-1] if prompt_shape else 0
        for site in self.t.sites_by_id:
            if site.via is None and site.op in _BOUND_TESTS \
                    and (site.file, self._statement(site.file, site.line)[0]) in branches:
                found = self._position_test(site, prompt, new_tokens)
                if found is not None:
                    self._entry(lines, site.file, site.line, site.function).position_tests.append(found)

    def _compared(self, call: OpCall, last: int) -> tuple[int, int] | None:
        """(the one value of the call's tensor minus the step's last position, the Python int it is compared with),
        or None where the call is not such a comparison."""
        bound = dict(call.ints).get("arg1")
        producer = call.inputs[0][0] if len(call.inputs) == 1 else None
        if bound is None or producer is None:
            return None
        values = self.t.sites_by_id[producer[0]].calls[producer[2]].values
        return (values[0] - last, bound) if values is not None and len(values) == 1 else None

    def _position_test(self, site: OpSite, prompt: int, new_tokens: int) -> PositionTest | None:
        """The site's comparison when, in every call of every Decode step, its one tensor held the step's last
        position plus the same offset (0 or 1) and the other side was the same Python int."""
        if len(self.decode_steps) < 2:
            return None  # one step cannot tell a position from any other number
        seen = set()
        for step in self.decode_steps:
            calls = self.by_step[site.id].get(step, [])
            compared = [self._compared(call, prompt + step * new_tokens - 1) for call in calls]
            if not calls or None in compared:
                return None
            seen.update(compared)
        if len(seen) != 1:
            return None
        offset, bound = seen.pop()
        return PositionTest(site.op, offset, bound) if offset in (0, 1) else None

    def _positions(self, site: OpSite, prompt_shape: list[int], new_tokens: int) -> bool:
        """Whether the site makes the positions of the tokens computed at every Decode step (rows of
        `past, ..., past + new - 1`, past being the prompt plus the tokens before) out of something else than
        positions: the first such tensor on the way, not each view of it."""
        prompt = prompt_shape[-1] if prompt_shape else 0
        k = self._holds_positions(site.id, prompt, new_tokens)
        if k is None:
            return False
        inputs = self.by_step[site.id][self.decode_steps[-1]][k].inputs
        return not any(p is not None and self._holds_positions(p[0], prompt, new_tokens) is not None
                       for p, _, _ in inputs)

    def _holds_positions(self, site_id: int, prompt: int, new_tokens: int) -> int | None:
        """The index of the site's call that holds the positions at every Decode step, or None."""
        memo = self._position_memo
        if site_id not in memo:
            found = None
            for k in range(self._aligned(self.t.sites_by_id[site_id])):
                calls = [self.by_step[site_id][s][k] for s in self.decode_steps]
                wanted = [tuple(range(prompt + (s - 1) * new_tokens, prompt + s * new_tokens))
                          for s in self.decode_steps]
                if len(calls) >= 2 and all(c.values and len(c.values) % new_tokens == 0
                                           and c.values == want * (len(c.values) // new_tokens)
                                           for c, want in zip(calls, wanted)):
                    found = k
                    break
            memo[site_id] = found
        return memo[site_id]

    def _token_input(self, site: OpSite) -> bool:
        """A growing integer input of this site comes from outside the sources, or is carried: token ids."""
        k = self.growth[site.id][0]
        call = self.by_step[site.id][1][k]
        carried = self._carried(site, k)
        return any(integer and (i == carried or self._input_grows(site, k, i) == (True, True))
                   for i, (_, _, integer) in enumerate(call.inputs))

    def _changing_parameters(self, record: dict) -> dict[str, ScalarChange]:
        """A function's Python-int parameters that change at every Decode step, in the k-th call of each step."""
        params: dict[str, ScalarChange] = {}
        grouped: dict[int, list[dict[str, int]]] = defaultdict(list)
        for step, values in record["calls"]:
            grouped[step].append(values)
        n = min((len(grouped.get(s, [])) for s in self.decode_steps), default=0)
        for per_step in ([grouped[s][k] for s in self.decode_steps] for k in range(n)):
            for name in per_step[0]:
                change = None if name in params else _changes_every_step(record["name"], name, per_step)
                if change is not None:
                    params[name] = change
        return params

    def _functions(self) -> dict[SourceLine, FunctionEvidence]:
        out: dict[SourceLine, FunctionEvidence] = {}
        for (file, line), record in sorted(self.t.function_calls.items()):
            params = self._changing_parameters(record)
            out[SourceLine(file, line)] = FunctionEvidence(
                record["name"], [p for p in (PREFILL, DECODE) if p in record["phases"]], params)
        return out

    def _coverage(self) -> dict[str, dict[str, str]]:
        return {file: {phase: line_ranges(lines) for phase, lines in sorted(phases.items())}
                for file, phases in sorted(self.t.coverage.items())}


def _changes_every_step(function: str, name: str, per_step: list[dict[str, int]]) -> ScalarChange | None:
    """The change of parameter `name` where every step passed it and it changed at every one, else None."""
    if not all(name in p for p in per_step):
        return None
    values = [p[name] for p in per_step]
    changed, delta = _change(values)
    return ScalarChange(function, name, values, delta) if changed else None


def _change(values: list[int]) -> tuple[bool, int | None]:
    """(whether the value changed at every step, the change per step when it is always the same)."""
    steps = [b - a for a, b in zip(values, values[1:])]
    if not steps or any(s == 0 for s in steps):
        return False, None
    return True, steps[0] if len(set(steps)) == 1 else None

