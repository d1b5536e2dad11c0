"""The device address space: an address is a plain int that encodes its node and card.

``make_addr(node, card, offset)`` sets a tag bit (so small ints, host addresses and garbage are never
device addresses), 8 bits of node, 8 bits of card and 44 bits of offset. Both sides use it: the host
to tell which card a pointer belongs to (and ``ACL_MEMCPY_DEFAULT`` to infer a copy's direction), the
card's allocator to hand out addresses and to name the card a foreign pointer belongs to.
"""

from __future__ import annotations

import numpy as np

from .constants import AclErrorCode
from .errors import AclError

ADDR_TAG = 1 << 60
NODE_SHIFT = 52
CARD_SHIFT = 44
OFFSET_LIMIT = 1 << CARD_SHIFT            # 16 TiB of address space per card
ID_LIMIT = 1 << (NODE_SHIFT - CARD_SHIFT)  # node and card ids are 8 bits each


def make_addr(node: int, card: int, offset: int) -> int:
    """The device address of byte ``offset`` of card ``card`` on node ``node``."""
    if not (0 <= node < ID_LIMIT and 0 <= card < ID_LIMIT and 0 <= offset < OFFSET_LIMIT):
        raise AclError(AclErrorCode.ACL_ERROR_RT_PARAM_INVALID,
                       f"make_addr: node {node}, card {card}, offset {offset} out of range "
                       f"(expected node, card in [0, {ID_LIMIT}), offset in [0, 2**44))")
    return ADDR_TAG | node << NODE_SHIFT | card << CARD_SHIFT | offset


def decode_addr(ptr) -> tuple[int, int] | None:
    """``(node, card)`` of a device address, or None if ``ptr`` is not one."""
    ptr = as_int(ptr)
    if ptr is None or ptr >> 60 != 1:
        return None
    return (ptr >> NODE_SHIFT) & (ID_LIMIT - 1), (ptr >> CARD_SHIFT) & (ID_LIMIT - 1)


def as_int(x) -> int | None:
    """``x`` as an int if it is an integer (not bool), else None."""
    if type(x) is int:
        return x
    if isinstance(x, (int, np.integer)) and not isinstance(x, (bool, np.bool_)):
        return int(x)
    return None
