#!/usr/bin/env python3
"""An independent Mooncake transfer-engine peer, for interop tests.

Written from the reference's wire formats (P2P handshake, segment
descriptor, TCP data framing v1/v2), not from Crescent's code. Standard
library only.

  client --segment HOST:PORT ...   act as a Mooncake initiator: fetch the
                                   segment's descriptor, decode it as the
                                   reference's decodeSegmentDesc does, move
                                   data over its data port, send a notify
                                   and a probe. Prints "ok: ..." per check
                                   and "ALL OK" at the end (exit 0), or
                                   "FAIL: ..." (exit 1).
  server [--proto-version 1|2] ... act as a Mooncake target: print
                                   "SEGMENT host:port", answer handshakes
                                   and data requests until stdin closes.
                                   Prints "NOTIFY {json}" per notify and
                                   "PEERDESC ok|bad ..." per Metadata
                                   request; stdin commands: HASH addr len,
                                   STATS, QUIT.

Wire formats (reference):
  handshake frame  u64 LE length (= 1 + len(json)), u8 type, json
                   types: 0 Connection, 1 Metadata, 2 Notify, 3 Probe;
                   a first payload byte above the last type = untyped
                   old-protocol frame. One exchange per connection.
  data header      u64 LE size, u64 LE addr, u8 opcode, 7 bytes padding;
                   opcode 0 READ, 1 WRITE, | 0x80 = v2 (status words)
  status word      u64 LE, "MCTV" << 32 | code (0 ok, 1 address rejected)
"""

import argparse
import hashlib
import json
import os
import re
import socket
import struct
import sys
import threading
import time

CONNECTION, METADATA, NOTIFY, PROBE = 0, 1, 2, 3
LAST_TYPE = PROBE
MAX_FRAME = 1 << 20
OP_READ, OP_WRITE, V2_FLAG = 0, 1, 0x80
STATUS_MAGIC = 0x4D435456 << 32
STATUS_OK = STATUS_MAGIC | 0
STATUS_REJECTED = STATUS_MAGIC | 1
HEADER = struct.Struct("<QQB7s")
assert HEADER.size == 24
CHUNK = 65536  # the reference's MC_TCP_SLICE_SIZE default
TIMEOUT = 30.0

_out_lock = threading.Lock()


def say(*parts):
    with _out_lock:
        sys.stdout.write(" ".join(str(p) for p in parts) + "\n")
        sys.stdout.flush()


# ---------------------------------------------------------------------------
# Test pattern: byte i of a region with seed s is
#   (s + 7*i + 13*(i >> 8) + 29*(i >> 16)) mod 256
# (period 16 MiB, so offset mistakes show). The Go tests compute the same.

_BASE = bytes((7 * i + 13 * (i >> 8)) & 0xFF for i in range(65536))
_ROT = [bytes((x + c) & 0xFF for x in range(256)) for c in range(256)]


def pattern(seed, start, n):
    out = bytearray()
    i = start
    end = start + n
    while i < end:
        k = i >> 16
        block = _BASE.translate(_ROT[(seed + 29 * k) & 0xFF])
        lo = i & 0xFFFF
        hi = min(65536, lo + (end - i))
        out += block[lo:hi]
        i += hi - lo
    return bytes(out)


# ---------------------------------------------------------------------------
# Handshake framing (include/common.h writeString/readString).


def compact_json(obj):
    # jsoncpp FastWriter: compact, keys sorted (std::map), newline at end.
    return (json.dumps(obj, separators=(",", ":"), sort_keys=True) + "\n").encode()


def recv_exact(sock, n):
    buf = bytearray(n)
    view = memoryview(buf)
    got = 0
    while got < n:
        k = sock.recv_into(view[got:], n - got)
        if k == 0:
            raise EOFError("connection closed after %d of %d bytes" % (got, n))
        got += k
    return bytes(buf)


def write_frame(sock, typ, body):
    sock.sendall(struct.pack("<Q", len(body) + 1) + bytes([typ]) + body)


