"""The rest of the Mooncake drop-in, each driven by a script written the
way vLLM's and SGLang's Mooncake connectors call it, in a subprocess with
PYTHONPATH=python/compat: the tensor helpers (over plain buffers here;
torch is used when it imports, and its test is skipped when it does not),
setup_dummy against a real crescent-client --local_socket process,
init_all, get_into_ranges, put_from_with_metadata and
batch_put_from_multi_buffers."""

import os
import subprocess
import sys
import tempfile
import unittest

from harness import PYTHON, Cluster

PRELUDE = r'''
import array, ctypes, mmap, os, struct
from mooncake.store import MooncakeDistributedStore, ReplicateConfig
MASTER = os.environ["MASTER"]

def real_store():
    s = MooncakeDistributedStore()
    assert s.setup("127.0.0.1", "P2PHANDSHAKE", 64 << 20, 32 << 20, "tcp", "", MASTER) == 0
    return s

def registered(s, n):
    m = mmap.mmap(-1, n)
    base = ctypes.addressof(ctypes.c_char.from_buffer(m))
    assert s.register_buffer(base, n) == 0
    return m, base
'''

TENSORS = PRELUDE + r'''
store = real_store()
# put_tensor / get_tensor as a connector stores a KV block: 2-D float32.
t = memoryview(array.array("f", [float(i) for i in range(4 * 256)])).cast("B").cast("f", (4, 256))
assert store.put_tensor("t/kv0", t) == 0
got = store.get_tensor("t/kv0")
assert got.shape == (4, 256) and got.format == "f" and got.tolist() == t.tolist()
assert store.get_tensor("t/missing") is None
assert store.put_tensor("t/kv0", t) == -705  # OBJECT_ALREADY_EXISTS
assert store.put_tensor("t/bad", object()) == -600

# The stored object is Mooncake's: a 304-byte header, then the bytes.
raw = store.get("t/kv0")
magic, version, hsize, dtype, ndim = struct.unpack_from("<IHHii", raw)
assert (magic, version, hsize, dtype, ndim) == (0x4D4F4F4E, 1, 304, 0, 2) and len(raw) == 304 + 4 * 256 * 4
assert struct.unpack_from("<QQ", raw, 24) == (304, 4 * 256 * 4)
assert raw[304:] == t.tobytes()

# Batches, one bad item among good ones; every dtype the buffer protocol has.
vals = [memoryview(array.array(c, range(16))) for c in "bBhHiIqQ"] + [memoryview(array.array("d", [0.5] * 8))]
keys = [f"t/b{i}" for i in range(len(vals))]
assert store.batch_put_tensor(keys + ["t/bad2"], vals + [3]) == [0] * len(vals) + [-600]
out = store.batch_get_tensor(keys + ["t/missing"])
assert [o.tolist() for o in out[:-1]] == [v.tolist() for v in vals] and out[-1] is None
assert store.batch_put_tensor([], []) == []

# get_tensor_into a registered buffer; put_tensor_from the same layout.
m, base = registered(store, 1 << 20)
g = store.get_tensor_into("t/kv0", base, 1 << 20)
assert g.tolist() == t.tolist()
assert store.put_tensor_from("t/copy", base, len(raw)) == 0
assert store.get_tensor("t/copy").tolist() == t.tolist()
assert store.put_tensor_from("t/junk", base + 8, 400) == -600
assert store.close() == 0
print("tensors: ok")
'''

TORCH = PRELUDE + r'''
import torch
store = real_store()
t = torch.arange(0, 1024, dtype=torch.bfloat16).reshape(4, 256)
assert store.put_tensor("torch/kv", t) == 0
g = store.get_tensor("torch/kv")
assert g.dtype == torch.bfloat16 and torch.equal(g, t)
assert store.batch_put_tensor(["torch/a", "torch/b"], [t, t.float()]) == [0, 0]
a, b = store.batch_get_tensor(["torch/a", "torch/b"])
assert torch.equal(a, t) and torch.equal(b, t.float())
store.close()
print("torch: ok")
'''

