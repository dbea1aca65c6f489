"""The Mooncake drop-in's tensor-parallel, pub and unsupported calls, each
driven by a script written the way an inference server's Mooncake store
connector calls them, in a subprocess with PYTHONPATH=python/compat,
against a real master and client. Plain buffers stand in for tensors (the
torch path runs when torch imports and is skipped when it does not)."""

import os
import subprocess
import sys
import unittest

from harness import PYTHON, Cluster

sys.path.insert(0, os.path.join(PYTHON, "compat"))
from mooncake import _tensor  # noqa: E402
from mooncake.store import tp_key  # noqa: E402

PRELUDE = r'''
import array, ctypes, mmap, os
from mooncake.store import MooncakeDistributedStore, ReplicateConfig
MASTER = os.environ["MASTER"]
store = MooncakeDistributedStore()
assert store.setup("127.0.0.1", "P2PHANDSHAKE", 64 << 20, 32 << 20, "tcp", "", MASTER) == 0

def grid(rows, cols, start=0):
    return memoryview(array.array("f", [float(start + i) for i in range(rows * cols)])).cast("B").cast("f", (rows, cols))
'''

TP = PRELUDE + r'''
# Rank r's shard of a (6, 4) tensor split 3 ways along dim 0 is rows 2r, 2r+1,
# stored under "{key}_tp_{r}" and nowhere else.
t = grid(6, 4)
assert store.put_tensor_with_tp("tp/a", t, tp_rank=0, tp_size=3, split_dim=0) == 0
for r in range(3):
    g = store.get_tensor_with_tp("tp/a", tp_rank=r, tp_size=3)
    assert g.shape == (2, 4) and g.tolist() == t.tolist()[2 * r:2 * r + 2], (r, g.tolist())
assert [store.is_exist(k) for k in ("tp/a_tp_0", "tp/a_tp_1", "tp/a_tp_2", "tp/a_tp_3", "tp/a")] == [1, 1, 1, 0, 0]

# Along dim 1: columns.
assert store.put_tensor_with_tp("tp/c", t, 1, 2, 1) == 0
g = store.get_tensor_with_tp("tp/c", tp_rank=1, tp_size=2, split_dim=1)
assert g.shape == (6, 2) and g.tolist() == [row[2:] for row in t.tolist()]

# A split that does not come out at tp_size chunks (5 rows, 4 ways: torch.chunk
# gives 3) is refused and stores nothing; a bad dim too.
assert store.put_tensor_with_tp("tp/bad", grid(5, 4), tp_size=4) == -600
assert store.is_exist("tp/bad_tp_0") == 0
assert store.put_tensor_with_tp("tp/bad", t, tp_size=2, split_dim=2) == -600
assert store.put_tensor_with_tp("tp/a", t, tp_size=3) == -705  # OBJECT_ALREADY_EXISTS, as put_tensor

# tp_size 1 is the plain call, under the key itself.
assert store.put_tensor_with_tp("tp/one", t) == 0 and store.is_exist("tp/one") == 1
assert store.get_tensor_with_tp("tp/one").tolist() == t.tolist()

# Batches: one bad item among good ones.
u = grid(4, 4, 100)
assert store.batch_put_tensor_with_tp(["tp/b0", "tp/b1", "tp/b2"], [t, u, object()], tp_size=2) == [0, 0, -600]
got = store.batch_get_tensor_with_tp(["tp/b0", "tp/b1", "tp/b2"], tp_rank=1, tp_size=2)
assert got[0].tolist() == t.tolist()[3:] and got[1].tolist() == u.tolist()[2:] and got[2] is None
assert store.batch_put_tensor_with_tp(["x"], [], tp_size=2) == [-600]

# The _into forms read the rank's shard into registered memory.
m = mmap.mmap(-1, 1 << 20)
base = ctypes.addressof(ctypes.c_char.from_buffer(m))
assert store.register_buffer(base, 1 << 20) == 0
g = store.get_tensor_with_tp_into("tp/a", base, 4096, tp_rank=2, tp_size=3)
assert g.tolist() == t.tolist()[4:]
outs = store.batch_get_tensor_with_tp_into(["tp/b0", "tp/b1"], [base, base + 65536], [65536, 65536], 0, 2)
assert outs[0].tolist() == t.tolist()[:3] and outs[1].tolist() == u.tolist()[:2]
outs = store.batch_get_tensor_into(["tp/one", "tp/missing"], [base, base + 65536], [65536, 65536])
assert outs[0].tolist() == t.tolist() and outs[1] is None
assert store.batch_get_tensor_into(["tp/one"], [base], []) == [None]
del g, outs
assert store.unregister_buffer(base) == 0
print("tp: ok")
'''