def read_frame(sock, max_len=MAX_FRAME):
    """Returns (type or None for an untyped frame, payload)."""
    (n,) = struct.unpack("<Q", recv_exact(sock, 8))
    if n == 0 or n > max_len:
        raise ValueError("frame length %d out of range" % n)
    payload = recv_exact(sock, n)
    if payload[0] <= LAST_TYPE:
        return payload[0], payload[1:]
    return None, payload


def wait_eof(sock, timeout=5.0):
    """After a reply: the peer must send nothing more and close."""
    sock.settimeout(timeout)
    extra = b""
    while True:
        b = sock.recv(4096)
        if not b:
            return extra
        extra += b


def handshake(host, port, typ, body):
    """One exchange per connection, as the reference's client does."""
    with socket.create_connection((host, port), timeout=TIMEOUT) as s:
        s.settimeout(TIMEOUT)
        write_frame(s, typ, body)
        rtyp, payload = read_frame(s)
        extra = wait_eof(s)
        if extra:
            raise AssertionError("%d extra bytes after the reply" % len(extra))
        return rtyp, payload


# ---------------------------------------------------------------------------
# Segment descriptor, decoded with the reference's rules for protocol "tcp"
# (decodeSegmentDesc): asString for name/protocol, asInt for ports and
# versions (missing -> 0 / version 1), asUInt64 for addr/length (a string
# throws), every buffer needs a name and non-zero addr and length.


class DescError(Exception):
    pass


def _as_string(v, field):
    if v is None:
        return ""
    if isinstance(v, str):
        return v
    if isinstance(v, bool) or isinstance(v, (int, float)):
        return json.dumps(v)
    raise DescError("%s is not a string: %r" % (field, v))


def _as_int(v, field):
    if v is None:
        return 0
    if isinstance(v, bool) or not isinstance(v, int):
        raise DescError("%s is not an integer: %r" % (field, v))
    if not -(1 << 31) <= v < (1 << 31):
        raise DescError("%s out of int range: %r" % (field, v))
    return v


def _as_uint64(v, field):
    if isinstance(v, bool) or not isinstance(v, int):
        raise DescError("%s is not an unsigned 64-bit number: %r" % (field, v))
    if not 0 <= v < (1 << 64):
        raise DescError("%s out of uint64 range: %r" % (field, v))
    return v


TIMESTAMP_RE = re.compile(r"^\d{4}-\d{2}-\d{2} \d{2}:\d{2}:\d{2}\.\d{6}$")


def decode_segment_desc(obj):
    if not isinstance(obj, dict):
        raise DescError("descriptor is not an object")
    d = {"name": _as_string(obj.get("name"), "name")}
    proto = obj.get("protocol")
    if isinstance(proto, list):  # multi-protocol builds
        protos = [_as_string(p, "protocol[]") for p in proto]
    else:
        protos = [_as_string(proto, "protocol")]
    if "tcp" not in protos:
        raise DescError("Unsupported segment descriptor protocol %r" % (proto,))
    d["protocol"] = "tcp"
    d["tcp_data_port"] = _as_int(obj.get("tcp_data_port"), "tcp_data_port")
    if "tcp_proto_version" in obj:
        d["tcp_proto_version"] = _as_int(obj.get("tcp_proto_version"), "tcp_proto_version")
    else:
        d["tcp_proto_version"] = 1
    d["timestamp"] = _as_string(obj.get("timestamp"), "timestamp")
    d["tcp_data_host"] = _as_string(obj.get("tcp_data_host"), "tcp_data_host")
    bufs = obj.get("buffers")
    if bufs is None:
        bufs = []
    if not isinstance(bufs, list):
        raise DescError("buffers is not an array")
    d["buffers"] = []
    for i, b in enumerate(bufs):
        if not isinstance(b, dict):
            raise DescError("buffer %d is not an object" % i)
        name = _as_string(b.get("name"), "buffers[%d].name" % i)
        if "addr" not in b or "length" not in b:
            raise DescError("Corrupted segment descriptor: buffer %d lacks addr/length" % i)
        addr = _as_uint64(b.get("addr"), "buffers[%d].addr" % i)
        length = _as_uint64(b.get("length"), "buffers[%d].length" % i)
        if not name or addr == 0 or length == 0:
            raise DescError("Corrupted segment descriptor: buffer %d (%r, %#x, %d)" % (i, name, addr, length))
        d["buffers"].append({"name": name, "addr": addr, "length": length})
    return d


