"""The rule catalogue and the scan that runs it. One rule per module, found by its file name (gmNNN_*.py)."""
from __future__ import annotations

import ast
import importlib
import pkgutil
import re
import warnings

from graphmode.transforms.analysis.reach import reachable_functions
from graphmode.transforms.findings import Finding
from graphmode.transforms.rules.base import Rule, SourceFile

# Each rule is one module, gmNNN_short_name.py in the sub-package of its kind (step/, compile_calls/), holding one
# Rule subclass: importing the package imports them all, so adding a rule is adding its file (and its fixture). The
# catalogue is in code order.
_RULE_MODULE = re.compile(r"gm\d{3}_\w+\Z")


def _rules_of_package() -> tuple[type[Rule], ...]:
    found = []
    for module in pkgutil.walk_packages(__path__, f"{__name__}."):
        if _RULE_MODULE.match(module.name.rpartition(".")[2]):
            loaded = importlib.import_module(module.name)
            found += [value for value in vars(loaded).values()
                      if isinstance(value, type) and issubclass(value, Rule) and value.__module__ == loaded.__name__]
    return tuple(sorted(found, key=lambda rule: rule.CODE))


RULES: tuple[type[Rule], ...] = _rules_of_package()
# GM901 (graph break) and GM902 (recompile) are runtime codes: the Dynamo probe reports them, no rule does.


def scan_source(source: str, path: str) -> list[Finding]:
    """Every finding of every rule in one source file, in line order. Raises SyntaxError (and
    ValueError for a NUL byte)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # invalid escape sequences and the like are not findings
        tree = ast.parse(source, filename=path)
    file = SourceFile(source, path, tree, reachable_functions(tree))
    rules = [rule(file) for rule in RULES]
    file.run(rules)
    findings = [f for rule in rules for f in rule.findings]
    return sorted(findings, key=lambda f: (f.line, f.column, f.code))
