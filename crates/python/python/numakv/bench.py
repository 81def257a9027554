"""Reading what ``numakv bench`` and ``numakv repro`` wrote.

``load(path)`` takes a ``results.json`` (or the directory holding it) and returns its runs: a
pandas DataFrame when pandas is installed, else a list of dicts. Figures a run did not measure
are ``None`` (``NaN`` in a DataFrame), never 0.
"""

import json
import os


def load(path, failures=False):
    """The runs of a benchmark report (``failures=True``: the failed runs instead)."""
    if os.path.isdir(path):
        path = os.path.join(path, "results.json")
    with open(path, encoding="utf-8") as f:
        doc = json.load(f)
    if not isinstance(doc, dict) or "runs" not in doc:
        raise ValueError(f"{path}: not a numakv bench report (no 'runs')")
    rows = doc.get("failures", []) if failures else doc["runs"]
    try:
        import pandas  # noqa: F401
    except ImportError:
        return rows
    return pandas.DataFrame(rows)
