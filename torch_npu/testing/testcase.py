"""torch_npu.testing.testcase: ``TestCase`` with torch_npu's assertions, and ``run_tests``.

A torch_npu-style test file — ``class TestX(TestCase)`` with ``test_*`` methods and ``run_tests()`` under
``if __name__ == "__main__"`` — runs as ``python file.py`` (unittest) and under ``python -m pytest`` (which
collects unittest classes). ``setUpClass`` binds the process to ``npu:$SET_NPU_DEVICE`` (default ``npu:0``);
``setUp`` seeds torch and ``random`` with ``$SEED`` (default 666), as torch_npu's does.
"""

from __future__ import annotations

import os
import random
import sys
import time
import unittest
import warnings
from collections import OrderedDict
from collections.abc import Sequence
from contextlib import contextmanager
from numbers import Number
from unittest.result import TestResult
from unittest.util import strclass

import numpy as np
import torch

from .common_utils import PERF_TEST_ENABLE, PerfBaseline, is_iterable, iter_indices, set_npu_device


def run_tests(argv=None):
    """Run the calling file's tests with unittest (``-v``, ``-k`` and test names as unittest takes them)."""
    unittest.main(argv=sys.argv if argv is None else argv)


def _rtol_compare(case, x, y, prec, minimum, message):
    """torch_npu's rule: fail only if more than ``size * prec`` elements miss both the relative and the
    absolute tolerance ``prec``."""
    nan_mask = np.isnan(x)
    if not np.equal(nan_mask, np.isnan(y)).all():
        case.fail(message)
    diff = (y - x).astype(np.float64) if x.dtype != np.bool_ else (y != x)
    if nan_mask.any():
        diff[nan_mask] = 0
    err = np.abs(diff)
    deno = np.maximum(np.abs(x), np.abs(y)).astype(np.float64)
    atol_ok = np.less_equal(err, prec)
    rtol_ok = np.less_equal(err / (deno + minimum), prec)
    if (not rtol_ok.all() and not atol_ok.all() and np.sum(~rtol_ok) > x.size * prec
            and np.sum(~atol_ok) > x.size * prec):
        case.fail(message or "result error")


