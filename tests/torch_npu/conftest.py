"""The torch_npu tests share pytest worker processes with the rest of the suite: a test whose ``torch.npu`` call
started the runtime (``torch_npu/_runtime.py`` starts it on first need, as torch_npu initializes a device)
finalizes it again, so the next test finds the process as it was."""

import pytest


@pytest.fixture(autouse=True)
def _runtime_left_as_found():
    import rt
    was = rt.is_initialized()
    yield
    if not was and rt.is_initialized():
        rt.finalize()
