"""A session at the terminal: the workflow streamed with a line per step, the confirmation question, the verdict.

`drive` runs the LangGraph workflow of one session (`graphmode adapt`, `graphmode resume`) and stops at
confirmation, or asks there when a person is at a terminal.
"""
from __future__ import annotations

import time
from typing import TYPE_CHECKING

from rich.table import Table

from graphmode.agent.cli.consoles import EXIT_INTERRUPTED, EXIT_STOPPED, console, errors

if TYPE_CHECKING:
    from graphmode.agent.workflow.state import RunState


def session_config(session: str) -> dict:
    return {"configurable": {"thread_id": session}}


def drive(graph, payload, session: str, interactive: bool) -> int:
    """Streams the workflow with one progress line per step; stops (or asks) at confirmation. Ctrl-C says which
    session to resume."""
    config = session_config(session)
    try:
        return _stream(graph, payload, session, config, interactive)
    except KeyboardInterrupt:
        errors.print(f"[yellow]graphmode: interrupted.[/] Session [bold]{session}[/] keeps every step that finished; "
                     f"continue it with `graphmode resume {session}`.", soft_wrap=True)
        return EXIT_INTERRUPTED


def _stream(graph, payload, session: str, config: dict, interactive: bool) -> int:
    from langgraph.types import Command

    from graphmode.agent.workflow.graph import saved_state
    from graphmode.agent.workflow.progress import listening
    from graphmode.agent.workflow.revisions import parameters_of

    while True:
        started = time.perf_counter()
        now = {"step": "working", "since": started}  # the step running, for its progress lines
        with console.status("working…") as status, listening(_progress_listener(status, now)):
            # The graph says which step runs next (a task starts): the terminal only shows it, never routes.
            for mode, event in graph.stream(payload, config, stream_mode=["tasks", "updates"]):
                if mode == "tasks":
                    if "result" not in event and "error" not in event:
                        started = time.perf_counter()
                        now.update(step=event["name"], since=started)
                        status.update(f"{event['name']}…")
                    continue
                for step, change in event.items():
                    if step == "__interrupt__":
                        continue
                    elapsed = time.perf_counter() - started
                    console.print(f"[green]✓[/] {step} ({elapsed:.1f} s): {_describe(step, change or {})}",
                                  soft_wrap=True)
        snapshot = graph.get_state(config)
        state = saved_state(session, snapshot.values)
        if not snapshot.next:
            return _finish(state)
        # Stopped at confirmation.
        answer = ask(state) if interactive else None
        if answer is None:
            console.print(f"\nDesign document: {state.design_path}")
            if state.round > 1:
                console.print(f"Round {state.round}: {state.rounds[-1].outcome}", soft_wrap=True)
            console.print(f"Stopped for confirmation. Session: [bold]{session}[/]")
            console.print(f"  apply every change:  graphmode resume {session}" if state.round == 1 else
                          f"  apply the proposed:  graphmode resume {session}")
            offered = _offered_choice(state)
            if offered:
                console.print(f"  add what you declined, which is behind a failure: graphmode resume {session} "
                              f"--approve {offered}")
            if len(state.plan) > 1:
                console.print(f"  choose changes:      graphmode resume {session} --approve {_example_choice(state)}")
            console.print(f"  apply nothing:       graphmode resume {session} --reject-all")
            if any(parameters_of(c) for c in state.plan):
                example = next(c for c in state.plan if parameters_of(c))
                console.print(f"  revise a parameter:  graphmode resume {session} --revise "
                              f"{example.id}.{parameters_of(example)[0]}=VALUE")
            return EXIT_STOPPED
        payload = Command(resume=answer)


_DIFFS_SHOWN_UP_TO = 80  # lines; longer diffs are paged on request


def _show_diffs(changes) -> None:
    from rich.rule import Rule
    from rich.syntax import Syntax

    for change in changes:
        console.print(Rule(f"{change.id}. {change.title}", align="left"))
        diff = change.diff()
        if diff:
            console.print(Syntax(diff, "diff", theme="ansi_dark", word_wrap=False))
        else:
            console.print("(no lines of its own: it changes what other changes' lines do)")


