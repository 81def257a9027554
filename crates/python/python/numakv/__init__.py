"""numakv: NUMA-aware persistent-memory indexes (NOBtree, F3-tree, Nap, NBTree, NStore and
FAST&FAIR) from Python.

>>> import numakv, tempfile, os
>>> d = os.path.join(tempfile.mkdtemp(), "store")
>>> with numakv.Store.create(d, engine="nbtree", capacity="64M") as s:
...     s.put(7, 49)
...     s.get(7)
49

Integer stores map ints in 1..2**64-2 to ints; bytes stores (``bytes=True``) map bytes-like (or
str, as UTF-8) keys of 1 B..1 KiB to values of up to 1 MiB, in byte order. A store is a mapping:
``k in s``, ``s[k]``, ``del s[k]``, ``s.get(k, default)``, ``len(s)`` and ordered ``for k in s``,
``keys()``, ``values()``, ``items()``. Close it (``with`` or ``close()``); one collected open is
closed with a ``ResourceWarning`` (if scan iterators of it are still open then, the last of them
closes it when it ends or is collected). A store belongs to the process that opened it: in a fork child
every call raises ``Forked``. ``numakv.bench.load``
reads the benchmark driver's JSON.
"""

from ._native import (  # noqa: F401
    ENGINES,
    Busy,
    Closed,
    Corrupted,
    Forked,
    InvalidArgument,
    NumakvError,
    OutOfSpace,
    StoreIoError,
    Store,
    TooLarge,
    WriteBatch,
    WrongKind,
    __version__,
)
from . import bench  # noqa: F401

__all__ = [
    "ENGINES",
    "Busy",
    "Closed",
    "Corrupted",
    "Forked",
    "InvalidArgument",
    "NumakvError",
    "OutOfSpace",
    "StoreIoError",
    "Store",
    "TooLarge",
    "WriteBatch",
    "WrongKind",
    "bench",
]
