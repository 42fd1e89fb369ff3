"""Bad input from the user, and the checks every part of the suite shares to reject it."""


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
