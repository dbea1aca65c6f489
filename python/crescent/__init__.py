"""Crescent from Python: the transfer engine and the store client over the
C ABI (libcrescent.so, include/crescent.h), with ctypes only.

The library is found through $CRESCENT_LIB, next to this package, or in
the repository's build/ (``make lib``). Values are bytes, bytearray,
memoryview or any object with the buffer protocol; writable and bytes
values are passed to the library without a copy. Every failure raises a
CrescentError subclass whose ``code`` is the numeric code of the C ABI
(the store's codes for Store, the engine's for Engine). Calls release the
GIL, so many threads may call at once. Batch calls cross into the library
once per batch.
"""

import ctypes
import threading
from collections import namedtuple

from . import _lib
from ._lib import lib

__all__ = ["CrescentError", "StoreError", "EngineError", "Store", "Engine", "ReplicateConfig",
           "BufferView", "address_of", "live_views", "READ", "WRITE", "codes"]

READ, WRITE = 0, 1
STATUS_NAMES = {0: "WAITING", 1: "PENDING", 2: "INVALID", 3: "CANCELED", 4: "COMPLETED", 5: "TIMEOUT",
                6: "FAILED"}
COMPLETED, TIMEOUT, FAILED = 4, 5, 6


class codes:
    """Store error codes (Mooncake Store's values)."""
    OK = 0
    INTERNAL_ERROR = -1
    BUFFER_OVERFLOW = -10
    SEGMENT_NOT_FOUND = -101
    NO_AVAILABLE_HANDLE = -200
    INVALID_KEY = -400
    INVALID_PARAMS = -600
    ILLEGAL_CLIENT = -601
    OBJECT_NOT_FOUND = -704
    OBJECT_ALREADY_EXISTS = -705
    OBJECT_HAS_LEASE = -706
    LEASE_EXPIRED = -707
    TRANSFER_FAIL = -800
    RPC_FAIL = -900
    RPC_TIMEOUT = -901
    UNAVAILABLE_IN_CURRENT_STATUS = -1010
    # Engine codes (Mooncake transfer engine error.h).
    ERR_INVALID_ARGUMENT = -1
    ERR_TOO_MANY_REQUESTS = -2
    ERR_ADDRESS_NOT_REGISTERED = -3
    ERR_BATCH_BUSY = -4
    ERR_ADDRESS_OVERLAPPED = -7
    ERR_QUARANTINED = -9
    ERR_SOCKET = -102
    ERR_METADATA = -200
    ERR_ENDPOINT = -201
    ERR_CONTEXT = -202
    ERR_NOT_IMPLEMENTED = -303


class CrescentError(Exception):
    """A failed call: ``code`` is the C ABI's negative code."""

    def __init__(self, code, message=""):
        super().__init__(f"{message} (code {code})" if message else f"code {code}")
        self.code = code
        self.message = message


class StoreError(CrescentError):
    pass


class EngineError(CrescentError):
    pass


def _err(cls, rc):
    return cls(rc, (lib.crescent_last_error() or b"").decode("utf-8", "replace"))


def _check(cls, rc):
    if rc < 0:
        raise _err(cls, rc)
    return rc


def _key(k):
    if isinstance(k, str):
        return k.encode()
    if isinstance(k, bytes):
        return k
    raise TypeError(f"key must be str or bytes, not {type(k).__name__}")


def _pointer(value, arg=False):
    """(address, length, keepalive) of a buffer-protocol object to read
    from, without a copy for bytes and writable buffers (a read-only
    non-bytes buffer is copied once). arg: the address may be the bytes
    object itself (ctypes passes its buffer), which is cheaper."""
    if isinstance(value, bytes):
        if arg:
            return value, len(value), value
        return ctypes.cast(ctypes.c_char_p(value), ctypes.c_void_p).value, len(value), value
    mv = memoryview(value)
    if mv.readonly:
        if not mv.c_contiguous:
            raise ValueError("value must be a C-contiguous buffer")
        b = mv.tobytes()
        return _pointer(b, arg)
    return _wpointer(mv)


def _wpointer(buf):
    """(address, length, keepalive) of a writable C-contiguous buffer, for
    the library to write into or register."""
    mv = memoryview(buf)
    if mv.readonly:
        raise TypeError(f"a writable buffer is needed, not a read-only {type(buf).__name__}")
    if not mv.c_contiguous:
        raise ValueError("buffer must be C-contiguous")
    n = mv.nbytes
    if n == 0:
        return None, 0, None
    arr = (ctypes.c_char * n).from_buffer(mv.cast("B") if mv.format != "B" or mv.ndim != 1 else mv)
    return ctypes.addressof(arr), n, arr


