"""How many weights a GGUF file holds, read from its header alone (no tensor data, no numpy), so a
load can say what converting it will cost before it starts (`treesearch.models.load`).

GGUF layout (little-endian): magic "GGUF", uint32 version, uint64 tensor count, uint64 key-value
count; the key-value pairs (uint64-length string key, uint32 value type, value); then per tensor
its name, uint32 dimension count, uint64 dimensions, uint32 type and uint64 offset.
"""

from __future__ import annotations

import struct
from pathlib import Path
from typing import BinaryIO

# fixed-size value types: uint8, int8, uint16, int16, uint32, int32, float32, bool, (8: string),
# (9: array), uint64, int64, float64
_SIZES = {0: 1, 1: 1, 2: 2, 3: 2, 4: 4, 5: 4, 6: 4, 7: 1, 10: 8, 11: 8, 12: 8}
_STRING, _ARRAY = 8, 9


def gguf_weights(path: str | Path) -> int:
    """The number of weights (tensor elements) in the GGUF file at `path`; ValueError if it is not one."""
    with open(path, "rb") as f:
        if f.read(4) != b"GGUF":
            raise ValueError(f"{path} is not a GGUF file")
        (version,) = _read(f, "<I")
        if version < 2:
            raise ValueError(f"{path}: GGUF version {version} is not read here (2 or later)")
        n_tensors, n_kv = _read(f, "<QQ")
        for _ in range(n_kv):
            _skip_string(f)
            _skip_value(f, _read(f, "<I")[0])
        total = 0
        for _ in range(n_tensors):
            _skip_string(f)
            (dims,) = _read(f, "<I")
            count = 1
            for d in _read(f, f"<{dims}Q"):
                count *= d
            _read(f, "<IQ")  # type, offset
            total += count
        return total


def _read(f: BinaryIO, fmt: str) -> tuple:
    size = struct.calcsize(fmt)
    data = f.read(size)
    if len(data) != size:
        raise ValueError("the GGUF header ends early")
    return struct.unpack(fmt, data)


def _skip_string(f: BinaryIO) -> None:
    (n,) = _read(f, "<Q")
    f.seek(n, 1)


def _skip_value(f: BinaryIO, kind: int) -> None:
    if kind == _STRING:
        _skip_string(f)
    elif kind == _ARRAY:
        item, n = _read(f, "<IQ")
        if item in _SIZES:
            f.seek(_SIZES[item] * n, 1)
        else:
            for _ in range(n):
                _skip_value(f, item)
    elif kind in _SIZES:
        f.seek(_SIZES[kind], 1)
    else:
        raise ValueError(f"unknown GGUF value type {kind}")