PUB = PRELUDE + r'''
t = grid(4, 8)
rc = ReplicateConfig()
rc.replica_num = 1
assert store.pub_tensor("pub/a", t, rc) == 0
assert store.get_tensor("pub/a").tolist() == t.tolist()
assert store.pub_tensor("pub/a", t) == -705
# preferred_segments must name replica_num segments.
bad = ReplicateConfig()
bad.preferred_segments = ["x:1", "y:2"]
assert store.pub_tensor("pub/b", t, bad) == -600 and store.is_exist("pub/b") == 0
ok = ReplicateConfig()
ok.preferred_segments = [store.get_hostname()]
assert store.pub_tensor("pub/pref", t, ok) == 0
assert store.batch_pub_tensor(["pub/c", "pub/d"], [t, object()], rc) == [0, -600]
assert store.batch_pub_tensor(["pub/e"], [t], bad) == [-600]
assert store.pub_tensor_with_tp("pub/tp", t, rc, tp_rank=0, tp_size=2, split_dim=1) == 0
assert store.get_tensor_with_tp("pub/tp", 1, 2).tolist() == [row[4:] for row in t.tolist()]
assert store.pub_tensor_with_tp("pub/tp1", t, rc) == 0 and store.is_exist("pub/tp1") == 1
assert store.batch_pub_tensor_with_tp(["pub/t0", "pub/t1"], [t, grid(3, 8)], rc, 0, 4) == [0, -600]
assert store.is_exist("pub/t0_tp_3") == 1 and store.is_exist("pub/t1_tp_0") == 0

# What Crescent does not serve answers NOT_SUPPORTED in the reference's shape.
assert store.create_copy_task("pub/a", ["x:1"]) == (None, -1012)
assert store.create_move_task("pub/a", "x:1", "y:2") == (None, -1012)
assert store.query_task(None) == (None, -1012)
assert store.get_replica_desc("pub/a") is None and store.batch_get_replica_desc(["pub/a"]) is None
store.close()
assert store.pub_tensor("pub/z", t) == -600  # closed: not initialized
print("pub: ok")
'''

TORCH_TP = PRELUDE + r'''
import torch
t = torch.arange(0, 6 * 8, dtype=torch.bfloat16).reshape(6, 8)
assert store.put_tensor_with_tp("ttp/a", t, tp_size=2, split_dim=1) == 0
for r, c in enumerate(t.chunk(2, 1)):
    assert torch.equal(store.get_tensor_with_tp("ttp/a", tp_rank=r, tp_size=2), c)
print("torch tp: ok")
'''


class TensorSplitTest(unittest.TestCase):
    """The splitting and naming, on plain buffers, with no store."""

    def test_chunk_bounds_as_torch_chunk(self):
        self.assertEqual(_tensor.chunk_bounds(10, 4), [(0, 3), (3, 6), (6, 9), (9, 10)])
        self.assertEqual(_tensor.chunk_bounds(8, 4), [(0, 2), (2, 4), (4, 6), (6, 8)])
        self.assertIsNone(_tensor.chunk_bounds(5, 4))  # torch.chunk gives 3 chunks of 2, 2, 1
        self.assertIsNone(_tensor.chunk_bounds(2, 3))
        self.assertEqual(_tensor.chunk_bounds(7, 1), [(0, 7)])

    def test_split_along_each_dim(self):
        import array
        t = memoryview(array.array("i", range(24))).cast("B").cast("i", (2, 3, 4))
        rows = t.tolist()
        for dim, parts in ((0, 2), (1, 3), (2, 2), (-1, 4)):
            objs = _tensor.split(t, parts, dim)
            self.assertEqual(len(objs), parts)
            d = dim % 3
            for r, obj in enumerate(objs):
                code, shape, off = _tensor.parse(obj)
                self.assertEqual(code, 6)  # int32
                n = t.shape[d] // parts
                want_shape = list(t.shape)
                want_shape[d] = n
                self.assertEqual(shape, tuple(want_shape))
                got = _tensor.deserialize(obj).tolist()
                if d == 0:
                    want = rows[r * n:(r + 1) * n]
                elif d == 1:
                    want = [plane[r * n:(r + 1) * n] for plane in rows]
                else:
                    want = [[line[r * n:(r + 1) * n] for line in plane] for plane in rows]
                self.assertEqual(got, want, (dim, r))
        with self.assertRaises(_tensor.TensorError):
            _tensor.split(t, 2, 3)
        with self.assertRaises(_tensor.TensorError):
            _tensor.split(t, 5, 0)

    def test_tp_key(self):
        self.assertEqual(tp_key("layer0/kv", 3), "layer0/kv_tp_3")


class CompatExtrasTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.cluster = Cluster(clients=1)

    @classmethod
    def tearDownClass(cls):
        cls.cluster.stop()

    def run_script(self, script, marker):
        e = dict(os.environ, PYTHONPATH=os.pathsep.join([os.path.join(PYTHON, "compat"), PYTHON]),
                 MASTER=self.cluster.master)
        p = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120, env=e)
        self.assertEqual(p.returncode, 0, p.stdout + p.stderr)
        self.assertIn(marker, p.stdout)

    def test_tensor_parallel(self):
        self.run_script(TP, "tp: ok")

    def test_pub_and_unsupported(self):
        self.run_script(PUB, "pub: ok")

    def test_tensor_parallel_torch(self):
        try:
            import torch  # noqa: F401
        except ImportError:
            self.skipTest("torch is not installed: the torch split is not tested here "
                          "(plain buffers are, in test_tensor_parallel)")
        self.run_script(TORCH_TP, "torch tp: ok")


if __name__ == "__main__":
    unittest.main()
