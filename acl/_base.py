"""``acl``'s root functions: init / finalize, the SoC name, versions, error text, dtype helpers."""

from __future__ import annotations

import json

import numpy as np

import rt

from rt import args
from rt.config import load_config
from rt.constants import AclErrorCode as E
from rt.dtypes import data_type_size as _data_type_size
from rt.errors import AclError
from rt.files import FileRefused, read_regular_file
from rt.host.runtime import RUNTIME
from ._core import code, plain, values

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
