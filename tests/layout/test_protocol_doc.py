"""docs/protocol.md against the code: every request code and response code of
node/wire/protocol.py, every HA control frame of replication/protocol.py with the fields its
encoder writes, every HA stream frame encoder, and the fields each request's handler reads
appear in the document. A code, frame or field added to the code and not to the document
fails here. Reads source files and the enums only."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

from node.wire.protocol import RequestCode, ResponseCode

ROOT = Path(__file__).resolve().parents[2]
DOC = ROOT / "docs" / "protocol.md"
FIELD_READERS = {"int", "str", "optional_str", "bytes", "list", "str_list", "str_map", "bool", "topic", "_get"}
# where each request's fields are read: (file, class, methods); AUTH is read by the transport
HANDLERS = {
    "AUTH": ("node/server/connections.py", "ClientServer", ("_authenticate",)),
    "SEND": ("node/server/handlers.py", "RequestHandlers", ("send", "_message")),
    "PULL": ("node/server/handlers.py", "RequestHandlers", ("pull",)),
    "QUERY_BY_KEY": ("node/server/handlers.py", "RequestHandlers", ("query_by_key",)),
    "QUERY_BY_TIME": ("node/server/handlers.py", "RequestHandlers", ("query_by_time",)),
    "QUERY_BY_ID": ("node/server/handlers.py", "RequestHandlers", ("query_by_id",)),
    "QUEUE_OFFSETS": ("node/server/handlers.py", "RequestHandlers", ("queue_offsets",)),
    "COMMIT_OFFSETS": ("node/server/handlers.py", "RequestHandlers", ("commit_offsets",)),
    "QUERY_OFFSETS": ("node/server/handlers.py", "RequestHandlers", ("query_offsets",)),
    "TOPIC_CREATE": ("node/server/handlers.py", "RequestHandlers", ("topic_create",)),
    "TOPIC_LIST": ("node/server/handlers.py", "RequestHandlers", ("topic_list",)),
    "STATUS": ("node/server/handlers.py", "RequestHandlers", ("status",)),
    "LAG_HISTORY": ("node/server/lag_sampler.py", "LagSampler", ("lag_history_reply",)),
    "READ_LOG_RANGE": ("node/server/log_ranges.py", "LogRangeHandlers", ("read_log_range",)),
    "LOG_RANGE_CRCS": ("node/server/log_ranges.py", "LogRangeHandlers", ("log_range_crcs",)),
}
SENT_BY_THE_NODE = {"AUTH_CHALLENGE"}   # no handler: the node's first frame


@pytest.fixture(scope="module")
def doc() -> str:
    return DOC.read_text(encoding="utf-8")


def _sections(text: str, level: str = "####") -> dict[str, str]:
    """Each ``level`` heading's first word -> the text up to the next heading of any level."""
    sections = {}
    for match in re.finditer(rf"^{level} (\S+)[^\n]*\n(.*?)(?=^#|\Z)", text, re.M | re.S):
        sections[match.group(1)] = match.group(2)
    return sections


def test_every_request_code_has_a_row_and_a_section(doc):
    for code in RequestCode:
        assert re.search(rf"^\| {code.value} \| {code.name} \|", doc, re.M), f"no table row for request {code.name}"
        assert re.search(rf"^#### {code.name} \({code.value}\)$", doc, re.M), f"no section for request {code.name}"


def test_every_response_code_has_a_row(doc):
    responses = doc[doc.index("### Response codes"):doc.index("## HA protocol")]
    for code in ResponseCode:
        assert re.search(rf"^\| {code.value} \| {code.name} \|", responses, re.M), \
            f"no row for response code {code.name} ({code.value}) under Response codes"


def _read_fields(path: str, class_name: str, methods: tuple[str, ...]) -> set[str]:
    """The request field names the methods read: first string arguments of Fields readers
    (``f.int("offset", ...)``, ``f.topic()`` is "topic") and of ``payload.get`` / ``first.get``."""
    tree = ast.parse((ROOT / path).read_text(encoding="utf-8"))
    (owner,) = [node for node in tree.body if isinstance(node, ast.ClassDef) and node.name == class_name]
    functions = [node for node in owner.body if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef))
                 and node.name in methods]
    assert {f.name for f in functions} == set(methods), f"{class_name} lacks one of {methods}"
    names = set()
    for function in functions:
        for call in ast.walk(function):
            if not (isinstance(call, ast.Call) and isinstance(call.func, ast.Attribute)):
                continue
            attribute = call.func.attr
            first = call.args[0] if call.args else None
            literal = first.value if isinstance(first, ast.Constant) and isinstance(first.value, str) else None
            if attribute == "topic" and literal is None and isinstance(call.func.value, ast.Name) \
                    and call.func.value.id in ("f", "m"):
                names.add("topic")
            elif attribute in FIELD_READERS and literal is not None and isinstance(call.func.value, ast.Name) \
                    and call.func.value.id in ("f", "m"):
                names.add(literal)
            elif attribute == "get" and literal is not None and isinstance(call.func.value, ast.Name) \
                    and call.func.value.id in ("payload", "first", "raw"):
                names.add(literal)
    return names - {"code", "opaque"}


