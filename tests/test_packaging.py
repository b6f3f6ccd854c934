"""graphmode installs as one named package and keeps its import-time promises."""
from __future__ import annotations

import json
import subprocess
import sys
import sysconfig
import venv
from pathlib import Path

import pytest

PROJECT_ROOT = Path(__file__).resolve().parents[1]


def test_nothing_outside_the_runners_imports_torch_at_import_time():
    """`graphmode scan` and `--help` must start without torch: every module of the agent, the transforms, the
    skills and the templates, and the backend registry (which `--help` lists), imports without it. So does the
    evidence a traced run saved, as data, and what is made of it: the agent reads it back (RunState.evidence)."""
    code = (
        "import importlib, json, pkgutil, sys\n"
        "import graphmode.agent, graphmode.transforms, graphmode.skills, graphmode.templates\n"
        "names = ['graphmode.runners.backends', 'graphmode.runners.evidence.model',\n"
        "         'graphmode.runners.evidence.analysis', 'graphmode.runners.evidence.findings']\n"
        "for package in (graphmode.agent, graphmode.transforms, graphmode.skills, graphmode.templates):\n"
        "    names += [m.name for m in pkgutil.walk_packages(package.__path__, package.__name__ + '.')]\n"
        "for name in names:\n"
        "    importlib.import_module(name)\n"
        "print(json.dumps({'modules': len(names), 'torch': 'torch' in sys.modules}))\n")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, cwd="/")
    assert done.returncode == 0, done.stderr[-2000:]
    result = json.loads(done.stdout.strip().splitlines()[-1])
    assert result["modules"] > 40 and result["torch"] is False


@pytest.mark.slow
def test_installs_beside_other_packages_named_agent_and_templates(tmp_path):
    """A project with its own top-level `agent` and `templates` packages shares the environment: both it and
    graphmode import, and the graphmode command runs."""
    env_dir = tmp_path / "venv"
    venv.EnvBuilder(system_site_packages=True, with_pip=True).create(env_dir)
    python = env_dir / "bin" / "python"
    site = Path(subprocess.run([python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                               capture_output=True, text=True, check=True).stdout.strip())
    # The new environment sees what the interpreter running this test sees: with system_site_packages it gets the
    # base interpreter's packages only, which are not these when the suite itself runs in a virtual environment
    # (the README's way). A .pth line that adds this environment's site folders (their own .pth files included).
    outer = sorted({sysconfig.get_paths()[key] for key in ("purelib", "platlib")})
    (site / "graphmode_test_outer.pth").write_text(
        "import site; " + "; ".join(f"site.addsitedir({folder!r})" for folder in outer) + "\n")
    for name in ("agent", "templates"):
        (site / name).mkdir()
        (site / name / "__init__.py").write_text(f"OWNER = 'another project ({name})'\n")
    install = subprocess.run([python, "-m", "pip", "install", "-q", "--no-deps", "-e", str(PROJECT_ROOT)],
                             capture_output=True, text=True, timeout=600)
    assert install.returncode == 0, install.stderr[-3000:]
    both = subprocess.run([python, "-c", "import agent, templates, graphmode.agent.cli, graphmode.templates; "
                                         "print(agent.OWNER, '|', templates.OWNER)"],
                          capture_output=True, text=True, timeout=120, cwd=tmp_path)
    assert both.stdout.strip() == "another project (agent) | another project (templates)", both.stderr[-2000:]
    scan = subprocess.run([env_dir / "bin" / "graphmode", "scan", str(PROJECT_ROOT / "examples" / "legacy_llm")],
                          capture_output=True, text=True, timeout=120, cwd=tmp_path)
    assert scan.returncode == 1 and "GM" in scan.stdout, scan.stderr[-2000:]  # findings, printed by graphmode


@pytest.mark.slow
def test_the_wheel_holds_every_sub_package_and_the_files_read_as_data(tmp_path):
    """Packages are found, not listed (setup.py): every folder with an __init__.py under the layout's folders is in the
    wheel as graphmode.<folder>..., with the skills, the templates and the helper code the codemods copy."""
    built = subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation",
                            str(PROJECT_ROOT), "-w", str(tmp_path)], capture_output=True, text=True, timeout=600)
    assert built.returncode == 0, built.stderr[-3000:]
    import zipfile

    (wheel,) = tmp_path.glob("graphmode-*.whl")
    names = set(zipfile.ZipFile(wheel).namelist())
    folders = ("agent", "transforms", "runners", "skills", "templates")
    packages = {init.parent.relative_to(PROJECT_ROOT) for folder in folders
                for init in (PROJECT_ROOT / folder).rglob("__init__.py")}
    assert len(packages) > 15
    assert {f"graphmode/{package}/__init__.py" for package in packages} <= names
    assert {"graphmode/skills/host-syncs.md", "graphmode/skills/agent/SKILL.md", "graphmode/templates/report.md.j2",
            "graphmode/transforms/codemods/helper-code/helpers.py", "graphmode/agent/cli/__main__.py"} <= names
