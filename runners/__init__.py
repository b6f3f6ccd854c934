"""graphmode's runners: everything that imports torch and touches a device.

They build models through harnesses, compile Decode with a backend, probe the unmodified
code and verify an adapted copy against it. Anything that runs user code runs in a fresh
subprocess (`runners.workers.verify_worker`, `runners.workers.probe_worker`) with a timeout, so a crash, a hang
or leftover Dynamo state cannot leak into the caller or into the other side.

Nothing here imports libcst, and torch_npu is imported only lazily, inside the NPU backends'
availability checks and compiles, and only when it is installed: importing graphmode never imports it
(on a host without CANN that import breaks `import torch` itself).
"""