def test_every_request_field_a_handler_reads_is_in_its_section(doc):
    assert set(HANDLERS) | SENT_BY_THE_NODE == {code.name for code in RequestCode}, \
        "a request code without a handler listed here: add it to HANDLERS and to docs/protocol.md"
    sections = _sections(doc)
    for name, (path, class_name, methods) in HANDLERS.items():
        fields = _read_fields(path, class_name, methods)
        missing = sorted(field for field in fields if f"`{field}`" not in sections[name])
        assert not missing, f"{name}: fields {missing} read in {path} are not in its docs/protocol.md section"


def _control_frames() -> dict[str, set[str]]:
    """HA control frame type -> the keys its encoder writes (every ``encode_control({...})``
    map literal in replication/protocol.py)."""
    tree = ast.parse((ROOT / "replication" / "protocol.py").read_text(encoding="utf-8"))
    frames = {}
    for call in ast.walk(tree):
        if isinstance(call, ast.Call) and isinstance(call.func, ast.Name) and call.func.id == "encode_control" \
                and call.args and isinstance(call.args[0], ast.Dict):
            keys = [key.value for key in call.args[0].keys if isinstance(key, ast.Constant)]
            values = dict(zip(keys, call.args[0].values))
            frame_type = values["type"].value
            frames[frame_type] = set(keys) - {"type"}
    return frames


def test_every_ha_control_frame_and_its_fields_are_documented(doc):
    frames = _control_frames()
    assert {"hello", "handshake", "welcome", "refusal"} <= set(frames)   # the reader works
    sections = _sections(doc)
    for frame_type, keys in frames.items():
        section = sections.get(frame_type.upper())
        assert section is not None, f"HA control frame {frame_type!r} has no section in docs/protocol.md"
        assert f'"type": "{frame_type}"' in section
        missing = sorted(key for key in keys if not re.search(rf"(?<![\w-]){re.escape(key)}(?![\w-])", section))
        assert not missing, f"HA {frame_type.upper()}: fields {missing} are not in its section"


def _stream_encoders() -> set[str]:
    """Functions of replication/protocol.py that build a stream frame (a header or an ack)."""
    tree = ast.parse((ROOT / "replication" / "protocol.py").read_text(encoding="utf-8"))
    encoders = set()
    for function in tree.body:
        if not isinstance(function, ast.FunctionDef):
            continue
        for call in ast.walk(function):
            if isinstance(call, ast.Call) and isinstance(call.func, ast.Attribute) and call.func.attr == "pack" \
                    and isinstance(call.func.value, ast.Name) and call.func.value.id in ("DATA_HEADER", "ACK"):
                encoders.add(function.name)
    return encoders


def test_every_ha_stream_frame_encoder_is_documented(doc):
    encoders = _stream_encoders()
    assert {"data_header", "heartbeat", "confirm", "ack"} <= encoders   # the reader works
    stream = doc[doc.index("### Stream frames"):]
    for encoder in encoders:
        assert f"encoded by `{encoder}`" in stream, f"HA stream frame of {encoder}() is not in docs/protocol.md"


def test_the_confirm_frame_is_told_apart_as_documented(doc):
    from replication import protocol
    header = protocol.parse_data_header(protocol.confirm(1234))
    assert header.is_confirm and header.offset == 1234
    assert f"[confirmOffset u64][0 u32][{protocol.CONFIRM_MARK} u32]" in doc
    assert not protocol.parse_data_header(protocol.heartbeat(1234)).is_confirm
    assert "[masterMaxOffset u64][0 u32][0 u32]" in doc


def test_the_readme_links_the_protocol_reference():
    assert "docs/protocol.md" in (ROOT / "README.md").read_text(encoding="utf-8")
