"""Commands that are processes of their own, each a client of what runs elsewhere: ``npu-smi`` (``smi.py``, the
table in ``smi_table.py``) asks the cards of every running session; ``hccl-test`` (``hccl_test.py``) runs the job
loop of ``launch`` in its own process with ``hccl/perf.py`` as the rank body."""
