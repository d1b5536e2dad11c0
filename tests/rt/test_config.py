"""Hostile config files (issue #21 item 5, config part): every key of rt/config.py's _FIELDS against values
that are out of range, of the wrong type, huge, non-finite or absurdly long — each refused with an AclError
naming the key, never a foreign exception."""

import pytest

import hccl  # noqa: F401  registers its [hccl] section (hccl/config.py): its keys are tested here too
import rt
from rt import config as config_mod
from rt.config import _FIELDS, load_config
from rt.constants import AclErrorCode

REFUSED = {AclErrorCode.ACL_ERROR_INVALID_PARAM, AclErrorCode.ACL_ERROR_INVALID_FILE,
           AclErrorCode.ACL_ERROR_PARSE_FILE, AclErrorCode.ACL_ERROR_FILE_ATTR_INVALID}
NUMERIC = [k for k, (_, typ) in _FIELDS.items() if typ is not str]
TEXT = [k for k, (_, typ) in _FIELDS.items() if typ is str]
# Zero means something for these keys (never / always mesh / the default share of memory): it is valid.
ZERO_VALID = {("hccl", "exec_timeout"), ("hccl", "ring_threshold_bytes"), ("host", "pinned_limit_bytes")}

HOSTILE_NUMBERS = {
    "negative": "-1",
    "huge-2**80": str(2 ** 80),
    "int64-overflow": str(2 ** 63),
    "nan": "nan",
    "inf": "inf",
    "-inf": "-inf",
    "float-1e300": "1e300",
    "5000-char string": '"' + "9" * 5000 + '"',
    "bool": "true",
    "array": "[1, 2]",
    "table": "{ a = 1 }",
}


def _write(tmp_path, section, key, literal):
    path = tmp_path / "hostile.toml"
    path.write_text(f"[{section}]\n{key} = {literal}\n")
    return str(path)


def _refused(path, must_name):
    with pytest.raises(rt.AclError) as e:
        load_config(path)
    assert e.value.code in REFUSED, e.value
    assert must_name in e.value.message, e.value.message
    assert len(e.value.message) < 2000, "a hostile value must not be echoed in full"
    return e.value


@pytest.mark.parametrize("label", sorted(HOSTILE_NUMBERS))
@pytest.mark.parametrize("section,key", NUMERIC, ids=[f"{s}.{k}" for s, k in NUMERIC])
def test_every_numeric_key_refuses_hostile_values(tmp_path, section, key, label):
    _refused(_write(tmp_path, section, key, HOSTILE_NUMBERS[label]), f"[{section}] {key}")


@pytest.mark.parametrize("section,key", [k for k in NUMERIC if k not in ZERO_VALID],
                         ids=[f"{s}.{k}" for s, k in NUMERIC if (s, k) not in ZERO_VALID])
def test_zero_is_refused_where_it_means_nothing(tmp_path, section, key):
    _refused(_write(tmp_path, section, key, "0"), f"[{section}] {key}")


@pytest.mark.parametrize("section,key", sorted(ZERO_VALID))
def test_zero_is_accepted_where_cann_gives_it_a_meaning(tmp_path, section, key):
    assert getattr(load_config(_write(tmp_path, section, key, "0")), _FIELDS[(section, key)][0]) == 0


@pytest.mark.parametrize("section,key", TEXT, ids=[f"{s}.{k}" for s, k in TEXT])
@pytest.mark.parametrize("literal", ['"' + "x" * 5000 + '"', '""', '"Ascend\\u0000910"', "7"])
def test_every_text_key_refuses_hostile_values(tmp_path, section, key, literal):
    _refused(_write(tmp_path, section, key, literal), f"[{section}] {key}")


@pytest.mark.parametrize("text,code", [
    ("[card]\nhbm_bytes = " + "9" * 5000 + "\n", AclErrorCode.ACL_ERROR_PARSE_FILE),     # past int()'s digit limit
    ("x = " + "[" * 5000 + "]" * 5000 + "\n", AclErrorCode.ACL_ERROR_PARSE_FILE),         # RecursionError in tomllib
    ("x = " + "{a=" * 3000 + "1" + "}" * 3000 + "\n", AclErrorCode.ACL_ERROR_PARSE_FILE),
    ("[card]\nhbm_bytes = ٢١٤٧٤٨٣٦٤٨\n", AclErrorCode.ACL_ERROR_PARSE_FILE),               # non-ASCII digits
    ("[" + ".".join(["a"] * 2000) + "]\nx = 1\n", AclErrorCode.ACL_ERROR_FILE_ATTR_INVALID),
    ("[card]\n" + "k" * 5000 + " = 1\n", AclErrorCode.ACL_ERROR_FILE_ATTR_INVALID),
], ids=["10**5000", "deep-array", "deep-inline-table", "arabic-digits", "deep-table", "5000-char-key"])
def test_hostile_documents(tmp_path, text, code):
    path = tmp_path / "doc.toml"
    path.write_text(text)
    with pytest.raises(rt.AclError) as e:
        load_config(str(path))
    assert e.value.code == code and len(e.value.message) < 2000, e.value


def test_a_1_tib_object_store_is_refused_before_ray_starts_naming_the_limit_that_fits(tmp_path, monkeypatch):
    import ray

    from rt.ray import session
    cfg = load_config(_write(tmp_path, "ray", "object_store_bytes", str(1 << 40)))   # valid on a larger host
    started = []
    monkeypatch.setattr(ray, "init", lambda *a, **k: started.append("ray.init"))
    monkeypatch.setattr(session.reaper, "new_tag", lambda: started.append("reaper") or "npusim-x-y")
    monkeypatch.setattr(ray, "is_initialized", lambda: False)
    with pytest.raises(rt.AclError) as e:
        session.start_local_ray(cfg)
    assert e.value.code in REFUSED and not started
    assert "[ray] object_store_bytes = 1099511627776" in e.value.message
    assert "at most" in e.value.message and "fits" in e.value.message


def test_an_object_store_that_fits_passes(tmp_path):
    config_mod.check_object_store(load_config(_write(tmp_path, "ray", "object_store_bytes", str(100 << 20))))


def test_segment_sizes_must_be_ordered(tmp_path):
    path = tmp_path / "seg.toml"
    path.write_text("[card]\nsmall_segment_bytes = 20971520\nlarge_segment_bytes = 2097152\n")
    _refused(str(path), "small_segment_bytes = 20971520")


def test_the_shipped_configs_and_edge_values_load(tmp_path):
    for name in ("default", "small", "ascend910b"):
        load_config(name)
    path = tmp_path / "edge.toml"
    path.write_text("[hccl]\nexec_timeout = 2147483647\nconnect_timeout = 7200\nbuffsize_mb = 1\n"
                    "[node]\ncards = 64\n[card]\nhbm_bytes = 1048576\n")
    cfg = load_config(str(path))
    assert (cfg.exec_timeout, cfg.connect_timeout, cfg.cards_per_node) == (2147483647, 7200, 64)


@pytest.mark.parametrize("name", ["x" * 5000, "a\0b", "a/" + "y" * 300])
def test_a_config_name_the_os_cannot_look_up_is_a_named_error(rt_factory, name):
    """Past NAME_MAX / PATH_MAX or with a NUL, Path.exists() raises OSError/ValueError: it must not escape rt.init."""
    import rt
    with pytest.raises(rt.AclError) as e:
        rt_factory(name)
    assert e.value.code in (100000, 100003) and "config" in e.value.message
