"""ONNX -> npusim offline model: the converter behind ``atc --framework=5`` (``launcher/tools/atc.py``).

The ``onnx`` package is an optional extra (``pip install "npusim[atc]"``), imported only when a model is read.
"""

from .convert import convert
from .errors import AtcError
from .options import ConvertOptions
from .options import parse as parse_options

__all__ = ["AtcError", "ConvertOptions", "convert", "parse_options"]
