import time as _time

IMPORTED_AT = _time.time()  # when this process started importing relax (relax/fault/boot.py)