def split_host_port(name):
    if name.startswith("["):
        host, _, rest = name[1:].partition("]")
        return host, int(rest.lstrip(":"))
    host, _, port = name.rpartition(":")
    if not host:
        raise DescError("segment name %r is not host:port" % name)
    return host, int(port)


def timestamp_now():
    t = time.time()
    return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(t)) + ".%06d" % int((t % 1) * 1e6)


# ---------------------------------------------------------------------------
# TCP data plane, client side.


def send_header(sock, size, addr, opcode):
    # The reference does not zero the padding: send garbage there.
    sock.sendall(HEADER.pack(size, addr, opcode, b"\xa5" * 7))


def read_status(sock):
    (v,) = struct.unpack("<Q", recv_exact(sock, 8))
    if v & 0xFFFFFFFF00000000 != STATUS_MAGIC:
        raise AssertionError("invalid status word %#018x" % v)
    return v


def data_write(sock, addr, data, v2=True):
    send_header(sock, len(data), addr, OP_WRITE | (V2_FLAG if v2 else 0))
    view = memoryview(data)
    for off in range(0, len(data), CHUNK):
        sock.sendall(view[off : off + CHUNK])
    if v2:
        st = read_status(sock)
        if st != STATUS_OK:
            raise AssertionError("WRITE [%#x,+%d): status %#018x" % (addr, len(data), st))


def data_read(sock, addr, n, v2=True):
    send_header(sock, n, addr, OP_READ | (V2_FLAG if v2 else 0))
    if v2:
        st = read_status(sock)
        if st != STATUS_OK:
            raise AssertionError("READ [%#x,+%d): status %#018x" % (addr, n, st))
    return recv_exact(sock, n)


class Peer:
    def __init__(self, host, port):
        self.host, self.port = host, port

    def connect(self):
        s = socket.create_connection((self.host, self.port), timeout=TIMEOUT)
        s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        return s

    def one_write(self, addr, data, v2=True):
        """The reference's default: one fresh connection per transfer."""
        with self.connect() as s:
            data_write(s, addr, data, v2)

    def one_read(self, addr, n, v2=True):
        with self.connect() as s:
            return data_read(s, addr, n, v2)

    def expect_rejected(self, size, addr, opcode):
        """A request outside the registered buffers: v2 gets MCTV|1 and
        the connection closes; v1 gets a close with nothing sent."""
        with self.connect() as s:
            send_header(s, size, addr, opcode)
            got = b""
            try:
                while len(got) < 9:
                    b = s.recv(9 - len(got))
                    if not b:
                        break
                    got += b
            except ConnectionResetError:
                pass
            if opcode & V2_FLAG:
                want = struct.pack("<Q", STATUS_REJECTED)
                if got != want:
                    raise AssertionError("want rejected status %s, got %s" % (want.hex(), got.hex()))
            elif got:
                raise AssertionError("v1 rejection sent %d bytes: %s" % (len(got), got[:16].hex()))


