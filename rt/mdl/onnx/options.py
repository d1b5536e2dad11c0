"""ATC's conversion flags, parsed and checked with ATC's error codes: ``--input_shape``, ``--dynamic_*``,
``--output_type``, ``--input_fp16_nodes``, ``--out_nodes``, ``--input_format``. The result is a frozen
:class:`ConvertOptions` the converter takes (Python callers may build one directly)."""

from __future__ import annotations

import dataclasses

from .errors import AtcError, input_shape_invalid, invalid_value

MIN_PROFILES, MAX_PROFILES = 2, 100          # ATC's bounds on --dynamic_batch_size/_image_size/_dims gears
OUTPUT_TYPES = {"FP32": "float32", "FP16": "float16", "UINT8": "uint8", "INT8": "int8"}
ONNX_FORMATS = ("NCHW", "ND", "NCDHW")


@dataclasses.dataclass(frozen=True)
class ConvertOptions:
    input_shape: dict = dataclasses.field(default_factory=dict)     # input name -> [dims], -1 = dynamic
    input_format: str = "NCHW"
    dynamic_batch_size: tuple = ()                                   # gears
    dynamic_image_size: tuple = ()                                   # ((h, w), ...)
    dynamic_dims: tuple = ()                                         # ((d, ...), ...)
    output_type: object = None           # None, a dtype name for every output, or {(node, index): dtype name}
    input_fp16_nodes: tuple = ()
    out_nodes: tuple = ()                                            # ((node name, output index), ...)


def _ints(text: str, parameter: str, what: str) -> list[int]:
    try:
        return [int(t) for t in text.split(",")]
    except ValueError:
        raise invalid_value(text, parameter, f"{what} must be comma-separated integers") from None


def parse_input_shape(text: str) -> dict:
    shapes = {}
    for item in filter(None, text.split(";")):
        name, sep, dims = item.rpartition(":")       # input names may hold ':' themselves; dims never do
        if not sep or not name:
            raise input_shape_invalid(text, f"entry [{item}] has no input name")
        if "~" in dims:
            raise invalid_value(text, "--input_shape", "shape ranges (n1~n2) are not supported by npusim; use -1 "
                                "for a dim chosen per execution, or a gear option (--dynamic_batch_size, "
                                "--dynamic_image_size, --dynamic_dims)")
        try:
            values = [int(d) for d in dims.split(",")] if dims.strip() else []
        except ValueError:
            raise input_shape_invalid(text, f"dims [{dims}] of input [{name}] are not integers") from None
        bad = [d for d in values if d < -1]
        if bad:
            raise AtcError("E10011", f"Value [{text}] for parameter [--input_shape] is invalid. Shape values must "
                                     f"be positive integers. The error value in the shape is [{bad[0]}].")
        if name in shapes:
            raise input_shape_invalid(text, f"input [{name}] is given twice")
        shapes[name] = values
    return shapes


def _profiles(text: str, parameter: str, width: int | None) -> tuple:
    profiles = []
    for item in filter(None, text.split(";")):
        dims = _ints(item, parameter, "each profile")
        if width == 2 and len(dims) != 2:
            raise AtcError("E10020", f"Value [{text}] for parameter [--dynamic_image_size] is invalid.")
        bad = [d for d in dims if d <= 0]
        if bad:
            raise AtcError("E10038", f"Dimension size [{bad[0]}] is invalid. The value must be greater than 0.")
        profiles.append(tuple(dims))
    return _check_count(profiles)


def _check_count(profiles: list) -> tuple:
    if len(profiles) < MIN_PROFILES:
        raise AtcError("E10035", f"--dynamic_batch_size, --dynamic_image_size, or --dynamic_dims has "
                                 f"[{len(profiles)}] profiles, which is less than the minimum [{MIN_PROFILES}].")
    if len(profiles) > MAX_PROFILES:
        raise AtcError("E10036", f"--dynamic_batch_size, --dynamic_image_size, or --dynamic_dims has "
                                 f"[{len(profiles)}] profiles, which is greater than the maximum [{MAX_PROFILES}].")
    counts = sorted({len(p) if isinstance(p, tuple) else 1 for p in profiles})
    if len(counts) > 1:
        raise AtcError("E10037", f"The profiles configured in --dynamic_batch_size, --dynamic_image_size, or "
                                 f"--dynamic_dims have inconsistent dimension counts. A profile has [{counts[0]}] "
                                 f"dimensions while another has [{counts[-1]}] dimensions.")
    if len(set(profiles)) != len(profiles):
        raise AtcError("E10039", "The --dynamic_batch_size, --dynamic_image_size, or --dynamic_dims argument have "
                                 "duplicate profiles.")
    return tuple(profiles)


def parse_batch_sizes(text: str) -> tuple:
    sizes = _ints(text, "--dynamic_batch_size", "batch sizes")
    bad = [d for d in sizes if d <= 0]
    if bad:
        raise AtcError("E10038", f"Dimension size [{bad[0]}] is invalid. The value must be greater than 0.")
    return _check_count(sizes)