RAW = PRELUDE + r'''
store = real_store()
m, base = registered(store, 4 << 20)
# put_from_with_metadata: the value is the metadata, then the data.
m[0:16] = b"M" * 16
m[4096:4096 + 65536] = os.urandom(65536)
assert store.put_from_with_metadata("raw/a", base + 4096, base, 65536, 16) == 0
assert store.get("raw/a") == b"M" * 16 + m[4096:4096 + 65536]
assert store.put_from_with_metadata("raw/z", base, base, 0, 16) == 0 and store.is_exist("raw/z") == 0
rc = ReplicateConfig(); rc.prefer_alloc_in_same_node = True
assert store.put_from_with_metadata("raw/n", base, base, 16, 16, rc) == -1

# batch_put_from_multi_buffers: key i is its buffers joined (layers of a block).
layers = [[base + 65536 * (2 + 2 * i), base + 65536 * (3 + 2 * i)] for i in range(3)]
for ps in layers:
    for p in ps:
        ctypes.memmove(p, os.urandom(1024), 1024)
sizes = [[1024, 512]] * 3
assert store.batch_put_from_multi_buffers(["raw/m0", "raw/m1", "raw/m2"], layers, sizes) == [0, 0, 0]
for i, ps in enumerate(layers):
    assert store.get(f"raw/m{i}") == ctypes.string_at(ps[0], 1024) + ctypes.string_at(ps[1], 512)
assert store.batch_put_from_multi_buffers(["raw/x"], layers[:1], [[1]]) == [-600]
dst = [[base + (3 << 20), base + (3 << 20) + 4096]]
assert store.batch_get_into_multi_buffers(["raw/m1", "raw/missing"], dst * 2, [[1000, 1000]] * 2) == [1536, -704]
assert ctypes.string_at(dst[0][0], 1000) + ctypes.string_at(dst[0][1], 536) == store.get("raw/m1")
assert store.batch_get_into_multi_buffers(["raw/m1"], dst, [[1000, 100]]) == [-10]

# setup(dict), the reference's other form.
s2 = MooncakeDistributedStore()
assert s2.setup({"local_hostname": "127.0.0.1", "metadata_server": "P2PHANDSHAKE", "global_segment_size": 0,
                 "master_server_addr": MASTER, "tenant_id": "default"}) == 0
assert s2.get("raw/m1") == store.get("raw/m1") and s2.close() == 0
assert s2.setup({"local_hostname": "127.0.0.1"}) == -600

# get_into_ranges: ranges of values scattered into registered buffers.
out = base + (2 << 20)
v = store.get("raw/m0")
res = store.get_into_ranges([out, out + 8192], [["raw/m0", "raw/missing"], ["raw/m1"]],
                            [[[0, 100], [0]], [[0]]], [[[10, 1000], [0]], [[1500]]],
                            [[[50, 24], [5]], [[36]]])
assert res == [[[50, 24], [-704]], [[36]]], res
assert m[2 << 20:(2 << 20) + 50] == v[10:60] and m[(2 << 20) + 100:(2 << 20) + 124] == v[1000:1024]
assert m[(2 << 20) + 8192:(2 << 20) + 8192 + 36] == store.get("raw/m1")[1500:1536]
# Out of the value, out of the registered region, an unregistered buffer.
res = store.get_into_ranges([out, base + (4 << 20) - 10, ctypes.addressof(ctypes.create_string_buffer(64))],
                            [["raw/m0"], ["raw/m0"], ["raw/m0"]], [[[0]], [[0]], [[0]]], [[[1500]], [[0]], [[0]]],
                            [[[100]], [[20]], [[8]]])
assert res == [[[-600]], [[-600]], [[-600]]], res
assert store.get_into_ranges([out], [], [], [], []) == []  # top-level size mismatch
assert store.batch_remove(["raw/a", "raw/missing"]) == [-706, -704]
assert store.batch_remove(["raw/a"], force=True) == [0]
assert store.health_check() == 0
assert store.close() == 0 and store.health_check() == 1
print("raw: ok")
'''

