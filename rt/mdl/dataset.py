"""Data buffers and datasets: small host objects describing device buffers (aclDataBuffer, aclmdlDataset)."""

from __future__ import annotations

from .. import args
from ..addresses import decode_addr
from ..constants import AclErrorCode
from ..errors import AclError
from ..host.procmaps import unmapped
from .desc import _is_index

INVALID = AclErrorCode.ACL_ERROR_INVALID_PARAM


class DataBuffer:
    """A device buffer (address + size in bytes), as aclDataBuffer; destroying it frees nothing."""

    def __init__(self, ptr: int, size: int):
        self.ptr, self.size, self.destroyed = ptr, size, False

    def __repr__(self) -> str:
        return f"DataBuffer(ptr={self.ptr:#x}, size={self.size}{', destroyed' if self.destroyed else ''})"


class Dataset:
    """An ordered list of DataBuffers plus the dynamic batch / dims chosen for an execution."""

    def __init__(self):
        self.buffers: list[DataBuffer] = []
        self.batch: int | None = None
        self.dims: dict[int, list[int]] = {}
        self.destroyed = False

    def __repr__(self) -> str:
        return f"Dataset({len(self.buffers)} buffers{', destroyed' if self.destroyed else ''})"


def _check_buffer(buf, what: str) -> DataBuffer:
    if not isinstance(buf, DataBuffer) or buf.destroyed:
        raise AclError(INVALID, f"{what}: {args.shown(buf)} is not a live data buffer (create_data_buffer)")
    return buf


def _check_dataset(ds, what: str) -> Dataset:
    if not isinstance(ds, Dataset) or ds.destroyed:
        raise AclError(INVALID, f"{what}: {args.shown(ds)} is not a live dataset (create_dataset)")
    return ds


def _check_ptr_size(ptr, size, what: str) -> None:
    """A device address (or 0, the empty buffer) and a size that fits CANN's size_t / int64 fields."""
    for name, v in (("ptr", ptr), ("size", size)):
        if not isinstance(v, int) or isinstance(v, bool) or not 0 <= v <= args.INT64_MAX:
            raise AclError(INVALID, f"{what}: {name}={args.shown(v)}, expected an int in [0, {args.INT64_MAX}]")
    if ptr and decode_addr(ptr) is None and unmapped(ptr, 1, write=False) is None:
        # memory of this process: a model reads and writes device memory only (an address that is neither
        # fails at execute, as on CANN)
        raise AclError(INVALID, f"{what}: ptr {ptr:#x} is host memory of this process, not a device address "
                                f"(rt.malloc); model inputs and outputs live in device memory")


def create_data_buffer(ptr: int, size: int) -> DataBuffer:
    """Describe ``size`` bytes of device memory at ``ptr``."""
    _check_ptr_size(ptr, size, "create_data_buffer")
    return DataBuffer(ptr, size)


def update_data_buffer(buf: DataBuffer, ptr: int, size: int) -> None:
    _check_buffer(buf, "update_data_buffer")
    _check_ptr_size(ptr, size, "update_data_buffer")
    buf.ptr, buf.size = ptr, size


def destroy_data_buffer(buf: DataBuffer) -> None:
    """Destroy the descriptor (the device memory stays allocated)."""
    _check_buffer(buf, "destroy_data_buffer").destroyed = True


def get_data_buffer_addr(buf: DataBuffer) -> int:
    return _check_buffer(buf, "get_data_buffer_addr").ptr


def get_data_buffer_size_v2(buf: DataBuffer) -> int:
    return _check_buffer(buf, "get_data_buffer_size_v2").size


get_data_buffer_size = get_data_buffer_size_v2  # deprecated name in pyACL


def create_dataset() -> Dataset:
    return Dataset()


def add_dataset_buffer(ds: Dataset, buf: DataBuffer) -> Dataset:
    """Append a buffer; returns the dataset (pyACL returns ``(dataset, ret)``)."""
    _check_dataset(ds, "add_dataset_buffer").buffers.append(_check_buffer(buf, "add_dataset_buffer"))
    return ds


def get_dataset_num_buffers(ds: Dataset) -> int:
    return len(_check_dataset(ds, "get_dataset_num_buffers").buffers)


def get_dataset_buffer(ds: Dataset, i: int) -> DataBuffer:
    buffers = _check_dataset(ds, "get_dataset_buffer").buffers
    if not _is_index(i) or not 0 <= i < len(buffers):
        raise AclError(INVALID, f"get_dataset_buffer: index {args.shown(i)} out of range, dataset has {len(buffers)} buffers")
    return buffers[i]


def destroy_dataset(ds: Dataset) -> None:
    """Destroy the dataset (its buffers stay alive)."""
    _check_dataset(ds, "destroy_dataset").destroyed = True




__all__ = ["DataBuffer", "Dataset", "add_dataset_buffer", "create_data_buffer", "create_dataset", "destroy_data_buffer", "destroy_dataset", "get_data_buffer_addr", "get_data_buffer_size", "get_data_buffer_size_v2", "get_dataset_buffer", "get_dataset_num_buffers", "update_data_buffer"]
