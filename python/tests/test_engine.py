"""The Python engine API: loopback transfers between two engines."""

import mmap
import threading
import unittest

import harness  # noqa: F401  (sets the library path)

import crescent
from crescent import READ, WRITE, EngineError, codes

SIZE = 1 << 20


class EngineTest(unittest.TestCase):
    def setUp(self):
        self.a, self.b = crescent.Engine("127.0.0.1"), crescent.Engine("127.0.0.1", protocols="tcp")
        self.ma, self.mb = mmap.mmap(-1, SIZE), mmap.mmap(-1, SIZE)
        self.pa, self.pb = self.a.register_memory(self.ma), self.b.register_memory(self.mb, "cpu:0")
        self.seg = self.a.open_segment(self.b.name)

    def tearDown(self):
        self.a.close_segment(self.seg)
        self.a.unregister_memory(self.pa)
        self.b.unregister_memory(self.pb)
        self.a.close()
        self.b.close()

    def test_write_read_notify(self):
        self.ma[:SIZE] = bytes(i & 0xFF for i in range(256)) * (SIZE // 256)
        bt = self.a.allocate_batch(4)
        half = SIZE // 2
        self.a.submit(bt, [(WRITE, self.pa, self.seg, self.pb, half),
                           (WRITE, self.pa + half, self.seg, self.pb + half, half)],
                      notify=(self.seg, "block ready"))
        st = self.a.wait(bt, timeout=10)
        self.assertEqual((st.status, st.completed, st.transferred), (crescent.COMPLETED, 2, SIZE))
        self.assertEqual(self.mb[:], self.ma[:])
        self.assertEqual(self.a.status(bt, 1), (crescent.COMPLETED, half))
        self.assertEqual(self.b.notifications(), [(self.a.name, "block ready")])
        self.assertEqual(self.b.notifications(), [])
        self.ma[:4096] = bytes(4096)
        self.a.submit(bt, [(READ, self.pa, self.seg, self.pb + 4096, 4096)])
        self.assertEqual(self.a.wait(bt).status, crescent.COMPLETED)
        self.assertEqual(self.ma[:4096], self.mb[4096:8192])
        self.assertEqual(self.a.batch_status(bt).requests, 3)
        self.a.free_batch(bt)
        with self.assertRaises(EngineError) as e:
            self.a.free_batch(bt)
        self.assertEqual(e.exception.code, codes.ERR_INVALID_ARGUMENT)

    def test_reference_extras(self):
        # genNotifyInEngine, openSegmentNoCache, syncSegmentCache, install/uninstallTransport.
        self.a.notify(self.seg, "no batch")
        self.assertEqual(self.b.notifications(), [(self.a.name, "no batch")])
        extra = mmap.mmap(-1, SIZE)
        pe = self.b.register_memory(extra)
        again = self.a.open_segment(self.b.name, cache=False)
        self.assertEqual(again, self.seg)
        self.a.close_segment(again)
        bt = self.a.allocate_batch(1)
        self.a.submit(bt, [(WRITE, self.pa, self.seg, pe, 64)])  # the new buffer is known now
        self.assertEqual(self.a.wait(bt, timeout=10).status, crescent.COMPLETED)
        self.a.free_batch(bt)
        self.b.unregister_memory(pe)
        self.a.sync_segment_cache()
        self.a.install_transport("tcp")  # running: nothing to do
        with self.assertRaises(EngineError) as e:
            self.a.install_transport("nvmeof")
        self.assertEqual(e.exception.code, codes.ERR_INVALID_ARGUMENT)

    def test_uninstall_install_transport(self):
        # b (tcp only) drops tcp: a learns it on its next fetch and is refused,
        # naming what b offers; b installs tcp again and a writes again.
        def write():
            bt = self.a.allocate_batch(1)
            try:
                self.a.submit(bt, [(WRITE, self.pa, self.seg, self.pb, 4096)])
                return self.a.wait(bt, timeout=10).status
            finally:
                self.a.free_batch(bt)

        self.ma[:4096] = b"\x5a" * 4096
        self.assertEqual(write(), crescent.COMPLETED)
        self.b.uninstall_transport("tcp")
        with self.assertRaises(EngineError) as e:
            self.b.uninstall_transport("tcp")
        self.assertEqual(e.exception.code, codes.ERR_INVALID_ARGUMENT)
        self.a.sync_segment_cache()
        with self.assertRaises(EngineError) as e:
            write()
        self.assertEqual(e.exception.code, codes.ERR_ENDPOINT)
        self.assertIn("offers []", str(e.exception))
        self.b.install_transport("tcp")
        self.a.sync_segment_cache()
        self.assertEqual(write(), crescent.COMPLETED)
        self.assertEqual(self.mb[:4096], b"\x5a" * 4096)
        # a drops its own tcp: refused at once, naming it.
        self.a.uninstall_transport("tcp")
        with self.assertRaises(EngineError) as e:
            write()
        self.assertEqual(e.exception.code, codes.ERR_ENDPOINT)
        self.assertIn("not installed: tcp", str(e.exception))
        self.a.install_transport("tcp")
        self.assertEqual(write(), crescent.COMPLETED)

    def test_errors(self):
        bt = self.a.allocate_batch(1)
        cases = [
            ([(WRITE, self.pa, self.seg, self.pb + SIZE, 64)], codes.ERR_INVALID_ARGUMENT),  # past the buffer
            ([(WRITE, crescent.address_of(bytearray(64)), self.seg, self.pb, 64)], codes.ERR_ADDRESS_NOT_REGISTERED),
            ([(9, self.pa, self.seg, self.pb, 64)], codes.ERR_INVALID_ARGUMENT),
            ([(WRITE, self.pa, self.seg, self.pb, 64)] * 2, codes.ERR_TOO_MANY_REQUESTS),
        ]
        for reqs, want in cases:
            with self.assertRaises(EngineError) as e:
                self.a.submit(bt, reqs)
            self.assertEqual(e.exception.code, want, e.exception)
        with self.assertRaises(EngineError) as e:
            self.a.register_memory(self.ma)
        self.assertEqual(e.exception.code, codes.ERR_ADDRESS_OVERLAPPED)
        with self.assertRaises(EngineError) as e:
            self.a.open_segment("127.0.0.1:1")
        self.assertLess(e.exception.code, 0)
        self.a.free_batch(bt)

    def test_threads(self):
        errors = []

        def worker(t):
            try:
                off = t * 4096
                for i in range(20):
                    self.ma[off:off + 4096] = bytes([t * 20 + i]) * 4096
                    bt = self.a.allocate_batch(1)
                    self.a.submit(bt, [(WRITE, self.pa + off, self.seg, self.pb + off, 4096)])
                    self.assertEqual(self.a.wait(bt, 10).status, crescent.COMPLETED)
                    self.a.free_batch(bt)
                    self.assertEqual(self.mb[off:off + 4096], bytes([t * 20 + i]) * 4096)
            except Exception as e:  # noqa: BLE001
                errors.append(e)

        threads = [threading.Thread(target=worker, args=(t,)) for t in range(8)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        self.assertEqual(errors, [])


if __name__ == "__main__":
    unittest.main()