DUMMY = PRELUDE + r'''
# SGLang/vLLM's dummy mode: the inference process is a dummy client of a
# crescent-client on this host; setup_dummy(mem_pool_size, local_buffer_size, server_address).
store = MooncakeDistributedStore()
assert store.setup_dummy(64 << 20, 16 << 20, "127.0.0.1:50052") == 0  # the socket from $CRESCENT_LOCAL_SOCKET
assert store.init_all("tcp", "") == -1  # a dummy cannot set up a real client
assert store.get_hostname() == ""  # no segment of its own
v = os.urandom(256 << 10)
assert store.put("dummy/a", v) == 0 and store.get("dummy/a") == v
assert store.is_exist("dummy/a") == 1 and store.batch_is_exist(["dummy/a", "dummy/none"]) == [1, 0]
addr = store.alloc_from_mem_pool(1 << 20)
assert addr != 0
ctypes.memmove(addr, v, len(v))
assert store.put_from("dummy/zc", addr, len(v)) == 0
assert store.get_into("dummy/zc", addr + len(v), len(v)) == len(v)
assert ctypes.string_at(addr + len(v), len(v)) == v
h = store.get_buffer("dummy/a")
assert bytes(memoryview(h)) == v
del h
assert store.get_into_ranges([addr], [["dummy/a"]], [[[0]]], [[[100]]], [[[64]]]) == [[[64]]]
assert ctypes.string_at(addr, 64) == v[100:164]
assert store.put_tensor("dummy/t", memoryview(array.array("i", range(100)))) == 0
assert store.get_tensor("dummy/t").tolist() == list(range(100))
assert store.remove("dummy/a", True) == 0
assert store.close() == 0

bad = MooncakeDistributedStore()
os.environ.pop("CRESCENT_LOCAL_SOCKET")
assert bad.setup_dummy(0, 0, "127.0.0.1:50052") == -1
assert bad.setup_dummy(0, 0, "/nonexistent/dir/c.sock") == -1
print("dummy: ok")
'''

INIT_ALL = PRELUDE + r'''
store = MooncakeDistributedStore()
assert store.init_all("tcp", "", 16 << 20) == 0  # the master from $MOONCAKE_MASTER
assert store.init_all("tcp", "") == -600  # already set up
assert store.put("init/a", b"x" * 1000) == 0 and store.get("init/a") == b"x" * 1000
assert store.close() == 0
print("init_all: ok")
'''


class CompatScriptsTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.dir = tempfile.TemporaryDirectory()
        cls.sock = os.path.join(cls.dir.name, "real.sock")
        cls.cluster = Cluster(clients=1, client_args=["--local_socket", cls.sock])

    @classmethod
    def tearDownClass(cls):
        cls.cluster.stop()
        cls.dir.cleanup()

    def run_script(self, script, marker, **env):
        e = dict(os.environ, PYTHONPATH=os.pathsep.join([os.path.join(PYTHON, "compat"), PYTHON]),
                 MASTER=self.cluster.master, **env)
        p = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120, env=e)
        self.assertEqual(p.returncode, 0, p.stdout + p.stderr)
        self.assertIn(marker, p.stdout)

    def test_tensors(self):
        self.run_script(TENSORS, "tensors: ok")

    def test_tensors_torch(self):
        try:
            import torch  # noqa: F401
        except ImportError:
            self.skipTest("torch is not installed: the torch tensor path is not tested here "
                          "(plain buffers are, in test_tensors)")
        self.run_script(TORCH, "torch: ok")

    def test_raw_memory_and_ranges(self):
        self.run_script(RAW, "raw: ok")

    def test_setup_dummy(self):
        self.run_script(DUMMY, "dummy: ok", CRESCENT_LOCAL_SOCKET=self.sock)

    def test_init_all(self):
        self.run_script(INIT_ALL, "init_all: ok", MOONCAKE_MASTER=self.cluster.master)


if __name__ == "__main__":
    unittest.main()
