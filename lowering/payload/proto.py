"""The protobuf wire format, as far as the payload needs it: a minimal reader/writer, and the Triton
proto schema a jaxlib GPU plugin was built with, read from the plugin binary itself.

jaxlib ships no Python protobuf module, and we must both read the proto descriptor embedded in the
plugin (the serialized FileDescriptorProto of `jaxlib/gpu/triton.proto`: which fields this jaxlib
understands, without comparing versions) and add a field the Python constructor cannot set
(`module_image`). Fields are kept as an ordered list so re-encoding an untouched message gives back
the same bytes. Reader and schema share this file: reading a schema is thousands of small decodes,
on a cold process's first call.
"""

from __future__ import annotations

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
    if value < 0:  # two's complement, as protobuf writes a negative int64
        value += 1 << 64
    out = bytearray()
    while value > 0x7F:
        out.append(value & 0x7F | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


def decode(data: bytes) -> list[Field]:
    """The top-level fields of one message; WireError on malformed input."""
    fields, pos = [], 0
    while pos < len(data):
        tag, pos = read_varint(data, pos)
        number, wire_type = tag >> 3, tag & 7
        if number == 0:
            raise WireError("field number 0")
        value: int | bytes
        if wire_type == VARINT:
            value, pos = read_varint(data, pos)
        elif wire_type in (FIXED64, FIXED32):
            end = pos + (8 if wire_type == FIXED64 else 4)
            value, pos = int.from_bytes(data[pos:end], "little"), end
        elif wire_type == LEN:
            length, pos = read_varint(data, pos)
            if pos + length > len(data):
                raise WireError("truncated length-delimited field")
            value, pos = data[pos:pos + length], pos + length
        else:
            raise WireError(f"unsupported wire type {wire_type}")
        if pos > len(data):
            raise WireError("truncated field")
        fields.append(Field(number, wire_type, value))
    return fields


def encode_field(field: Field) -> bytes:
    tag = encode_varint((field.number << 3) | field.wire_type)
    if field.wire_type == VARINT:
        return tag + encode_varint(cast(int, field.value))  # a VARINT field holds an int
    if field.wire_type in (FIXED64, FIXED32):
        return tag + int(field.value).to_bytes(8 if field.wire_type == FIXED64 else 4, "little")
    payload = bytes(field.value)
    return tag + encode_varint(len(payload)) + payload


def encode(fields: "list[Field]") -> bytes:
    return b"".join(encode_field(f) for f in fields)


def first(fields: "list[Field]", number: int, default: Any = None) -> Any:
    """The value of the first field with `number`: int or bytes by its wire type, which the caller knows."""
    for f in fields:
        if f.number == number:
            return f.value
    return default


def all_of(fields: "list[Field]", number: int) -> list[Any]:
    return [f.value for f in fields if f.number == number]


# The schema embedded in the plugin ----------------------------------------------------------------------
PROTO_PATH = b"jaxlib/gpu/triton.proto"
# FileDescriptorProto field numbers (descriptor.proto); anything else ends the embedded blob.
_FILE_FIELDS = {1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 14}
_MESSAGE_TYPE = 4
# DescriptorProto / FieldDescriptorProto field numbers.
_MSG_NAME, _MSG_FIELD, _MSG_NESTED = 1, 2, 3
_FIELD_NAME, _FIELD_NUMBER, _FIELD_TYPE, _FIELD_TYPE_NAME = 1, 3, 5, 6


# A message's fields: name -> (number, descriptor type, type name)
MessageSchema = dict[str, tuple[int, int, str]]


def _message(raw: bytes, prefix: str, out: dict[str, MessageSchema]) -> None:
    fields = decode(raw)
    name = prefix + first(fields, _MSG_NAME, b"").decode()
    schema = out[name] = {}
    for raw_field in all_of(fields, _MSG_FIELD):
        f = decode(raw_field)
        schema[first(f, _FIELD_NAME, b"").decode()] = (
            first(f, _FIELD_NUMBER, 0), first(f, _FIELD_TYPE, 0), first(f, _FIELD_TYPE_NAME, b"").decode().lstrip("."))
    for nested in all_of(fields, _MSG_NESTED):
        _message(nested, name + ".", out)


def schemas_from_binary(data: bytes) -> dict[str, MessageSchema]:
    """Messages of the embedded triton.proto descriptor by full name ("jax_triton.TritonKernel"); {} where none."""
    start = 0
    while (hit := data.find(PROTO_PATH, start)) >= 0:
        start = hit + 1
        begin = hit - 2  # the descriptor opens with field 1 (tag 0x0a) and a 1-byte length
        if begin < 0 or data[begin] != 0x0A or data[begin + 1] != len(PROTO_PATH):
            continue
        schemas = _parse_file_descriptor(data, begin)
        if schemas:
            return schemas
    return {}


def _parse_file_descriptor(data: bytes, begin: int) -> dict[str, MessageSchema]:
    # The blob's length is not stored next to it: read fields until one cannot belong to a
    # FileDescriptorProto (or a second `name` starts another descriptor).
    pos, package, messages, seen_name = begin, "", [], False
    while pos < len(data):
        try:
            tag, body = read_varint(data, pos)
            number, wire_type = tag >> 3, tag & 7
            if number not in _FILE_FIELDS:
                break
            if wire_type == VARINT and number in (10, 11):  # unpacked dependency indices
                _, pos = read_varint(data, body)
                continue
            if wire_type != LEN:
                break
            length, body = read_varint(data, body)
            value = data[body:body + length]
            if len(value) != length:
                break
        except WireError:
            break
        if number == 1:
            if seen_name:
                break
            seen_name = True
        elif number == 2:
            package = value.decode(errors="replace")
        elif number == _MESSAGE_TYPE:
            messages.append(value)
        pos = body + length
    out: dict[str, MessageSchema] = {}
    prefix = f"{package}." if package else ""
    try:
        for raw in messages:
            _message(raw, prefix, out)
    except (WireError, UnicodeDecodeError):
        return {}
    return out
