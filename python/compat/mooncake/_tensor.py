"""Tensor objects in Mooncake's stored format (integration_utils.h,
TensorMetadata v1): a 304-byte little-endian header, then the tensor's
bytes in C order.

    header (40 bytes): u32 magic 0x4d4f4f4e, u16 version 1, u16 header
        size 304, i32 dtype, i32 ndim, u32 layout kind (0 full, 1 shard),
        u32 flags 0, u64 data offset (304), u64 data bytes
    layout (264 bytes): i64 global shape[8], i64 local shape[8] (unused
        dims -1), u32 axis count, u32 0, 4 axes of (i32 kind, i32 axis
        index, i32 shard rank, i32 shard count, i32 split dim, i32 0, i64 0)

Tensors in: torch tensors (CPU; moved to CPU when not), numpy-like arrays
(``dtype``, ``shape`` and the buffer protocol) and plain buffers
(memoryview, array.array, bytes: dtype from the buffer's format). Out:
torch tensors when torch imports, else numpy arrays when numpy imports,
else memoryviews cast to the format and shape (bfloat16 and float8 as
their unsigned storage, as the reference's numpy fallback does).
"""

import ctypes
import struct

MAGIC, VERSION, HEADER = 0x4D4F4F4E, 1, 304
MAX_DIMS, MAX_AXES = 8, 4
_HDR = struct.Struct("<IHHiiIIQQ")
_SHAPE = struct.Struct("<8q")
_AXES = struct.Struct("<II")
_AXIS = struct.Struct("<iiiiiiq")
assert _HDR.size + 2 * _SHAPE.size + _AXES.size + MAX_AXES * _AXIS.size == HEADER

# dtype code -> (name, element size, struct format of its storage)
DTYPES = {0: ("float32", 4, "f"), 1: ("float64", 8, "d"), 2: ("int8", 1, "b"), 3: ("uint8", 1, "B"),
          4: ("int16", 2, "h"), 5: ("uint16", 2, "H"), 6: ("int32", 4, "i"), 7: ("uint32", 4, "I"),
          8: ("int64", 8, "q"), 9: ("uint64", 8, "Q"), 10: ("bool", 1, "?"), 11: ("float16", 2, "e"),
          12: ("bfloat16", 2, "H"), 13: ("float8_e4m3fn", 1, "B"), 14: ("float8_e5m2", 1, "B")}
_BY_NAME = {v[0]: k for k, v in DTYPES.items()}
_BY_FORMAT = {"f": 0, "d": 1, "b": 2, "B": 3, "c": 3, "h": 4, "H": 5, "i": 6, "I": 7, "q": 8, "Q": 9, "?": 10,
              "e": 11}
for _f, _code in (("l", 8 if struct.calcsize("l") == 8 else 6), ("L", 9 if struct.calcsize("L") == 8 else 7)):
    _BY_FORMAT[_f] = _code


class TensorError(ValueError):
    pass


def _is_torch(t):
    return type(t).__module__.split(".")[0] == "torch"


def tensor_parts(t):
    """(dtype code, shape, memoryview of the bytes in C order, keepalive)."""
    if _is_torch(t):
        name = str(t.dtype).removeprefix("torch.")
        if name not in _BY_NAME:
            raise TensorError(f"unsupported torch dtype {t.dtype}")
        c = t.detach()
        if c.device.type != "cpu":
            c = c.cpu()
        c = c.contiguous()
        n = c.numel() * c.element_size()
        data = memoryview((ctypes.c_char * n).from_address(c.data_ptr())).cast("B") if n else memoryview(b"")
        return _BY_NAME[name], tuple(c.shape), data, c
    dt = getattr(t, "dtype", None)
    mv = memoryview(t)
    if not mv.c_contiguous:
        raise TensorError("tensor must be C-contiguous")
    if dt is not None and not isinstance(dt, str) and getattr(dt, "name", None) is not None:
        name = dt.name
        if name not in _BY_NAME:
            raise TensorError(f"unsupported dtype {name}")
        code, shape = _BY_NAME[name], tuple(t.shape)
    else:
        fmt = mv.format.lstrip("@=<")
        if fmt not in _BY_FORMAT:
            raise TensorError(f"unsupported buffer format {mv.format!r}")
        code, shape = _BY_FORMAT[fmt], tuple(mv.shape or (mv.nbytes,))
    if len(shape) > MAX_DIMS:
        raise TensorError(f"{len(shape)} dimensions: at most {MAX_DIMS}")
    return code, shape, mv.cast("B") if mv.nbytes else memoryview(b""), mv


def header(code, shape, nbytes):
    dims = list(shape) + [-1] * (MAX_DIMS - len(shape))
    return (_HDR.pack(MAGIC, VERSION, HEADER, code, len(shape), 0, 0, HEADER, nbytes) + _SHAPE.pack(*dims)
            + _SHAPE.pack(*dims) + _AXES.pack(0, 0) + bytes(MAX_AXES * _AXIS.size))


