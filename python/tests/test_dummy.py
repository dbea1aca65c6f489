"""Dummy clients through the C ABI: crescent.Store.dial_local against a
real crescent-client process serving --local_socket with a shared hot
cache, and what a caller sees when that process is killed."""

import os
import signal
import tempfile
import unittest

from harness import Cluster

import crescent
from crescent import StoreError, codes

BLOCK = 1 << 20


class DummyTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.dir = tempfile.TemporaryDirectory()
        cls.sock = os.path.join(cls.dir.name, "crescent.sock")
        # Admit a key at its first miss, so the second read is a hit.
        cls.cl = Cluster(clients=1, client_args=["--local_socket", cls.sock, "--local_hot_cache_size", "16MiB",
                                                 "--local_hot_block_size", "1MiB", "--local_hot_cache_shm=1"],
                         client_env={"MC_STORE_LOCAL_HOT_ADMISSION_THRESHOLD": "1"})

    @classmethod
    def tearDownClass(cls):
        cls.cl.stop()
        cls.dir.cleanup()

    def test_put_get_batches(self):
        with crescent.Store.dial_local(self.sock) as d:
            v = os.urandom(100_000)
            d.put("dummy/a", v)
            self.assertEqual(d.get("dummy/a"), v)
            self.assertTrue(d.exist("dummy/a"))
            self.assertFalse(d.exist("dummy/none"))
            buf = bytearray(len(v))
            self.assertEqual(d.get_into("dummy/a", buf), len(v))
            self.assertEqual(bytes(buf), v)
            keys = [f"dummy/b{i}" for i in range(8)]
            vals = [os.urandom(1000 + i) for i in range(8)]
            self.assertEqual(d.put_batch(keys, vals), [None] * 8)
            self.assertEqual(d.get_batch(keys), vals)
            self.assertEqual(d.exist_batch(keys + ["dummy/none"]), [True] * 8 + [False])
            with self.assertRaises(StoreError) as e:
                d.put("dummy/a", v)
            self.assertEqual(e.exception.code, codes.OBJECT_ALREADY_EXISTS)
            with self.assertRaises(StoreError) as e:
                d.get("dummy/none")
            self.assertEqual(e.exception.code, codes.OBJECT_NOT_FOUND)
            with self.assertRaises(StoreError) as e:
                d.remove_all()
            self.assertEqual(e.exception.code, -1012)  # NOT_SUPPORTED
            self.assertEqual(d.remove_batch(keys, force=True), [None] * 8)
            d.remove("dummy/a", force=True)
            self.assertFalse(d.exist("dummy/a"))

    def test_get_buffer_views_the_shared_cache(self):
        real = crescent.Store(self.cl.master, local_hostname="127.0.0.1")  # values outside the real client
        try:
            v = os.urandom(BLOCK // 2)
            real.put("dummy/hot", v)
        finally:
            real.close()
        with crescent.Store.dial_local(self.sock) as d:
            d.get_buffer("dummy/hot").release()  # the miss fills a block
            with d.get_buffer("dummy/hot") as m1, d.get_buffer("dummy/hot") as m2:
                self.assertEqual(bytes(m1), v)
                # Two views held at once at one address: the cache block
                # itself, not two private copies.
                h1, h2 = d.get_buffer_handle("dummy/hot"), d.get_buffer_handle("dummy/hot")
                self.assertEqual(h1.ptr(), h2.ptr())
                self.assertEqual(bytes(m2), v)
                del h1, h2
            d.remove("dummy/hot", force=True)

    def test_alloc_buffer_put_from_get_into(self):
        with crescent.Store.dial_local(self.sock) as d:
            n = 2 * BLOCK
            addr = d.alloc_buffer(n)
            mv = d.buffer_view(addr, n)
            v = os.urandom(BLOCK)
            mv[:BLOCK] = v
            d.put_from("dummy/zc", addr, BLOCK)
            self.assertEqual(d.get_into_ptr("dummy/zc", addr + BLOCK, BLOCK), BLOCK)
            self.assertEqual(bytes(mv[BLOCK:]), v)
            mv.release()
            d.remove("dummy/zc", force=True)
            d.free_buffer(addr)
            with self.assertRaises(StoreError) as e:
                d.free_buffer(addr)
            self.assertEqual(e.exception.code, codes.INVALID_PARAMS)
            # register_buffer is accepted (values go through the socket).
            b = bytearray(4096)
            d.register_buffer(b)
            b[:] = os.urandom(4096)
            d.put_from("dummy/reg", crescent.address_of(b), 4096)
            self.assertEqual(d.get("dummy/reg"), bytes(b))
            d.unregister_buffer(b)
            d.remove("dummy/reg", force=True)

    def test_alloc_buffer_real_client(self):
        with crescent.Store(self.cl.master, local_hostname="127.0.0.1", global_segment_size=16 << 20) as s:
            addr = s.alloc_buffer(2 * BLOCK)
            mv = s.buffer_view(addr, 2 * BLOCK)
            mv[:BLOCK] = os.urandom(BLOCK)
            s.put_from("real/zc", addr, BLOCK)
            self.assertEqual(s.get_into_ptr("real/zc", addr + BLOCK, BLOCK), BLOCK)
            self.assertEqual(mv[:BLOCK], mv[BLOCK:])
            mv.release()
            s.remove("real/zc", force=True)
            s.free_buffer(addr)
            s.alloc_buffer(4096)  # left to close

    def test_bad_socket(self):
        with self.assertRaises(StoreError) as e:
            crescent.Store.dial_local(os.path.join(self.dir.name, "nothing.sock"))
        self.assertEqual(e.exception.code, codes.RPC_FAIL)


class DummyKilledTest(unittest.TestCase):
    def test_real_client_killed(self):
        with tempfile.TemporaryDirectory() as td:
            sock = os.path.join(td, "c.sock")
            cl = Cluster(clients=1, client_args=["--local_socket", sock])
            try:
                d = crescent.Store.dial_local(sock)
                d.put("dummy/k", b"x" * 100)
                client = cl.procs[1]
                client.send_signal(signal.SIGKILL)
                client.wait(10)
                with self.assertRaises(StoreError) as e:
                    d.get("dummy/k")
                self.assertEqual(e.exception.code, codes.RPC_FAIL)
                d.close()
            finally:
                cl.stop()


if __name__ == "__main__":
    unittest.main()
