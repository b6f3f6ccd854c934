"""Which calls read a tensor's value on the host: the one recogniser of the host-sync family.

GM101 reports a host sync and GM103 a copy to the host (both on Python's `ast`); hoist_item moves a check that reads
one into eager code and host_scalars keeps a `.item()` read on the device (both on libcst's tree). Each describes
the call in the same three facts, the method's name and how many positional and keyword arguments it has
(astutil's `method_call`, cstutil's `method_call`), and asks here, so a finding and an edit cannot disagree on what
a host read is. Written over that description rather than either tree: the rules stay on `ast` (a libcst parse
would multiply scan's time), and the codemods ask it of statements they have rebuilt, which have no place in the
chain's `ast` parse.
"""
from __future__ import annotations

# The methods that wait for the device and hand a value to Python.
SYNC_METHODS = frozenset({"item", "tolist"})
# The methods that copy a whole tensor to host memory.
COPY_METHODS = frozenset({"cpu", "numpy"})


def host_sync(method: str | None, positional: int, keywords: int) -> str | None:
    """The method's name when a call of it with these arguments waits for the device and copies a value to the
    host (`t.item()`, `t.tolist()`); None otherwise. With an argument, `.item(i)` is numpy's element access."""
    return method if method in SYNC_METHODS and not positional and not keywords else None


def host_copy(method: str | None) -> str | None:
    """The method's name when it copies a tensor to host memory (`t.cpu()`, `t.numpy()`), whatever its arguments;
    None otherwise. `.to("cpu")` is a device argument, read by GM103 itself."""
    return method if method in COPY_METHODS else None