def parse_output_type(text: str):
    if ":" not in text:
        if text.upper() not in OUTPUT_TYPES:
            raise invalid_value(text, "--output_type", f"the value must be one of {', '.join(OUTPUT_TYPES)}")
        return OUTPUT_TYPES[text.upper()]
    per_output = {}
    for item in filter(None, text.split(";")):
        node, _, rest = item.rpartition(":")
        node, _, index = node.rpartition(":")
        if not node or not index.isdigit() or rest.upper() not in OUTPUT_TYPES:
            raise invalid_value(text, "--output_type", f"entry [{item}] must be node_name:index:type with type one of "
                                                       f"{', '.join(OUTPUT_TYPES)}")
        per_output[(node, int(index))] = OUTPUT_TYPES[rest.upper()]
    return per_output


def parse_out_nodes(text: str) -> tuple:
    out = []
    for item in filter(None, text.split(";")):
        node, sep, index = item.rpartition(":")
        if not sep or not node or not index.isdigit():
            raise invalid_value(text, "--out_nodes", f"entry [{item}] must be node_name:output_index")
        out.append((node, int(index)))
    return tuple(out)


def parse(input_shape: str = "", input_format: str = "", dynamic_batch_size: str = "", dynamic_image_size: str = "",
          dynamic_dims: str = "", output_type: str = "", input_fp16_nodes: str = "", out_nodes: str = "") -> ConvertOptions:
    """ConvertOptions from flag texts, checked as ATC checks them (before the model is read)."""
    texts = {"input_shape": input_shape, "input_format": input_format, "dynamic_batch_size": dynamic_batch_size,
             "dynamic_image_size": dynamic_image_size, "dynamic_dims": dynamic_dims, "output_type": output_type,
             "input_fp16_nodes": input_fp16_nodes, "out_nodes": out_nodes}
    for flag, text in texts.items():
        if not isinstance(text, str):
            raise invalid_value(repr(text), f"--{flag}", "expected the flag's text (a str)")
    given = [f for f, v in (("dynamic_batch_size", dynamic_batch_size), ("dynamic_image_size", dynamic_image_size),
                            ("dynamic_dims", dynamic_dims)) if v]
    if len(given) > 1:
        raise AtcError("E10009", "--dynamic_batch_size, --dynamic_image_size, --input_shape_range, and --dynamic_dims "
                                 "are mutually exclusive.")
    fmt = input_format or "NCHW"
    if fmt not in ONNX_FORMATS:
        raise invalid_value(input_format, "--input_format", "The value must be NCHW, ND or NCDHW in ONNX model.")
    shapes = parse_input_shape(input_shape)
    batch = parse_batch_sizes(dynamic_batch_size) if dynamic_batch_size else ()
    images = _profiles(dynamic_image_size, "--dynamic_image_size", 2) if dynamic_image_size else ()
    dims = _profiles(dynamic_dims, "--dynamic_dims", None) if dynamic_dims else ()
    unknown = [n for n, s in shapes.items() if -1 in s]
    if given and not unknown:
        raise AtcError("E10040", "As the --dynamic_batch_size, --dynamic_image_size, or --dynamic_dims argument is "
                                 "included, the corresponding nodes specified in --input_shape must have -1 axes and "
                                 "cannot have '~'.")
    if batch:
        if not any(s and s[0] == -1 for s in shapes.values()):
            raise AtcError("E10031", "--dynamic_batch_size is included, but none of the nodes specified in "
                                     "--input_shape has a batch size equaling -1.")
        for name, s in shapes.items():
            if -1 in s[1:]:
                raise AtcError("E10018", f"Value [{s}] for shape [{name}] is invalid. When --dynamic_batch_size is "
                                         f"included, only batch size N can be -1 in --input_shape.")
    if images:
        h, w = (2, 3) if fmt != "NCDHW" else (3, 4)
        for s in (shapes[n] for n in unknown):
            if len(s) <= w or [i for i, d in enumerate(s) if d == -1] != [h, w]:
                raise AtcError("E10019", "When --dynamic_image_size is included, only the height and width axes "
                                         "can be -1 in --input_shape.")
    if dims:
        total = sum(s.count(-1) for s in shapes.values())
        if total > len(dims[0]):
            raise AtcError("E10046", "The total number of -1 axes in the --input_shape argument is greater than the "
                                     "dimension count per profile in --dynamic_dims.")
        if total < len(dims[0]):
            raise invalid_value(dynamic_dims, "--dynamic_dims", f"each profile has {len(dims[0])} dims but "
                                                                f"--input_shape has {total} -1 axes")
    fp16 = tuple(filter(None, input_fp16_nodes.split(";")))
    return ConvertOptions(shapes, fmt, batch, images, dims, parse_output_type(output_type) if output_type else None,
                          fp16, parse_out_nodes(out_nodes))
