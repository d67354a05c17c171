import time as _time

IMPORTED_AT = _time.time()  # when this process started importing relax (relax/fault/boot.py)

from relax.imports import install as _install  # noqa: E402 -- after the clock: tensordict without torch._dynamo

_install()
