"""ATC's error reports: an E-code and the message text of CANN's error-code table (``error_code.json``).

``atc`` prints ``<code>: <message>`` after ``ATC run failed, ...``, as ATC does; Python callers of the converter
catch :class:`AtcError` (``.code`` is the E-code string, ``.message`` the text).
"""

from __future__ import annotations


class AtcError(Exception):
    """A conversion refused with one of ATC's error codes."""

    def __init__(self, code: str, message: str):
        super().__init__(f"{code}: {message}")
        self.code = code
        self.message = message


def invalid_value(value, parameter: str, reason: str) -> AtcError:
    """E10001, ATC's code for a flag value it cannot use."""
    return AtcError("E10001", f"Value [{value}] for parameter [{parameter}] is invalid. Reason: {reason}")


def input_shape_invalid(value, reason: str) -> AtcError:
    return AtcError("E10002", f"Value [{value}] for parameter [--input_shape] is invalid. Reason: {reason}. "
                              f"The value must be formatted as \"input_name1:n1,c1,h1,w1;input_name2:n2,c2,h2,w2\".")


def required(parameter: str) -> AtcError:
    return AtcError("E10054", f"The required parameter [{parameter}] for ATC is empty. Another possible reason is "
                              f"that the values of some parameters are not enclosed by quotation marks (\"\").")


def no_parser(node: str, op_type: str, opset: int, domain: str = "ai.onnx") -> AtcError:
    """An ONNX op npusim has no kernel for: ATC's "No parser is registered" report, naming node and type."""
    return AtcError("E19010", f"No parser is registered for Op [{node}, optype [{domain}::{opset}::{op_type}]].")


def op_param_invalid(value, parameter: str, node: str, reason: str) -> AtcError:
    """E13014: an op's parameter (an attribute, or an input that must be constant) cannot be used."""
    return AtcError("E13014", f"Value [{value}] of parameter [{parameter}] for Op [{node}] is invalid. "
                              f"Reason: {reason}.")


def load_failed(path: str, reason: str) -> AtcError:
    return AtcError("E10041", f"Failed to load the model from [{path}]. Reason: {reason}")
