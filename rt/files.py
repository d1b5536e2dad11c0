"""Reading small data files (models, rank tables, configs) without trusting the path.

A path handed to npusim may name anything: a FIFO (``open`` would block forever), ``/dev/zero``
(``stat`` says 0 bytes, a read never ends), a directory, a huge file. :func:`read_regular_file`
opens without blocking, accepts only regular files, and never reads more than ``limit`` bytes.
Callers turn :class:`FileRefused` into their own error (``AclError``, ``HcclError``) with the
right code.

Directories npusim creates or reuses in a shared place (``$TMPDIR``) go through :func:`private_dir`: another
local user may have created the name first (a "squatted" directory, or a symbolic link to one of theirs), and
sockets or secrets put inside would then be theirs to rename, replace or read.
"""

from __future__ import annotations

import errno
import os
import stat
import tempfile

from .args import shown
from .constants import AclErrorCode
from .errors import AclError

PRIVATE_MODE = 0o700
# A Unix socket's path must fit 107 bytes. The longest npusim puts under its per-user directory is a card's,
# <root>/ray-<job, 12>/npu<node>_<card>.sock (up to 34 bytes more), so a root past this length moves to /tmp.
USER_ROOT_MAX = 72


def user_root_path() -> str:
    """The per-user npusim directory's path: ``$TMPDIR/npusim-<uid>``, or ``/tmp/npusim-<uid>`` when ``$TMPDIR``
    is so long that card sockets inside it would pass the 108-byte limit of a Unix socket's path."""
    root = os.path.join(tempfile.gettempdir(), f"npusim-{os.getuid()}")
    return root if len(root) <= USER_ROOT_MAX else f"/tmp/npusim-{os.getuid()}"


class FileRefused(Exception):
    """Why a file was not read: ``reason`` is 'type', 'missing', 'not_regular', 'too_large' or 'io'."""

    def __init__(self, reason: str, message: str):
        super().__init__(message)
        self.reason = reason
        self.message = message


def check_path(path, what: str) -> str:
    """``path`` as a str if it is a usable path (str / os.PathLike, no NUL, < 4096 bytes)."""
    if isinstance(path, bool) or not isinstance(path, (str, bytes, os.PathLike)):
        raise FileRefused("type", f"{what}: path {shown(path)} is not a path (expected str or os.PathLike)")
    try:
        text = os.fsdecode(os.fspath(path))
    except (TypeError, UnicodeError) as e:
        raise FileRefused("type", f"{what}: path {shown(path)} is not a valid path: {e}") from None
    if not text or "\0" in text or len(text.encode(errors="surrogateescape")) >= 4096:
        raise FileRefused("type", f"{what}: path {shown(path)} is empty, contains NUL or is 4096 bytes or longer")
    return text


def read_regular_file(path, limit: int, what: str, private: bool = False) -> bytes:
    """The bytes of regular file ``path`` (at most ``limit``); FileRefused naming the path otherwise.
    ``private``: a secret — refused ('unsafe') if it is a symbolic link, not ours, or readable by others."""
    text = check_path(path, what)
    flags = os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC | (os.O_NOFOLLOW if private else 0)
    try:
        fd = os.open(text, flags)                   # a FIFO opens at once, unread
    except FileNotFoundError:
        raise FileRefused("missing", f"{what}: {text!r} does not exist") from None
    except OSError as e:
        if private and e.errno == errno.ELOOP:
            raise FileRefused("unsafe", f"{what}: {text!r} is a symbolic link; expected a regular file") from None
        raise FileRefused("io", f"{what}: cannot open {text!r}: {e.strerror or e}") from None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            kind = _kind(st.st_mode)
            raise FileRefused("not_regular", f"{what}: {text!r} is {kind}, not a regular file")
        if private and (st.st_uid != os.geteuid() or st.st_mode & 0o077):
            raise FileRefused("unsafe", f"{what}: {text!r} is {_owner_mode(st)}; expected a file owned by "
                                        f"uid {os.geteuid()} that only its owner can read (mode 0600)")
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


