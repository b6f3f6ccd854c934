"""`graphmode scan`: the static rules over files and folders; nothing is imported from the model or run."""
from __future__ import annotations

import argparse

from graphmode.agent.cli.consoles import console, errors
from graphmode.agent.errors import UserError


def run_scan(args: argparse.Namespace) -> int:
    import json
    from importlib.metadata import PackageNotFoundError, version

    from graphmode.transforms.sarif import to_sarif
    from graphmode.transforms.scan import finding_record, fix_note, may_fix, scan_paths

    if args.entry_class and not args.check_fixes:
        raise UserError("--entry-class is used only with --check-fixes")
    try:
        result = scan_paths(args.paths, jobs=args.jobs, check_fixes=args.check_fixes, entry_class=args.entry_class)
    except FileNotFoundError as error:
        raise UserError(str(error)) from None
    for problem in result.errors:
        errors.print(f"{problem.path}: error: {problem.message}", soft_wrap=True, markup=False)
    if args.format == "json":
        print(json.dumps([finding_record(f, result) for f in result.findings], indent=2))
    elif args.format == "sarif":
        try:
            tool_version = version("graphmode")
        except PackageNotFoundError:
            tool_version = "0"
        print(json.dumps(to_sarif(result, tool_version), indent=2))
    else:
        for f in result.findings:
            note = fix_note(f, result)
            console.print(f"{f.location}: {f.code} {f.message}{f' ({note})' if note else ''}", soft_wrap=True,
                          markup=False)
        if result.fixes_checked:
            fixes = f"{len(result.fixed_by)} fixed by a codemod, checked by running them"
        else:
            fixes = (f"{sum(bool(may_fix(f.code)) for f in result.findings)} of a kind a codemod may fix; "
                     "--check-fixes runs them to tell which they do")
        console.print(f"{len(result.findings)} findings ({fixes}) in {result.files} files: {result.parsed} "
                      f"checked by the rules, {result.spared} with no model step or compile call (parsed only), "
                      f"{len(result.errors)} could not be scanned; {result.seconds:.2f} s", soft_wrap=True)
    if result.findings:
        return 1
    return 2 if result.errors else 0
