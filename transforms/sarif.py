"""Findings as SARIF 2.1.0, the format code-scanning tools (GitHub, IDEs) read.

A rule's `codemods` property names the codemods that handle its kind of hazard. A result's `autofix` is
true only when the scan ran them (`fixChecked`, `graphmode scan --check-fixes`) and one of them fixes
that very finding (`fixedBy`); `mayBeFixedBy` lists the candidates either way.
"""
from __future__ import annotations

from graphmode.transforms.findings import Finding
from graphmode.transforms.rules import RULES
from graphmode.transforms.scan import ScanResult, may_fix

SCHEMA = "https://json.schemastore.org/sarif-2.1.0.json"


def to_sarif(result: ScanResult, version: str) -> dict:
    rules = [
        {
            "id": rule.CODE,
            "name": rule.__name__,
            "shortDescription": {"text": rule.MESSAGE.replace("{name}", "…")},
            "help": {"text": f"See skills/{rule.SKILL}.md"},
            "properties": {"skill": rule.SKILL, "codemods": list(may_fix(rule.CODE))},
        }
        for rule in RULES
    ]
    return {
        "$schema": SCHEMA,
        "version": "2.1.0",
        "runs": [
            {
                "tool": {"driver": {"name": "graphmode", "version": version, "rules": rules}},
                "results": [_result(f, result) for f in result.findings],
                "invocations": [
                    {
                        "executionSuccessful": not result.errors,
                        "toolExecutionNotifications": [
                            {
                                "level": "error",
                                "message": {"text": e.message},
                                "locations": [{"physicalLocation": {"artifactLocation": {"uri": e.path}}}],
                            }
                            for e in result.errors
                        ],
                    }
                ],
            }
        ],
    }


def _result(finding: Finding, result: ScanResult) -> dict:
    return {
        "ruleId": finding.code,
        "level": "warning",
        "message": {"text": finding.message},
        "locations": [
            {
                "physicalLocation": {
                    "artifactLocation": {"uri": finding.path},
                    "region": {"startLine": finding.line, "startColumn": finding.column},
                }
            }
        ],
        "properties": {
            "autofix": finding.autofix,
            "fixChecked": result.fixes_checked,
            "fixedBy": result.fixed_by.get(finding),
            "mayBeFixedBy": list(may_fix(finding.code)),
            "skill": finding.skill,
            "function": finding.function,
        },
    }
