"""`graphmode mcp [--root DIR]... [--out DIR]`: graphmode's tools for coding agents, as a Model Context Protocol
server over stdio (agent.mcp_server). Needs the `mcp` extra; starts without torch."""
from __future__ import annotations

import argparse
from pathlib import Path

from graphmode.agent.errors import UserError


def add_mcp_parser(commands) -> None:
    mcp = commands.add_parser(
        "mcp", help="serve scan, design, apply, verify, report and sessions as MCP tools over stdio",
        description="A Model Context Protocol server over stdin/stdout, for coding agents: the tools scan, design, "
                    "apply, verify, report and sessions, each the command of that name. A tool reads only paths "
                    "under a --root and writes only under --out. Sessions are the command line's own "
                    "(`graphmode resume` carries on one the server started). Needs `pip install graphmode[mcp]`.")
    mcp.add_argument("--root", type=Path, action="append", default=None, metavar="DIR",
                     help="a folder the tools may read targets and adapted sources from; repeat for several "
                          "(default: the current folder)")
    mcp.add_argument("--out", type=Path, default=Path("graphmode-out"),
                     help="where the tools' run folders go (default: ./graphmode-out)")


def run_mcp(args: argparse.Namespace) -> int:
    try:
        from graphmode.agent.mcp_server.server import build
    except ModuleNotFoundError as error:
        if error.name and error.name.split(".")[0] == "mcp":
            raise UserError("graphmode mcp needs the MCP SDK: pip install 'graphmode[mcp]'") from None
        raise
    from graphmode.agent.mcp_server.paths import Folders

    build(Folders.of(args.root or [Path.cwd()], args.out)).run("stdio")
    return 0