class TestCase(unittest.TestCase):
    _precision = 1e-5
    maxDiff = None
    exact_dtype = False

    @property
    def precision(self):
        return self._precision

    @precision.setter
    def precision(self, prec):
        self._precision = prec

    @classmethod
    def setUpClass(cls):
        cls.npu_device = set_npu_device()

    def setUp(self):
        seed = int(os.getenv("SEED", "666"))
        torch.manual_seed(seed)
        random.seed(seed)

    # ---------------------------------------------------------------- torch_npu's comparisons
    def assertRtolEqual(self, x, y, prec=1.e-4, prec16=1.e-3, auto_trans_dtype=False, message=None):
        """Element-wise closeness with torch_npu's tolerance rule (``prec16`` for float16 and bfloat16)."""
        if isinstance(x, Sequence) and isinstance(y, Sequence) and not isinstance(x, str):
            for x_, y_ in zip(x, y):
                self.assertRtolEqual(x_, y_, prec, prec16, auto_trans_dtype, message)
            return
        if isinstance(x, torch.Tensor) and isinstance(y, Sequence):
            y = torch.as_tensor(y, dtype=x.dtype)
        elif isinstance(x, Sequence) and isinstance(y, torch.Tensor):
            x = torch.as_tensor(x, dtype=y.dtype)
        if torch.is_tensor(x) and torch.is_tensor(y):
            if auto_trans_dtype:
                x = x.to(y.dtype)
            if x.dtype == torch.bfloat16 and y.dtype == torch.bfloat16:
                if x.shape != y.shape:
                    self.fail("shape error!")
                if not torch.allclose(x.detach().cpu(), y.detach().cpu(), rtol=prec16, atol=prec16):
                    self.fail("result error!")
                return
            x = x.detach().cpu().numpy()
            y = y.detach().cpu().numpy()
        elif isinstance(x, Number) and isinstance(y, Number):
            x, y = np.array(x), np.array(y)
        if x.shape != y.shape:
            self.fail("shape error")
        if x.dtype != y.dtype:
            self.fail("dtype error")
        if x.dtype == np.bool_:
            if not np.equal(x, y).all():
                self.fail("result error")
        elif x.dtype == np.float16:
            _rtol_compare(self, x, y, prec16, 6e-8, message)
        elif x.dtype in (np.float32, np.float64, np.int8, np.uint8, np.uint16, np.int16, np.int32, np.int64):
            _rtol_compare(self, x, y, prec, 10e-10, message)
        else:
            self.fail("required dtype in [np.bool_, np.uint16, np.int16, np.int32, np.float16, np.float32, "
                      "np.int8, np.uint8, np.int64]")

    def assertTensorsSlowEqual(self, x, y, prec=None, message=""):
        self.assertEqual(x.size(), y.size())
        self.assertEqual(x.dtype, y.dtype)
        y = y.type_as(x)
        if x.dtype == torch.bool:
            self.assertEqual(x, y)
            return
        max_err = max((abs(float(x[i]) - float(y[i])) for i in iter_indices(x)), default=0)
        self.assertLessEqual(max_err, self.precision if prec is None else prec, message)

    def _tensors_equal(self, a, b, prec, message, allow_inf, exact_dtype):
        super().assertEqual(a.size(), b.size(), message)
        if exact_dtype:
            super().assertEqual(a.dtype, b.dtype, message)
        if a.numel() == 0:
            return
        a = a.detach().cpu()
        b = b.detach().cpu()
        if a.dtype in (torch.float16, torch.bfloat16):
            a = a.float()
        b = b.to(a.dtype)
        if not (a.dtype.is_floating_point or a.dtype.is_complex):
            a, b = a.long(), b.long()                      # bool and unsigned: subtract without wrapping
        diff = a - b
        if a.dtype.is_floating_point or a.dtype.is_complex:
            nan_mask = torch.isnan(a)
            self.assertTrue(torch.equal(nan_mask, torch.isnan(b)), message)
            diff[nan_mask] = 0
            if allow_inf:
                inf_mask = torch.isinf(a)
                self.assertTrue(torch.equal(inf_mask.sign(), torch.isinf(b).sign()), message)
                diff[inf_mask] = 0
        diff = diff.abs()
        self.assertLessEqual(float(diff.max()), prec, message)

    def assertEqual(self, x, y, prec=None, message="", allow_inf=False, exact_dtype=None):
        """torch_npu's assertEqual: tensors, numbers and containers of them equal within ``prec``."""
        exact_dtype = self.exact_dtype if exact_dtype is None else exact_dtype
        if isinstance(prec, str) and message == "":
            message, prec = prec, None
        prec = self.precision if prec is None else prec
        if isinstance(x, torch.Tensor) and isinstance(y, Number):
            x = x.item()
        elif isinstance(y, torch.Tensor) and isinstance(x, Number):
            y = y.item()
        if isinstance(x, torch.Tensor) and isinstance(y, torch.Tensor):
            self._tensors_equal(x, y, prec, message, allow_inf, exact_dtype)
        elif isinstance(x, (bool, np.bool_)) or isinstance(y, (bool, np.bool_)):
            super().assertEqual(x, y, message)
        elif isinstance(x, Number) and isinstance(y, Number):
            if abs(x) == float("inf") or abs(y) == float("inf"):
                if allow_inf:
                    super().assertEqual(x, y, message)
                else:
                    self.fail(f"Expected finite numeric values - x={x}, y={y}")
                return
            super().assertLessEqual(abs(x - y), prec, message)
        elif isinstance(x, (str, bytes)) and isinstance(y, (str, bytes)) or isinstance(x, set) and isinstance(y, set):
            super().assertEqual(x, y, message)
        elif isinstance(x, dict) and isinstance(y, dict):
            if isinstance(x, OrderedDict) and isinstance(y, OrderedDict):
                self.assertEqual(list(x.items()), list(y.items()), prec, message, allow_inf, exact_dtype)
            else:
                self.assertEqual(set(x.keys()), set(y.keys()), prec, message, allow_inf, exact_dtype)
                keys = list(x.keys())
                self.assertEqual([x[k] for k in keys], [y[k] for k in keys], prec, message, allow_inf, exact_dtype)
        elif is_iterable(x) and is_iterable(y) and not isinstance(x, np.ndarray):
            super().assertEqual(len(x), len(y), message)
            for x_, y_ in zip(x, y):
                self.assertEqual(x_, y_, prec, message, allow_inf, exact_dtype)
        elif isinstance(x, np.ndarray) or isinstance(y, np.ndarray):
            self.assertEqual(torch.as_tensor(np.asarray(x)), torch.as_tensor(np.asarray(y)), prec, message,
                             allow_inf, exact_dtype)
        else:
            super().assertEqual(x, y, message)

    def assertAlmostEqual(self, x, y, places=None, msg=None, delta=None, allow_inf=None):
        prec = 10 ** (-places) if places else delta
        self.assertEqual(x, y, prec, msg or "", bool(allow_inf))

    def assertNotEqual(self, x, y, prec=None, message=""):
        if isinstance(prec, str) and message == "":
            message, prec = prec, None
        prec = self.precision if prec is None else prec
        if isinstance(x, torch.Tensor) and isinstance(y, torch.Tensor):
            if x.size() != y.size():
                return
            self.assertGreater(x.numel(), 0)
            a, b = x.detach().cpu(), y.detach().cpu().type_as(x.detach().cpu())
            if a.dtype == torch.bool:
                a, b = a.int(), b.int()
            diff = (a.double() - b.double()).abs()
            diff[torch.isnan(a)] = 0
            self.assertGreaterEqual(float(diff.max()), prec, message)
        elif isinstance(x, Number) and isinstance(y, Number):
            self.assertGreaterEqual(abs(x - y), prec, message)
        else:
            super().assertNotEqual(x, y, message)

    def assertObjectIn(self, obj, iterable):
        if not any(id(obj) == id(elem) for elem in iterable):
            raise AssertionError("object not found in iterable")

    def assertNotWarn(self, call_fn, msg=""):
        with warnings.catch_warnings(record=True) as ws:
            warnings.simplefilter("always")
            call_fn()
            self.assertTrue(len(ws) == 0, msg)

    def assertWarns(self, call_fn, msg=""):
        """torch_npu's form: ``call_fn`` (a callable) raises at least one warning."""
        if isinstance(call_fn, type) and issubclass(call_fn, Warning):      # unittest's form, for other callers
            return super().assertWarns(call_fn, msg) if msg else super().assertWarns(call_fn)
        with warnings.catch_warnings(record=True) as ws:
            warnings.simplefilter("always")
            call_fn()
            self.assertTrue(len(ws) > 0, msg)
        return None

    @contextmanager
    def maybeWarnsRegex(self, category, regex=""):
        """The body may raise warnings of ``category`` matching ``regex``; any other warning fails the test."""
        with warnings.catch_warnings(record=True) as ws:
            warnings.simplefilter("always")
            warnings.filterwarnings("ignore", message=regex, category=category)
            yield
        if ws:
            self.fail("Caught unexpected warnings:\n" + "\n".join(
                warnings.formatwarning(w.message, w.category, w.filename, w.lineno, w.line) for w in ws))

    def run(self, result=None):
        outcome = super().run(result)
        if PERF_TEST_ENABLE:
            perf = TestResult()
            start = time.perf_counter()
            super().run(perf)
            runtime = time.perf_counter() - start
            if not perf.errors and not perf.failures:
                method = strclass(self.__class__) + "." + self._testMethodName
                baseline = PerfBaseline.get_baseline(method)
                if baseline and runtime > baseline * 1.2 and result is not None:
                    err = self.failureException(f"Performance test failed. Performance baseline: {baseline}s, "
                                                f"current time: {runtime}s")
                    result.addFailure(self, (self.failureException, err, None))
                if baseline is None or runtime < baseline * 0.9:
                    PerfBaseline.set_baseline(method, runtime)
        return outcome
