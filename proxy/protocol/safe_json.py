"""JSON from outside the proxy (upstream answers, bundles): bounded nesting, parsed in small steps.

`loads` accepts what `json.loads` accepts, with two differences that matter for hostile input:

- nesting deeper than `MAX_DEPTH` levels is refused with `JSONDocumentError`, never a
  `RecursionError` (a document of 200,000 `[` made `json.loads` raise one); registry documents
  are five levels deep, and a document kept and encoded again later stays far from the
  interpreter's recursion limit;
- a document with more brackets than `MAX_DEPTH` (a big version list) is not parsed in one call
  of the C decoder: the two outer levels are walked here and each of their items is decoded on its
  own, so a thread parsing a 7.8 MB list hands the interpreter back every few milliseconds (one
  `json.loads` call holds it for the whole document, about 0.3 s here) and the event loop keeps
  answering (`proxy.services.documents` parses big documents in a worker thread).

Pure: no I/O.
"""

from __future__ import annotations

import json
import re
from typing import Any

MAX_DEPTH = 64
STEPPED_LEVELS = 2  # containers at these outer levels are walked here; the values inside, decoded whole
_DECODER = json.JSONDecoder()
_WHITESPACE = re.compile(r"[ \t\n\r]*")


class JSONDocumentError(ValueError):
    """A document that is not JSON, or is nested deeper than `MAX_DEPTH`; the message completes
    "the document …" (e.g. "is not valid JSON: …")."""


def loads(data: bytes | str) -> Any:
    """The document `data` holds (bytes in UTF-8, -16 or -32, as `json.loads` reads them)."""
    if isinstance(data, bytes | bytearray):
        try:
            text = bytes(data).decode(json.detect_encoding(data), "surrogatepass")
        except UnicodeDecodeError as exc:
            raise JSONDocumentError(f"is not valid JSON: {exc.reason}") from None
    else:
        text = data
    if text.startswith("\ufeff"):
        raise JSONDocumentError("is not valid JSON: it starts with a byte order mark")
    if text.count("[") + text.count("{") <= MAX_DEPTH:  # cannot be nested deeper: one call does it
        try:
            return json.loads(text)
        except json.JSONDecodeError as exc:
            raise JSONDocumentError(f"is not valid JSON: {exc}") from None
    start = _skip(text, 0)
    value, end = _value(text, start, 1)
    if _skip(text, end) != len(text):
        raise JSONDocumentError(f"is not valid JSON: extra data at character {_skip(text, end)}")
    return value


def _skip(text: str, index: int) -> int:
    return _WHITESPACE.match(text, index).end()


def _value(text: str, index: int, depth: int) -> tuple[Any, int]:
    """The value starting at `index`, at nesting level `depth` (the document itself is level 1)."""
    if depth <= STEPPED_LEVELS and text.startswith(("[", "{"), index):
        return _container(text, index, depth)
    value, end = _decode(text, index)
    allowed = MAX_DEPTH - depth + 1  # levels the value may have itself
    if text.count("[", index, end) + text.count("{", index, end) > allowed:  # else it cannot have more
        _check_depth(value, allowed)
    return value, end


def _decode(text: str, index: int) -> tuple[Any, int]:
    """One value decoded whole by the C decoder."""
    try:
        return _DECODER.raw_decode(text, index)
    except json.JSONDecodeError as exc:
        raise JSONDocumentError(f"is not valid JSON: {exc}") from None
    except RecursionError:
        raise JSONDocumentError(f"is nested deeper than {MAX_DEPTH} levels") from None


def _container(text: str, index: int, depth: int) -> tuple[list[Any] | dict[str, Any], int]:
    """The array or object starting at `index`, each of its items decoded by `_value`."""
    is_array = text[index] == "["
    closing = "]" if is_array else "}"
    items: list[Any] = []
    members: dict[str, Any] = {}
    index = _skip(text, index + 1)
    if text.startswith(closing, index):
        return (items if is_array else members), index + 1
    while True:
        if is_array:
            value, index = _value(text, index, depth + 1)
            items.append(value)
        else:
            if not text.startswith('"', index):
                raise JSONDocumentError(f"is not valid JSON: expected a property name at character {index}")
            name, index = _decode(text, index)
            index = _skip(text, index)
            if not text.startswith(":", index):
                raise JSONDocumentError(f"is not valid JSON: expected ':' at character {index}")
            members[name], index = _value(text, _skip(text, index + 1), depth + 1)
        index = _skip(text, index)
        if text.startswith(",", index):
            index = _skip(text, index + 1)
        elif text.startswith(closing, index):
            return (items if is_array else members), index + 1
        else:
            raise JSONDocumentError(f"is not valid JSON: expected ',' or '{closing}' at character {index}")


def _check_depth(value: Any, allowed: int) -> None:
    """Refuse `value` if it nests more than `allowed` levels of arrays and objects (walked without recursion)."""
    pending = [(value, 1)] if isinstance(value, list | dict) else []
    while pending:
        node, level = pending.pop()
        if level > allowed:
            raise JSONDocumentError(f"is nested deeper than {MAX_DEPTH} levels")
        children = node.values() if isinstance(node, dict) else node
        pending.extend((child, level + 1) for child in children if isinstance(child, list | dict))