def run_client(args):
    host, port = split_host_port(args.segment)
    own_port = 1 + (os.getpid() % 60000)
    own = {
        "name": "127.0.0.1:%d" % own_port,
        "protocol": "tcp",
        "tcp_data_port": own_port + 1,
        "tcp_proto_version": 2,
        "timestamp": timestamp_now(),
        "buffers": [{"name": "127.0.0.1:%d" % own_port, "addr": 0x7F0000000000, "length": 1 << 20}],
    }
    checks = []

    def check(name, f):
        try:
            r = f()
        except Exception as e:  # noqa: BLE001 - every failure is reported
            say("FAIL: %s: %s: %s" % (name, type(e).__name__, e))
            sys.exit(1)
        checks.append(name)
        say("ok:", name)
        return r

    # 1. Metadata exchange: our descriptor out, theirs back.
    def fetch():
        rtyp, payload = handshake(host, port, METADATA, compact_json(own))
        if rtyp != METADATA:
            raise AssertionError("reply type %r, want %d" % (rtyp, METADATA))
        obj = json.loads(payload)
        desc = decode_segment_desc(obj)
        if desc["name"] != args.segment:
            raise AssertionError("descriptor name %r, want %r" % (desc["name"], args.segment))
        if desc["tcp_data_port"] <= 0:
            raise AssertionError("no tcp_data_port")
        if desc["tcp_proto_version"] < 2:
            raise AssertionError("tcp_proto_version %d" % desc["tcp_proto_version"])
        if desc["timestamp"] and not TIMESTAMP_RE.match(desc["timestamp"]):
            raise AssertionError("timestamp %r" % desc["timestamp"])
        if not desc["buffers"]:
            raise AssertionError("no buffers")
        # Old peers dial the host of "name"; newer prefer tcp_data_host.
        name_host, _ = split_host_port(desc["name"])
        if desc["tcp_data_host"] and desc["tcp_data_host"] != name_host:
            raise AssertionError("tcp_data_host %r differs from name host %r" % (desc["tcp_data_host"], name_host))
        if args.expect_buffers:
            want = [tuple(int(x, 0) for x in b.split(":")) for b in args.expect_buffers.split(",")]
            got = [(b["addr"], b["length"]) for b in desc["buffers"]]
            if sorted(got) != sorted(want):
                raise AssertionError("buffers %s, want %s" % (got, want))
        return desc

    desc = check("metadata exchange and descriptor decode", fetch)
    data_host = desc["tcp_data_host"] or split_host_port(desc["name"])[0]
    peer = Peer(data_host, desc["tcp_data_port"])
    buf = desc["buffers"][0]
    if args.use_buffer:
        match = [b for b in desc["buffers"] if b["addr"] == args.use_buffer]
        if not match:
            raise SystemExit("FAIL: no buffer at %#x in the descriptor" % args.use_buffer)
        buf = match[0]
    base, length = buf["addr"], buf["length"]

    def need(off, n):
        if off + n > length:
            raise SystemExit("FAIL: buffer is %d bytes, test needs %d" % (length, off + n))
        return base + off

    # 2. One connection per transfer (the reference's default).
    if args.write_len:
        addr = need(args.write_off, args.write_len)
        data = pattern(args.write_seed, 0, args.write_len)
        check("v2 WRITE %d bytes, own connection" % len(data), lambda: peer.one_write(addr, data))

        def readback():
            got = peer.one_read(addr, len(data))
            if got != data:
                raise AssertionError("READ returned different bytes")

        check("v2 READ back %d bytes, own connection" % len(data), readback)
    if args.read_len:
        addr = need(args.read_off, args.read_len)

        def read_engine():
            got = peer.one_read(addr, args.read_len)
            want = pattern(args.read_seed, 0, args.read_len)
            if got != want:
                first = next(i for i in range(len(got)) if got[i] != want[i])
                raise AssertionError("byte %d: got %#x want %#x" % (first, got[first], want[first]))

        check("v2 READ %d bytes the target wrote" % args.read_len, read_engine)

    scratch = args.scratch_off

    # 3. Many requests on one connection (the reference's lane mode:
    # one outstanding request per socket), writes and reads interleaved.
    def lane():
        with peer.connect() as s:
            regions = []
            for k in range(8):
                off = scratch + k * 9000
                data = pattern(100 + k, 0, 4096 + 97 * k)
                data_write(s, need(off, len(data)), data)
                regions.append((off, data))
                if k % 2:
                    o, d = regions[k - 1]
                    if data_read(s, base + o, len(d)) != d:
                        raise AssertionError("interleaved READ %d differs" % (k - 1))
            for off, data in regions:
                if data_read(s, base + off, len(data)) != data:
                    raise AssertionError("READ at +%d differs" % off)

    check("20 v2 requests on one connection", lane)

    # 4. Several connections at once, each one transfer (the default
    # client opens one per in-flight request).
    def parallel():
        errs = []

        def worker(k):
            try:
                off = scratch + 128 * 1024 + k * 300000
                data = pattern(200 + k, 0, 256 * 1024 + k)
                peer.one_write(need(off, len(data)), data)
                if peer.one_read(base + off, len(data)) != data:
                    errs.append("worker %d: READ differs" % k)
            except Exception as e:  # noqa: BLE001
                errs.append("worker %d: %s" % (k, e))

        ts = [threading.Thread(target=worker, args=(k,)) for k in range(4)]
        for t in ts:
            t.start()
        for t in ts:
            t.join()
        if errs:
            raise AssertionError("; ".join(errs))

    check("4 parallel connections", parallel)

    # 5. v1 framing (older initiators, or MC_TCP_PROTO=1): no status
    # words. Same connection, so the READ is served after the WRITE.
    def v1():
        off = scratch + 1536 * 1024
        data = pattern(77, 0, 70000)
        with peer.connect() as s:
            data_write(s, need(off, len(data)), data, v2=False)
            if data_read(s, base + off, len(data), v2=False) != data:
                raise AssertionError("v1 READ differs (a status word in the stream?)")

    check("v1 WRITE then READ on one connection", v1)

    # 6. Rejections: outside every buffer, straddling the end of one
    # (into a gap, or into an adjacent buffer: a request must lie inside
    # ONE buffer), zero size, wrapping, in v2 and v1.
    last_end = max(b["addr"] + b["length"] for b in desc["buffers"])
    adjacent = any(b["addr"] == base + length for b in desc["buffers"])
    check("v2 READ past the last buffer rejected", lambda: peer.expect_rejected(16, last_end, OP_READ | V2_FLAG))
    check("v2 READ straddling the buffer end (%s) rejected" % ("into an adjacent buffer" if adjacent else "into a gap"),
          lambda: peer.expect_rejected(16, base + length - 8, OP_READ | V2_FLAG))
    check("v2 WRITE at an unregistered address rejected", lambda: peer.expect_rejected(4096, 0x1000, OP_WRITE | V2_FLAG))
    check("v2 zero-size request rejected", lambda: peer.expect_rejected(0, base, OP_READ | V2_FLAG))
    check("v2 wrapping request rejected", lambda: peer.expect_rejected(2, (1 << 64) - 1, OP_READ | V2_FLAG))
    check("v1 READ outside closed without data", lambda: peer.expect_rejected(16, last_end, OP_READ))

    def still_serving():
        if peer.one_read(base, 8) is None:
            raise AssertionError("no data")

    check("data port still serving after rejections", still_serving)

    # 7. Notify and Probe.
    def notify():
        rtyp, payload = handshake(host, port, NOTIFY, compact_json({"name": own["name"], "notify_msg": args.notify}))
        if rtyp != NOTIFY:
            raise AssertionError("reply type %r" % rtyp)
        r = json.loads(payload)
        if r.get("notify_msg") != "success" or r.get("name") != "":
            raise AssertionError("notify reply %r" % r)

    check("notify", notify)

    def probe():
        rtyp, payload = handshake(host, port, PROBE, compact_json({}))
        if rtyp != PROBE:
            raise AssertionError("reply type %r" % rtyp)
        if json.loads(payload) != {"status": "success"}:
            raise AssertionError("probe reply %r" % payload)

    check("probe", probe)
    say("ALL OK", len(checks), "checks")


