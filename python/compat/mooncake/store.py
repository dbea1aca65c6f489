"""MooncakeDistributedStore and ReplicateConfig over Crescent's C ABI.

Method names, positional arguments, defaults and return conventions follow
Mooncake's binding (mooncake-integration/store/store_py.cpp): calls return
0 or a negative store code instead of raising; get/get_batch return b""
for a value that cannot be read; is_exist returns 1, 0 or a code;
get_buffer returns a BufferHandle (ptr(), size(), the buffer protocol) or
None. The codes are the store's (the same numbers as Mooncake's).

setup_dummy(mem_pool_size, local_buffer_size, server_address) makes a
dummy client of a crescent-client serving --local_socket: server_address
is that socket's path, or the reference's "host:port" of the real client
with the path in $CRESCENT_LOCAL_SOCKET. alloc_from_mem_pool maps shared
memory registered with it (zero-copy put_from/get_into).

The tensor helpers (put_tensor, get_tensor, batch_put_tensor,
batch_get_tensor, get_tensor_into, put_tensor_from) store Mooncake's
tensor object format (see _tensor.py) and take torch tensors, numpy-like
arrays or plain buffers; without torch they return numpy arrays, or
memoryviews without numpy.

The tensor-parallel calls (put_tensor_with_tp, batch_put_tensor_with_tp,
pub_tensor_with_tp, batch_pub_tensor_with_tp) split a tensor along
split_dim into tp_size chunks as torch.chunk does (tp_size must come out
exactly, else INVALID_PARAMS) and store chunk r under "{key}_tp_{r}";
the get forms (get_tensor_with_tp, batch_get_tensor_with_tp,
get_tensor_with_tp_into, batch_get_tensor_with_tp_into) read the
caller's rank's key. tp_size <= 1 is the plain call. pub_tensor and its
forms are put_tensor with a ReplicateConfig, refused (INVALID_PARAMS)
when preferred_segments is given with a length other than replica_num.

Answered NOT_SUPPORTED (-1012) with a log line: the replication tasks
(create_copy_task, create_move_task, query_task: (None, -1012)) and
get_replica_desc / batch_get_replica_desc (None). Not provided: offload,
segment mounting, CUDA IPC, MooncakeHostMemAllocator.
"""

import ctypes
import logging
import os

import crescent
from crescent import StoreError, lib

from . import _tensor

__all__ = ["MooncakeDistributedStore", "ReplicateConfig", "BufferHandle"]

log = logging.getLogger("mooncake.store")

_INVALID_PARAMS = -600
_INTERNAL_ERROR = -1
_NOT_SUPPORTED = -1012