def address_of(buf):
    """Address of a writable buffer (mmap, bytearray, numpy array, ...)."""
    addr, _, _ = _wpointer(buf)
    return addr


class ReplicateConfig:
    """How a put places its replicas (the reference's defaults)."""

    def __init__(self, replica_num=1, with_soft_pin=False, with_hard_pin=False, preferred_segment="",
                 prefer_alloc_in_same_node=False):
        self.replica_num = replica_num
        self.with_soft_pin = with_soft_pin
        self.with_hard_pin = with_hard_pin
        self.preferred_segment = preferred_segment
        self.prefer_alloc_in_same_node = prefer_alloc_in_same_node

    def _c(self):
        pref = self.preferred_segment
        if isinstance(pref, (list, tuple)):
            pref = ",".join(pref)
        return _lib.ReplicateConfigC(int(self.replica_num), int(bool(self.with_soft_pin)),
                                     int(bool(self.with_hard_pin)), (pref or "").encode() or None,
                                     int(bool(self.prefer_alloc_in_same_node)))


def _rc(config):
    return None if config is None else ctypes.byref(config._c())


class _Held:
    """Mixin of the ctypes arrays over a zero-copy value: the library's
    view is released when the last reference goes (the array, or any
    memoryview or slice of it), so no Python object ever points at freed
    memory."""

    _h = 0

    def ptr(self):
        return ctypes.addressof(self) if len(self) else 0

    def size(self):
        return len(self)

    def __del__(self):
        h, self._h = self._h, 0
        if h:
            lib.crescent_buffer_release(h)
            with _live_lock:
                _live[0] -= 1


_live, _live_lock = [0], threading.Lock()  # views held (for tests)
_held_types = {}


def _held_type(n):
    t = _held_types.get(n)
    if t is None:
        if len(_held_types) > 4096:
            _held_types.clear()
        t = _held_types[n] = type("BufferHandle", (ctypes.c_ubyte * n, _Held), {})
    return t


def _held(h, addr, n):
    if n == 0:
        lib.crescent_buffer_release(h)
        return _held_type(0)()
    a = _held_type(n).from_address(addr)
    a._h = h
    with _live_lock:
        _live[0] += 1
    return a


def live_views():
    """How many zero-copy values are still held (released ones are not)."""
    return _live[0]


class BufferView:
    """A zero-copy view of a stored value (Store.get_buffer). Use it as a
    context manager: ``with store.get_buffer(k) as mv: ...``; the
    memoryview is released when the block ends (or at release()), and the
    library's view as soon as nothing else refers to the memory: slices
    or numpy arrays made from it keep it alive until they go."""

    def __init__(self, held):
        self._mv = memoryview(held).cast("B")
        self.size = len(held)
        self.address = held.ptr()

    @property
    def memoryview(self):
        return self._mv

    def release(self):
        self._mv.release()

    def __enter__(self):
        return self._mv

    def __exit__(self, *exc):
        self.release()

    def __len__(self):
        return self.size


def _cstrings(keys):
    arr = (ctypes.c_char_p * len(keys))()
    arr[:] = [_key(k) for k in keys]
    return arr


