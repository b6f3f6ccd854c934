"""Stand-ins for packages a model folder imports but this machine lacks (flash-attn, quantisation kernels, ...).

Hub repositories import packages at the top of their modeling files that a CPU run never calls. Importing such a
file must not fail the whole run; calling into the missing package must still fail, with a message that names the
package and where the file imported it. `install(missing)` puts a meta-path finder in front of the real ones that
answers only for the named top-level packages and their submodules. For torch_npu, `torch.npu` gets a CPU
stand-in too (runners/npu_standin.py).
"""
from __future__ import annotations

import importlib.abc
import importlib.machinery
import sys
import types


class MissingPackageError(ImportError):
    """Code called into a package the folder imports but that is not installed."""


def _refuse(package: str, where: str, attribute: str):
    def refuse(*args, **kwargs):
        raise MissingPackageError(
            f"{attribute} comes from {package}, which is not installed (imported at {where}); this model needs it on "
            f"this path: install it (pip install {package.replace('_', '-')}) or use a code path without it")
    return refuse


class _Placeholder(types.ModuleType):
    """A module whose every attribute is a placeholder: importable, and failing with a clear message when used."""

    def __init__(self, name: str, package: str, where: str) -> None:
        super().__init__(name)
        self.__graphmode_missing__ = package
        self.__where__ = where
        self.__path__ = []  # a package, so `import flash_attn.layers.rotary` resolves too

    def __getattr__(self, attribute: str):
        if attribute.startswith("__"):
            raise AttributeError(attribute)
        placeholder = _PlaceholderClass(attribute, (), {"__graphmode_missing__": self.__graphmode_missing__})
        placeholder._refuse = staticmethod(_refuse(self.__graphmode_missing__, self.__where__,
                                                   f"{self.__name__}.{attribute}"))
        return placeholder


class _PlaceholderClass(type):
    """A stand-in for a function or class from a missing package: subclassable and storable; calling it raises."""

    def __call__(cls, *args, **kwargs):
        return cls._refuse(*args, **kwargs)


class _Finder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    def __init__(self, missing: dict[str, str]) -> None:
        self.missing = missing

    def find_spec(self, fullname, path=None, target=None):
        top = fullname.partition(".")[0]
        if top in self.missing:
            return importlib.machinery.ModuleSpec(fullname, self, is_package=True)
        return None

    def create_module(self, spec):
        top = spec.name.partition(".")[0]
        return _Placeholder(spec.name, top, self.missing[top])

    def exec_module(self, module):
        return None


def install(missing: dict[str, str]) -> None:
    """Placeholders for the packages `missing` names ({top-level package: "file:line" of its import}) that still
    cannot be imported here; a package installed since the harness was written is imported for real."""
    import importlib.util

    absent = {name: where for name, where in missing.items() if importlib.util.find_spec(name) is None}
    if absent:
        sys.meta_path.insert(0, _Finder(absent))
    if "torch_npu" in absent:
        # Importing torch_npu registers `torch.npu`, which code written for Ascend asks about the device.
        from graphmode.runners import npu_standin

        npu_standin.install()
