"""``tf.train.Example`` <-> rows, and the schema that maps features to columns.

The Example message classes are built from their descriptor with the ``protobuf`` package, so
executors that convert data need no TensorFlow. The bytes are TensorFlow's: TF parses them with
``tf.io.parse_example`` and duotf parses what TF wrote.

A :class:`Schema` is a list of :class:`Field` (name, kind ``int64``/``float``/``bytes``/``string``,
``is_list``, ``nullable``). :func:`infer_schema` reads many records, not just the first:

- a feature that is int64 in some records and float in others becomes float;
- a feature with a length other than 1 in any record is a list;
- a feature missing from any record is nullable (a null in that row);
- a feature with no value in any record (empty lists only) takes the kind its empty lists were
  written with (TF and duotf write ``int64_list {}``, ``float_list {}``, ``bytes_list {}``), and
  float where they name none or disagree; a ``bytes_as`` entry naming the column wins.

Nulls and NaN: a null (None, ``pd.NA``) is an absent feature and an absent feature reads as a null.
NaN and infinities are float values and stay so (a NaN in a string or bytes column is a null:
pandas' ``str`` dtype spells a missing string that way). An empty list is a present, empty feature and
reads as an empty list. A null inside a list has no TFRecord form and is refused.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Dict, Iterable, Iterator, List, Optional, Union

from duotf.errors import SchemaMismatchError

__all__ = ["Field", "Schema", "SchemaMismatchError", "encode_example", "decode_example",
           "infer_schema", "row_to_example", "example_to_row", "is_null", "numpy_kind"]

KINDS = ("int64", "float", "bytes", "string")


@dataclasses.dataclass(frozen=True)
class Field:
    name: str
    kind: str  # int64 | float | bytes | string
    is_list: bool = False
    nullable: bool = True

    def __post_init__(self):
        if self.kind not in KINDS:
            raise ValueError(f"Field {self.name!r}: kind {self.kind!r} is not one of {KINDS}")


Schema = List[Field]

_classes = None


def _example_classes():
    """Build Example/Features/Feature from their descriptor (tensorflow/core/example/*.proto)."""
    global _classes
    if _classes is not None:
        return _classes
    from google.protobuf import descriptor_pb2, descriptor_pool, message_factory

    F = descriptor_pb2.FieldDescriptorProto
    fdp = descriptor_pb2.FileDescriptorProto(name="duotf_example.proto", package="tensorflow",
                                             syntax="proto3")

    def message(name, *fields):
        m = fdp.message_type.add(name=name)
        for fname, number, ftype, label, type_name, packed in fields:
            f = m.field.add(name=fname, number=number, type=ftype, label=label)
            if type_name:
                f.type_name = type_name
            if packed:
                f.options.packed = True
        return m

    rep, opt = F.LABEL_REPEATED, F.LABEL_OPTIONAL
    message("BytesList", ("value", 1, F.TYPE_BYTES, rep, None, False))
    message("FloatList", ("value", 1, F.TYPE_FLOAT, rep, None, True))
    message("Int64List", ("value", 1, F.TYPE_INT64, rep, None, True))
    feature = message(
        "Feature",
        ("bytes_list", 1, F.TYPE_MESSAGE, opt, ".tensorflow.BytesList", False),
        ("float_list", 2, F.TYPE_MESSAGE, opt, ".tensorflow.FloatList", False),
        ("int64_list", 3, F.TYPE_MESSAGE, opt, ".tensorflow.Int64List", False),
    )
    feature.oneof_decl.add(name="kind")
    for f in feature.field:
        f.oneof_index = 0
    features = message("Features", ("feature", 1, F.TYPE_MESSAGE, rep, ".tensorflow.Features.FeatureEntry", False))
    entry = features.nested_type.add(name="FeatureEntry")
    entry.field.add(name="key", number=1, type=F.TYPE_STRING, label=opt)
    entry.field.add(name="value", number=2, type=F.TYPE_MESSAGE, label=opt, type_name=".tensorflow.Feature")
    entry.options.map_entry = True
    message("Example", ("features", 1, F.TYPE_MESSAGE, opt, ".tensorflow.Features", False))

    pool = descriptor_pool.DescriptorPool()
    pool.Add(fdp)
    _classes = message_factory.GetMessageClass(pool.FindMessageTypeByName("tensorflow.Example"))
    return _classes


_KIND_OF_LIST = {"int64_list": "int64", "float_list": "float", "bytes_list": "bytes"}


def decode_example(data: bytes) -> Dict[str, tuple]:
    """``{name: (kind, values)}`` of a serialized Example (kind: int64, float or bytes; None for
    a feature that holds no list at all)."""
    example = _example_classes()()
    example.ParseFromString(data)
    out: Dict[str, tuple] = {}
    for name, feature in example.features.feature.items():
        which = feature.WhichOneof("kind")
        if which is None:
            out[name] = (None, [])
        else:
            out[name] = (_KIND_OF_LIST[which], list(getattr(feature, which).value))
    return out


def encode_example(features: Dict[str, tuple]) -> bytes:
    """Serialize ``{name: (kind, values)}``; kind int64, float, bytes or string."""
    example = _example_classes()()
    fmap = example.features.feature
    for name, (kind, values) in features.items():
        if kind == "int64":
            fmap[name].int64_list.value.extend(values)
        elif kind == "float":
            fmap[name].float_list.value.extend(values)
        else:
            fmap[name].bytes_list.value.extend(
                v.encode() if isinstance(v, str) else bytes(v) for v in values
            )
    return example.SerializeToString()


# -- rows -----------------------------------------------------------------------------------
def _mismatch(field: Field, value, why: str) -> SchemaMismatchError:
    shown = repr(value)
    if len(shown) > 80:
        shown = shown[:77] + "..."
    return SchemaMismatchError(
        f"column {field.name!r} ({'list of ' if field.is_list else ''}{field.kind}"
        f"{', nullable' if field.nullable else ''}): {why}; got {shown}",
        column=field.name, expected=field.kind, value=value,
    )


def numpy_kind(v: Any) -> str:
    """The numpy kind letter of a numpy scalar ("i", "u", "f", "b"...), "" for anything else."""
    return getattr(getattr(v, "dtype", None), "kind", None) or ""


def _check_scalar(field: Field, v):
    kind = field.kind
    if v is None or is_null(v):
        raise _mismatch(field, v, "a null inside a list (a TFRecord list cannot hold one)")
    if kind == "int64":
        if isinstance(v, int):  # bool included: True is 1, as Spark's boolean maps to int64
            return int(v)
        if numpy_kind(v) in ("i", "u", "b"):
            return int(v)
        raise _mismatch(field, v, "expected an integer")
    if kind == "float":
        if isinstance(v, (int, float)) and not isinstance(v, bool):
            return float(v)
        if numpy_kind(v) in ("i", "u", "f"):
            return float(v)
        raise _mismatch(field, v, "expected a number")
    if kind == "string":
        if isinstance(v, str):
            return v
        raise _mismatch(field, v, "expected a str")
    if isinstance(v, (bytes, bytearray, memoryview, str)):
        return v
    raise _mismatch(field, v, "expected bytes")


def is_null(v: Any) -> bool:
    """None, pandas' NA or NaT; not NaN, which is a float value (stored as NaN)."""
    return v is None or type(v).__name__ in ("NAType", "NaTType")


def row_to_example(row: Dict[str, Any], schema: Schema) -> bytes:
    """Serialize one row (a mapping) as an Example; a null omits the feature."""
    features = {}
    for field in schema:
        v: Any = row.get(field.name)
        if is_null(v) or field.kind in ("string", "bytes") and isinstance(v, float) and v != v:
            # pandas' str dtype spells a missing string as NaN, which no text column can hold
            if not field.nullable:
                raise _mismatch(field, v, "a null in a non-nullable column")
            continue
        if field.is_list:
            if isinstance(v, (str, bytes)) or not hasattr(v, "__iter__"):
                raise _mismatch(field, v, "expected a list")
            values = [_check_scalar(field, x) for x in v]
        else:
            values = [_check_scalar(field, v)]
        features[field.name] = (field.kind, values)
    return encode_example(features)


def example_to_row(data: bytes, schema: Schema) -> Dict[str, Any]:
    """One row from a serialized Example, shaped by ``schema``."""
    decoded = decode_example(data)
    row: Dict[str, Any] = {}
    for field in schema:
        got = decoded.get(field.name)
        if got is None:
            if not field.nullable:
                raise _mismatch(field, None, "the feature is missing from a record")
            row[field.name] = None
            continue
        kind, values = got
        if not values:
            pass  # an empty list is an empty list of the field's kind, whatever it was written as
        elif field.kind == "float" and kind == "int64":
            values = [float(x) for x in values]
        elif field.kind == "string" and kind == "bytes":
            values = [x.decode() for x in values]
        elif field.kind != kind and not (field.kind in ("bytes", "string") and kind == "bytes"):
            raise _mismatch(field, values, f"the record holds {kind} values")
        if field.is_list:
            row[field.name] = values
        elif len(values) == 1:
            row[field.name] = values[0]
        elif not values and field.nullable:
            row[field.name] = None
        else:
            raise _mismatch(field, values, f"expected one value, the record holds {len(values)}")
    return row


def infer_schema(records: Iterable[bytes], limit: Optional[int] = 1000,
                 bytes_as: Union[str, Dict[str, str]] = "bytes") -> Schema:
    """Infer a schema from up to ``limit`` serialized Examples (all when None).

    ``bytes_as``: "bytes" (binary columns), "string" (UTF-8 text columns), or a mapping of
    column name to either (columns not named stay binary).
    """
    per_column: Dict[str, str] = dict(bytes_as) if isinstance(bytes_as, dict) else {}
    default = "bytes" if per_column else bytes_as
    for value in list(per_column.values()) + [default]:
        if value not in ("bytes", "string"):
            raise ValueError(f"bytes_as={bytes_as!r}: use 'bytes', 'string' or a dict of those")
    seen: Dict[str, dict] = {}
    count = 0
    for count, data in enumerate(records, 1):
        decoded = decode_example(data)
        for name, (kind, values) in decoded.items():
            info = seen.setdefault(name, {"kinds": set(), "empty": set(), "list": False,
                                          "present": 0})
            info["kinds" if values else "empty"].add(kind)
            info["list"] = info["list"] or len(values) != 1
            info["present"] += 1
        if limit is not None and count >= limit:
            break
    schema = []
    for name in sorted(seen):
        info = seen[name]
        kinds = info["kinds"]
        if kinds <= {"int64"} and kinds:
            kind = "int64"
        elif kinds <= {"int64", "float"} and kinds:
            kind = "float"  # int widened to float
        elif kinds == {"bytes"} or not kinds and (name in per_column or info["empty"] == {"bytes"}):
            kind = per_column.get(name, default)
        elif not kinds:  # empty lists only: the kind they were written with, else float
            kind = next(iter(info["empty"])) if len(info["empty"]) == 1 and None not in info["empty"] else "float"
        else:
            raise SchemaMismatchError(
                f"feature {name!r} holds {' and '.join(sorted(kinds))} values in different "
                "records; pass an explicit schema",
                column=name, expected=None, value=sorted(kinds),
            )
        schema.append(Field(name, kind, is_list=info["list"], nullable=info["present"] < count))
    return schema


def rows_from_records(records: Iterable[bytes], schema: Schema) -> Iterator[Dict[str, Any]]:
    for data in records:
        yield example_to_row(data, schema)
