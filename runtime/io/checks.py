"""Argument checks shared by the MORI-IO value types: each returns the normalized value or raises a
``TypeError`` (wrong type) or ``ValueError`` (out of range) whose message names the field (``where``).

Integers are refused when they are ``bool`` or anything without ``__index__`` (floats, strings): MORI's
fields are C++ integers and a silent conversion would hide a mistake. The ranges are those of the C++
types the fields have in MORI.
"""

from __future__ import annotations

import enum
import operator

I32 = (-(2**31), 2**31 - 1)
U16 = (0, 2**16 - 1)
U32 = (0, 2**32 - 1)
U64 = (0, 2**64 - 1)


def integer(where: str, value, lo: int, hi: int) -> int:
    if type(value) is int and lo <= value <= hi:  # the common case, on every transfer's offsets
        return value
    if isinstance(value, bool) or not hasattr(type(value), "__index__"):
        raise TypeError(f"{where} must be an integer, not {type(value).__name__}")
    number = operator.index(value)
    if not lo <= number <= hi:
        raise ValueError(f"{where} must be in [{lo}, {hi}], got {number}")
    return number


def boolean(where: str, value) -> bool:
    if not isinstance(value, bool):
        raise TypeError(f"{where} must be a bool, not {type(value).__name__}")
    return value


def string(where: str, value) -> str:
    if not isinstance(value, str):
        raise TypeError(f"{where} must be a str, not {type(value).__name__}")
    try:
        value.encode("utf-8")
    except UnicodeEncodeError as exc:  # lone surrogates: msgpack could not pack the string
        raise ValueError(f"{where} is not encodable as UTF-8 ({exc.reason} at index {exc.start})") from None
    return value


def member(where: str, value, enum_type: type[enum.IntEnum]) -> enum.IntEnum:
    """A member of ``enum_type``, given as a member or its integer value."""
    if type(value) is enum_type:
        return value
    if isinstance(value, enum.Enum) and not isinstance(value, enum_type):
        raise TypeError(f"{where} must be a {enum_type.__name__}, not {type(value).__name__}")
    number = integer(where, value, *U32)
    try:
        return enum_type(number)
    except ValueError:
        allowed = ", ".join(f"{m.name}={m.value}" for m in enum_type)
        raise ValueError(f"{where}: {number} is not a {enum_type.__name__} (allowed: {allowed})") from None


def fixed_bytes(where: str, value, length: int) -> bytes:
    if not isinstance(value, (bytes, bytearray, memoryview)):
        raise TypeError(f"{where} must be bytes, not {type(value).__name__}")
    value = bytes(value)
    if len(value) != length:
        raise ValueError(f"{where} must be exactly {length} bytes, got {len(value)}")
    return value
