"""torch_npu.testing.decorator: ``Dtypes`` / ``Formats`` and ``instantiate_tests``, which expands a test method
into one method per (dtype, format) combination (``test_add_float16_2`` ...)."""

from __future__ import annotations

import inspect
import itertools
from functools import wraps

import torch


def _feed(func, name, **kwargs):
    @wraps(func)
    def wrapper(self):
        return func(self, **kwargs)
    wrapper.__name__ = name
    wrapper.__wrapped__ = func
    return wrapper


def instantiate_tests(arg=None, **kwargs):
    """Class decorator: replace each method marked by ``@Dtypes`` / ``@Formats`` by its combinations; a method
    with a ``device`` parameter gets ``device="npu"``."""
    def wrapper(cls):
        for name, func in list(cls.__dict__.items()):
            data = {}
            if hasattr(func, "dtypes"):
                data["dtype"] = func.dtypes
            if hasattr(func, "formats"):
                data["format"] = func.formats
            if not data:
                continue
            params = inspect.getfullargspec(func).args
            for values in itertools.product(*data.values()):
                new_kwargs = {"device": "npu"} if "device" in params else {}
                test_name = name
                for key, value in zip(data, values):
                    test_name += "_" + (str(value).split(".")[1] if key == "dtype" else str(value))
                    matches = [p for p in params if key in p]
                    if len(matches) > 1:
                        raise RuntimeError(f"Multiple matches for {key}")
                    if matches:
                        new_kwargs[matches[0]] = value
                setattr(cls, test_name, _feed(func, test_name, **new_kwargs))
            delattr(cls, name)
        return cls
    return wrapper(arg) if arg is not None else wrapper


class Dtypes:
    def __init__(self, *args):
        if not args:
            raise RuntimeError("No dtypes given")
        if not all(isinstance(a, torch.dtype) for a in args):
            raise RuntimeError(f"Unknown dtype in {args}")
        self.args = args

    def __call__(self, fn):
        fn.dtypes = self.args
        return fn


class Formats:
    def __init__(self, *args):
        if not args:
            raise RuntimeError("No formats given")
        self.args = args

    def __call__(self, fn):
        fn.formats = self.args
        return fn