def _example_choice(state: RunState) -> str:
    """A choice to show in the hint that graphmode accepts: the last change (the entry points, usually) with
    what it needs."""
    from graphmode.agent.workflow.choices import unmet_needs

    last = state.plan[-1].id
    return ",".join(unmet_needs(state.plan, [last]) + [last])


def _offered_choice(state: RunState) -> str:
    """The proposed choice with the declined changes behind a failure added (a later round), as --approve's value;
    "" when nothing is offered."""
    from graphmode.agent.workflow.choices import proposed_choice

    offered = {o["codemod"] for o in state.offers}
    if not offered:
        return ""
    return ",".join(proposed_choice(state.plan, [d for d in state.declined if d not in offered]))


def _progress_listener(status, now: dict):
    """Where a long step's lines go: the spinner's text at a terminal (with the time since the step began), else
    one printed line per finished run."""
    def listen(line: str) -> None:
        elapsed = time.perf_counter() - now["since"]
        if console.is_terminal:
            status.update(f"{now['step']}: {line} ({elapsed:.0f} s in)")
        elif not line.endswith(": running"):
            console.print(f"  {now['step']}: {line} ({elapsed:.0f} s in)", soft_wrap=True)
    return listen


def change_table(state: RunState) -> Table:
    """The planned changes as the confirmation shows them, fitted to the console's width: the description column
    wraps at words, and ids, file names and parameters fold onto further lines instead of being cut with an
    ellipsis (a parameter cut short is a value the person cannot read before approving it)."""
    from graphmode.agent.workflow.adaptation import parameter_values
    from graphmode.agent.workflow.choices import needs_of
    from graphmode.agent.workflow.revisions import parameters_of

    values = parameter_values(state)
    table = Table(title=f"Planned changes (details: {state.design_path})", title_justify="left")
    table.add_column("id", no_wrap=True)
    table.add_column("change", overflow="fold")
    for column in ("files", "fixes", "needs", "parameters"):
        table.add_column(column, overflow="fold")
    for change in state.plan:
        table.add_row(change.id, change.title, ", ".join(change.files), str(len(change.fixes)),
                      ", ".join(needs_of(state.plan, change.id)),
                      ", ".join(f"{name}={values[name]}" for name in parameters_of(change)))
    return table


def choice_prompt(default: str) -> str:
    """The confirmation's question: each answer once, the one Enter takes first and marked so. `default` is "all"
    in round 1, else the proposed choice (ids, comma-separated; "" for nothing)."""
    if default == "all":
        answers = "[bold]all[/] (Enter), none, ids (C1,C3)"
    else:
        answers = f"[bold]proposed: {default or 'nothing'}[/] (Enter), all, none, ids (C1,C3)"
    return f"Apply which changes? {answers}, d \\[ids] for diffs, e ID NAME=VALUE, or later: "


def ask(state: RunState):
    """Asks which changes to apply. Returns 'all', a list of ids, {"revise": {parameter: value}} to design again,
    {"stop": why} when a later round could change nothing (agent.workflow.repair.rounds.nothing_new), or None to
    stop here."""
    from graphmode.agent.workflow.adaptation import parameter_values

    _show_plan(state)
    default = "all"
    if state.round > 1:
        default = _later_round_proposal(state)
        if not isinstance(default, str):
            return default  # None (stop here) or {"stop": why}
    fused_ops = parameter_values(state)["fused_ops"]
    while True:
        try:
            reply = console.input(choice_prompt(default)).strip()
        except EOFError:  # Ctrl-D: the same as "later"
            console.print()
            return None
        answer = _answer(state, reply, default, fused_ops)
        if answer is not _ASK_AGAIN:
            return answer


# What `_answer` returns for a reply that was shown something (a diff) or refused: the question is asked again.
_ASK_AGAIN = object()


