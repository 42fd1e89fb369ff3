"""Files written atomically: a reader, or a run killed midway, never sees half a file; the user's cache folder."""
from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path


def write_atomic(path: Path, text: str | bytes) -> None:
    """Write to a temporary file beside `path`, then rename: readers never see half a file.

    The file gets the mode a plain open() would give it (0666 less the umask), not mkstemp's
    0600, so that colleagues on a shared file system can read a run. An OSError names `path`,
    not the temporary file."""
    path = Path(path)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    except OSError as e:
        raise OSError(e.errno, e.strerror, str(path)) from e
    try:
        os.fchmod(fd, 0o666 & ~current_umask())
        with os.fdopen(fd, "wb" if isinstance(text, bytes) else "w") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException as e:
        os.unlink(tmp)
        if isinstance(e, OSError):
            raise OSError(e.errno, e.strerror, str(path)) from e
        raise


def current_umask() -> int:
    umask = os.umask(0o022)  # the umask can only be read by setting it: put it straight back
    os.umask(umask)
    return umask


def write_json(path: Path, obj) -> None:
    write_atomic(path, json.dumps(obj, indent=1, sort_keys=True) + "\n")


CACHE_ENV = "TMEM_BENCH_CACHE"


def cache_root() -> Path:
    """The user's cache folder (fetched weights, validation records, measured step timings):
    $TMEM_BENCH_CACHE, default ~/.cache/tmem-bench."""
    return Path(os.environ.get(CACHE_ENV) or Path.home() / ".cache" / "tmem-bench")
