"""The name of graphmode's helper module beside an adapted file: a module of its own, with no import, because the
workers read it where libcst may not be installed (a target's own interpreter has torch and its model's packages)."""

MODULE_NAME = "graphmode_static"
FILE_NAME = f"{MODULE_NAME}.py"
