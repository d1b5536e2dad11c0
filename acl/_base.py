"""``acl``'s root functions: init / finalize, the SoC name, versions, error text, dtype helpers."""

from __future__ import annotations

import json

import numpy as np

import rt
from rt import args
from rt.config import load_config
from rt.constants import AclErrorCode as E
from rt.diag import slog
from rt.dtypes import data_type_size as _data_type_size
from rt.errors import AclError
from rt.files import FileRefused, read_regular_file
from rt.host.runtime import RUNTIME

from ._core import code, plain, values

# aclLogLevel (acl_base.h), the levels app_log takes: slog's own numbering
ACL_DEBUG, ACL_INFO, ACL_WARNING, ACL_ERROR = slog.DEBUG, slog.INFO, slog.WARNING, slog.ERROR
APP_LOG_BYTES = 1024          # CANN: one app log line at most 1024 bytes, longer ones truncated
VERSION = (1, 17, 0)          # the ACL version whose API this facade follows (acl_rt.h 1.17.0)
MAX_ACL_JSON = 1 << 20


@code("init")
def init(config_path=None):
    """Start the runtime. ``config_path`` is CANN's acl.json (dump, profiling and log settings, none of which
    apply to a simulated card): it must be readable JSON, its contents are ignored. The simulated hardware
    comes from NPUSIM_CONFIG, as for ``rt.init()``. A second init returns ACL_ERROR_REPEAT_INITIALIZE."""
    if config_path not in (None, ""):
        try:
            json.loads(read_regular_file(config_path, MAX_ACL_JSON, "init").decode())
        except FileRefused as e:
            raise AclError(E.ACL_ERROR_INVALID_FILE, e.message) from None
        # ValueError: bad UTF-8 or JSON, or an integer past Python's digit limit; RecursionError: a hostile
        # nesting depth. Both mean a config file CANN cannot parse, not an npusim failure.
        except (ValueError, RecursionError) as e:
            raise AclError(E.ACL_ERROR_PARSE_FILE, f"init: {args.shown(config_path)} is not valid JSON: "
                                                   f"{type(e).__name__}: {str(e)[:200]}") from None
    rt.init()


@code("finalize")
def finalize():
    rt.finalize()


@plain("get_soc_name", None)
def get_soc_name():
    """The simulated SoC (from the config; also before ``init``, as Ray's NPU detection asks)."""
    return RUNTIME.cfg.soc_name if RUNTIME.initialized else load_config(None).soc_name


@values("get_version", 0, 0, 0)
def get_version():
    return VERSION


def get_recent_err_msg():
    """This thread's error text since the last call (newest first), or None."""
    return rt.get_recent_err_msg()


@plain("data_type_size", 0)
def data_type_size(data_type):
    return _data_type_size(data_type)


@plain("float16_to_float", 0.0)
def float16_to_float(value):
    if not args.is_int(value) or not 0 <= value < 1 << 16:
        raise AclError(E.ACL_ERROR_INVALID_PARAM, f"float16_to_float: {args.shown(value)} is not a 16-bit pattern")
    return float(np.array([value], np.uint16).view(np.float16)[0])


@plain("float_to_float16", 0)
def float_to_float16(value):
    if isinstance(value, bool) or not isinstance(value, (int, float, np.integer, np.floating)):
        raise AclError(E.ACL_ERROR_INVALID_PARAM, f"float_to_float16: {args.shown(value)} is not a number")
    with np.errstate(over="ignore"):                       # out of range is inf, as a cast in C gives
        return int(np.array([value], np.float16).view(np.uint16)[0])


def app_log(log_level, message):
    """``acl.app_log(log_level, message)``: one line of the program's own into the host log (slog/plog,
    module ``APP``) at the program's call site, as ``ACL_APP_LOG`` writes it; nothing is returned, as in pyACL.
    The level filter is CANN's (``ASCEND_GLOBAL_LOG_LEVEL`` / ``ASCEND_MODULE_LOG_LEVEL=APP=...``). A level
    outside 0..3 or a message that is not a str returns 100000 (pyACL's binding would not parse them)."""
    if not args.is_int(log_level) or not ACL_DEBUG <= log_level <= ACL_ERROR or not isinstance(message, str):
        from ._core import report
        return report("app_log", AclError(E.ACL_ERROR_INVALID_PARAM, f"app_log: log_level {args.shown(log_level)} "
                                          f"must be 0 (ACL_DEBUG) .. 3 (ACL_ERROR) and message a str, got "
                                          f"{args.shown(message)}"))
    data = message.encode("utf-8", "backslashreplace")
    if len(data) > APP_LOG_BYTES:
        message = data[:APP_LOG_BYTES].decode("utf-8", "ignore")
    slog.log(int(log_level), "APP", "%s", message, user_site=True)
    return None
