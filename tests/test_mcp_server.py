"""`graphmode mcp` through the MCP SDK's own client over stdio, as a coding agent drives it: the tools listed, then
scan -> design -> apply -> verify on the bundled example to a verified report, and bad input answered as tool errors
with the command line's messages while the server carries on. What lies outside the server's folders stays out of
reach: a session the command line saved on another folder, and a graphmode.toml naming files elsewhere.

One server session runs the whole conversation once (module-scoped); the tests read what it answered.
"""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

mcp = pytest.importorskip("mcp", reason="the mcp extra (pip install -e '.[mcp]')")

import anyio  # noqa: E402  (after the skip: anyio comes with the SDK)
from mcp import ClientSession  # noqa: E402
from mcp.client.stdio import StdioServerParameters, stdio_client  # noqa: E402

EXAMPLES = Path(__file__).parents[1] / "examples"
EXAMPLE = EXAMPLES / "legacy_llm"
TOOLS = {"scan", "design", "apply", "verify", "report", "sessions"}


class Conversation:
    """One client session with the server: each call's result and the progress lines it was sent."""

    def __init__(self, session: ClientSession):
        self.session, self.progress = session, {}

    async def call(self, name: str, arguments: dict, label: str | None = None):
        heard = self.progress.setdefault(label or name, [])

        async def progress(done: float, total: float | None, message: str | None) -> None:
            heard.append(message)

        return await self.session.call_tool(name, arguments, progress_callback=progress)


def _session_on(home: Path, target: Path, session: str) -> None:
    """A session the command line saved on `target`, stopped at confirmation; saved through the workflow's own graph
    without running a model."""
    from graphmode.agent.cli.terminal import session_config
    from graphmode.agent.workflow.graph import build_graph, open_checkpointer
    from graphmode.agent.workflow.state import RunOptions, RunState

    state = RunState(session_id=session, options=RunOptions(target=str(target), run_dir=str(target / "out")))
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("GRAPHMODE_HOME", str(home))
        with open_checkpointer() as checkpointer:
            build_graph(checkpointer).update_state(session_config(session), state.model_dump(), as_node="design")


def _target_file_naming(folder: Path, target: str) -> Path:
    """A target folder (under the server's folders) whose graphmode.toml has `target` as its [target] table."""
    folder.mkdir()
    (folder / "graphmode.toml").write_text(f"[target]\n{target}\n")
    return folder


async def _converse(home: Path, out: Path, elsewhere: Path) -> dict:
    env = {**os.environ, "GRAPHMODE_HOME": str(home)}
    # Two roots: the examples, and the folder the run folders go in, so verify may read the session's adapted copy.
    server = StdioServerParameters(command=sys.executable, env=env, cwd=str(out.parent), args=[
        "-m", "graphmode.agent.cli", "mcp", "--root", str(EXAMPLES), "--root", str(out.parent), "--out", str(out)])
    answers: dict = {}
    async with stdio_client(server) as (read, write), ClientSession(read, write) as session:
        await session.initialize()
        talk = Conversation(session)
        answers["tools"] = (await session.list_tools()).tools
        answers["scan"] = await talk.call("scan", {"paths": ["legacy_llm"]})
        answers["missing"] = await talk.call("scan", {"paths": ["no_such_model"]})
        answers["outside"] = await talk.call("verify", {"original": "legacy_llm", "adapted": str(Path.home())})
        answers["unknown_session"] = await talk.call("apply", {"session": "nosuch01"})
        answers["session_elsewhere"] = await talk.call("report", {"session": "elsewh01"})
        harness = _target_file_naming(out.parent / "harness_elsewhere", f'harness = "{elsewhere / "harness.py"}"')
        answers["harness_elsewhere"] = await talk.call("design", {"target": str(harness), "backend": "eager"})
        sources = _target_file_naming(out.parent / "sources_elsewhere",
                                     f'sources = ["../../{elsewhere.name}/model.py"]')
        (sources / "harness.py").write_text((elsewhere / "harness.py").read_text())
        answers["sources_elsewhere"] = await talk.call("design", {"target": str(sources), "backend": "eager"})
        designed = answers["design"] = await talk.call(
            "design", {"target": str(EXAMPLE), "backend": "eager", "runs": 1})
        session_id = designed.structured_content["session"]
        answers["unknown_change"] = await talk.call("apply", {"session": session_id, "approve": ["C99"]})
        answers["report_too_soon"] = await talk.call("report", {"session": session_id})
        answers["apply"] = await talk.call("apply", {"session": session_id})
        answers["verify"] = await talk.call("verify", {
            "original": str(EXAMPLE), "adapted": answers["apply"].structured_content["adapted_dir"],
            "backend": "eager", "runs": 1})
        answers["report"] = await talk.call("report", {"session": session_id})
        answers["sessions"] = await talk.call("sessions", {})
        answers["progress"] = talk.progress
    answers["session"] = session_id
    return answers


@pytest.fixture(scope="module")
def conversation(tmp_path_factory) -> dict:
    tmp = tmp_path_factory.mktemp("mcp")
    # A folder beside the server's: a harness that says so if it is ever run, and a saved session on it.
    elsewhere = tmp_path_factory.mktemp("elsewhere")
    (elsewhere / "harness.py").write_text(f"open({str(elsewhere / 'ran')!r}, 'w').close()\n")
    (elsewhere / "model.py").write_text("")
    _session_on(tmp / "home", elsewhere, "elsewh01")
    answers = anyio.run(_converse, tmp / "home", tmp / "out", elsewhere)
    answers["home"], answers["elsewhere"] = tmp / "home", elsewhere
    return answers


