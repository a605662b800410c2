"""Keeping Python's cyclic garbage collector out of the decode loop.

The collector's full pass walks every container object the process holds.
Once a model, its tokenizer and the libraries behind them are loaded, that
is several hundred thousand objects, and a full pass over them stops the
engine thread mid-step for as long as the walk takes. Lookahead makes those
passes come round more often than plain decoding does, because the output
memory keeps growing (every finished request adds its n-grams as trie
nodes, which live on), and the collector starts a full pass each time the
long-lived objects grow by a quarter.

`settle` collects once, then moves everything alive into the collector's
permanent generation (`gc.freeze`), which no later pass walks: the model
and the loaded memory are no longer part of any pause. Called once a
replica has loaded everything it keeps. What is frozen is still freed by
reference counting when its last reference goes; only a reference cycle
among frozen objects would outlive its use, which is why this is for a
process that keeps what it loaded (a replica), not for one that loads
models again and again (a test run).
"""

import gc
import time


def settle() -> tuple[int, float]:
    """Collect, then freeze what is alive; (objects frozen so far, seconds the collection took)."""
    t0 = time.perf_counter()
    gc.collect()
    seconds = time.perf_counter() - t0
    gc.freeze()
    return gc.get_freeze_count(), seconds

