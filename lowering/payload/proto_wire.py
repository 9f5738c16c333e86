"""A minimal protobuf wire-format reader/writer.

jaxlib serializes its Triton protos in C++ and ships no Python protobuf module, and we must both read
the proto descriptor embedded in the plugin and add a field the Python constructor cannot set
(`module_image`). Fields are kept as an ordered list so re-encoding an untouched message gives back
the same bytes.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any, NamedTuple, cast

from kernel_cache.errors import KernelCacheError

VARINT, FIXED64, LEN, FIXED32 = 0, 1, 2, 5


class Field(NamedTuple):
    number: int
    wire_type: int
    value: "int | bytes"  # int for VARINT/FIXED*, raw bytes for LEN


class WireError(KernelCacheError, ValueError):
    """The bytes are not a well-formed protobuf message."""


def read_varint(data: bytes, pos: int) -> tuple[int, int]:
    result = shift = 0
    while True:
        if pos >= len(data):
            raise WireError("truncated varint")
        byte = data[pos]
        pos += 1
        result |= (byte & 0x7F) << shift
        if not byte & 0x80:
            return result, pos
        shift += 7
        if shift > 63:
            raise WireError("varint too long")


def encode_varint(value: int) -> bytes:
    if value < 0:
        value += 1 << 64
    out = bytearray()
    while True:
        byte = value & 0x7F
        value >>= 7
        if value:
            out.append(byte | 0x80)
        else:
            out.append(byte)
            return bytes(out)


def iter_fields(data: bytes) -> Iterator[Field]:
    """Yield the top-level fields of one message; raises WireError on malformed input."""
    pos = 0
    while pos < len(data):
        tag, pos = read_varint(data, pos)
        number, wire_type = tag >> 3, tag & 7
        if number == 0:
            raise WireError("field number 0")
        value: int | bytes
        if wire_type == VARINT:
            value, pos = read_varint(data, pos)
        elif wire_type == FIXED64:
            value, pos = int.from_bytes(data[pos:pos + 8], "little"), pos + 8
        elif wire_type == FIXED32:
            value, pos = int.from_bytes(data[pos:pos + 4], "little"), pos + 4
        elif wire_type == LEN:
            length, pos = read_varint(data, pos)
            if pos + length > len(data):
                raise WireError("truncated length-delimited field")
            value, pos = data[pos:pos + length], pos + length
        else:
            raise WireError(f"unsupported wire type {wire_type}")
        if pos > len(data):
            raise WireError("truncated field")
        yield Field(number, wire_type, value)


def decode(data: bytes) -> list[Field]:
    return list(iter_fields(data))


def encode_field(field: Field) -> bytes:
    tag = encode_varint((field.number << 3) | field.wire_type)
    if field.wire_type == VARINT:
        return tag + encode_varint(cast(int, field.value))  # a VARINT field holds an int
    if field.wire_type == FIXED64:
        return tag + int(field.value).to_bytes(8, "little")
    if field.wire_type == FIXED32:
        return tag + int(field.value).to_bytes(4, "little")
    payload = bytes(field.value)
    return tag + encode_varint(len(payload)) + payload


def encode(fields: "list[Field]") -> bytes:
    return b"".join(encode_field(f) for f in fields)


def first(fields: "list[Field]", number: int, default: Any = None) -> Any:
    """The value of the first field with `number` (proto3 messages here never repeat scalars); int or
    bytes by the field's wire type, which the caller knows, hence Any."""
    for f in fields:
        if f.number == number:
            return f.value
    return default


def all_of(fields: "list[Field]", number: int) -> list[Any]:
    return [f.value for f in fields if f.number == number]