@pytest.mark.slow
def test_scan_design_apply_verify_through_the_sdk_client(conversation):
    assert {tool.name for tool in conversation["tools"]} == TOOLS
    scan = conversation["scan"]
    assert not scan.is_error and {f["code"] for f in scan.structured_content["findings"]} >= {"GM101"}
    designed = conversation["design"].structured_content
    assert not conversation["design"].is_error and designed["stands_at"] == ["confirm"]
    assert Path(designed["design_md"]).is_file() and designed["changes"]
    assert all(c["id"].startswith("C") and c["title"] for c in designed["changes"])
    assert any(c["parameters"].get("max_seq_len") for c in designed["changes"])
    applied = conversation["apply"].structured_content
    assert not conversation["apply"].is_error, conversation["apply"].content
    assert applied["passed"] and applied["exit_status"] == 0 and applied["graph_breaks"] == 0
    assert applied["tokens_equal"] and applied["backend"] == "eager" and applied["session"] == conversation["session"]
    assert "**Result: verified.**" in Path(applied["report_md"]).read_text()
    report = conversation["report"].structured_content
    assert report["report_md"] == applied["report_md"] and report["passed"]
    listed = {s["session"]: s for s in conversation["sessions"].structured_content["sessions"]}
    assert listed[conversation["session"]]["stands_at"] == "finished"
    # Long steps said what they did as MCP progress: each step of the workflow, each verify run.
    assert any(line.startswith("✓ analyze") for line in conversation["progress"]["design"])
    assert any("verify: graph (adapted) run 1 of 1: done" in line for line in conversation["progress"]["apply"])
    verified = conversation["verify"]
    assert not verified.is_error, verified.content
    result = verified.structured_content
    assert result["passed"] and result["exit_status"] == 0 and Path(result["report_md"]).is_file()
    assert result["hand_edits"]["written_by"] == "graphmode adapt" and result["hand_edits"]["files"] == []
    assert any("run 1 of 1: done" in line for line in conversation["progress"]["verify"])


@pytest.mark.slow
def test_a_session_the_server_started_is_the_command_lines_too(conversation):
    env = {**os.environ, "GRAPHMODE_HOME": str(conversation["home"])}
    done = subprocess.run([sys.executable, "-m", "graphmode.agent.cli", "resume", conversation["session"]],
                          capture_output=True, text=True, env=env, stdin=subprocess.DEVNULL, timeout=120)
    assert done.returncode == 0 and "has finished, verified" in done.stdout, done.stdout + done.stderr


@pytest.mark.slow
@pytest.mark.parametrize("answer, expected", [
    ("missing", "no_such_model: no such file or folder"),
    ("outside", "outside the folders this server may read"),
    ("unknown_session", "no session nosuch01"),
    ("unknown_change", "--approve C99:"),
    ("report_too_soon", "has no report yet: it stands at confirm"),
    ("session_elsewhere", "session elsewh01's target"),
])
def test_bad_input_is_a_tool_error_with_the_command_lines_message(conversation, answer, expected):
    result = conversation[answer]
    text = result.content[0].text
    assert result.is_error and expected in text, result.content
    # The message alone: no "Error executing tool NAME: " from the SDK before it, no traceback after it.
    assert not text.startswith("Error executing tool") and "Traceback" not in text, text


@pytest.mark.slow
def test_a_tool_error_says_what_the_command_line_says(conversation):
    env = {**os.environ, "GRAPHMODE_HOME": str(conversation["home"])}
    done = subprocess.run([sys.executable, "-m", "graphmode.agent.cli", "resume", "nosuch01"],
                          capture_output=True, text=True, env=env, stdin=subprocess.DEVNULL, timeout=120)
    assert done.returncode == 2, done.stdout + done.stderr
    assert done.stderr.strip() == f"graphmode: error: {conversation['unknown_session'].content[0].text}"


@pytest.mark.slow
def test_sessions_lists_only_sessions_on_targets_under_the_roots(conversation):
    listed = {s["session"]: s for s in conversation["sessions"].structured_content["sessions"]}
    assert listed[conversation["session"]]["target"] == str(EXAMPLE.resolve())
    assert "elsewh01" not in listed, listed


@pytest.mark.slow
@pytest.mark.parametrize("answer, key", [("harness_elsewhere", "harness"), ("sources_elsewhere", "sources")])
def test_a_target_file_naming_a_file_outside_the_roots_is_refused_before_anything_runs(conversation, answer, key):
    result, elsewhere = conversation[answer], conversation["elsewhere"]
    text = result.content[0].text
    assert result.is_error and f"graphmode.toml: [target] {key} {elsewhere}" in text, text
    assert "is outside the folders this server may read" in text, text
    assert not (elsewhere / "ran").exists(), "the harness outside the roots was run"


def test_the_server_starts_without_torch():
    code = ("import sys; from pathlib import Path; from graphmode.agent.mcp_server.server import build; "
            "from graphmode.agent.mcp_server.paths import Folders; build(Folders.of([Path('.')], Path('out'))); "
            "assert 'torch' not in sys.modules, 'torch imported'")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
