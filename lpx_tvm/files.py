"""The mode of the files the tool writes: what the user's umask allows, as for any file
they make (``tempfile`` makes its files private, 0600 and 0700)."""

import os


def user_mode(mode: int = 0o666) -> int:
    """``mode`` less the process's umask (read without changing it for long)."""
    umask = os.umask(0)
    os.umask(umask)
    return mode & ~umask
