class UsageError(ValueError):
    """Bad input from the user: the CLI prints the message on one line and exits 2."""
