"""Bad input from the user, and the checks every part of the suite shares to reject it."""
import errno


class UsageError(ValueError):
    """Bad input from the user: the CLI prints the message on one line and exits 2."""


def check_int(name: str, value, minimum: int = 1) -> int:
    """`value` as an int, or a UsageError naming `name` (a bool, fraction or value below `minimum` is refused)."""
    try:
        integral = not isinstance(value, bool) and float(value).is_integer()
    except (TypeError, ValueError):
        integral = False
    if not integral or int(value) < minimum:
        raise UsageError(f"{name} must be an integer >= {minimum}, got {value!r}")
    return int(value)


def check_float(name: str, value, minimum: float = 0.0, maximum: float = float("inf")) -> float:
    try:
        ok = not isinstance(value, bool) and minimum <= float(value) <= maximum
    except (TypeError, ValueError):
        ok = False
    if not ok:
        raise UsageError(f"{name} must be a number in [{minimum}, {maximum}], got {value!r}")
    return float(value)


# What a full, read-only or forbidden file system raises: the user's to fix, so one line, not a traceback.
STORAGE_HINTS = {
    errno.ENOSPC: "free some space and rerun the same command; finished work is kept",
    errno.EDQUOT: "free some of your quota and rerun the same command; finished work is kept",
    errno.EFBIG: "the file system refuses a file this large",
    errno.EROFS: "give a folder on a writable file system",
    errno.EACCES: "give a folder you may write to",
    errno.EPERM: "give a folder you may write to",
    errno.ENOTDIR: "a part of the path is a file, not a folder",
}


def storage_error(error: OSError) -> str | None:
    """The one line for an OSError of the file system, or None for any other OSError."""
    hint = STORAGE_HINTS.get(error.errno)
    if hint is None:
        return None
    where = f"{error.filename}: " if error.filename else ""
    return f"{where}{error.strerror or errno.errorcode[error.errno]}; {hint}"
