"""``acl.media``: DVPP memory (the image and video operations of DVPP are not simulated: docs/pyacl.md)."""

from ._util import dvpp_free, dvpp_malloc

__all__ = ["dvpp_free", "dvpp_malloc"]