class Store:
    """A store client (crescent_store_*). Close it, or use it as a context
    manager."""

    def __init__(self, master_server_address="127.0.0.1:50051", local_hostname=None, metadata_server=None,
                 protocol=None, global_segment_size=0, local_buffer_size=0, master_protocol=None,
                 rpc_timeout_ms=0, device_name=None, token_file=None, admin_token_file=None,
                 tls_ca=None, tls_cert=None, tls_key=None, put_ahead_bytes=0, location_cache=0):
        # Credentials left None come from CRESCENT_TOKEN_FILE,
        # CRESCENT_ADMIN_TOKEN_FILE, CRESCENT_TLS_CA/_CERT/_KEY.
        # location_cache > 0 caches where that many objects are, so
        # repeated gets skip the master; put_ahead_bytes bounds the
        # put-ahead reservations (0: the default, 64 MiB).
        kv = {"master_server_address": master_server_address, "local_hostname": local_hostname,
              "metadata_server": metadata_server, "protocol": protocol, "device_name": device_name,
              "master_protocol": master_protocol, "global_segment_size": global_segment_size,
              "local_buffer_size": local_buffer_size, "rpc_timeout_ms": rpc_timeout_ms,
              "token_file": token_file, "admin_token_file": admin_token_file, "tls_ca": tls_ca,
              "tls_cert": tls_cert, "tls_key": tls_key, "put_ahead_bytes": put_ahead_bytes,
              "location_cache": location_cache}
        kv = {k: str(v) for k, v in kv.items() if v}  # unset: the default
        keys = (ctypes.c_char_p * len(kv))(*[k.encode() for k in kv])
        vals = (ctypes.c_char_p * len(kv))(*[v.encode() for v in kv.values()])
        h = ctypes.c_uint64()
        _check(StoreError, lib.crescent_store_create_kv(keys, vals, len(kv), ctypes.byref(h)))
        self._h = h.value
        self._regs = {}  # address -> keepalive of registered buffers
        self._allocs = {}  # address -> size of alloc_buffer memory

    @classmethod
    def dial_local(cls, path):
        """A dummy client of the real client serving the Unix socket path
        on this host (crescent-client --local_socket): the same calls,
        forwarded; get_buffer views its shared hot cache in place."""
        h = ctypes.c_uint64()
        _check(StoreError, lib.crescent_store_dial_local(path.encode(), ctypes.byref(h)))
        s = cls.__new__(cls)
        s._h, s._regs, s._allocs = h.value, {}, {}
        return s

    def close(self):
        h, self._h = self._h, 0
        if h:
            self._allocs.clear()  # unmapped by the close
            _check(StoreError, lib.crescent_store_close(h))

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    @property
    def hostname(self):
        buf = ctypes.create_string_buffer(256)
        _check(StoreError, lib.crescent_store_get_hostname(self._h, buf, 256))
        return buf.value.decode()

    def put(self, key, value, config=None):
        addr, n, keep = _pointer(value, arg=True)
        _check(StoreError, lib.crescent_store_put(self._h, _key(key), addr, n, _rc(config)))
        del keep

    def put_from(self, key, addr, size, config=None):
        """Put from raw memory (zero copy when registered)."""
        _check(StoreError, lib.crescent_store_put_from(self._h, _key(key), addr, size, _rc(config)))

    def get(self, key):
        h, p, n = self._get_buffer(key)
        try:
            return ctypes.string_at(p, n) if n else b""
        finally:
            lib.crescent_buffer_release(h)

    def get_into(self, key, buf):
        """Reads the value into a writable buffer; returns its size."""
        addr, n, keep = _wpointer(buf)
        r = _check(StoreError, lib.crescent_store_get_into(self._h, _key(key), addr, n))
        del keep
        return r

    def get_into_ptr(self, key, addr, size):
        return _check(StoreError, lib.crescent_store_get_into(self._h, _key(key), addr, size))

    def _get_buffer(self, key):
        h, p, n = ctypes.c_uint64(), ctypes.c_void_p(), ctypes.c_size_t()
        _check(StoreError, lib.crescent_store_get_buffer(self._h, _key(key), ctypes.byref(h), ctypes.byref(p),
                                                         ctypes.byref(n)))
        return h.value, p.value, n.value

    def get_buffer(self, key):
        """A zero-copy BufferView of the value (a context manager)."""
        return BufferView(self.get_buffer_handle(key))

    def get_buffer_handle(self, key):
        """The value as a ctypes array over the library's memory (buffer
        protocol, ptr(), size()); released when its last reference goes."""
        return _held(*self._get_buffer(key))

    def exist(self, key):
        return _check(StoreError, lib.crescent_store_exist(self._h, _key(key))) == 1

    def remove(self, key, force=False):
        _check(StoreError, lib.crescent_store_remove(self._h, _key(key), int(force)))

    def remove_all(self, force=False):
        return _check(StoreError, lib.crescent_store_remove_all(self._h, int(force)))

    def remove_by_regex(self, regex, force=False):
        return _check(StoreError, lib.crescent_store_remove_by_regex(self._h, regex.encode(), int(force)))

    # Batches: one call each; per item a result or a StoreError instance
    # (returned, not raised). Bad arguments of the call itself raise.

    def _items(self, codes_, ok):
        return [ok(i) if c >= 0 else StoreError(c, "") for i, c in enumerate(codes_)]

    def put_batch(self, keys, values, config=None):
        n = len(keys)
        if len(values) != n:
            raise ValueError("keys and values differ in length")
        ptrs, sizes, keep = (ctypes.c_void_p * n)(), (ctypes.c_size_t * n)(), []
        for i, v in enumerate(values):
            ptrs[i], sizes[i], k = _pointer(v)
            keep.append(k)
        res = (ctypes.c_int * n)()
        rc = lib.crescent_store_batch_put(self._h, _cstrings(keys), ptrs, sizes, n, _rc(config), res)
        self._call_failed(rc, res)
        return self._items(res, lambda i: None)

    def get_batch(self, keys):
        n = len(keys)
        vals, sizes, res = (ctypes.c_void_p * n)(), (ctypes.c_size_t * n)(), (ctypes.c_int * n)()
        rc = lib.crescent_store_batch_get(self._h, _cstrings(keys), n, vals, sizes, res)
        self._call_failed(rc, res)
        out = []
        for i in range(n):
            if res[i] == 0:
                out.append(ctypes.string_at(vals[i], sizes[i]))
                lib.crescent_free(vals[i])
            else:
                out.append(StoreError(res[i], ""))
        return out

    def get_batch_into(self, keys, bufs):
        n = len(keys)
        ptrs, caps, keep = (ctypes.c_void_p * n)(), (ctypes.c_size_t * n)(), []
        for i, b in enumerate(bufs):
            ptrs[i], caps[i], k = _wpointer(b)
            keep.append(k)
        res = (ctypes.c_int64 * n)()
        rc = lib.crescent_store_batch_get_into(self._h, _cstrings(keys), ptrs, caps, n, res)
        self._call_failed(rc, res)
        return self._items(res, lambda i: res[i])

    def exist_batch(self, keys):
        n = len(keys)
        res = (ctypes.c_int * n)()
        rc = lib.crescent_store_batch_exist(self._h, _cstrings(keys), n, res)
        self._call_failed(rc, res)
        return self._items(res, lambda i: res[i] == 1)

    def remove_batch(self, keys, force=False):
        n = len(keys)
        res = (ctypes.c_int * n)()
        rc = lib.crescent_store_batch_remove(self._h, _cstrings(keys), n, int(force), res)
        self._call_failed(rc, res)
        return self._items(res, lambda i: None)

    def _call_failed(self, rc, res):
        # A failure that no item carries is the call's own (bad arguments).
        if rc < 0 and rc not in list(res):
            raise _err(StoreError, rc)

    def register_buffer(self, buf):
        """Registers a writable buffer (kept alive until unregistered) for
        zero-copy put_from/get_into; returns its address."""
        addr, n, keep = _wpointer(buf)
        self.register_buffer_ptr(addr, n)
        self._regs[addr] = keep
        return addr

    def register_buffer_ptr(self, addr, size):
        _check(StoreError, lib.crescent_store_register_buffer(self._h, addr, size))

    def unregister_buffer(self, buf_or_addr):
        addr = buf_or_addr if isinstance(buf_or_addr, int) else address_of(buf_or_addr)
        _check(StoreError, lib.crescent_store_unregister_buffer(self._h, addr))
        self._regs.pop(addr, None)

    def alloc_buffer(self, size):
        """Shared memory registered with the client (zero-copy put_from and
        get_into, also for a dummy client): returns its address. Free it
        with free_buffer; views of it must be gone by then."""
        p = ctypes.c_void_p()
        _check(StoreError, lib.crescent_store_alloc_buffer(self._h, size, ctypes.byref(p)))
        self._allocs[p.value] = size
        return p.value

    def buffer_view(self, addr, size):
        """A writable memoryview of size bytes at addr (memory from
        alloc_buffer; it must outlive the view)."""
        return memoryview((ctypes.c_char * size).from_address(addr)).cast("B")

    def free_buffer(self, addr):
        _check(StoreError, lib.crescent_store_free_buffer(self._h, addr))
        self._allocs.pop(addr, None)


