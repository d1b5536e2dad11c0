"""npu-smi's text forms (``launcher/tools/smi.py``): CANN's ``npu-smi info`` table and ``info -t usages``, drawn from the
JSON document ``collect`` builds."""

from __future__ import annotations

MiB = 1 << 20
WIDTHS = (27, 15, 52)                             # the columns of CANN's table
WIDTH = sum(WIDTHS) + len(WIDTHS) - 1


def mb(nbytes: int) -> int:
    """Bytes as whole MiB, rounded to nearest (npu-smi's MB)."""
    return (nbytes + MiB // 2) // MiB


def _rule(char: str = "-") -> str:
    return "+" + "+".join(char * w for w in WIDTHS) + "+"


def _row(*cells, widths=WIDTHS) -> str:
    return "|" + "|".join((" " + str(c)).ljust(w)[:w] for c, w in zip(cells, widths)) + "|"


def _wide(text: str) -> str:
    return _row(text, widths=(WIDTH,))


def _session_title(s: dict, node: int) -> str:
    if s["kind"] == "cluster":
        who = f"local cluster (launch --up), pid {s['owner_pid']}"
    elif s["owner_pid"]:
        who = f"pid {s['owner_pid']} {s['owner_command']}".rstrip()
    else:
        who = "owner unknown"
    where = f" [{s['name']}, node {node}]"
    room = WIDTH - 1 - len("npusim session: ") - len(where)
    if len(who) > room:
        who = who[:max(0, room - 3)] + "..."
    return f"npusim session: {who}{where}"


def _blocks(doc: dict):
    """(session, node, cards of that node) in order."""
    for s in doc["sessions"]:
        for node in sorted({c["node"] for c in s["cards"]}):
            yield s, node, sorted((c for c in s["cards"] if c["node"] == node), key=lambda c: c["npu"])


def render_info(doc: dict) -> str:
    na = "N/A"
    lines = ["+" + "-" * WIDTH + "+", _wide(f"npu-smi {doc['version']} (npusim: simulated cards)    Version: {doc['version']}"),
             _rule(),
             _row("NPU   Name", "Health", f"{'Power(W)':<12}{'Temp(C)':<18}Hugepages-Usage(page)"),
             _row("Chip", "Bus-Id", f"{'AICore(%)':<12}{'Memory-Usage(MB)':<18}HBM-Usage(MB)"),
             _rule("=")]
    for s, node, cards in _blocks(doc):
        lines += [_wide(_session_title(s, node)), _rule("=")]
        for c in cards:
            hbm = f"{c['hbm_used_mb']:<4} / {c['hbm_total_mb']}" if c["health"] == "OK" else na
            lines += [_row(f"{c['npu']:<6}{c['name']}", c["health"], f"{na:<12}{na:<18}{'0    / 0'}"),
                      _row(f"{c['chip']}", na, f"{na:<12}{'0    / 0':<18}{hbm}"),
                      _rule("=")]
    widths = (WIDTHS[0], WIDTHS[1], 26, 25)
    lines += [_rule(),
              _row("NPU     Chip", "Process id", "Process name", "Process memory(MB)", widths=widths),
              _rule("=")]
    for s, node, cards in _blocks(doc):
        lines += [_wide(_session_title(s, node)), _rule("=")]
        for c in cards:
            procs = c.get("processes")
            if c["health"] != "OK":
                lines.append(_wide(f"NPU {c['npu']} does not answer ({c.get('error', '')})"))
            elif procs is None:
                lines.append(_wide(f"NPU {c['npu']}: this card is too old to list its processes"))
            elif not procs:
                lines.append(_wide(f"No running processes found in NPU {c['npu']}"))
            for p in procs or ():
                lines.append(_row(f"{c['npu']:<8}{c['chip']}", p["pid"], p["name"][:24], p["memory_mb"],
                                  widths=widths))
            lines.append(_rule("="))
    return "\n".join(lines)


def render_usages(doc: dict) -> str:
    blocks = list(_blocks(doc))
    out = []
    for s, node, cards in blocks:
        for c in cards:
            if len(blocks) > 1 or len(cards) > 1:
                out.append(f"NPU {c['npu']} — {_session_title(s, node)}")
            if c["health"] != "OK":
                items = [("Health", c["health"]), ("Error", c.get("error", ""))]
            else:
                procs = c.get("processes")
                items = [("HBM Capacity(MB)", c["hbm_total_mb"]), ("HBM Usage(MB)", c["hbm_used_mb"]),
                         ("HBM Usage Rate(%)", c["hbm_usage_percent"]),
                         ("HBM Allocated(MB)", mb(c["allocated_bytes"]) if "allocated_bytes" in c else "N/A"),
                         ("HBM Peak Usage(MB)", mb(c["peak_reserved_bytes"]) if "peak_reserved_bytes" in c else "N/A"),
                         ("Aicore Usage Rate(%)", "N/A"), ("Aicpu Usage Rate(%)", "N/A"),
                         ("Ctrlcpu Usage Rate(%)", "N/A"), ("HBM Bandwidth Usage Rate(%)", "N/A"),
                         ("Streams", c.get("streams", "N/A")),
                         ("Processes", "N/A" if procs is None else len(procs)), ("Chip ID", c["chip"])]
            out += [f"        {k:<31}: {v}" for k, v in items]
            out.append("")
    return "\n".join(out).rstrip("\n")
