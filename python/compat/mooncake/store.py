"""MooncakeDistributedStore and ReplicateConfig over Crescent's C ABI.

Method names, positional arguments, defaults and return conventions follow
Mooncake's binding (mooncake-integration/store/store_py.cpp): calls return
0 or a negative store code instead of raising; get/get_batch return b""
for a value that cannot be read; is_exist returns 1, 0 or a code;
get_buffer returns a BufferHandle (ptr(), size(), the buffer protocol) or
None. The codes are the store's (the same numbers as Mooncake's).

Not provided: the tensor helpers (get_tensor, put_tensor, ... need torch),
setup_dummy/init_all (Crescent's shared-memory dummy clients are Go-only),
get_into_ranges, put_from_with_metadata and batch_put_from_multi_buffers.
"""

import ctypes
import logging

import crescent
from crescent import StoreError, lib

__all__ = ["MooncakeDistributedStore", "ReplicateConfig", "BufferHandle"]

log = logging.getLogger("mooncake.store")

_INVALID_PARAMS = -600
_INTERNAL_ERROR = -1


class ReplicateConfig:
    """Mooncake's ReplicateConfig: replica_num 1, no pins, no preference."""

    def __init__(self):
        self.replica_num = 1
        self.with_soft_pin = False
        self.with_hard_pin = False
        self.preferred_segment = ""
        self.preferred_segments = []
        self.prefer_alloc_in_same_node = False

    def __repr__(self):
        return (f"ReplicateConfig(replica_num={self.replica_num}, with_soft_pin={self.with_soft_pin}, "
                f"with_hard_pin={self.with_hard_pin}, preferred_segment={self.preferred_segment!r})")

    def _crescent(self):
        pref = list(self.preferred_segments or [])
        if self.preferred_segment:
            pref.insert(0, self.preferred_segment)
        return crescent.ReplicateConfig(self.replica_num, self.with_soft_pin, self.with_hard_pin, pref,
                                        self.prefer_alloc_in_same_node)


def _code(e):
    return e.code if isinstance(e, StoreError) else _INTERNAL_ERROR


# get_buffer's BufferHandle: a ctypes array over the value (ptr(),
# size(), len(), the buffer protocol), released when its last reference
# (the handle or a memoryview of it) goes.
BufferHandle = crescent._Held


class MooncakeDistributedStore:
    def __init__(self):
        self._s = None

    def setup(self, local_hostname, metadata_server, global_segment_size=16 * 1024 * 1024,
              local_buffer_size=16 * 1024 * 1024, protocol="tcp", rdma_devices="",
              master_server_addr="127.0.0.1:50051", engine=None):
        """Connects to the master; 0 or a negative code. metadata_server
        "P2PHANDSHAKE" (or etcd://, redis://, http://) is the engine's
        metadata; protocol is a transport or comma-separated list."""
        if engine is not None:
            log.error("setup: an external engine is not supported")
            return _INVALID_PARAMS
        if self._s is not None:
            self.close()
        try:
            self._s = crescent.Store(master_server_address=master_server_addr, local_hostname=local_hostname,
                                     metadata_server=metadata_server, protocol=protocol,
                                     global_segment_size=global_segment_size,
                                     local_buffer_size=local_buffer_size, device_name=rdma_devices)
        except StoreError as e:
            log.error("setup: %s", e)
            return e.code
        return 0

    def _store(self):
        if self._s is None:
            raise StoreError(_INVALID_PARAMS, "client is not initialized")
        return self._s

    def _rc(self, f, *args):
        try:
            r = f(*args)
        except StoreError as e:
            return e.code
        return 0 if r is None else r

    def close(self):
        s, self._s = self._s, None
        if s is None:
            return 0
        try:
            s.close()
        except StoreError as e:
            return e.code
        return 0

    def get_hostname(self):
        return self._store().hostname

    def put(self, key, value, config=None):
        cfg = (config or ReplicateConfig())._crescent()
        return self._rc(lambda: self._store().put(key, value, cfg))

    def put_parts(self, key, *parts, config=None):
        return self.put(key, b"".join(bytes(p) for p in parts), config)

    def put_batch(self, keys, values, config=None):
        cfg = (config or ReplicateConfig())._crescent()
        try:
            res = self._store().put_batch(keys, values, cfg)
        except StoreError as e:
            return e.code
        for r in res:
            if isinstance(r, StoreError):
                return r.code
        return 0

    def put_from(self, key, buffer_ptr, size, config=None):
        cfg = (config or ReplicateConfig())._crescent()
        return self._rc(lambda: self._store().put_from(key, buffer_ptr, size, cfg))

    def batch_put_from(self, keys, buffer_ptrs, sizes, config=None):
        cfg = (config or ReplicateConfig())._crescent()
        if not (len(keys) == len(buffer_ptrs) == len(sizes)):
            return [_INVALID_PARAMS] * len(keys)
        views = [(ctypes.c_char * n).from_address(p) if n else b"" for p, n in zip(buffer_ptrs, sizes)]
        try:
            res = self._store().put_batch(keys, views, cfg)
        except StoreError as e:
            return [e.code] * len(keys)
        return [r.code if isinstance(r, StoreError) else 0 for r in res]

    def get(self, key):
        try:
            return self._store().get(key)
        except StoreError:
            return b""

    def get_batch(self, keys):
        try:
            res = self._store().get_batch(keys)
        except StoreError:
            return [b""] * len(keys)
        return [b"" if isinstance(r, StoreError) else r for r in res]

    def get_buffer(self, key):
        try:
            return self._store().get_buffer_handle(key)
        except StoreError:
            return None

    def batch_get_buffer(self, keys):
        return [self.get_buffer(k) for k in keys]

    def get_into(self, key, buffer_ptr, size):
        return self._rc(lambda: self._store().get_into_ptr(key, buffer_ptr, size))

    def batch_get_into(self, keys, buffer_ptrs, sizes):
        if not (len(keys) == len(buffer_ptrs) == len(sizes)):
            return [_INVALID_PARAMS] * len(keys)
        views = [(ctypes.c_char * n).from_address(p) for p, n in zip(buffer_ptrs, sizes)]
        try:
            res = self._store().get_batch_into(keys, views)
        except StoreError as e:
            return [e.code] * len(keys)
        return [r.code if isinstance(r, StoreError) else r for r in res]

    def get_size(self, key):
        """The value's size or a code (reads it: Crescent has no size-only
        query)."""
        try:
            with self._store().get_buffer(key) as mv:
                return len(mv)
        except StoreError as e:
            return e.code

    def is_exist(self, key):
        try:
            return 1 if self._store().exist(key) else 0
        except StoreError as e:
            return e.code

    def batch_is_exist(self, keys):
        try:
            res = self._store().exist_batch(keys)
        except StoreError as e:
            return [e.code] * len(keys)
        return [r.code if isinstance(r, StoreError) else int(r) for r in res]

    def remove(self, key, force=False):
        return self._rc(lambda: self._store().remove(key, force))

    def remove_by_regex(self, regex_pattern, force=False):
        return self._rc(lambda: self._store().remove_by_regex(regex_pattern, force))

    def remove_all(self, force=False):
        return self._rc(lambda: self._store().remove_all(force))

    def register_buffer(self, buffer_ptr, size):
        return self._rc(lambda: self._store().register_buffer_ptr(buffer_ptr, size))

    def unregister_buffer(self, buffer_ptr):
        return self._rc(lambda: self._store().unregister_buffer(buffer_ptr))
