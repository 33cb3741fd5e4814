"""JSON-RPC 2.0 over newline-delimited lines: framing only. Pure: no I/O.

Theory of operation
-------------------

ACP (and other stdio protocols) send one JSON-RPC 2.0 message per line. A message is one
of four shapes, told apart by its keys:

* a **request** has ``method`` and ``id``: the peer expects an answer;
* a **notification** has ``method`` and no ``id``: nobody answers it;
* a **response** has ``id`` and ``result``;
* an **error response** has ``id`` and ``error`` (``{code, message, data?}``).

:func:`encode` renders a message as one line (JSON never puts a raw newline inside a
string, so the framing is safe for any text). :func:`decode` reads one line and raises
:class:`JsonRpcError` — the one error type of this module — with the JSON-RPC code that
describes what is wrong: :data:`PARSE_ERROR` for a line that is not JSON (or too long),
:data:`INVALID_REQUEST` for JSON that is not a message. Batches (JSON arrays) are not
supported by ACP and are invalid here. The caller decides what to do with the error: a
client answers an invalid *request* with an error response, and logs everything else.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

#: The line is not JSON.
PARSE_ERROR = -32700
#: The JSON is not a valid JSON-RPC 2.0 message.
INVALID_REQUEST = -32600
#: The peer asked for a method this side does not implement.
METHOD_NOT_FOUND = -32601
#: The params of a request are not what the method takes.
INVALID_PARAMS = -32602
#: Something failed while handling a valid request.
INTERNAL_ERROR = -32603

#: Longest line :func:`decode` accepts by default (bytes of UTF-8): an agent replaying a
#: long session may send large updates, but a runaway line must not exhaust memory.
MAX_LINE_BYTES = 8 << 20

#: A request id: JSON-RPC allows strings and numbers (and null, only in error responses).
RequestId = int | str


@dataclass(frozen=True, slots=True)
class Request:
    """A call the peer must answer with a response carrying the same ``id``."""

    id: RequestId
    method: str
    params: Any = None


@dataclass(frozen=True, slots=True)
class Notification:
    """A one-way message: no answer."""

    method: str
    params: Any = None


@dataclass(frozen=True, slots=True)
class Response:
    """The successful answer to the request ``id``."""

    id: RequestId
    result: Any = None


@dataclass(frozen=True, slots=True)
class ErrorResponse:
    """The failed answer to the request ``id`` (``None`` when the request could not be read)."""

    id: RequestId | None
    code: int
    message: str
    data: Any = None


Message = Request | Notification | Response | ErrorResponse


class JsonRpcError(Exception):
    """A line that is not a valid JSON-RPC 2.0 message.

    ``code`` is the JSON-RPC error code; ``id`` the request id when one could be read, so the
    caller can answer an invalid request.
    """

    def __init__(self, code: int, message: str, *, id: RequestId | None = None) -> None:
        super().__init__(message)
        self.code = code
        self.message = message
        self.id = id


def encode(message: Message) -> bytes:
    """One message as a UTF-8 line ending in ``\\n``."""
    obj: dict[str, Any] = {"jsonrpc": "2.0"}
    if isinstance(message, Request):
        obj["id"] = message.id
        obj["method"] = message.method
        if message.params is not None:
            obj["params"] = message.params
    elif isinstance(message, Notification):
        obj["method"] = message.method
        if message.params is not None:
            obj["params"] = message.params
    elif isinstance(message, Response):
        obj["id"] = message.id
        obj["result"] = message.result
    else:
        error: dict[str, Any] = {"code": message.code, "message": message.message}
        if message.data is not None:
            error["data"] = message.data
        obj["id"] = message.id
        obj["error"] = error
    return json.dumps(obj, ensure_ascii=False, separators=(",", ":")).encode() + b"\n"


def _valid_id(value: object) -> bool:
    # bool is an int in Python, but true is no request id.
    return isinstance(value, str) or (isinstance(value, int) and not isinstance(value, bool))


def decode(line: bytes | str, *, max_bytes: int = MAX_LINE_BYTES) -> Message:
    """Read one line (with or without its newline) as a JSON-RPC 2.0 message.

    Raises :class:`JsonRpcError` with :data:`PARSE_ERROR` or :data:`INVALID_REQUEST`.
    """
    raw = line.encode() if isinstance(line, str) else line
    if len(raw) > max_bytes:
        raise JsonRpcError(PARSE_ERROR, f"line of {len(raw)} bytes is longer than the {max_bytes}-byte limit")
    try:
        obj = json.loads(raw)
    except (ValueError, RecursionError) as exc:
        raise JsonRpcError(PARSE_ERROR, f"not JSON: {exc}") from None
    if not isinstance(obj, dict):
        raise JsonRpcError(INVALID_REQUEST, f"a message is a JSON object, not {type(obj).__name__}")
    raw_id = obj.get("id")
    known_id: RequestId | None = raw_id if _valid_id(raw_id) else None
    if obj.get("jsonrpc") != "2.0":
        raise JsonRpcError(INVALID_REQUEST, f'"jsonrpc" must be "2.0", not {obj.get("jsonrpc")!r}', id=known_id)
    if "id" in obj and raw_id is not None and not _valid_id(raw_id):
        raise JsonRpcError(INVALID_REQUEST, f'"id" must be a string or an integer, not {raw_id!r}')
    if "method" in obj:
        method = obj["method"]
        if not isinstance(method, str):
            raise JsonRpcError(INVALID_REQUEST, '"method" must be a string', id=known_id)
        params = obj.get("params")
        if params is not None and not isinstance(params, dict | list):
            raise JsonRpcError(INVALID_REQUEST, '"params" must be an object or an array', id=known_id)
        if known_id is None:
            return Notification(method, params)
        return Request(known_id, method, params)
    if "result" in obj and "error" in obj:
        raise JsonRpcError(INVALID_REQUEST, 'a response has "result" or "error", not both', id=known_id)
    if "error" in obj:
        error = obj["error"]
        if (
            not isinstance(error, dict)
            or not isinstance(error.get("code"), int)
            or not isinstance(error.get("message"), str)
        ):
            raise JsonRpcError(INVALID_REQUEST, '"error" must be {"code": int, "message": str}', id=known_id)
        return ErrorResponse(known_id, error["code"], error["message"], error.get("data"))
    if "result" in obj:
        if known_id is None:
            raise JsonRpcError(INVALID_REQUEST, 'a response needs an "id"')
        return Response(known_id, obj["result"])
    raise JsonRpcError(INVALID_REQUEST, 'neither a request ("method") nor a response ("result"/"error")', id=known_id)
