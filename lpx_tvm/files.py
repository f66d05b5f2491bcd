"""The files the tool writes: their mode, and the one policy every writer follows.

:func:`check_outputs` is called by each command before its work starts (a compile or a
plan can take minutes): a destination that would overwrite one of the command's inputs,
a folder where a file is expected, a foreign non-empty folder where an output folder is
expected, a missing parent folder or a name of the wrong kind is refused then, and the
user's files are left as they were.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Callable, Iterable, Optional

from .errors import LPXError


class OutputError(LPXError):
    """A destination the tool refuses to write: it would replace an input or a file or
    folder that is not the tool's, or it is not the kind of path the writer takes."""


def user_mode(mode: int = 0o666) -> int:
    """``mode`` less the process's umask (read without changing it for long)."""
    umask = os.umask(0)
    os.umask(umask)
    return mode & ~umask


@dataclass(frozen=True)
class Output:
    """One destination of a command: the flag that names it and its path.

    ``folder``: the writer fills a folder (made if missing) rather than one file.
    ``suffix``: the file's name must end so (``.png``: the figure's format follows it).
    ``ours``: whether a non-empty existing folder is one this writer made and may write
    into again; ``what`` says what such a folder holds, for the refusal."""

    flag: str
    path: Optional[str]
    folder: bool = False
    suffix: Optional[str] = None
    ours: Optional[Callable[[str], bool]] = None
    what: str = "one this command wrote"


def check_outputs(outputs: Iterable[Output], inputs: Iterable = ()) -> None:
    """Refuse, with one line naming the flag and the path, any destination of ``outputs``
    (those whose path is None are not written) that would lose a file: one of ``inputs``
    (paths the command reads; names that are no file are ignored), a destination given
    twice, a folder where a file is written, a non-empty folder that is not the writer's
    (``Output.ours``), or a file where a folder is written; and a name without its
    ``suffix``, or in a folder that does not exist."""
    outputs = [o for o in outputs if o.path is not None]
    read = [os.fspath(p) for p in inputs if p is not None and os.path.exists(os.fspath(p))]
    seen = {}
    for out in outputs:
        path = os.fspath(out.path)
        where = f"{out.flag} {path}"
        if not path.strip():
            raise OutputError(f"{out.flag}: an empty path")
        key = os.path.realpath(path)
        if key in seen:
            raise OutputError(f"{where}: also the destination of {seen[key]}; give each its own path")
        seen[key] = out.flag
        for src in read:
            if _same(path, src):
                raise OutputError(f"{where}: is the input {src}; refusing to overwrite it: choose another path")
        (_check_folder if out.folder else _check_file)(out, path, where)
        for src in read:  # a folder of the writer's own (an artifact is replaced whole)
            if out.folder and _inside(src, path):
                raise OutputError(f"{where}: holds the input {src}; refusing to write into it: choose another "
                                  "folder")


def _check_file(out: Output, path: str, where: str) -> None:
    if os.path.isdir(path):
        raise OutputError(f"{where}: is a folder; {out.flag} writes a file: give a file's path")
    if os.path.lexists(path) and not os.path.isfile(path):
        raise OutputError(f"{where}: exists and is not a regular file; refusing to replace it")
    if out.suffix and not path.lower().endswith(out.suffix):
        raise OutputError(f"{where}: {out.flag} writes a {out.suffix[1:].upper()} file: give a name ending in "
                          f"{out.suffix}")
    parent = os.path.dirname(os.path.abspath(path))
    if not os.path.isdir(parent):
        raise OutputError(f"{where}: the folder {os.path.dirname(path) or parent} does not exist")
    if not os.access(parent, os.W_OK):
        raise OutputError(f"{where}: cannot write into the folder {os.path.dirname(path) or parent}")


def _check_folder(out: Output, path: str, where: str) -> None:
    if os.path.lexists(path) and (not os.path.isdir(path) or os.path.islink(path)):
        raise OutputError(f"{where}: exists and is not a folder; {out.flag} writes a folder: choose another path")
    if not os.path.isdir(path):
        return  # made by the writer
    entries = os.listdir(path)
    if entries and not (out.ours is not None and out.ours(path)):
        raise OutputError(f"{where}: a folder that is not {out.what} and not empty ({len(entries)} entries); "
                          "refusing to replace it: choose a new or empty folder")


def _same(a: str, b: str) -> bool:
    try:
        return os.path.samefile(a, b)
    except OSError:  # ``a`` does not exist yet
        return os.path.realpath(a) == os.path.realpath(b)


def _inside(path: str, folder: str) -> bool:
    path, folder = os.path.realpath(path), os.path.realpath(folder)
    return path != folder and os.path.commonpath([path, folder]) == folder


def holds_only(files: dict) -> Callable[[str], bool]:
    """An ``Output.ours`` test: the folder holds only files named as the keys of ``files``,
    each beginning with its value (bytes): a folder the writer filled before."""
    def ours(folder: str) -> bool:
        for name in os.listdir(folder):
            head = files.get(name)
            if head is None:
                return False
            try:
                with open(os.path.join(folder, name), "rb") as f:
                    if not f.read(len(head)) == head:
                        return False
            except OSError:
                return False
        return True

    return ours


def manifest_says(fmt: str) -> Callable[[str], bool]:
    """An ``Output.ours`` test: the folder's ``manifest.json`` names the format ``fmt``
    (an artifact folder, which the writer replaces whole)."""
    def ours(folder: str) -> bool:
        import json

        try:
            with open(os.path.join(folder, "manifest.json"), encoding="utf-8") as f:
                return json.load(f).get("format") == fmt
        except (OSError, ValueError, AttributeError):
            return False

    return ours
