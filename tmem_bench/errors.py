"""Bad input from the user, and the checks every part of the suite shares to reject it."""
import argparse
import errno


class UsageError(ValueError):
    """Bad input from the user: the CLI prints the message on one line and exits `exit_code`."""

    exit_code = 2


class MissingExtra(UsageError):
    """Something (a leaderboard entry) names a task of an optional extra that is not installed: not a
    fault of the thing itself, so the CLI exits with a code of its own, neither 1 (rejected) nor 2."""

    exit_code = 3

    def __init__(self, extra: str, where: str = ""):
        self.extra = extra
        super().__init__(f"{where}cannot be checked without the {extra} extra: pip install -e '.[{extra}]'")


# check_int's default upper bound: larger counts overflow numpy's and torch's int32 arguments with a
# traceback, and no count of the suite comes near it; callers that allocate per unit give a smaller one.
INT_MAX = 2**31 - 1


def check_int(name: str, value, minimum: int = 1, maximum: int | None = None) -> int:
    """`value` as an int, or a UsageError naming `name`: a bool, a fraction, a value out of
    [minimum, maximum] (default INT_MAX) or text that is no number is refused, in one line. Text is
    read as a number: "12", "1e3" and "2.0" are the integers they write."""
    limit = INT_MAX if maximum is None else maximum
    number = None
    if isinstance(value, str):
        try:
            number = int(value.strip())
        except ValueError:
            try:
                number = float(value)
            except ValueError:
                pass
    elif not isinstance(value, bool):
        number = value
    try:
        integral = number is not None and float(number).is_integer()
    except (TypeError, ValueError, OverflowError):  # OverflowError: an int too large for a float
        integral = isinstance(number, int) and not isinstance(number, bool)
    if not integral or not minimum <= number <= limit:
        allowed = f">= {minimum}" if maximum is None and (not integral or number < minimum) else \
            f"from {minimum} to {limit}"
        shown = repr(value) if len(repr(value)) <= 40 else f"{repr(value)[:37]}..."
        raise UsageError(f"{name} must be an integer {allowed}, got {shown}")
    return int(number)


def positive(text: str) -> int:
    """An argparse type: a positive integer (argparse names the flag in its one-line error)."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not an integer") from None
    if value <= 0:
        raise argparse.ArgumentTypeError(f"must be positive, got {value}")
    return value


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
