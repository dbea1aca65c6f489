"""The Mooncake drop-in, driven the way vLLM's Mooncake store connector
(vllm/distributed/kv_transfer/kv_lookup_buffer/mooncake_store.py and the
v1 MooncakeStoreConnector) and SGLang's HiCache backend call it: a config,
setup() with seven positional arguments, then put/get/is_exist/remove,
batches through registered buffers, and close(). Runs in a subprocess with
PYTHONPATH=python/compat, as a user would."""

import os
import subprocess
import sys
import unittest

from harness import PYTHON, Cluster

SCRIPT = r'''
import ctypes, json, mmap, os
from dataclasses import dataclass

from mooncake.store import MooncakeDistributedStore, ReplicateConfig


@dataclass
class MooncakeStoreConfig:  # the connector's config, from its JSON file
    local_hostname: str
    metadata_server: str
    global_segment_size: int
    local_buffer_size: int
    protocol: str
    device_name: str
    master_server_address: str

    @staticmethod
    def from_file(path):
        with open(path) as f:
            c = json.load(f)
        return MooncakeStoreConfig(c.get("local_hostname"), c.get("metadata_server"),
                                   c.get("global_segment_size", 3355443200), c.get("local_buffer_size", 1073741824),
                                   c.get("protocol", "tcp"), c.get("device_name", ""),
                                   c.get("master_server_address"))


cfg_path = os.environ["MOONCAKE_CONFIG_PATH"]
config = MooncakeStoreConfig.from_file(cfg_path)
store = MooncakeDistributedStore()
rc = store.setup(config.local_hostname, config.metadata_server, config.global_segment_size,
                 config.local_buffer_size, config.protocol, config.device_name, config.master_server_address)
assert rc == 0, rc
assert store.get_hostname().startswith("127.0.0.1:")

# kv_lookup_buffer: put bytes, get bytes, b"" when missing.
value = os.urandom(1 << 20)
assert store.put("vllm/k0", value) == 0
assert store.put("vllm/k0", value) == -705  # OBJECT_ALREADY_EXISTS
assert store.get("vllm/k0") == value
assert store.get("vllm/missing") == b""
assert store.is_exist("vllm/k0") == 1 and store.is_exist("vllm/missing") == 0
assert store.get_size("vllm/k0") == len(value) and store.get_size("vllm/missing") == -704

# ReplicateConfig as the connectors build it.
rep = ReplicateConfig()
rep.replica_num = 1
rep.with_soft_pin = True
assert store.put("vllm/pinned", b"p" * 4096, rep) == 0
assert store.put_batch(["vllm/b0", "vllm/b1"], [b"0" * 4096, b"1" * 4096], rep) == 0
assert store.get_batch(["vllm/b0", "vllm/missing", "vllm/b1"]) == [b"0" * 4096, b"", b"1" * 4096]
assert store.batch_is_exist(["vllm/b0", "vllm/missing"]) == [1, 0]

# v1 connector: a registered KV buffer, batch_put_from / batch_get_into by address.
kv = mmap.mmap(-1, 8 << 20)
base = ctypes.addressof(ctypes.c_char.from_buffer(kv))
assert store.register_buffer(base, 8 << 20) == 0
block = 64 << 10
for i in range(8):
    kv[i * block:(i + 1) * block] = bytes([i]) * block
keys = [f"vllm/blk{i}" for i in range(8)]
assert store.batch_put_from(keys, [base + i * block for i in range(8)], [block] * 8) == [0] * 8
out = 4 << 20
assert store.batch_get_into(keys + ["vllm/missing"], [base + out + i * block for i in range(9)],
                            [block] * 9) == [block] * 8 + [-704]
assert kv[out:out + 8 * block] == kv[:8 * block]
assert store.put_from("vllm/one", base, block) == 0
assert store.get_into("vllm/one", base + out, block) == block
assert store.get_into("vllm/one", base + out, 16) == -10  # BUFFER_OVERFLOW

# Zero copy: a BufferHandle with ptr(), size() and the buffer protocol.
h = store.get_buffer("vllm/k0")
assert h.size() == len(value) == len(h) and h.ptr() != 0
assert bytes(memoryview(h)[:32]) == value[:32]
assert ctypes.string_at(h.ptr(), 16) == value[:16]
del h
assert store.get_buffer("vllm/missing") is None

# Reads grant a lease (10 s by default): removing a key just read is refused,
# as in the reference; keys only written are removed.
assert store.remove("vllm/k0") == -706  # OBJECT_HAS_LEASE
assert store.remove("vllm/pinned") == 0 and store.remove("vllm/pinned") == -704
assert store.put_batch([f"vllm/r{i}" for i in range(4)], [b"r"] * 4) == 0
assert store.remove_by_regex("^vllm/r[0-3]$") == 4
assert store.remove_all() == 0  # all that is left is leased
assert store.unregister_buffer(base) == 0
assert store.close() == 0 and store.close() == 0
print("compat: ok")
'''


class MooncakeCompatTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.cluster = Cluster(clients=0)

    @classmethod
    def tearDownClass(cls):
        cls.cluster.stop()

    def test_vllm_style_script(self):
        import json
        import tempfile
        with tempfile.NamedTemporaryFile("w", suffix=".json", delete=False) as f:
            json.dump({"local_hostname": "127.0.0.1", "metadata_server": "P2PHANDSHAKE",
                       "global_segment_size": 64 << 20, "local_buffer_size": 32 << 20, "protocol": "tcp",
                       "device_name": "", "master_server_address": self.cluster.master}, f)
        try:
            env = dict(os.environ, PYTHONPATH=os.pathsep.join([os.path.join(PYTHON, "compat"), PYTHON]),
                       MOONCAKE_CONFIG_PATH=f.name)
            p = subprocess.run([sys.executable, "-c", SCRIPT], capture_output=True, text=True, timeout=120, env=env)
        finally:
            os.unlink(f.name)
        self.assertEqual(p.returncode, 0, p.stdout + p.stderr)
        self.assertIn("compat: ok", p.stdout)

    def test_setup_failure_returns_a_code(self):
        env = dict(os.environ, PYTHONPATH=os.pathsep.join([os.path.join(PYTHON, "compat"), PYTHON]))
        script = ("from mooncake.store import MooncakeDistributedStore\n"
                  "s = MooncakeDistributedStore()\n"
                  "print(s.setup('127.0.0.1', 'P2PHANDSHAKE', 0, 1 << 20, 'tcp', '', 'bad address'))\n"
                  "print(s.get('k') == b'', s.put('k', b'v'), s.close())\n")
        p = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60, env=env)
        self.assertEqual(p.stdout.split(), ["-600", "True", "-600", "0"], p.stderr)


if __name__ == "__main__":
    unittest.main()
