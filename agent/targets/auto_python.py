"""`python = "auto"` (`--python auto`, graphmode.toml, a batch manifest): the interpreter a target's code needs.

The target's code is read (agent.targets.resolve.target_code) for the transformers names whose releases are known;
where this interpreter's release serves them all, it runs the model; otherwise graphmode makes, or reuses, an
environment with a release that does (runners.environments), with the packages the code imports that this
interpreter lacks.
"""
from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from graphmode.agent.errors import UserError


def auto_python(path: Path | None, hf: str | None, said_by: str, say: Callable[[str], None]) -> str | None:
    """The interpreter's path for a target named by `path` or `hf`; None when graphmode's own serves its code."""
    from graphmode.runners.environments import EnvironmentMakeError, environment_for

    needs = environment_needs(path, hf)
    if needs is None:
        say(f"{said_by} auto: this interpreter's transformers serves the code")
        return None
    requirement, packages = needs
    try:
        return environment_for(requirement, packages, say)
    except EnvironmentMakeError as error:
        raise UserError(f"{said_by} auto: the environment for {requirement} cannot be made: {error}") from None


def environment_needs(path: Path | None, hf: str | None) -> tuple[str, list[str]] | None:
    """What the environment for the target's code holds: the transformers requirement, and the packages the code
    imports that this interpreter lacks; None when this interpreter's release serves the code."""
    from graphmode.agent.targets.hf import absent_packages, unguarded_imports
    from graphmode.agent.targets.resolve import target_code
    from graphmode.runners.environments import transformers_requirement
    from graphmode.runners.measure.env_info import package_version
    from graphmode.runners.releases import names_used, release_need

    folder, texts = target_code(path, hf)
    uses = names_used(texts)
    problem = release_need(uses, package_version("transformers"))
    if problem is None:
        return None
    requirement = transformers_requirement(uses)
    if requirement is None:  # no one release has every name: no environment can run the code as it is
        raise UserError(f"{folder}: {problem}")
    imports: dict[str, str] = {}
    for relative in texts:
        imports.update(unguarded_imports(folder / relative))
    own = {relative.split("/")[0].removesuffix(".py") for relative in texts}  # the folder's own modules
    return requirement, sorted(absent_packages(set(imports) - own - {"transformers", "torch"}, None))