BatchStatus = namedtuple("BatchStatus", "status requests completed failed timed_out canceled pending transferred")


class Engine:
    """A transfer engine (crescent_engine_*)."""

    def __init__(self, local_server_name="127.0.0.1", metadata_server=None, protocols=None):
        h = ctypes.c_uint64()
        enc = lambda s: s.encode() if s else None  # noqa: E731
        if isinstance(protocols, (list, tuple)):
            protocols = ",".join(protocols)
        _check(EngineError, lib.crescent_engine_create(enc(metadata_server), enc(local_server_name),
                                                       enc(protocols), ctypes.byref(h)))
        self._h = h.value
        self._regs = {}

    def close(self):
        h, self._h = self._h, 0
        if h:
            _check(EngineError, lib.crescent_engine_destroy(h))

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    @property
    def name(self):
        buf = ctypes.create_string_buffer(256)
        _check(EngineError, lib.crescent_engine_get_local_name(self._h, buf, 256))
        return buf.value.decode()

    def register_memory(self, buf, location="*"):
        """Registers a writable buffer (kept alive until unregistered);
        returns its address."""
        addr, n, keep = _wpointer(buf)
        _check(EngineError, lib.crescent_engine_register_memory(self._h, addr, n, location.encode(), 1))
        self._regs[addr] = keep
        return addr

    def unregister_memory(self, buf_or_addr):
        addr = buf_or_addr if isinstance(buf_or_addr, int) else address_of(buf_or_addr)
        _check(EngineError, lib.crescent_engine_unregister_memory(self._h, addr))
        self._regs.pop(addr, None)

    def open_segment(self, name, cache=True):
        """A segment handle; cache=False fetches its descriptor now even
        when it is open already."""
        s = ctypes.c_uint64()
        f = lib.crescent_engine_open_segment if cache else lib.crescent_engine_open_segment_no_cache
        _check(EngineError, f(self._h, name.encode(), ctypes.byref(s)))
        return s.value

    def sync_segment_cache(self):
        """Fetches every opened segment's descriptor again."""
        _check(EngineError, lib.crescent_engine_sync_segment_cache(self._h))

    def notify(self, seg, msg):
        """Sends msg to an opened segment now, with no batch."""
        _check(EngineError, lib.crescent_engine_notify(self._h, seg, msg.encode()))

    def install_transport(self, proto):
        """Starts transport proto on the live engine and republishes its
        descriptor; a running one is left as it is."""
        _check(EngineError, lib.crescent_engine_install_transport(self._h, proto.encode()))

    def uninstall_transport(self, proto):
        """Stops transport proto: requests it carried fail, later ones only
        it could carry raise EngineError (ERR_ENDPOINT) naming it."""
        _check(EngineError, lib.crescent_engine_uninstall_transport(self._h, proto.encode()))

    def close_segment(self, seg):
        _check(EngineError, lib.crescent_engine_close_segment(self._h, seg))

    def allocate_batch(self, size):
        b = ctypes.c_uint64()
        _check(EngineError, lib.crescent_engine_allocate_batch(self._h, size, ctypes.byref(b)))
        return b.value

    def free_batch(self, batch):
        _check(EngineError, lib.crescent_engine_free_batch(self._h, batch))

    def submit(self, batch, requests, notify=None):
        """requests: (opcode, local_address, segment, remote_address, length)
        tuples; notify: optional (segment, message) sent once they complete."""
        arr = (_lib.TransferRequest * len(requests))(*[_lib.TransferRequest(*r) for r in requests])
        if notify is None:
            rc = lib.crescent_engine_submit(self._h, batch, arr, len(requests))
        else:
            rc = lib.crescent_engine_submit_with_notify(self._h, batch, arr, len(requests), notify[0],
                                                        notify[1].encode())
        _check(EngineError, rc)

    def status(self, batch, task):
        st = _lib.TransferStatus()
        _check(EngineError, lib.crescent_engine_get_transfer_status(self._h, batch, task, ctypes.byref(st)))
        return st.status, st.transferred_bytes

    def _bs(self, st):
        return BatchStatus(st.status, st.requests, st.completed, st.failed, st.timed_out, st.canceled,
                           st.pending, st.transferred_bytes)

    def batch_status(self, batch):
        st = _lib.BatchStatusC()
        _check(EngineError, lib.crescent_engine_get_batch_status(self._h, batch, ctypes.byref(st)))
        return self._bs(st)

    def wait(self, batch, timeout=None):
        """Waits up to timeout seconds (None: the engine's transfer
        timeout); returns a BatchStatus saying how the batch ended."""
        ms = -1 if timeout is None else int(timeout * 1000)
        st = _lib.BatchStatusC()
        _check(EngineError, lib.crescent_engine_wait(self._h, batch, ms, ctypes.byref(st)))
        return self._bs(st)

    def notifications(self):
        p, n = ctypes.POINTER(_lib.NotifyMsg)(), ctypes.c_size_t()
        _check(EngineError, lib.crescent_engine_get_notifs(self._h, ctypes.byref(p), ctypes.byref(n)))
        out = [(ctypes.string_at(p[i].name).decode(), ctypes.string_at(p[i].msg).decode())
               for i in range(n.value)]
        if n.value:
            lib.crescent_engine_free_notifs(p, n)
        return out