def _show_plan(state: RunState) -> None:
    """The diffs (in full when they fit a screen or two, else on request through a pager), the change table and
    how to ask for more."""
    total = sum(change.diff().count("\n") for change in state.plan)
    if total <= _DIFFS_SHOWN_UP_TO:
        _show_diffs(state.plan)
    console.print(change_table(state))
    console.print(f"Diffs: `d` pages through every change's ({total} lines), `d C3` one change's"
                  + (f"; all of them applied together: {state.planned_diff_path}" if state.planned_diff_path else ""))
    console.print("Revise a parameter: `e C3 max_seq_len=4096` (the design is made again with it)")


def _later_round_proposal(state: RunState):
    """A later round's proposed choice ("C1,C3"), after offering the declined changes behind the last failure; None
    to stop here, or {"stop": why} when the same selection again would fail the same way."""
    from graphmode.agent.workflow.choices import proposed_choice
    from graphmode.agent.workflow.repair.rounds import nothing_new

    added = _offer_declined(state)
    if added is None:
        return None
    stop = nothing_new(state, added)
    if stop:  # the report says why instead
        console.print(f"[yellow]{stop[0].upper()}{stop[1:]}.[/] Writing the report.", soft_wrap=True)
        return {"stop": stop}
    proposed = ",".join(proposed_choice(state.plan, [d for d in state.declined if d not in added]))
    console.print(f"Round {state.round}: {state.rounds[-1].outcome}. Proposed: {proposed or 'nothing'} "
                  "(Enter takes it)", soft_wrap=True)
    return proposed


def _answer(state: RunState, reply: str, default: str, fused_ops: str):
    """What one reply to the question asks for (as `ask` returns it), or _ASK_AGAIN."""
    from graphmode.agent.workflow.revisions import parse_revision, source_classes

    if reply.lower().startswith("e "):
        try:
            name, value = parse_revision(state.plan, reply[2:], source_classes(state), fused_ops)
        except ValueError as error:
            console.print(f"[yellow]{error}[/]", soft_wrap=True)
            return _ASK_AGAIN
        return {"revise": {name: value}}
    reply = reply.lower()
    if reply in ("", "y", "yes", "proposed", "p") and default != "all":
        return [part for part in default.split(",") if part]
    words = {"all": "all", "a": "all", "y": "all", "yes": "all", "": "all", "none": [], "n": [], "no": [],
             "later": None, "l": None, "q": None, "quit": None}
    if reply in words:
        return words[reply]
    if reply == "d" or reply == "diff" or reply.startswith(("d ", "diff ")):
        _page_diffs(state, reply)
        return _ASK_AGAIN
    chosen = [part.strip().upper() for part in reply.split(",") if part.strip()]
    if not all(c in {change.id for change in state.plan} for c in chosen):
        console.print(f"[yellow]unknown id in {reply!r}[/]")
        return _ASK_AGAIN
    return _with_what_it_needs(state, chosen)


def _page_diffs(state: RunState, reply: str) -> None:
    """`d` (every change's diff) or `d C1,C3`, through a pager."""
    wanted = {part.strip().upper() for part in reply.split(None, 1)[1].split(",")} if " " in reply else None
    shown = [c for c in state.plan if wanted is None or c.id in wanted]
    if not shown:
        console.print(f"[yellow]unknown id in {reply!r}[/]")
        return
    with console.pager(styles=True):
        _show_diffs(shown)


def _with_what_it_needs(state: RunState, chosen: list[str]):
    """The chosen ids, with the changes they need when the person agrees to add them; _ASK_AGAIN when they do not.
    Never drop what the person chose, and never apply what they did not: ask."""
    from graphmode.agent.workflow.choices import unmet_needs

    missing = unmet_needs(state.plan, chosen)
    if not missing:
        return chosen
    try:
        add = console.input(f"{', '.join(chosen)} need{'s' if len(chosen) == 1 else ''} "
                            f"{', '.join(missing)} too. Add {'it' if len(missing) == 1 else 'them'}? "
                            "[bold]yes[/]/no: ").strip().lower()
    except EOFError:
        console.print()
        return None
    if add in ("", "y", "yes"):
        return [c.id for c in state.plan if c.id in set(chosen) | set(missing)]
    return _ASK_AGAIN


