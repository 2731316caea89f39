"""Tuned parameters on disk: what ``firesched.tune`` found fastest, for the recipes to read.

One JSON file per entry under ``cache_dir()/tuned`` (``$FIRESCHED_CACHE_DIR``, as the kernel
cache), named by the SHA-256 of its key.  The key is the problem (the recipe and every argument
that changes its schedule), the device (name, compute capability, SM count), the CUDA driver's
version and the library's version: a new driver or a new release re-tunes, an old entry is never
misread.  An entry also repeats its key, and a read that does not find exactly that (a torn or
hand-edited file, a hash collision, a field of another release) is a miss, never an error::

    ~/.cache/firesched/tuned/3f9c...e1.json
    {"key": {"problem": {...}, "device": {...}, "driver": 13000, "version": "0.1.0"},
     "params": {"atoms": "sm90a", "block_m": 128, ...}, "time_us": 191.4, ...}

Writers write a temporary file in the same folder and rename it over the entry
(``os.replace`` is atomic on POSIX and Windows), so concurrent tuners of one problem leave one
whole entry, the last one's, and a reader sees the old entry or the new, never half of one.
"""

from __future__ import annotations

import hashlib
import json
import os
import tempfile
import time
from pathlib import Path

from . import runtime
from .cuda.nvrtc import cache_dir
from .version import __version__

#: Bumped when an entry's layout changes.
FORMAT = 1


def tuned_dir() -> Path:
    """The folder of tuned entries (``cache_dir()/tuned``), read at each call like ``cache_dir``."""
    return cache_dir() / "tuned"


def device_key(device: int | None = None) -> dict:
    """The identity of CUDA device ``device`` (None: the current one) that tuned entries are
    keyed by, with the driver's version; a ``LaunchError`` without a GPU."""
    index = runtime.current_device() if device is None else device
    info = runtime.device_info(index)
    return {"name": info.name, "capability": list(info.compute_capability), "sms": info.sm_count,
            "driver": runtime.driver_version()}


def entry_key(problem: dict, device: dict) -> dict:
    """The whole key of an entry: ``problem`` (JSON values only), ``device`` (``device_key``),
    the library's version and the entry format."""
    return {"problem": problem, "device": device, "version": __version__, "format": FORMAT}


def _path(key: dict) -> Path:
    digest = hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()
    return tuned_dir() / f"{digest}.json"


def lookup(problem: dict, device: dict) -> dict | None:
    """The stored entry for ``problem`` on ``device`` (a dict with ``params``, ``time_us`` and
    what ``store`` was given), or None: no entry, or a file that is not exactly a whole entry
    of this key (those are overwritten by the next ``store``)."""
    key = entry_key(problem, device)
    try:
        with open(_path(key), encoding="utf-8") as f:
            entry = json.load(f)
    except (OSError, ValueError):
        return None
    if not isinstance(entry, dict) or entry.get("key") != json.loads(json.dumps(key)) \
            or not isinstance(entry.get("params"), dict):
        return None
    return entry


def store(problem: dict, device: dict, params: dict, **info) -> Path | None:
    """Write the entry for ``problem`` on ``device``: ``params`` (JSON values) and ``info``
    (times, candidate counts), atomically.  Returns its path, or None (with a warning) when the
    folder cannot be written: tuning still returns its result, it is just not kept."""
    import warnings

    key = entry_key(problem, device)
    path = _path(key)
    entry = {"key": key, "params": params, "stored": time.strftime("%Y-%m-%dT%H:%M:%S"), **info}
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".tmp-", suffix=".json")
        try:
            with os.fdopen(fd, "w", encoding="utf-8") as f:
                json.dump(entry, f, indent=1, sort_keys=True)
            os.replace(tmp, path)
        except BaseException:
            try:
                os.unlink(tmp)
            except OSError:
                pass
            raise
    except OSError as e:
        warnings.warn(f"firesched cannot write tuned parameters in {path.parent} ({e}); set FIRESCHED_CACHE_DIR "
                      f"to a writable folder to keep them", stacklevel=2)
        return None
    return path


def clear() -> int:
    """Remove every tuned entry; returns how many files were removed."""
    n = 0
    for p in tuned_dir().glob("*.json"):
        try:
            p.unlink()
            n += 1
        except OSError:
            pass
    for p in tuned_dir().glob(".tmp-*"):
        try:
            p.unlink()
        except OSError:
            pass
    return n
