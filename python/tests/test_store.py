"""The Python store API against a real master and crescent-client."""

import array
import mmap
import os
import subprocess
import sys
import threading
import unittest

from harness import PYTHON, Cluster

import crescent
from crescent import StoreError, codes

cluster = None


def setUpModule():
    global cluster
    cluster = Cluster(clients=1)


def tearDownModule():
    cluster.stop()


def payload(n, seed):
    return bytes((seed + i * 31) & 0xFF for i in range(256)) * (n // 256) + bytes(n % 256)


class StoreTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        # A pure client: every value lives in the crescent-client's segment.
        cls.s = crescent.Store(cluster.master, local_hostname="127.0.0.1", local_buffer_size=32 << 20)

    @classmethod
    def tearDownClass(cls):
        cls.s.close()

    def setUp(self):
        self.s.remove_all(force=True)

    def test_admin_operations_need_the_admin_token(self):
        # The master's --admin_token_file guards remove_all, remove_by_regex
        # and forced removes; this process's token comes from
        # CRESCENT_ADMIN_TOKEN_FILE (the harness), a wrong one is refused.
        import tempfile
        with tempfile.NamedTemporaryFile("w", prefix="wrong-admin-") as f:
            f.write("not-the-admin-token-0123456789")
            f.flush()
            with crescent.Store(cluster.master, local_hostname="127.0.0.1", local_buffer_size=1 << 20,
                                admin_token_file=f.name) as other:
                for call in (lambda: other.remove_all(force=True), lambda: other.remove_by_regex(".*", force=True),
                             lambda: other.remove("k", force=True)):
                    with self.assertRaises(StoreError) as e:
                        call()
                    self.assertEqual(e.exception.code, codes.ILLEGAL_CLIENT)
        self.assertEqual(self.s.remove_all(force=True), 0)  # the right token

    def test_put_get_every_buffer_kind(self):
        v = payload(1 << 20, 1)
        values = {"bytes": v, "bytearray": bytearray(v), "memoryview": memoryview(v),
                  "readonly-slice": memoryview(v)[1:4097], "array": array.array("I", v[:4096])}
        for name, value in values.items():
            with self.subTest(name):
                self.s.put(name, value)
                self.assertEqual(self.s.get(name), bytes(memoryview(value).cast("B")))
                self.assertTrue(self.s.exist(name))

    def test_get_into_and_zero_copy_view(self):
        v = payload(1 << 20, 2)
        self.s.put("k", v)
        dst = bytearray(1 << 20)
        self.assertEqual(self.s.get_into("k", dst), len(v))
        self.assertEqual(dst, v)
        with self.s.get_buffer("k") as mv:
            self.assertEqual(len(mv), len(v))
            self.assertEqual(mv[:100].tobytes(), v[:100])
            held = mv
        with self.assertRaises(ValueError):  # released with the block
            held[0]
        with self.assertRaises(StoreError) as e:
            self.s.get_into("k", bytearray(10))
        self.assertEqual(e.exception.code, codes.BUFFER_OVERFLOW)

    def test_get_into_refuses_read_only_buffers(self):
        self.s.put("ro", b"y" * 64)
        frozen = b"x" * 64
        for buf in (frozen, memoryview(frozen), memoryview(bytearray(64)).toreadonly()):
            with self.subTest(type(buf).__name__), self.assertRaises(TypeError):
                self.s.get_into("ro", buf)
        self.assertEqual(frozen, b"x" * 64)  # never written through
        with self.assertRaises(TypeError):
            self.s.get_batch_into(["ro"], [frozen])
        with self.assertRaises(TypeError):
            self.s.register_buffer(frozen)

    def test_view_memory_lives_while_referenced(self):
        v = payload(4096, 3)
        self.s.put("k", v)
        base = crescent.live_views()
        with self.s.get_buffer("k") as mv:
            piece = mv[10:20]  # a slice keeps the memory, not the view
        self.assertEqual(crescent.live_views(), base + 1)
        self.assertEqual(piece.tobytes(), v[10:20])
        del piece
        self.assertEqual(crescent.live_views(), base)
        h = self.s.get_buffer_handle("k")
        self.assertEqual((h.size(), bytes(h[:4])), (4096, v[:4]))
        del h
        self.assertEqual(crescent.live_views(), base)

    def test_errors_carry_codes(self):
        cases = [
            (lambda: self.s.get("missing"), codes.OBJECT_NOT_FOUND),
            (lambda: self.s.put("", b"x"), codes.INVALID_KEY),
            (lambda: self.s.put("e", b""), codes.INVALID_PARAMS),
            (lambda: self.s.remove("missing"), codes.OBJECT_NOT_FOUND),
            (lambda: self.s.get_buffer("missing"), codes.OBJECT_NOT_FOUND),
        ]
        for f, want in cases:
            with self.assertRaises(StoreError) as e:
                f()
            self.assertEqual(e.exception.code, want)
            self.assertIn(str(want), str(e.exception))
        self.s.put("dup", b"1")
        with self.assertRaises(StoreError) as e:
            self.s.put("dup", b"2")
        self.assertEqual(e.exception.code, codes.OBJECT_ALREADY_EXISTS)
        self.assertIn("OBJECT_ALREADY_EXISTS", e.exception.message)
        with self.assertRaises(StoreError) as e:
            crescent.Store("not an address")
        self.assertEqual(e.exception.code, codes.INVALID_PARAMS)

    def test_batches(self):
        keys = [f"b{i}" for i in range(16)]
        vals = [payload(4096, i) for i in range(16)]
        self.assertEqual(self.s.put_batch(keys, vals), [None] * 16)
        again = self.s.put_batch(keys[:2] + ["new"], [b"a", b"b", b"c"])
        self.assertEqual([getattr(r, "code", 0) for r in again],
                         [codes.OBJECT_ALREADY_EXISTS, codes.OBJECT_ALREADY_EXISTS, 0])
        got = self.s.get_batch(keys + ["missing"])
        self.assertEqual(got[:16], vals)
        self.assertEqual(got[16].code, codes.OBJECT_NOT_FOUND)
        bufs = [bytearray(4096) for _ in range(3)]
        n = self.s.get_batch_into(["b0", "b1", "missing"], bufs)
        self.assertEqual(n[:2], [4096, 4096])
        self.assertEqual(n[2].code, codes.OBJECT_NOT_FOUND)
        self.assertEqual(bytes(bufs[1]), vals[1])
        self.assertEqual(self.s.exist_batch(["b3", "zz"]), [True, False])
        r = self.s.remove_batch(["b3", "zz"], force=True)
        self.assertIsNone(r[0])
        self.assertEqual(r[1].code, codes.OBJECT_NOT_FOUND)
        self.assertEqual(self.s.remove_by_regex("^b1.*", force=True), 7)  # b1, b10..b15

    def test_registered_buffer_put_from_get_into(self):
        m = mmap.mmap(-1, 1 << 20)
        addr = self.s.register_buffer(m)
        m[:4096] = payload(4096, 7)
        self.s.put_from("reg", addr, 4096)
        self.assertEqual(self.s.get_into_ptr("reg", addr + 8192, 4096), 4096)
        self.assertEqual(m[8192:8192 + 4096], m[:4096])
        self.s.unregister_buffer(addr)
        with self.assertRaises(StoreError):
            self.s.unregister_buffer(addr)

    def test_many_threads(self):
        errors = []

        def worker(t):
            try:
                for i in range(20):
                    k, v = f"t{t}/{i}", payload(16384, t * 20 + i)
                    self.s.put(k, v)
                    self.assertEqual(self.s.get(k), v)
                    with self.s.get_buffer(k) as mv:
                        self.assertEqual(mv[:16].tobytes(), v[:16])
                try:
                    self.s.get(f"t{t}/missing")
                except StoreError as e:
                    # Each thread sees its own error, not another's.
                    self.assertEqual(e.code, codes.OBJECT_NOT_FOUND)
                    self.assertIn(f"t{t}/missing", e.message)
            except Exception as e:  # noqa: BLE001
                errors.append(e)

        threads = [threading.Thread(target=worker, args=(t,)) for t in range(16)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        self.assertEqual(errors, [])
        self.assertEqual(self.s.remove_all(force=True), 16 * 20)

    def test_close_leaks_no_fds(self):
        def cycle():
            with crescent.Store(cluster.master, local_hostname="127.0.0.1", global_segment_size=8 << 20,
                                local_buffer_size=4 << 20) as s:
                s.put("fd", b"v" * 4096)
                with s.get_buffer("fd") as mv:
                    self.assertEqual(len(mv), 4096)
                s.remove("fd", force=True)

        cycle()  # the runtime's own fds (epoll, ...) stay open once made
        base = len(os.listdir("/proc/self/fd"))
        for _ in range(5):
            cycle()
        self.assertLessEqual(len(os.listdir("/proc/self/fd")), base)

    def test_location_cache(self):
        # A client with location_cache reads repeated gets from where it
        # cached them; a forced remove by another client reaches it first.
        with crescent.Store(cluster.master, local_hostname="127.0.0.1", local_buffer_size=4 << 20,
                            location_cache=256, put_ahead_bytes=8 << 20) as c:
            v = payload(8192, 5)
            self.s.put("lc", v)
            for _ in range(3):
                self.assertEqual(c.get("lc"), v)
            self.s.remove("lc", force=True)
            with self.assertRaises(StoreError) as e:
                c.get("lc")
            self.assertEqual(e.exception.code, codes.OBJECT_NOT_FOUND)
            w = payload(8192, 6)
            self.s.put("lc", w)
            self.assertEqual(c.get("lc"), w)
        with self.assertRaises(StoreError) as e:
            crescent.Store(cluster.master, location_cache=-1)
        self.assertEqual(e.exception.code, codes.INVALID_PARAMS)

    def test_closed_store(self):
        s = crescent.Store(cluster.master, local_hostname="127.0.0.1", local_buffer_size=4 << 20)
        s.close()
        s.close()  # twice: nothing
        with self.assertRaises(StoreError) as e:
            s.put("k", b"v")  # its handle is gone: refused, not a crash
        self.assertEqual(e.exception.code, codes.INVALID_PARAMS)
        self.assertEqual(crescent.lib.crescent_store_close(12345), codes.INVALID_PARAMS)


EXIT_SCRIPT = r"""
import os, sys
sys.path.insert(0, {python!r})
import crescent
s = crescent.Store({master!r}, local_hostname="127.0.0.1", global_segment_size=8 << 20,
                   local_buffer_size=4 << 20)
# On its own segment: earlier exit tests left dead segments mounted (until
# the master's client TTL), and a put placed on one would fail.
s.put({key!r}, b"v" * 4096, crescent.ReplicateConfig(preferred_segment=s.hostname))
assert s.get({key!r}) == b"v" * 4096
print("put", flush=True)
{exit}
"""


class ExitWithoutCloseTest(unittest.TestCase):
    def run_exit(self, exit_stmt, key):
        script = EXIT_SCRIPT.format(python=PYTHON, master=cluster.master, key=key, exit=exit_stmt)
        p = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60,
                           env=os.environ)
        self.assertIn("put", p.stdout, p.stderr)
        return p

    def test_return_from_main(self):
        p = self.run_exit("", "exit-main")
        self.assertEqual(p.returncode, 0, p.stderr)

    def test_os_exit_with_views_and_threads(self):
        p = self.run_exit("v = s.get_buffer('exit-hard')\nimport threading\n"
                          "threading.Thread(target=lambda: s.get('exit-hard'), daemon=True).start()\n"
                          "os._exit(3)", "exit-hard")
        self.assertEqual(p.returncode, 3, p.stderr)

    def test_sys_exit_from_a_thread_blocked_in_a_call(self):
        p = self.run_exit("import threading\n"
                          "threading.Thread(target=lambda: [s.exist('exit-thread') for _ in range(10**6)],"
                          " daemon=True).start()\nsys.exit(0)", "exit-thread")
        self.assertEqual(p.returncode, 0, p.stderr)

    def test_master_still_serves(self):
        self.run_exit("", "exit-check")
        with crescent.Store(cluster.master, local_hostname="127.0.0.1", local_buffer_size=4 << 20) as s:
            s.put("after-exit", b"ok")
            self.assertEqual(s.get("after-exit"), b"ok")


if __name__ == "__main__":
    unittest.main()