def serialize(t):
    """The stored object of tensor t (header + bytes), as bytes."""
    code, shape, data, keep = tensor_parts(t)
    out = bytearray(header(code, shape, data.nbytes))
    out += data
    del keep
    return out


def parse(buf):
    """(dtype code, local shape, data offset) of a stored tensor object,
    checked as the reference's ValidateTensorMetadata does."""
    mv = memoryview(buf).cast("B")
    if len(mv) < HEADER:
        raise TensorError(f"{len(mv)} bytes: shorter than the {HEADER}-byte tensor header")
    magic, version, hsize, code, ndim, kind, _, off, nbytes = _HDR.unpack_from(mv, 0)
    if magic != MAGIC or version != VERSION or hsize != HEADER:
        raise TensorError("not a tensor object (magic, version or header size)")
    if code not in DTYPES or not 0 <= ndim <= MAX_DIMS or kind > 1:
        raise TensorError(f"bad dtype {code}, ndim {ndim} or layout {kind}")
    gshape = _SHAPE.unpack_from(mv, _HDR.size)
    lshape = _SHAPE.unpack_from(mv, _HDR.size + _SHAPE.size)
    axis_count, _ = _AXES.unpack_from(mv, _HDR.size + 2 * _SHAPE.size)
    if axis_count > MAX_AXES or not HEADER <= off <= len(mv) or nbytes != len(mv) - off:
        raise TensorError("bad axis count, data offset or data size")
    if any(d < 0 for d in gshape[:ndim] + lshape[:ndim]) or any(d != -1 for d in gshape[ndim:] + lshape[ndim:]):
        raise TensorError("bad shape")
    n = DTYPES[code][1]
    for d in lshape[:ndim]:
        n *= d
    if n != nbytes:
        raise TensorError(f"shape {lshape[:ndim]} needs {n} bytes, the object has {nbytes}")
    return code, tuple(lshape[:ndim]), off


def _torch():
    try:
        import torch
    except ImportError:
        return None
    return torch


def _numpy():
    try:
        import numpy
    except ImportError:
        return None
    return numpy


def deserialize(buf):
    """A tensor (torch, else numpy, else memoryview) over a copy of the
    stored object's data."""
    code, shape, off = parse(buf)
    data = bytearray(memoryview(buf).cast("B")[off:])
    name, _, fmt = DTYPES[code]
    torch = _torch()
    if torch is not None:
        t = torch.frombuffer(data, dtype=getattr(torch, name)) if data else torch.empty(0, dtype=getattr(torch, name))
        return t.reshape(shape)
    np = _numpy()
    if np is not None:
        dt = {"bfloat16": "uint16", "float8_e4m3fn": "uint8", "float8_e5m2": "uint8"}.get(name, name)
        return np.frombuffer(data, dtype=dt).reshape(shape)
    mv = memoryview(data).cast(fmt)
    return mv.cast("B").cast(fmt, shape) if len(shape) > 1 and 0 not in shape else mv


def chunk_bounds(n, parts):
    """[start, end) of each chunk when n rows are split into parts as
    torch.chunk does (ceil(n / parts) rows each, the last ones shorter);
    None when that gives other than parts chunks (the reference then
    refuses the put)."""
    if parts < 1 or n < parts:
        return None
    step = -(-n // parts)
    bounds = [(s, min(s + step, n)) for s in range(0, n, step)]
    return bounds if len(bounds) == parts else None


def split(t, parts, dim):
    """The stored objects of t split along dim into parts chunks (each a
    full tensor object of its chunk's shape, C order), as the reference's
    tensor-parallel puts store them; TensorError when it cannot be."""
    code, shape, data, keep = tensor_parts(t)
    try:
        if not shape:
            raise TensorError("a 0-dimensional tensor cannot be split")
        if dim < 0:
            dim += len(shape)
        if not 0 <= dim < len(shape):
            raise TensorError(f"split dim {dim} out of range for {len(shape)} dimensions")
        bounds = chunk_bounds(shape[dim], parts)
        if bounds is None:
            raise TensorError(f"dimension {dim} of size {shape[dim]} does not split into {parts} chunks")
        outer = 1
        for d in shape[:dim]:
            outer *= d
        inner = DTYPES[code][1]
        for d in shape[dim + 1:]:
            inner *= d
        row = shape[dim] * inner
        out = []
        for s, e in bounds:
            cshape = shape[:dim] + (e - s,) + shape[dim + 1:]
            obj = bytearray(header(code, cshape, outer * (e - s) * inner))
            for o in range(outer):
                obj += data[o * row + s * inner:o * row + e * inner]
            out.append(obj)
        return out
    finally:
        del data, keep
