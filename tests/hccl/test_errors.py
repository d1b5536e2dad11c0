"""HCCL's error table (hccl/errors.py) and the codes a fail fault may give (hccl/diag.py): HcclResult's, all of
them (moved here from tests/rt/test_faults.py with the table)."""

import hccl.diag  # noqa: F401  registers the codes
from hccl.errors import RESULT_TEXTS
from hccl.types import HcclResult
from rt.diag import faultspec


def test_the_hccl_code_table_matches_hccl_types():
    failures = {m.name: int(m) for m in HcclResult if m is not HcclResult.HCCL_SUCCESS}
    assert set(RESULT_TEXTS) == set(failures)
    assert faultspec.CODES.by_name == failures
