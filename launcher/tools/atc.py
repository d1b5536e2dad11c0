"""atc — ATC's command line for npusim: ONNX model -> npusim offline model (``<output>.om``).

Usage::

    atc --model=resnet18.onnx --framework=5 --output=resnet18 --soc_version=Ascend910B1
    atc --model=resnet18.onnx --framework=5 --output=resnet18_dyn --soc_version=Ascend910B1 \\
        --input_shape="input:-1,3,224,224" --dynamic_batch_size="1,2,4,8"
    atc --model=bert.onnx --framework=5 --output=bert --soc_version=Ascend910B1 \\
        --input_shape="input_ids:1,128;attention_mask:1,128" --output_type=FP32
    atc --singleop=add_op.json --output=op_models --soc_version=Ascend910B1
    atc --mode=1 --om=resnet18.om --json=resnet18.json

The written file is npusim's model format (``docs/model_format.md``: a msgpack map tagged ``"npusim-om"``), not
a CANN ``.om``: a card of npusim runs it through ``acl.mdl.load_from_file`` and friends exactly as CANN runs
ATC's output. Flags, messages and exit codes follow ATC: ``ATC start working now, please wait for a moment.``,
then ``ATC run success, welcome to the next use.`` (exit 0) or ``ATC run failed, Please check the detail log,
Try 'atc --help' for more information`` and the E-code report (exit 255, ATC's ``return -1``). Every flag
and supported op: ``docs/atc.md``. Reading ONNX needs the optional extra: ``pip install "npusim[atc]"``.
"""

from __future__ import annotations

import json
import os
import sys
import time
import tomllib

from rt.config import CONFIG_DIR
from rt.mdl.onnx import errors as atc_errors
from rt.mdl.onnx.errors import AtcError, invalid_value, required

START = "ATC start working now, please wait for a moment."
SUCCESS = "ATC run success, welcome to the next use."
FAILED = "ATC run failed, Please check the detail log, Try 'atc --help' for more information"
EXIT_FAILED = 255

FLAGS = {  # flag -> default; every flag ATC users pass to npusim's atc
    "model": "", "framework": "", "output": "", "soc_version": "", "input_shape": "", "input_format": "",
    "dynamic_batch_size": "", "dynamic_image_size": "", "dynamic_dims": "", "output_type": "",
    "input_fp16_nodes": "", "out_nodes": "", "singleop": "", "log": "null", "mode": "0", "om": "", "json": "",
    # accepted and ignored: they tune the AI Core compiler, which npusim does not have (docs/atc.md)
    "precision_mode": "", "precision_mode_v2": "", "op_select_implmode": "", "optypelist_for_implmode": "",
    "disable_reuse_memory": "0", "buffer_optimize": "l2_optimize", "enable_small_channel": "0",
    "op_debug_level": "0", "virtual_type": "0", "core_type": "AiCore",
    # refused: they change what the model computes in ways npusim does not simulate
    "insert_op_conf": "", "input_shape_range": "", "weight": "", "is_input_adjust_hw_layout": "",
    "is_output_adjust_hw_layout": "",
}
BOOL_FLAGS = {"help", "h"}
PRECISION_MODES = ("force_fp16", "force_fp32", "cube_fp16in_fp32out", "allow_mix_precision", "allow_fp32_to_fp16",
                   "must_keep_origin_dtype", "allow_mix_precision_fp16", "allow_mix_precision_bf16",
                   "allow_fp32_to_bf16")
LOG_LEVELS = ("debug", "info", "warning", "error", "null")
FRAMEWORKS = {"0": "Caffe", "1": "MindSpore", "3": "TensorFlow", "5": "Onnx"}
SOLUTIONS = {"E10001": "Try again with a valid argument.", "E10016": "Specify the name of an existing node in the graph.",
             "E10054": "Check whether the command line parameter format is correct.",
             "E19010": "Check the version of the operator plugin, or submit an issue to request support for the "
                       "operator (npusim: docs/atc.md lists the supported ONNX ops).",
             "E10041": "1. Check that the model file is valid. 2. Check that the --framework argument matches the "
                       "actual framework of the model file."}

