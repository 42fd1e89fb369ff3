"""The board's folder: one writer at a time, and nothing a killed writer left behind.

    entries/<slug>/           a published entry (entry.json, cells/)
    entries/.submit-*/        a submit being written: every entry of it in its own <slug>/, then
                              journal.json, the commit point, then each renamed into entries/
    .README.md.*.tmp,         a build's pages being written (the atomic writer's temporaries)
    .index.html.*.tmp

`submit` and `build` hold the folder's lock while they write. Whoever takes it next tidies: a
submit killed after its journal is finished (its entries renamed into place), one killed before
is removed with a killed build's temporaries, so after any kill the board is as it was or as
the killed command would have left it. The lock is an advisory `flock` on the folder itself
(no lock file to commit), which the kernel drops when its holder dies however it dies.
"""
from __future__ import annotations

import contextlib
import fcntl
import json
import os
import shutil
from pathlib import Path

from ..errors import UsageError

STAGING_PREFIX = ".submit-"
JOURNAL = "journal.json"
PAGES = ("README.md", "index.html")


@contextlib.contextmanager
def held(board, say=print):
    """Hold the board folder's lock (tidied first) for the duration of the block; a second holder is refused.
    Not filelock: it locks a lock file, which would sit in the board and, deleted while held, let a second writer in."""
    board = Path(board)
    if not board.is_dir():
        raise UsageError(f"{str(board)!r} is not a leaderboard folder (it does not exist or is not a folder)")
    fd = os.open(board, os.O_RDONLY | os.O_DIRECTORY)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise UsageError(f"the leaderboard folder {str(board)!r} is in use by another `tmem-bench leaderboard "
                             f"submit` or `build`; wait for it to finish, then rerun") from None
        tidy(board, say)
        yield board
    finally:
        os.close(fd)  # closing releases the flock


def tidy(board: Path, say=print) -> None:
    """Finish a killed submit that had staged all its entries, remove one that had not, and remove
    a killed build's temporaries; only under the lock, where no other writer is midway."""
    entries = board / "entries"
    for staging in sorted(entries.glob(f"{STAGING_PREFIX}*")) if entries.is_dir() else []:
        slugs = journal(staging)
        if slugs is None:
            say(f"removing {staging.name}, left by a submit that was interrupted before its entries were written")
            shutil.rmtree(staging)
        else:
            say(f"finishing a submit that was interrupted while placing its entries: {', '.join(slugs)}")
            place(staging, slugs)
    for name in PAGES:
        for tmp in board.glob(f".{name}.*.tmp"):
            tmp.unlink()


def journal(staging: Path) -> list[str] | None:
    """The slugs a staging folder's journal lists (all of them written), or None without a readable one."""
    try:
        slugs = json.loads((staging / JOURNAL).read_text())["entries"]
    except (OSError, UnicodeDecodeError, json.JSONDecodeError, KeyError, TypeError):
        return None
    if not isinstance(slugs, list) or not all(isinstance(s, str) and s == Path(s).name and s not in ("", ".", "..")
                                              and not s.startswith(".") for s in slugs):
        return None
    return slugs


def place(staging: Path, slugs: list[str]) -> None:
    """Rename each staged entry into entries/ (those renamed before a kill are there already), then
    remove the staging folder."""
    entries = staging.parent
    for slug in slugs:
        if not (staging / slug).exists():
            continue
        if os.path.lexists(entries / slug):
            raise UsageError(f"{staging} holds a finished submit of {slug!r}, but entries/{slug} exists already; "
                             f"remove one of the two, then rerun")
        os.rename(staging / slug, entries / slug)
    shutil.rmtree(staging)


def write_pages(folder: Path, texts: dict[str, str]) -> list[Path]:
    """Write every page aside first, then rename each into place: a kill or a full disk while they
    are written leaves the previous pages whole."""
    if folder.exists() and not folder.is_dir():
        raise UsageError(f"{folder} is a file, not a folder; give a folder for the board's pages")
    for name in texts:
        if (folder / name).is_dir():
            raise UsageError(f"{folder / name} is in the way: a folder where the board's {name} goes; "
                             f"remove it or give another folder")
    folder.mkdir(parents=True, exist_ok=True)
    staged = []
    try:
        for name, text in texts.items():
            path = folder / name
            tmp = folder / f".{name}.{os.getpid()}.tmp"
            staged.append(tmp)
            try:
                with open(tmp, "w") as f:  # open's mode, 0666 less the umask, as every file of the suite
                    f.write(text)
                    f.flush()
                    os.fsync(f.fileno())
            except OSError as e:
                raise OSError(e.errno, e.strerror, str(path)) from e
        for tmp, name in zip(staged, texts):
            os.replace(tmp, folder / name)
    finally:
        for tmp in staged:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(tmp)
    return [folder / name for name in texts]

