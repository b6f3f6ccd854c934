"""Every package under the layout's top-level folders, installed as graphmode.<folder>.<...> (pyproject.toml holds
the rest of the project's metadata). Found, not listed: a new sub-package needs no edit here."""
from setuptools import find_packages, setup

FOLDERS = ("agent", "transforms", "runners", "skills", "templates")

setup(
    packages=[f"graphmode.{name}" for name in find_packages(include=[f"{folder}*" for folder in FOLDERS])],
    package_dir={f"graphmode.{folder}": folder for folder in FOLDERS},
)