USAGE = """usage: atc <args>
generate offline model example:
atc --model=./resnet18.onnx --framework=5 --output=./resnet18 --soc_version=<soc_version>
generate offline model for single op example:
atc --singleop=./op_list.json --output=./op_model --soc_version=<soc_version>

npusim's atc writes npusim offline models (format "npusim-om", docs/model_format.md), not CANN .om files.

[General]
  --h/help            Show this help message
  --mode              Run mode. 0: default, generate offline model; 1: convert model to JSON format
[Input]
  --model             Model file (ONNX)
  --om                The model file to be converted to json (an npusim .om, or ONNX with --framework=5)
  --framework         Framework type. 5:Onnx (0:Caffe, 1:MindSpore, 3:Tensorflow are not supported by npusim)
  --input_format      Format of input data. NCHW (default), ND or NCDHW
  --input_shape       Shape of input data. E.g.: "input_name1:n1,c1,h1,w1;input_name2:n2,c2,h2,w2"
  --dynamic_batch_size Set dynamic batch size. E.g.: "batchsize1,batchsize2,batchsize3"
  --dynamic_image_size Set dynamic image size. E.g.: "imagesize1_height,imagesize1_width;imagesize2_height,imagesize2_width"
  --dynamic_dims      Set dynamic dims. E.g.: "dims1_n1,dims1_n2;dims2_n1,dims2_n2"
  --singleop          Single op definition file. atc will generate offline model(s) for single op if --singleop is set.
[Output]
  --output            Output file path&name (needn't suffix, will add .om automatically).
                      If --singleop is set, this arg specifies the directory of the single op offline models.
  --output_type       Set net output type. Support FP32, FP16, UINT8, INT8. E.g.: FP16, or "node1:0:FP16;node2:1:FP32"
  --json              The output json file path&name which is converted from a model
[Target]
  --soc_version       The soc version (one of the SoCs npusim simulates: {socs})
[Feature]
  --out_nodes         Output nodes designated by users. E.g.: "node_name1:0;node_name1:1;node_name2:0"
  --input_fp16_nodes  Input node datatype is fp16. E.g.: "node_name1;node_name2"
[Accepted and ignored (no AI Core compiler to tune)]
  --precision_mode --precision_mode_v2 --op_select_implmode --optypelist_for_implmode --disable_reuse_memory
  --buffer_optimize --enable_small_channel --op_debug_level --virtual_type --core_type
[Debug]
  --log               Generate log with level. Support debug, info, warning, error, null(default)
"""


def soc_names() -> list[str]:
    """The SoC names of the shipped hardware configs (what ``rt.get_soc_name()`` can return)."""
    names = set()
    for path in sorted(CONFIG_DIR.glob("*.toml")):
        with open(path, "rb") as f:
            names.add(tomllib.load(f).get("soc", {}).get("name", ""))
    return sorted(n for n in names if n)


def parse_argv(argv: list[str]) -> dict:
    """gflags-style ``--flag=value`` / ``--flag value``; an unknown flag fails as gflags fails."""
    flags = dict(FLAGS)
    given, i = set(), 0
    while i < len(argv):
        arg = argv[i]
        if not arg.startswith("-"):
            raise AtcError("E10001", f"Value [{arg}] for parameter [argv] is invalid. Reason: positional arguments "
                                     f"are not supported; pass --flag=value.")
        key, eq, value = arg.lstrip("-").partition("=")
        if key in BOOL_FLAGS:
            flags["help"] = True
        elif key not in FLAGS:
            raise AtcError("ERROR", f"unknown command line flag '{key}'")
        elif eq:
            flags[key] = value
        elif i + 1 < len(argv):
            i += 1
            flags[key] = argv[i]
        else:
            raise AtcError("ERROR", f"flag '{key}' is missing its argument")
        given.add(key)
        i += 1
    flags["_given"] = given
    return flags


def check_common(flags: dict, log) -> None:
    if flags["log"] not in LOG_LEVELS:
        raise AtcError("E10010", f"Value [{flags['log']}] for parameter [--log] is invalid.")
    for key in ("insert_op_conf", "input_shape_range", "weight", "is_input_adjust_hw_layout",
                "is_output_adjust_hw_layout"):
        if flags[key]:
            raise invalid_value(flags[key], f"--{key}", "npusim's atc does not support this option (docs/atc.md)")
    if flags["precision_mode"] and flags["precision_mode"] not in PRECISION_MODES:
        raise invalid_value(flags["precision_mode"], "--precision_mode",
                            f"The value must be one of {', '.join(PRECISION_MODES)}")
    ignored = sorted(k for k in flags["_given"] if k in ("precision_mode", "precision_mode_v2", "op_select_implmode",
                                                         "optypelist_for_implmode", "disable_reuse_memory",
                                                         "buffer_optimize", "enable_small_channel", "op_debug_level",
                                                         "virtual_type", "core_type"))
    if ignored:
        log("warning", f"ignored (no AI Core compiler to tune in npusim): {', '.join('--' + k for k in ignored)}")


def check_soc(value: str) -> None:
    if not value:
        raise required("--soc_version")
    socs = soc_names()
    if value not in socs:
        raise invalid_value(value, "--soc_version", f"npusim simulates the SoCs {', '.join(socs)}; a model for "
                                                    f"another SoC cannot run on its cards")


