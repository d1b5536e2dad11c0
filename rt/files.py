"""Reading small data files (models, rank tables, configs) without trusting the path.

A path handed to npusim may name anything: a FIFO (``open`` would block forever), ``/dev/zero``
(``stat`` says 0 bytes, a read never ends), a directory, a huge file. :func:`read_regular_file`
opens without blocking, accepts only regular files, and never reads more than ``limit`` bytes.
Callers turn :class:`FileRefused` into their own error (``AclError``, ``HcclError``) with the
right code.
"""

from __future__ import annotations

import os
import stat


class FileRefused(Exception):
    """Why a file was not read: ``reason`` is 'type', 'missing', 'not_regular', 'too_large' or 'io'."""

    def __init__(self, reason: str, message: str):
        super().__init__(message)
        self.reason = reason
        self.message = message


def check_path(path, what: str) -> str:
    """``path`` as a str if it is a usable path (str / os.PathLike, no NUL, < 4096 bytes)."""
    if isinstance(path, bool) or not isinstance(path, (str, bytes, os.PathLike)):
        raise FileRefused("type", f"{what}: path {path!r} is not a path (expected str or os.PathLike)")
    try:
        text = os.fsdecode(os.fspath(path))
    except (TypeError, UnicodeError) as e:
        raise FileRefused("type", f"{what}: path {path!r} is not a valid path: {e}") from None
    if not text or "\0" in text or len(text.encode(errors="surrogateescape")) >= 4096:
        raise FileRefused("type", f"{what}: path {path!r} is empty, contains NUL or is 4096 bytes or longer")
    return text


def read_regular_file(path, limit: int, what: str) -> bytes:
    """The bytes of regular file ``path`` (at most ``limit``); FileRefused naming the path otherwise."""
    text = check_path(path, what)
    try:
        fd = os.open(text, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)   # a FIFO opens at once, unread
    except FileNotFoundError:
        raise FileRefused("missing", f"{what}: {text!r} does not exist") from None
    except OSError as e:
        raise FileRefused("io", f"{what}: cannot open {text!r}: {e.strerror or e}") from None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            kind = _kind(st.st_mode)
            raise FileRefused("not_regular", f"{what}: {text!r} is {kind}, not a regular file")
        if st.st_size > limit:
            raise FileRefused("too_large", f"{what}: {text!r} is {st.st_size} bytes, larger than the "
                                           f"{limit}-byte limit")
        os.set_blocking(fd, True)
        chunks, left = [], limit + 1
        while left > 0:
            chunk = os.read(fd, min(left, 1 << 24))
            if not chunk:
                break
            chunks.append(chunk)
            left -= len(chunk)
        data = b"".join(chunks)
        if len(data) > limit:                       # it grew while we read
            raise FileRefused("too_large", f"{what}: {text!r} holds more than the {limit}-byte limit")
        return data
    except OSError as e:
        raise FileRefused("io", f"{what}: cannot read {text!r}: {e.strerror or e}") from None
    finally:
        os.close(fd)


def _kind(mode: int) -> str:
    for test, name in ((stat.S_ISDIR, "a directory"), (stat.S_ISFIFO, "a FIFO"), (stat.S_ISCHR, "a character device"),
                       (stat.S_ISBLK, "a block device"), (stat.S_ISSOCK, "a socket")):
        if test(mode):
            return name
    return "not a regular file"