def write_private_file(path: str, data: bytes) -> bool:
    """Create ``path`` holding ``data``, readable by its owner only (0600), whole or not at all (written
    beside it, then linked into place: a reader never sees it half written). False if ``path`` exists already
    (a symbolic link there counts: ``link`` never follows one); OSError for any other failure."""
    tmp = f"{path}.{os.getpid()}.{os.urandom(4).hex()}.tmp"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    try:
        try:
            os.write(fd, data)
        finally:
            os.close(fd)
        os.link(tmp, path)
        return True
    except FileExistsError:
        return False
    finally:
        os.unlink(tmp)


def private_dir(path: str, what: str, hint: str = "", create: bool = True) -> str:
    """``path`` as a directory only this user can use: created 0700 (with missing parents) if absent; if it
    exists it must be a real directory (not a symbolic link) owned by us and writable by no one else — one
    that is only readable by others is narrowed to 0700. FileRefused('unsafe', naming the directory, its
    owner and mode, what is expected and ``hint``: what to do) otherwise; ('missing') if absent and not
    ``create``; ('io') if it cannot be created."""
    if create:
        try:
            os.makedirs(os.path.dirname(path) or ".", mode=PRIVATE_MODE, exist_ok=True)
            os.mkdir(path, PRIVATE_MODE)
        except FileExistsError:
            pass
        except OSError as e:
            raise FileRefused("io", f"{what}: cannot create the directory {path}: {e.strerror or e}") from None
    try:                                        # O_NOFOLLOW: what we check is what we use, never a link's target
        fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except FileNotFoundError:
        raise FileRefused("missing", f"{what}: the directory {path} does not exist") from None
    except OSError as e:
        if e.errno in (errno.ELOOP, errno.ENOTDIR):
            try:
                st = os.lstat(path)
            except OSError:
                raise FileRefused("io", f"{what}: cannot open the directory {path}: {e.strerror or e}") from None
            kind = ("a symbolic link" if stat.S_ISLNK(st.st_mode) else
                    "a regular file" if stat.S_ISREG(st.st_mode) else _kind(st.st_mode))
            raise FileRefused("unsafe", f"{what}: {path} is {kind} ({_owner_mode(st)}); expected a directory "
                                        f"owned by uid {os.geteuid()} with mode 0700{hint}") from None
        raise FileRefused("io", f"{what}: cannot open the directory {path}: {e.strerror or e}") from None
    try:
        st = os.fstat(fd)
        if st.st_uid != os.geteuid() or st.st_mode & 0o022:
            raise FileRefused("unsafe", f"{what}: the directory {path} is {_owner_mode(st)}; expected one owned "
                                        f"by uid {os.geteuid()} with mode 0700 (writable by no one else){hint}")
        if stat.S_IMODE(st.st_mode) != PRIVATE_MODE:
            os.fchmod(fd, PRIVATE_MODE)         # ours, merely readable by others: keep its names to ourselves
    finally:
        os.close(fd)
    return path


def _owner_mode(st: os.stat_result) -> str:
    """'owned by uid 65534 (nobody) with mode 0777'."""
    try:
        import pwd
        name = f" ({pwd.getpwuid(st.st_uid).pw_name})"
    except (ImportError, KeyError):
        name = ""
    return f"owned by uid {st.st_uid}{name} with mode {stat.S_IMODE(st.st_mode):04o}"


def setup_dir(path: str, what: str, hint: str = "", create: bool = True) -> str:
    """:func:`private_dir` with its refusal as AclError 507033 (ACL_ERROR_RT_DEV_SETUP_ERROR): cards cannot be set
    up, or reached, in a directory that is not ours alone."""
    try:
        return private_dir(path, what, hint, create=create)
    except FileRefused as e:
        raise AclError(AclErrorCode.ACL_ERROR_RT_DEV_SETUP_ERROR, e.message) from None