def tp_key(key, rank):
    """The key of a tensor-parallel shard, as the reference names it."""
    return f"{key}_tp_{rank}"


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
        self._dummy = False
        self._regs = {}  # register_buffer / alloc_from_mem_pool: address -> size

    def setup(self, local_hostname, metadata_server=None, global_segment_size=16 * 1024 * 1024,
              local_buffer_size=16 * 1024 * 1024, protocol="tcp", rdma_devices="",
              master_server_addr="127.0.0.1:50051", engine=None, **_ignored):
        """Connects to the master; 0 or a negative code. metadata_server
        "P2PHANDSHAKE" (or etcd://, redis://, http://) is the engine's
        metadata; protocol is a transport or comma-separated list. As in
        the reference, setup(dict) takes the same settings by name
        (local_hostname and metadata_server required); the reference's
        SSD-offload, tenant and client-HTTP settings are accepted and
        ignored."""
        if isinstance(local_hostname, dict):
            c = {k: str(v) for k, v in local_hostname.items()}
            if not c.get("local_hostname") or not c.get("metadata_server"):
                log.error("setup: local_hostname and metadata_server are required")
                return _INVALID_PARAMS
            try:
                return self.setup(c["local_hostname"], c["metadata_server"],
                                  int(c.get("global_segment_size", 16 << 20)),
                                  int(c.get("local_buffer_size", 16 << 20)), c.get("protocol", "tcp"),
                                  c.get("rdma_devices", ""), c.get("master_server_addr", "127.0.0.1:50051"))
            except ValueError as e:
                log.error("setup: %s", e)
                return _INVALID_PARAMS
        if engine is not None:
            log.error("setup: an external engine is not supported")
            return _INVALID_PARAMS
        if self._s is not None:
            self.close()
        try:
            self._dummy = False
            self._s = crescent.Store(master_server_address=master_server_addr, local_hostname=local_hostname,
                                     metadata_server=metadata_server, protocol=protocol,
                                     global_segment_size=global_segment_size,
                                     local_buffer_size=local_buffer_size, device_name=rdma_devices)
        except StoreError as e:
            log.error("setup: %s", e)
            return e.code
        return 0

    def setup_dummy(self, mem_pool_size, local_buffer_size, server_address):
        """Connects as a dummy client of the real client on this host;
        0, or -1 as the reference. mem_pool_size and local_buffer_size
        are accepted for the reference's shape (alloc_from_mem_pool maps
        memory per call; values not in it travel through the socket)."""
        path = server_address if ("/" in server_address or server_address.endswith(".sock")) \
            else os.environ.get("CRESCENT_LOCAL_SOCKET", "")
        if not path:
            log.error("setup_dummy: %r is not a socket path and CRESCENT_LOCAL_SOCKET is not set", server_address)
            return -1
        if self._s is not None:
            self.close()
        try:
            self._s = crescent.Store.dial_local(path)
        except StoreError as e:
            log.error("setup_dummy: %s", e)
            return -1
        self._dummy = True
        return 0

    def init_all(self, protocol, device_name, mount_segment_size=16 * 1024 * 1024):
        """The reference's one-call setup of a real client: this host, the
        P2P handshake, the master at $MOONCAKE_MASTER (default
        127.0.0.1:50051, the reference's fixed choice). -1 on a dummy
        client, INVALID_PARAMS when already set up."""
        if self._dummy:
            return -1
        if self._s is not None:
            log.error("init_all: client is already initialized")
            return _INVALID_PARAMS
        return self.setup("localhost", "P2PHANDSHAKE", mount_segment_size, 0, protocol, device_name,
                          os.environ.get("MOONCAKE_MASTER", "127.0.0.1:50051"))

    def alloc_from_mem_pool(self, size):
        """Address of size bytes of shared memory registered with the
        client (free it with close), or 0."""
        try:
            addr = self._store().alloc_buffer(size)
        except StoreError as e:
            log.error("alloc_from_mem_pool: %s", e)
            return 0
        self._regs[addr] = size
        return addr

    def health_check(self):
        """0 healthy, 1 not initialized or closed, 2 master unreachable."""
        if self._s is None:
            return 1
        try:
            self._s.exist("crescent/health_check")
        except StoreError as e:
            return 1 if e.code == -1010 else 2
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
        self._regs.clear()
        s, self._s = self._s, None
        if s is None:
            return 0
        try:
            s.close()
        except StoreError as e:
            return e.code
        return 0

    def get_hostname(self):
        """This client's segment name; "" for a dummy client (it has no
        segment) or before setup."""
        try:
            return self._store().hostname
        except StoreError:
            return ""

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
        rc = self._rc(lambda: self._store().register_buffer_ptr(buffer_ptr, size))
        if rc == 0:
            self._regs[buffer_ptr] = size
        return rc

    def unregister_buffer(self, buffer_ptr):
        rc = self._rc(lambda: self._store().unregister_buffer(buffer_ptr))
        if rc == 0:
            self._regs.pop(buffer_ptr, None)
        return rc

    def batch_remove(self, keys, force=False):
        try:
            res = self._store().remove_batch(keys, force)
        except StoreError as e:
            return [e.code] * len(keys)
        return [r.code if isinstance(r, StoreError) else 0 for r in res]

    # Raw-memory puts and ranged reads.

    def _region_left(self, addr):
        """Bytes from addr to the end of the registered region holding it
        (0: not in one)."""
        for base, size in self._regs.items():
            if base <= addr < base + size:
                return base + size - addr
        return 0

    def put_from_with_metadata(self, key, buffer_ptr, metadata_buffer_ptr, size, metadata_size, config=None):
        """Stores metadata then data as one value (they are joined: one
        copy); 0, a code, or -1 for prefer_alloc_in_same_node, as the
        reference."""
        cfg = config or ReplicateConfig()
        if cfg.prefer_alloc_in_same_node:
            log.error("put_from_with_metadata: prefer_alloc_in_same_node is not supported")
            return -1
        if self._s is None:
            return -1
        if size == 0:
            return 0
        v = bytearray(metadata_size + size)
        v[:metadata_size] = ctypes.string_at(metadata_buffer_ptr, metadata_size) if metadata_size else b""
        v[metadata_size:] = ctypes.string_at(buffer_ptr, size)
        return self._rc(lambda: self._store().put(key, v, cfg._crescent()))

    def batch_put_from_multi_buffers(self, keys, all_buffer_ptrs, all_sizes, config=None):
        """Key i's value is its buffers joined in order; per key 0 or a
        code ([] when not set up, as the reference)."""
        if self._s is None:
            return []
        if not (len(keys) == len(all_buffer_ptrs) == len(all_sizes)) or any(
                len(p) != len(n) for p, n in zip(all_buffer_ptrs, all_sizes)):
            return [_INVALID_PARAMS] * len(keys)
        values = [b"".join(ctypes.string_at(p, n) for p, n in zip(ps, ns)) for ps, ns in zip(all_buffer_ptrs, all_sizes)]
        cfg = (config or ReplicateConfig())._crescent()
        try:
            res = self._store().put_batch(keys, values, cfg)
        except StoreError as e:
            return [e.code] * len(keys)
        return [r.code if isinstance(r, StoreError) else 0 for r in res]

    def batch_get_into_multi_buffers(self, keys, all_buffer_ptrs, all_sizes, prefer_alloc_in_same_node=False):
        """Key i's value scattered over its buffers in order; per key the
        bytes read or a code (BUFFER_OVERFLOW when they cannot hold it)."""
        if self._s is None or not (len(keys) == len(all_buffer_ptrs) == len(all_sizes)) or any(
                len(p) != len(n) for p, n in zip(all_buffer_ptrs, all_sizes)):
            return [_INVALID_PARAMS] * len(keys)
        out = []
        for key, ps, ns in zip(keys, all_buffer_ptrs, all_sizes):
            try:
                v = self._s.get_buffer_handle(key)
            except StoreError as e:
                out.append(e.code)
                continue
            n = len(v)
            if n > sum(ns):
                out.append(-10)
                continue
            off = 0
            for p, sz in zip(ps, ns):
                k = min(sz, n - off)
                if k <= 0:
                    break
                ctypes.memmove(p, v.ptr() + off, k)
                off += k
            del v
            out.append(n)
        return out

    def get_into_ranges(self, buffer_ptrs, all_keys, all_dst_offsets, all_src_offsets, all_sizes):
        """For buffer i, key j, range k: copies value[src:src+size] to
        buffer_ptrs[i]+dst. Result [i][j][k] is the bytes copied or a
        code. Each buffer must lie in a registered region (register_buffer
        or alloc_from_mem_pool), which bounds the ranges; each key is read
        once (a zero-copy view)."""
        def fill(code):
            return [[[code] * len(r) for r in d] for d in all_dst_offsets]
        n = len(buffer_ptrs)
        if not (n == len(all_keys) == len(all_dst_offsets) == len(all_src_offsets) == len(all_sizes)):
            return fill(_INVALID_PARAMS)
        if self._s is None:
            return fill(_INVALID_PARAMS)
        views, out = {}, []
        try:
            for i in range(n):
                cap, per_key = self._region_left(buffer_ptrs[i]), []
                for j, key in enumerate(all_keys[i]):
                    dsts, srcs, sizes = all_dst_offsets[i][j], all_src_offsets[i][j], all_sizes[i][j]
                    if cap == 0 or not (len(dsts) == len(srcs) == len(sizes)):
                        per_key.append([_INVALID_PARAMS] * len(dsts))
                        continue
                    if key not in views:
                        try:
                            views[key] = self._s.get_buffer_handle(key)
                        except StoreError as e:
                            views[key] = e.code
                    v = views[key]
                    if isinstance(v, int):
                        per_key.append([v] * len(dsts))
                        continue
                    res = []
                    for d, sr, sz in zip(dsts, srcs, sizes):
                        if d + sz > cap or sr + sz > len(v):
                            res.append(_INVALID_PARAMS)
                            continue
                        if sz:
                            ctypes.memmove(buffer_ptrs[i] + d, v.ptr() + sr, sz)
                        res.append(sz)
                    per_key.append(res)
                out.append(per_key)
        finally:
            views.clear()  # releases the views
        return out

    # Tensors, in Mooncake's stored tensor format.

    def put_tensor(self, key, tensor):
        if self._s is None:
            return _INVALID_PARAMS
        try:
            v = _tensor.serialize(tensor)
        except (_tensor.TensorError, TypeError) as e:
            log.error("put_tensor %s: %s", key, e)
            return _INVALID_PARAMS
        return self._rc(lambda: self._s.put(key, v))

    def batch_put_tensor(self, keys, tensors_list):
        if self._s is None or len(keys) != len(tensors_list) or not keys:
            return [_INVALID_PARAMS] * len(keys)
        values, res = [], [0] * len(keys)
        for i, t in enumerate(tensors_list):
            try:
                values.append(_tensor.serialize(t))
            except (_tensor.TensorError, TypeError) as e:
                log.error("batch_put_tensor %s: %s", keys[i], e)
                values.append(None)
                res[i] = _INVALID_PARAMS
        todo = [i for i in range(len(keys)) if values[i] is not None]
        if todo:
            try:
                got = self._s.put_batch([keys[i] for i in todo], [values[i] for i in todo])
            except StoreError as e:
                got = [e] * len(todo)
            for i, r in zip(todo, got):
                res[i] = r.code if isinstance(r, StoreError) else 0
        return res

    def _to_tensor(self, key, buf):
        try:
            return _tensor.deserialize(buf)
        except _tensor.TensorError as e:
            log.error("tensor %s: %s", key, e)
            return None

    def get_tensor(self, key):
        """The tensor under key, or None."""
        if self._s is None:
            return None
        try:
            h = self._s.get_buffer_handle(key)
        except StoreError:
            return None
        try:
            return self._to_tensor(key, h)
        finally:
            del h

    def batch_get_tensor(self, keys):
        if self._s is None:
            return [None] * len(keys)
        try:
            res = self._s.get_batch(keys)
        except StoreError:
            return [None] * len(keys)
        return [None if isinstance(r, StoreError) else self._to_tensor(k, r) for k, r in zip(keys, res)]

    def get_tensor_into(self, key, buffer_ptr, size):
        """Reads the object into [buffer_ptr, +size) and returns the tensor
        (a copy of its data), or None."""
        if self._s is None or not buffer_ptr:
            return None
        try:
            n = self._s.get_into_ptr(key, buffer_ptr, size)
        except StoreError:
            return None
        return self._to_tensor(key, (ctypes.c_char * n).from_address(buffer_ptr))

    def put_tensor_from(self, key, buffer_ptr, size):
        """Stores the tensor object already serialized at [buffer_ptr,
        +size) (header and data, as get_tensor_into reads it)."""
        if self._s is None:
            return _INVALID_PARAMS
        try:
            _tensor.parse((ctypes.c_char * size).from_address(buffer_ptr))
        except _tensor.TensorError as e:
            log.error("put_tensor_from %s: %s", key, e)
            return _INVALID_PARAMS
        return self.put_from(key, buffer_ptr, size)

    # Tensor parallelism: chunk r of a tensor under tp_key(key, r).

    def _put_objects(self, keys, objects, config):
        """Stores serialized tensor objects in one batch; the per-key codes."""
        cfg = (config or ReplicateConfig())._crescent()
        try:
            got = self._s.put_batch(keys, objects, cfg)
        except StoreError as e:
            return [e.code] * len(keys)
        return [r.code if isinstance(r, StoreError) else 0 for r in got]

    def _put_tp(self, name, base_keys, tensors_list, config, tp_size, split_dim):
        """Splits each tensor into tp_size chunks and stores them all at
        once; the code of each base key (its first failed chunk's)."""
        res = [0] * len(base_keys)
        keys, objects, owner = [], [], []
        for i, (k, t) in enumerate(zip(base_keys, tensors_list)):
            try:
                chunks = _tensor.split(t, tp_size, split_dim)
            except (_tensor.TensorError, TypeError) as e:
                log.error("%s %s: %s", name, k, e)
                res[i] = _INVALID_PARAMS
                continue
            for r, c in enumerate(chunks):
                keys.append(tp_key(k, r))
                objects.append(c)
                owner.append(i)
        if keys:
            for i, code in zip(owner, self._put_objects(keys, objects, config)):
                if code and not res[i]:
                    res[i] = code
        return res

    def put_tensor_with_tp(self, key, tensor, tp_rank=0, tp_size=1, split_dim=0):
        if self._s is None or self._dummy:
            return _INVALID_PARAMS
        if tp_size <= 1:
            return self.put_tensor(key, tensor)
        return self._put_tp("put_tensor_with_tp", [key], [tensor], None, tp_size, split_dim)[0]

    def batch_put_tensor_with_tp(self, base_keys, tensors_list, tp_rank=0, tp_size=1, split_dim=0):
        if tp_size <= 1:
            return self.batch_put_tensor(base_keys, tensors_list)
        if self._s is None or self._dummy or len(base_keys) != len(tensors_list) or not base_keys:
            return [_INVALID_PARAMS] * len(base_keys)
        return self._put_tp("batch_put_tensor_with_tp", base_keys, tensors_list, None, tp_size, split_dim)

    def get_tensor_with_tp(self, key, tp_rank=0, tp_size=1, split_dim=0):
        return self.get_tensor(key if tp_size <= 1 else tp_key(key, tp_rank))

    def batch_get_tensor_with_tp(self, base_keys, tp_rank=0, tp_size=1):
        if tp_size <= 1:
            return self.batch_get_tensor(base_keys)
        return self.batch_get_tensor([tp_key(k, tp_rank) for k in base_keys])

    def get_tensor_with_tp_into(self, key, buffer_ptr, size, tp_rank=0, tp_size=1, split_dim=0):
        return self.get_tensor_into(key if tp_size <= 1 else tp_key(key, tp_rank), buffer_ptr, size)

    def batch_get_tensor_into(self, keys, buffer_ptrs, sizes):
        """Reads each object into its buffer and returns the tensors (None
        for those that cannot be read)."""
        if self._s is None or self._dummy or not (len(keys) == len(buffer_ptrs) == len(sizes)):
            return [None] * len(keys)
        got = self.batch_get_into(keys, buffer_ptrs, sizes)
        if isinstance(got, int):
            return [None] * len(keys)
        return [self._to_tensor(k, (ctypes.c_char * n).from_address(p)) if n > 0 else None
                for k, p, n in zip(keys, buffer_ptrs, got)]

    def batch_get_tensor_with_tp_into(self, base_keys, buffer_ptrs, sizes, tp_rank=0, tp_size=1):
        keys = base_keys if tp_size <= 1 else [tp_key(k, tp_rank) for k in base_keys]
        return self.batch_get_tensor_into(keys, buffer_ptrs, sizes)

    # pub: put_tensor with a replication config.

    @staticmethod
    def _check_config(config):
        c = config or ReplicateConfig()
        if c.preferred_segments and len(c.preferred_segments) != c.replica_num:
            log.error("preferred_segments (%d) must match replica_num (%d)", len(c.preferred_segments),
                      c.replica_num)
            return _INVALID_PARAMS
        return 0

    def pub_tensor(self, key, tensor, config=None):
        if self._s is None or self._dummy:
            return _INVALID_PARAMS
        bad = self._check_config(config)
        if bad:
            return bad
        try:
            v = _tensor.serialize(tensor)
        except (_tensor.TensorError, TypeError) as e:
            log.error("pub_tensor %s: %s", key, e)
            return _INVALID_PARAMS
        return self._put_objects([key], [v], config)[0]

    def batch_pub_tensor(self, keys, tensors_list, config=None):
        if self._s is None or self._dummy or len(keys) != len(tensors_list) or not keys or self._check_config(config):
            return [_INVALID_PARAMS] * len(keys)
        res, todo, objs = [0] * len(keys), [], []
        for i, t in enumerate(tensors_list):
            try:
                objs.append(_tensor.serialize(t))
                todo.append(i)
            except (_tensor.TensorError, TypeError) as e:
                log.error("batch_pub_tensor %s: %s", keys[i], e)
                res[i] = _INVALID_PARAMS
        if todo:
            for i, code in zip(todo, self._put_objects([keys[i] for i in todo], objs, config)):
                res[i] = code
        return res

    def pub_tensor_with_tp(self, key, tensor, config=None, tp_rank=0, tp_size=1, split_dim=0):
        if self._s is None or self._dummy:
            return _INVALID_PARAMS
        bad = self._check_config(config)
        if bad:
            return bad
        if tp_size <= 1:
            return self.pub_tensor(key, tensor, config)
        return self._put_tp("pub_tensor_with_tp", [key], [tensor], config, tp_size, split_dim)[0]

    def batch_pub_tensor_with_tp(self, base_keys, tensors_list, config=None, tp_rank=0, tp_size=1, split_dim=0):
        if tp_size <= 1:
            return self.batch_pub_tensor(base_keys, tensors_list, config)
        if (self._s is None or self._dummy or len(base_keys) != len(tensors_list) or not base_keys
                or self._check_config(config)):
            return [_INVALID_PARAMS] * len(base_keys)
        return self._put_tp("batch_pub_tensor_with_tp", base_keys, tensors_list, config, tp_size, split_dim)

    # Calls Crescent does not serve: the reference's shape, a clear code.

    def _unsupported(self, name):
        log.error("%s is not supported by Crescent's compat store (NOT_SUPPORTED %d)", name, _NOT_SUPPORTED)
        return _NOT_SUPPORTED

    def create_copy_task(self, key, targets):
        return None, self._unsupported("create_copy_task")

    def create_move_task(self, key, source, target):
        return None, self._unsupported("create_move_task")

    def query_task(self, task_id):
        return None, self._unsupported("query_task")

    def get_replica_desc(self, key):
        self._unsupported("get_replica_desc")
        return None

    def batch_get_replica_desc(self, keys):
        self._unsupported("batch_get_replica_desc")
        return None
