"""npusim's ``torch_npu.testing``: the helpers torch_npu's own test files import, so they run unchanged.

- ``testcase``: ``TestCase`` (unittest, with torch_npu's ``assertRtolEqual`` and tolerance-taking
  ``assertEqual``) and ``run_tests()``; such a file runs under ``python file.py`` and ``python -m pytest``;
- ``common_utils``: ``create_common_tensor``, ``create_dtype_tensor``, ``SupportedDevices``, ...;
- ``common_distributed``: ``skipIfUnsupportMultiNPU(n)`` (skips only if fewer than ``n`` cards are visible —
  a default config has 8 simulated cards, so multi-NPU tests run), ``with_comms``, ``init_pg``, ``TEST_SKIPS``;
- ``decorator``: ``Dtypes``, ``Formats``, ``instantiate_tests``.

Importing it does not patch torch's own OpInfo test machinery as torch_npu's does (npusim runs no OpInfo
suites).
"""
