"""The `graphmode mcp` server: agent.mcp_server.tools as MCP tools over stdio, on the official `mcp` SDK.

One tool runs at a time, in a worker thread, so the event loop keeps answering while a model runs. What the command
line would print goes to stderr, and each of its lines is also sent as an MCP progress notification to a client that
asked for progress (the step that finished, each verify run). A tool's bad input comes back as a tool error whose text
is the command line's message; anything else as a tool error naming the exception, as the command line says it, never
a crash of the server. A tool returns its own CallToolResult for both: a ToolError raised from a tool reaches the
client prefixed "Error executing tool NAME: " by the SDK.
"""
from __future__ import annotations

import json
import sys
from collections.abc import Callable
from typing import Annotated, Any

import anyio
import anyio.from_thread
import anyio.to_thread
from mcp.server.mcpserver import Context, MCPServer
from mcp.types import CallToolResult, TextContent

from graphmode.agent.errors import UserError
from graphmode.agent.mcp_server import tools
from graphmode.agent.mcp_server.paths import Folders

# A tool's answer: a CallToolResult, whose structured content is checked against (and advertised as) this schema.
Answer = Annotated[CallToolResult, dict[str, Any]]

INSTRUCTIONS = (
    "graphmode adapts PyTorch LLM inference code so its Decode step runs in graph mode (torch.compile, no graph "
    "breaks or recompiles), and proves it with a measured report. scan finds hazards without running anything; design "
    "runs the target's harness, plans changes and stops for a person to confirm; apply implements what the person "
    "approved and verifies; verify checks a folder of adapted sources edited by hand; report and sessions read what "
    "was saved. Never edit the original sources: edit the adapted copy, then call verify."
)


class _Lines:
    """A text file for the command line's console: each whole line goes to stderr and to `heard`."""

    def __init__(self, heard: Callable[[str], None]):
        self._heard, self._pending = heard, ""

    def write(self, text: str) -> int:
        sys.stderr.write(text)
        self._pending += text
        *lines, self._pending = self._pending.split("\n")
        for line in lines:
            if line.strip():
                self._heard(line.strip())
        return len(text)

    def flush(self) -> None:
        sys.stderr.flush()

    def isatty(self) -> bool:
        return False


def build(folders: Folders) -> MCPServer:
    from graphmode.agent.cli.consoles import console

    server = MCPServer("graphmode", instructions=INSTRUCTIONS)
    one_at_a_time = anyio.Lock()

    async def run(ctx: Context, work: Callable[..., dict[str, Any]], *args) -> CallToolResult:
        said = 0

        def heard(line: str) -> None:  # in the worker thread: the notification is sent from the event loop
            nonlocal said
            said += 1
            anyio.from_thread.run(ctx.report_progress, said, None, line)

        async with one_at_a_time:
            before = console.file
            console.file = _Lines(heard)
            try:
                result = await anyio.to_thread.run_sync(lambda: work(folders, *args))
            except UserError as error:
                return _error(str(error))
            except Exception as error:  # our bug, said as the command line says it: the server carries on
                return _error(f"internal error: {type(error).__name__}: {error}")
            finally:
                console.file = before
        return CallToolResult(content=[TextContent(type="text", text=json.dumps(result, indent=2, default=str))],
                              structured_content=result)

    @server.tool(description="The static rules over Python files and folders, nothing imported or run: each finding "
                             "with its rule code, file:line, message and the codemods that may fix it. check_fixes "
                             "runs the codemods to say which finding each fixes.")
    async def scan(paths: list[str], ctx: Context, check_fixes: bool = False) -> Answer:
        return await run(ctx, tools.scan, paths, check_fixes)

    @server.tool(description="Analyze and design for a target folder with a harness.py: runs the harness (the model "
                             "code) once traced and once under Dynamo, then plans the changes. Returns the session id, "
                             "design.md, each change's id, title, files, diff and parameters, and the items left for "
                             "a person. The session then waits for apply. Takes minutes; sends progress.")
    async def design(target: str, ctx: Context, backend: str | None = None, steps: int | None = None,
                     runs: int | None = None) -> Answer:
        return await run(ctx, tools.design, target, backend, steps, runs)

    @server.tool(description="Answer a session's confirmation, as the person chose: approve lists change ids (none "
                             "given: every change), decline_all applies nothing, revise maps 'C4.max_seq_len' to a new "
                             "value (the design is made again and the session stops again). Then implements, verifies "
                             "and reports: report.json's fields with the report's paths. Takes minutes.")
    async def apply(session: str, ctx: Context, approve: list[str] | None = None, decline_all: bool = False,
                    revise: dict[str, str] | None = None) -> Answer:
        return await run(ctx, tools.apply, session, approve, decline_all, revise)

    @server.tool(description="Verify and report on a folder of adapted sources (perhaps edited by hand) against the "
                             "original target folder: the same workers, equivalence battery and report as apply. "
                             "Neither folder is changed; the report lists files that differ from what graphmode "
                             "wrote. Takes minutes.")
    async def verify(original: str, adapted: str, ctx: Context, backend: str | None = None,
                     steps: int | None = None, runs: int | None = None) -> Answer:
        return await run(ctx, tools.verify, original, adapted, backend, steps, runs)

    @server.tool(description="A finished session's report: report.json's fields with the paths of report.md and "
                             "report.json.")
    async def report(session: str, ctx: Context) -> Answer:
        return await run(ctx, tools.report, session)

    @server.tool(description="Every saved session (the command line's too) and where it stands.")
    async def sessions(ctx: Context) -> Answer:
        return await run(ctx, tools.sessions)

    return server


def _error(message: str) -> CallToolResult:
    """A tool error whose text is `message` alone, the SDK adding nothing to it."""
    return CallToolResult(content=[TextContent(type="text", text=message)], is_error=True)