def generate_om(flags: dict, log) -> str:
    """Mode 0: convert the ONNX model; returns the path written."""
    from rt.mdl.format import serialize
    from rt.mdl.onnx import convert, parse_options

    check_soc(flags["soc_version"])
    if not flags["output"]:
        raise required("--output")
    if not flags["model"]:
        raise required("--model")
    framework = flags["framework"]
    if framework == "":
        raise AtcError("E10007", "[--framework] is required. The value must be [0(Caffe) or 1(MindSpore) or "
                                 "3(TensorFlow) or 5(Onnx)].")
    if framework != "5":
        reason = (f"npusim's atc converts ONNX models only (5); {FRAMEWORKS[framework]} is not supported"
                  if framework in FRAMEWORKS else "The value must be 0(Caffe), 1(MindSpore), 3(TensorFlow) or 5(Onnx)")
        raise invalid_value(framework, "--framework", reason)
    if not os.path.isfile(flags["model"]):
        raise invalid_value(flags["model"], "--model", "the path does not exist or is not a file")
    target = flags["output"] + ".om"
    parent = os.path.dirname(os.path.abspath(target))
    if not os.path.isdir(parent):
        raise invalid_value(flags["output"], "--output", f"the directory {parent} does not exist")
    options = parse_options(flags["input_shape"], flags["input_format"], flags["dynamic_batch_size"],
                            flags["dynamic_image_size"], flags["dynamic_dims"], flags["output_type"],
                            flags["input_fp16_nodes"], flags["out_nodes"])
    t0 = time.perf_counter()
    model = convert(flags["model"], options, name=os.path.basename(flags["output"]))
    log("info", f"converted {flags['model']}: {len(model.nodes)} nodes, {len(model.weights)} weights "
                f"({model.weight_bytes} bytes) in {time.perf_counter() - t0:.2f} s")
    data = serialize(model)
    try:
        with open(target, "wb") as f:
            f.write(data)
    except OSError as exc:
        raise AtcError("E13004", f"Failed to write file [{target}]. Reason: {exc.strerror or exc}.") from None
    log("info", f"wrote {target} ({len(data)} bytes, npusim-om)")
    return target


def model_to_json(flags: dict, log) -> str:
    """Mode 1: an npusim .om (or, with --framework=5, an ONNX file) as JSON; weights by name/dtype/shape only."""
    if not flags["om"]:
        raise required("--om")
    if not flags["json"]:
        raise required("--json")
    if not os.path.isfile(flags["om"]):
        raise invalid_value(flags["om"], "--om", "the path does not exist or is not a file")
    if flags["framework"] not in ("", "5"):
        raise invalid_value(flags["framework"], "--framework", "The framework must be selected from {0(Caffe), "
                            "3(TensorFlow), 5(Onnx)} when model is set to 1(JSON); npusim reads 5(Onnx) and its own .om")
    if flags["framework"] == "5":
        doc = _onnx_json(flags["om"])
    else:
        from rt.errors import AclError
        from rt.mdl import format as fmt
        try:
            model = fmt.parse(fmt.read_model_file(flags["om"]))
        except AclError as exc:
            raise atc_errors.load_failed(flags["om"], exc.message) from None
        doc = fmt.to_document(model)
        doc["weights"] = [{k: v for k, v in w.items() if k != "data"} | {"nbytes": len(w["data"])} for w in doc["weights"]]
    try:
        with open(flags["json"], "w", encoding="utf-8") as f:
            json.dump(doc, f, indent=2)
    except OSError as exc:
        raise AtcError("E13004", f"Failed to write file [{flags['json']}]. Reason: {exc.strerror or exc}.") from None
    return flags["json"]


def _onnx_json(path: str) -> dict:
    from google.protobuf import json_format

    from rt.mdl.onnx.reader import onnx_module
    onnx = onnx_module()
    try:
        proto = onnx.load(path, load_external_data=False)
    except Exception as exc:  # noqa: BLE001 - protobuf DecodeError, OSError
        raise atc_errors.load_failed(path, f"{type(exc).__name__}: {exc}") from None
    for t in proto.graph.initializer:  # the graph, not megabytes of base64 weights
        t.ClearField("raw_data")
    return json_format.MessageToDict(proto)


def run(flags: dict, log) -> str:
    check_common(flags, log)
    mode = flags["mode"]
    if flags["singleop"]:
        from rt.mdl.onnx import singleop
        check_soc(flags["soc_version"])
        if not flags["output"]:
            raise required("--output")
        written = singleop.generate(flags["singleop"], flags["output"])
        for path in written:
            log("info", f"wrote {path}")
        return flags["output"]
    if mode == "0":
        return generate_om(flags, log)
    if mode == "1":
        return model_to_json(flags, log)
    raise invalid_value(mode, "--mode", "The value must be selected from the following: 0(model to framework "
                                        "model), 1(framework model to json); npusim does not implement 3, 5, 6, 7, 30")


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    print(START, flush=True)
    level = {"value": "null"}

    def log(severity: str, message: str) -> None:
        order = {"debug": 0, "info": 1, "warning": 2, "error": 3, "null": 9}
        if order[severity] >= order.get(level["value"], 9):
            print(f"[{severity.upper()}] ATC({os.getpid()}): {message}", file=sys.stderr, flush=True)

    try:
        flags = parse_argv(argv)
        if flags.get("help"):
            print(USAGE.format(socs=", ".join(soc_names())))
            return 0
        level["value"] = flags["log"]
        run(flags, log)
    except AtcError as exc:
        print(FAILED, flush=True)
        if exc.code == "ERROR":
            print(f"ERROR: {exc.message}")
        else:
            print(f"{exc.code}: {exc.message}")
            if exc.code in SOLUTIONS:
                print(f"        Solution: {SOLUTIONS[exc.code]}")
        return EXIT_FAILED
    print(SUCCESS, flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
