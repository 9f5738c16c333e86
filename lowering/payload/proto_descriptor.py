"""Read the Triton proto schema that a jaxlib GPU plugin was built with, from the plugin binary itself.

The plugin's `_triton` extension embeds the serialized FileDescriptorProto of
`jaxlib/gpu/triton.proto`. Reading it tells us which fields this jaxlib understands (for example
whether `TritonKernel` has `module_image`) without comparing version strings.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from . import proto_wire as pw

PROTO_PATH = b"jaxlib/gpu/triton.proto"
# FileDescriptorProto field numbers (descriptor.proto); anything else ends the embedded blob.
_FILE_FIELDS = {1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 14}
_MESSAGE_TYPE = 4
# DescriptorProto / FieldDescriptorProto field numbers.
_MSG_NAME, _MSG_FIELD, _MSG_NESTED = 1, 2, 3
_FIELD_NAME, _FIELD_NUMBER, _FIELD_TYPE, _FIELD_TYPE_NAME = 1, 3, 5, 6


@dataclass(frozen=True)
class MessageSchema:
    """One message: field name -> (number, descriptor type, type name)."""

    name: str
    fields: dict[str, tuple[int, int, str]] = field(default_factory=dict)

    def number(self, field_name: str) -> int | None:
        entry = self.fields.get(field_name)
        return entry[0] if entry else None


def _message(raw: bytes, prefix: str, out: dict[str, MessageSchema]) -> None:
    fields = pw.decode(raw)
    name = prefix + pw.first(fields, _MSG_NAME, b"").decode()
    schema = MessageSchema(name)
    for raw_field in pw.all_of(fields, _MSG_FIELD):
        f = pw.decode(raw_field)
        schema.fields[pw.first(f, _FIELD_NAME, b"").decode()] = (
            pw.first(f, _FIELD_NUMBER, 0), pw.first(f, _FIELD_TYPE, 0),
            pw.first(f, _FIELD_TYPE_NAME, b"").decode().lstrip("."))
    out[name] = schema
    for nested in pw.all_of(fields, _MSG_NESTED):
        _message(nested, name + ".", out)


def schemas_from_binary(data: bytes) -> dict[str, MessageSchema]:
    """Messages of the embedded triton.proto descriptor, keyed by full name ("jax_triton.TritonKernel").
    Empty when the binary embeds no readable descriptor."""
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
            tag, body = pw.read_varint(data, pos)
            number, wire_type = tag >> 3, tag & 7
            if number not in _FILE_FIELDS:
                break
            if wire_type == pw.VARINT and number in (10, 11):  # unpacked dependency indices
                _, pos = pw.read_varint(data, body)
                continue
            if wire_type != pw.LEN:
                break
            length, body = pw.read_varint(data, body)
            value = data[body:body + length]
            if len(value) != length:
                break
        except pw.WireError:
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
    except (pw.WireError, UnicodeDecodeError):
        return {}
    return out