def _offer_declined(state: RunState) -> list[str] | None:
    """Round 2 on: each change the person declined that is behind a failure of the last round, named with it, and
    the question whether to add it. The codemods added (a list), or None for "later"."""
    from graphmode.agent.workflow.repair.rounds import by_change, offer_sentence

    added = []
    for offers in by_change(state.offers).values():
        change = next((c for c in state.plan if c.codemod == offers[0]["codemod"]), None)
        if change is None:
            continue
        console.print(f"{offer_sentence(offers)} in round {state.round - 1}: it would {change.title[0].lower()}"
                      f"{change.title[1:]} ({change.id} in this round's design).", soft_wrap=True)
        try:
            answer = console.input(f"Add {change.id}? yes/[bold]no[/]: ").strip().lower()
        except EOFError:
            console.print()
            return None
        if answer in ("y", "yes"):
            added.append(change.codemod)
    return added


def finished_status(state: RunState) -> int:
    """A finished session's exit status (README's contract): 0 verified, 1 not verified; the same whether the session
    just finished or `graphmode resume` finds it finished."""
    v = state.verification
    return 0 if v is not None and v.passed else 1


def _finish(state: RunState) -> int:
    v = state.verification
    console.print(f"\nReport: [bold]{state.report_path}[/]")
    if finished_status(state) == 0:
        console.print("[green]Verified:[/] identical tokens, 0 graph breaks, 0 recompiles in Decode.")
        return 0
    console.print("[red]Not verified:[/] " + "; ".join(v.problems if v is not None else ["no verification"]))
    return 1


def _describe(step: str, change: dict) -> str:
    if step == "analyze":
        base = change["baseline"]
        figures = base.headline or f"{base.graph_breaks} graph breaks, {base.recompiles} recompiles"
        return (f"{len(change.get('findings', []))} findings in {len(change.get('sources', []))} file(s); the "
                f"unmodified Decode under Dynamo: {figures}")
    if step == "design":
        return f"{len(change.get('plan', []))} changes planned, {len(change.get('manual', []))} items for a person " \
               f"-> {change.get('design_path')}"
    if step == "confirm":
        if change.get("revising"):
            return "revised " + ", ".join(f"{name}={value}" for name, value in change["revisions"].items()) + \
                ": the design is made again"
        if change.get("stopped"):
            return "not run: " + change["stopped"]
        return "approved " + (", ".join(change.get("approved") or []) or "nothing")
    if step == "implement":
        return f"applied {', '.join(change.get('applied', [])) or 'nothing'} -> {change.get('adapted_dir')}"
    if step == "verify":
        return verify_line(change["verification"])
    if step == "repair":
        record = change["rounds"][-1]
        return f"round {record.number}: {record.outcome}"
    if step == "report":
        return str(change.get("report_path"))
    return ""


def verify_line(v) -> str:
    """The verify step's line: its figures, the Decode times qualified as the report qualifies them."""
    from graphmode.runners.measure.timing import qualified

    if not v.ran:
        return "not run: " + "; ".join(v.problems)
    decode = qualified(f"{v.eager.decode_ms_per_token:.3f} -> {v.graph.decode_ms_per_token:.3f} ms/token",
                       v.decode_speedup_unstable)
    return (f"tokens equal: {v.tokens_equal}, graph breaks {v.graph_breaks}, recompiles {v.recompiles}, "
            f"Decode {decode}, warm-up {v.graph.warmup_s:.1f} s, median of {v.runs} run(s) per side"
            + _describe_buckets(v.bucket_sweep))


def _describe_buckets(sweep: dict) -> str:
    buckets = sweep.get("buckets", [])
    if not buckets:
        return ""
    unchanged = all(b["tokens_equal"] for b in buckets)
    return (f"; batch buckets {','.join(str(b['bucket']) for b in buckets)}: real rows "
            f"{'unchanged' if unchanged else 'CHANGED'} by padding, "
            f"{sum(b['captures'] for b in buckets)} capture(s)")