# ---------------------------------------------------------------------------
# Target mode.


class Target:
    def __init__(self, args):
        self.args = args
        self.size = args.buffer_size
        self.mem = bytearray(args.buffers * self.size)
        self.buffers = []  # (addr, length, mem offset)
        for i in range(args.buffers):
            addr = args.base + i * (self.size + args.gap)
            self.buffers.append((addr, self.size, i * self.size))
            self.mem[i * self.size : (i + 1) * self.size] = pattern(i + 1, 0, self.size)
        self.stats = {"v1_read": 0, "v1_write": 0, "v2_read": 0, "v2_write": 0, "rejected": 0, "connections": 0, "bad_opcode": 0}
        self.lock = threading.Lock()
        self.hs = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self.hs.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.hs.bind((args.host, 0))
        self.hs.listen(128)
        self.data = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self.data.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.data.bind((args.host, 0))
        self.data.listen(128)
        self.name = "%s:%d" % (args.host, self.hs.getsockname()[1])

    def count(self, key):
        with self.lock:
            self.stats[key] += 1

    def descriptor(self):
        d = {
            "name": self.name,
            "protocol": "tcp",
            "tcp_data_port": self.data.getsockname()[1],
            "timestamp": timestamp_now(),
            # TcpTransport names each buffer after the local server.
            "buffers": [{"name": self.name, "addr": a, "length": n} for a, n, _ in self.buffers],
        }
        if self.args.proto_version >= 2:
            d["tcp_proto_version"] = self.args.proto_version
        return d

    def translate(self, addr, size):
        """validateTcpAddress: non-zero size, no overflow, inside ONE buffer
        (shrunk by --shrink bytes at the end, to make an honest descriptor
        lie for tests of the rejected path)."""
        if size == 0 or addr + size >= 1 << 64:
            return None
        for a, n, off in self.buffers:
            n -= self.args.shrink
            if a <= addr and addr + size <= a + n:
                return off + (addr - a)
        return None

    # Handshake daemon: one request per connection.
    def serve_handshake(self):
        while True:
            try:
                c, _ = self.hs.accept()
            except OSError:
                return
            threading.Thread(target=self.handshake_conn, args=(c,), daemon=True).start()

    def handshake_conn(self, c):
        with c:
            try:
                c.settimeout(5.0)
                (n,) = struct.unpack("<Q", recv_exact(c, 8))
                if n == 0 or n > MAX_FRAME:
                    return  # Invalid: close without a reply
                payload = recv_exact(c, n)
                typ = payload[0] if payload[0] <= LAST_TYPE else None
                body = payload[1:] if typ is not None else payload
                try:
                    req = json.loads(body)
                except ValueError:
                    return  # the reference closes on bad JSON
                if typ == METADATA:
                    try:
                        pd = decode_segment_desc(req)
                        say("PEERDESC ok", pd["name"], len(pd["buffers"]))
                    except DescError as e:
                        say("PEERDESC bad", e)
                    reply = self.descriptor()
                elif typ == NOTIFY:
                    say("NOTIFY", json.dumps({"name": req.get("name"), "notify_msg": req.get("notify_msg")}))
                    reply = {"name": "", "notify_msg": "success"}
                elif typ == PROBE:
                    reply = {"status": "success"}
                else:
                    return  # no Connection handler for tcp: close
                write_frame(c, typ, compact_json(reply))
                c.shutdown(socket.SHUT_WR)
                wait_eof(c)
            except (OSError, EOFError, ValueError):
                return

    # Data server: loops over requests on each connection.
    def serve_data(self):
        while True:
            try:
                c, _ = self.data.accept()
            except OSError:
                return
            c.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            self.count("connections")
            threading.Thread(target=self.data_conn, args=(c,), daemon=True).start()

    def data_conn(self, c):
        with c:
            c.settimeout(TIMEOUT)
            try:
                while True:
                    try:
                        hdr = recv_exact(c, HEADER.size)
                    except EOFError:
                        return
                    size, addr, opcode, _ = HEADER.unpack(hdr)
                    v2 = bool(opcode & V2_FLAG)
                    if v2 and self.args.proto_version < 2:
                        # An old target would serve 0x81 as a READ: a v2
                        # request to a v1 descriptor is a client bug.
                        self.count("bad_opcode")
                        say("PROTOCOL v2 request to a v1 target")
                        return
                    write = (opcode & ~V2_FLAG) == OP_WRITE
                    off = self.translate(addr, size)
                    if off is None:
                        self.count("rejected")
                        if v2:
                            c.sendall(struct.pack("<Q", STATUS_REJECTED))
                        return
                    if write:
                        view = memoryview(self.mem)[off : off + size]
                        got = 0
                        while got < size:
                            k = c.recv_into(view[got:], min(CHUNK, size - got))
                            if k == 0:
                                return
                            got += k
                        view.release()
                        self.count("v2_write" if v2 else "v1_write")
                        if v2:
                            c.sendall(struct.pack("<Q", STATUS_OK))
                    else:
                        self.count("v2_read" if v2 else "v1_read")
                        if v2:
                            c.sendall(struct.pack("<Q", STATUS_OK))
                        view = memoryview(self.mem)
                        for o in range(off, off + size, CHUNK):
                            c.sendall(view[o : min(o + CHUNK, off + size)])
                        view.release()
            except (OSError, EOFError):
                return

    def control(self):
        for line in sys.stdin:
            f = line.split()
            if not f:
                continue
            if f[0] == "QUIT":
                return
            if f[0] == "STATS":
                with self.lock:
                    say("STATS", json.dumps(self.stats, sort_keys=True))
            elif f[0] == "HASH" and len(f) == 3:
                addr, n = int(f[1], 0), int(f[2], 0)
                off = self.translate(addr, n)
                if off is None:
                    say("HASH none")
                else:
                    say("HASH", hashlib.sha256(self.mem[off : off + n]).hexdigest())
            else:
                say("ERROR unknown command", line.strip())


