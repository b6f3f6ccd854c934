"""The workflow graph: analyze -> design -> confirm -> implement -> verify -> report, with three loops back:

- confirm -> design when a person revises a change's parameters (agent.workflow.revisions);
- confirm -> report when a person declines every planned change (nothing to implement or verify);
- verify -> repair -> design when verification failed and the repair found something another round can fix
  (agent.workflow.repair), while --rounds allows; repair -> report otherwise.

`confirm` interrupts until a person answers (unless --yes); the SQLite checkpointer keeps the
session, so `graphmode resume <id>` can finish it in a later process.
"""
from __future__ import annotations

import sqlite3
from collections.abc import Iterator
from contextlib import contextmanager

from langgraph.checkpoint.serde.jsonplus import JsonPlusSerializer
from langgraph.checkpoint.sqlite import SqliteSaver
from langgraph.graph import END, START, StateGraph

from graphmode.agent.errors import UserError
from graphmode.agent.home import sessions_db  # here too: the commands that run sessions import it from here
from graphmode.agent.workflow import nodes
from graphmode.agent.workflow.state import SCHEMA_VERSION, RunState

# The classes checkpoints hold, by module: they load without an "unregistered type" warning.
STATE_CLASSES = (*(("graphmode.agent.workflow.state", name)
                   for name in ("RunState", "RunOptions", "Baseline", "ManualItem", "Change", "Round")),
                 *(("graphmode.runners.verify.record", name) for name in ("Verification", "SideFigures")),
                 ("graphmode.transforms.findings", "Finding"))

STEPS = ("analyze", "design", "confirm", "implement", "verify", "repair", "report")


def build_graph(checkpointer):
    graph = StateGraph(RunState)
    for name in STEPS:
        graph.add_node(name, getattr(nodes, name))
    graph.add_edge(START, "analyze")
    graph.add_edge("analyze", "design")
    graph.add_edge("design", "confirm")
    graph.add_conditional_edges("confirm", nodes.after_confirm, ["design", "implement", "report"])
    graph.add_edge("implement", "verify")
    graph.add_conditional_edges("verify", nodes.after_verify, ["repair", "report"])
    graph.add_conditional_edges("repair", nodes.after_repair, ["design", "report"])
    graph.add_edge("report", END)
    return graph.compile(checkpointer=checkpointer)


@contextmanager
def open_checkpointer() -> Iterator[SqliteSaver]:
    connection = sqlite3.connect(sessions_db(), check_same_thread=False)
    try:
        serde = JsonPlusSerializer(allowed_msgpack_modules=list(STATE_CLASSES))
        yield SqliteSaver(connection, serde=serde)
    finally:
        connection.close()


def saved_state(session: str, values: dict) -> RunState:
    """A checkpointed session's state, or a clear refusal when an earlier graphmode saved it in another layout."""
    saved = values.get("schema_version", 1)
    if saved != SCHEMA_VERSION:
        raise UserError(f"session {session} was saved by an earlier graphmode (state layout {saved}, this one reads "
                        f"{SCHEMA_VERSION}); start it again with `graphmode adapt {saved_target(values) or 'PATH'}`")
    return RunState.model_validate(values)


def saved_target(values: dict) -> str:
    """The target folder of a checkpointed session, whatever its layout (for listing sessions)."""
    options = values.get("options")
    if options is None:
        return str(values.get("target", ""))  # layout 1: the options were top-level fields
    return options.target if hasattr(options, "target") else str(options.get("target", ""))
