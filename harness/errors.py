"""The one exception type a user ever sees as a message instead of a traceback."""


class UserError(Exception):
    """Bad input from the user: the CLI prints it as one line and exits 2.

    The message says what is wrong, where, and what to do next.
    """