def run_server(args):
    t = Target(args)
    threading.Thread(target=t.serve_handshake, daemon=True).start()
    threading.Thread(target=t.serve_data, daemon=True).start()
    say("SEGMENT", t.name)
    t.control()
    t.hs.close()
    t.data.close()


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="mode", required=True)
    c = sub.add_parser("client")
    c.add_argument("--segment", required=True, help="target segment name host:port")
    c.add_argument("--expect-buffers", default="", help="addr:len,addr:len the descriptor must list")
    c.add_argument("--use-buffer", type=lambda s: int(s, 0), default=0, help="address of the buffer to test (default: first)")
    c.add_argument("--write-off", type=lambda s: int(s, 0), default=0)
    c.add_argument("--write-len", type=lambda s: int(s, 0), default=(1 << 20) + 3)
    c.add_argument("--write-seed", type=int, default=11)
    c.add_argument("--read-off", type=lambda s: int(s, 0), default=0)
    c.add_argument("--read-len", type=lambda s: int(s, 0), default=0)
    c.add_argument("--read-seed", type=int, default=0)
    c.add_argument("--scratch-off", type=lambda s: int(s, 0), default=4 << 20)
    c.add_argument("--notify", default="hello from mooncake_peer.py")
    s = sub.add_parser("server")
    s.add_argument("--host", default="127.0.0.1")
    s.add_argument("--proto-version", type=int, default=2, choices=[1, 2])
    s.add_argument("--buffers", type=int, default=2)
    s.add_argument("--buffer-size", type=lambda s: int(s, 0), default=4 << 20)
    s.add_argument("--base", type=lambda s: int(s, 0), default=0x7F0000000000)
    s.add_argument("--gap", type=lambda s: int(s, 0), default=1 << 20)
    s.add_argument("--shrink", type=lambda s: int(s, 0), default=0,
                   help="serve each buffer this many bytes shorter than advertised")
    args = ap.parse_args()
    if args.mode == "client":
        run_client(args)
    else:
        run_server(args)


if __name__ == "__main__":
    main()
