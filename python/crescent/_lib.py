"""Loads libcrescent.so and declares the C ABI (include/crescent.h)."""

import ctypes
import os

c_void_p, c_char_p, c_int, c_int64, c_uint64, c_size_t = (
    ctypes.c_void_p, ctypes.c_char_p, ctypes.c_int, ctypes.c_int64, ctypes.c_uint64, ctypes.c_size_t)
P = ctypes.POINTER


class TransferRequest(ctypes.Structure):
    _fields_ = [("opcode", c_int), ("source", c_void_p), ("target_id", c_uint64),
                ("target_offset", c_uint64), ("length", c_uint64)]


class TransferStatus(ctypes.Structure):
    _fields_ = [("status", c_int), ("transferred_bytes", c_uint64)]


class BatchStatusC(ctypes.Structure):
    _fields_ = [("status", c_int), ("requests", c_uint64), ("completed", c_uint64),
                ("failed", c_uint64), ("timed_out", c_uint64), ("canceled", c_uint64),
                ("pending", c_uint64), ("transferred_bytes", c_uint64)]


class NotifyMsg(ctypes.Structure):
    _fields_ = [("name", c_void_p), ("msg", c_void_p)]


class ReplicateConfigC(ctypes.Structure):
    _fields_ = [("replica_num", c_int), ("with_soft_pin", c_int), ("with_hard_pin", c_int),
                ("preferred_segment", c_char_p), ("prefer_alloc_in_same_node", c_int)]


H = c_uint64  # every handle
_SIGS = {
    "crescent_last_error": (c_char_p, []),
    "crescent_last_error_code": (c_int, []),
    "crescent_abi_version": (c_int, []),
    "crescent_free": (None, [c_void_p]),
    "crescent_engine_create": (c_int, [c_char_p, c_char_p, c_char_p, P(H)]),
    "crescent_engine_destroy": (c_int, [H]),
    "crescent_engine_get_local_name": (c_int, [H, c_char_p, c_size_t]),
    "crescent_engine_register_memory": (c_int, [H, c_void_p, c_size_t, c_char_p, c_int]),
    "crescent_engine_unregister_memory": (c_int, [H, c_void_p]),
    "crescent_engine_open_segment": (c_int, [H, c_char_p, P(H)]),
    "crescent_engine_close_segment": (c_int, [H, H]),
    "crescent_engine_allocate_batch": (c_int, [H, c_size_t, P(H)]),
    "crescent_engine_free_batch": (c_int, [H, H]),
    "crescent_engine_submit": (c_int, [H, H, P(TransferRequest), c_size_t]),
    "crescent_engine_submit_with_notify": (c_int, [H, H, P(TransferRequest), c_size_t, H, c_char_p]),
    "crescent_engine_get_transfer_status": (c_int, [H, H, c_size_t, P(TransferStatus)]),
    "crescent_engine_get_batch_status": (c_int, [H, H, P(BatchStatusC)]),
    "crescent_engine_wait": (c_int, [H, H, c_int64, P(BatchStatusC)]),
    "crescent_engine_get_notifs": (c_int, [H, P(P(NotifyMsg)), P(c_size_t)]),
    "crescent_engine_free_notifs": (None, [P(NotifyMsg), c_size_t]),
    "crescent_engine_notify": (c_int, [H, H, c_char_p]),
    "crescent_engine_open_segment_no_cache": (c_int, [H, c_char_p, P(H)]),
    "crescent_engine_sync_segment_cache": (c_int, [H]),
    "crescent_engine_install_transport": (c_int, [H, c_char_p]),
    "crescent_engine_uninstall_transport": (c_int, [H, c_char_p]),
    "crescent_store_create_kv": (c_int, [P(c_char_p), P(c_char_p), c_size_t, P(H)]),
    "crescent_store_dial_local": (c_int, [c_char_p, P(H)]),
    "crescent_store_close": (c_int, [H]),
    "crescent_store_get_hostname": (c_int, [H, c_char_p, c_size_t]),
    "crescent_store_put": (c_int, [H, c_char_p, c_void_p, c_size_t, P(ReplicateConfigC)]),
    "crescent_store_put_from": (c_int, [H, c_char_p, c_void_p, c_size_t, P(ReplicateConfigC)]),
    "crescent_store_get_into": (c_int64, [H, c_char_p, c_void_p, c_size_t]),
    "crescent_store_get_buffer": (c_int, [H, c_char_p, P(H), P(c_void_p), P(c_size_t)]),
    "crescent_buffer_release": (c_int, [H]),
    "crescent_store_batch_put": (c_int, [H, P(c_char_p), P(c_void_p), P(c_size_t), c_size_t,
                                         P(ReplicateConfigC), P(c_int)]),
    "crescent_store_batch_get_into": (c_int, [H, P(c_char_p), P(c_void_p), P(c_size_t), c_size_t, P(c_int64)]),
    "crescent_store_batch_get": (c_int, [H, P(c_char_p), c_size_t, P(c_void_p), P(c_size_t), P(c_int)]),
    "crescent_store_batch_exist": (c_int, [H, P(c_char_p), c_size_t, P(c_int)]),
    "crescent_store_batch_remove": (c_int, [H, P(c_char_p), c_size_t, c_int, P(c_int)]),
    "crescent_store_exist": (c_int, [H, c_char_p]),
    "crescent_store_remove": (c_int, [H, c_char_p, c_int]),
    "crescent_store_remove_all": (c_int64, [H, c_int]),
    "crescent_store_remove_by_regex": (c_int64, [H, c_char_p, c_int]),
    "crescent_store_register_buffer": (c_int, [H, c_void_p, c_size_t]),
    "crescent_store_unregister_buffer": (c_int, [H, c_void_p]),
    "crescent_store_alloc_buffer": (c_int, [H, c_size_t, P(c_void_p)]),
    "crescent_store_free_buffer": (c_int, [H, c_void_p]),
}


def _candidates():
    env = os.environ.get("CRESCENT_LIB")
    if env:
        return [env]
    here = os.path.dirname(os.path.abspath(__file__))
    # Next to the package, then the repository's build/ (make lib).
    return [os.path.join(here, "libcrescent.so"),
            os.path.join(here, "..", "..", "build", "libcrescent.so")]


ABI_VERSION = 2  # include/crescent.h CRESCENT_ABI_VERSION


def load():
    errors = []
    for path in _candidates():
        try:
            lib = ctypes.CDLL(path)  # CDLL releases the GIL around each call
        except OSError as e:
            errors.append(f"{path}: {e}")
            continue
        for name, (res, args) in _SIGS.items():
            f = getattr(lib, name)
            f.restype, f.argtypes = res, args
        if lib.crescent_abi_version() != ABI_VERSION:
            # The structs above are this version's layout.
            raise ImportError(f"crescent: {path} has ABI version {lib.crescent_abi_version()}, this package wants {ABI_VERSION}")
        return lib
    raise ImportError("crescent: libcrescent.so not found (build it with `make lib` or set CRESCENT_LIB): "
                      + "; ".join(errors))


lib = load()
