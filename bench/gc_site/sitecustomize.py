"""For bench/limits.py --master-gc only: a master started with this folder on PYTHONPATH sets
Python's cyclic garbage collector as CHUNKMASTER_BENCH_GC says ("g0,g1,g2": thresholds), to
measure what a GC setting in the master would change. Not part of chunkmaster."""

import gc
import os

_setting = os.environ.get("CHUNKMASTER_BENCH_GC", "")
if _setting:
    gc.set_threshold(*(int(x) for x in _setting.split(",")))
