package engine_test

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"math"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/crescent-kv/crescent/engine"
	"github.com/crescent-kv/crescent/engine/mempool"
	"github.com/crescent-kv/crescent/engine/metadata"
	"github.com/crescent-kv/crescent/engine/transport"
	"github.com/crescent-kv/crescent/engine/transport/cxl"
	"github.com/crescent-kv/crescent/engine/transport/efa"
	"github.com/crescent-kv/crescent/engine/transport/rdma"
	"github.com/crescent-kv/crescent/engine/transport/rdma/rdmadev"
	"github.com/crescent-kv/crescent/engine/transport/rdma/soft"
	"github.com/crescent-kv/crescent/engine/transport/shm"
	"github.com/crescent-kv/crescent/engine/transport/tcp"
	"github.com/crescent-kv/crescent/internal/testsvc/metatest"
	"github.com/crescent-kv/crescent/internal/testutil"
)

// The hostile-descriptor harness: a real target engine with every
// transport (rdma on the software device, efa on libfabric's tcp
// provider, a file standing in for a CXL device), an engine that finds
// segments through a backend answering with whatever descriptor the
// test sets (unchecked), and every transport started on its own so a
// descriptor the engine would refuse can still be fed to it directly.

// hostileScheme is a metadata backend whose Get returns the descriptor
// set by setHostile, as it is: no decoding, no validation.
const hostileScheme = "hostile-test"

var hostileDescs sync.Map // segment name -> *metadata.SegmentDesc

func init() {
	metadata.Register(hostileScheme, func(string, metadata.Options) (metadata.Backend, error) { return hostileBackend{}, nil })
}

type hostileBackend struct{}

func (hostileBackend) Publish(context.Context, *metadata.SegmentDesc) error { return nil }
func (hostileBackend) Remove(context.Context, string) error                 { return nil }
func (hostileBackend) Close() error                                         { return nil }
func (hostileBackend) RPCAddr(_ context.Context, name string) (string, error) {
	return name, nil
}
func (hostileBackend) Get(_ context.Context, name string) (*metadata.SegmentDesc, error) {
	d, ok := hostileDescs.Load(name)
	if !ok {
		return nil, fmt.Errorf("%w: %q", metadata.ErrNotFound, name)
	}
	return d.(*metadata.SegmentDesc), nil
}

var quietLog = slog.New(slog.NewTextHandler(io.Discard, nil))

// stack is every transport started on its own over one registry and
// one handshake server, as an engine would start them.
type stack struct {
	srv  *metadata.Server
	reg  *transport.Registry
	trs  []transport.Transport
	pool *mempool.Pool
	buf  []byte
}

func newStack(tb testing.TB, fab *soft.Fabric, cxlPath, hostID string) *stack {
	tb.Helper()
	srv, err := metadata.NewServer(metadata.ServerConfig{Addr: "127.0.0.1:0", Logger: quietLog})
	require.NoError(tb, err)
	s := &stack{srv: srv, reg: transport.NewRegistry()}
	dev := fab.NewDevice("stack_soft0", soft.Options{})
	tb.Cleanup(func() {
		for i := len(s.trs) - 1; i >= 0; i-- {
			s.trs[i].Close()
		}
		s.reg.Close()
		srv.Close()
		dev.Close()
		if s.pool != nil {
			s.pool.Close()
		}
	})
	env := transport.Env{LocalName: srv.Addr(), Host: "127.0.0.1", HostID: hostID, Registry: s.reg, Logger: quietLog, Handshake: testutil.Handshake{S: srv}}
	for _, tr := range []transport.Transport{
		shm.New(shm.Config{RetryAfter: time.Millisecond}),
		cxl.New(cxl.Config{Path: cxlPath}),
		rdma.New(rdma.Config{Devices: []rdmadev.Device{dev}}),
		efa.New(efa.Config{Provider: "tcp;ofi_rxm"}),
		tcp.New(tcp.Config{}),
	} {
		if err := tr.Start(env); err != nil {
			tb.Logf("%s not started: %v", tr.Name(), err)
			tr.Close()
			continue
		}
		s.trs = append(s.trs, tr)
	}
	s.pool, err = mempool.New(mempool.Options{Size: 1 << 20, SlabSize: 1 << 20})
	require.NoError(tb, err)
	s.buf, err = s.pool.Alloc(1 << 20)
	require.NoError(tb, err)
	fd, off, p, _ := mempool.Lookup(s.buf)
	r, err := s.reg.Add(s.buf, "cpu:0", fd, off, p.Size())
	require.NoError(tb, err)
	for _, tr := range s.trs {
		if rt, ok := tr.(transport.Registerer); ok {
			require.NoError(tb, rt.AfterRegister(r))
		}
	}
	return s
}

// rawPeer shows a transport a descriptor exactly as given.
type rawPeer struct {
	name string
	d    *metadata.SegmentDesc
}

func (p *rawPeer) Name() string                { return p.name }
func (p *rawPeer) Desc() *metadata.SegmentDesc { return p.d }
func (p *rawPeer) Refresh(context.Context) (*metadata.SegmentDesc, error) {
	return p.d, nil
}

// hostileRig is the target, the engine opening it through the hostile
// backend, and the stand-alone transports.
type hostileRig struct {
	target  *node
	cxlBuf  []byte // a target buffer on the CXL device
	desc    *metadata.SegmentDesc
	opener  *node
	stack   *stack
	allowed [][2]uint64 // the target's registered ranges
	cxlName string
}

func newHostileRig(tb testing.TB) *hostileRig {
	tb.Helper()
	fab := soft.NewFabric()
	dev := filepath.Join(tb.TempDir(), "dax0.0")
	require.NoError(tb, os.WriteFile(dev, nil, 0o600))
	require.NoError(tb, os.Truncate(dev, cxlDevSize))
	cfg := func(name string) engine.Config {
		c := engine.Config{Logger: quietLog, TransferTimeout: 10 * time.Second, EFA: efa.Config{Provider: "tcp;ofi_rxm"}}
		c.CXL.Path = dev
		d := fab.NewDevice(name+"_soft0", soft.Options{})
		tb.Cleanup(func() { d.Close() })
		c.RDMA.Devices = []rdmadev.Device{d}
		return c
	}
	r := &hostileRig{target: newNode(tb, 1<<20, cfg("target"))}
	cdev, ok := r.target.e.CXLDevice()
	require.True(tb, ok, "cxl transport not started")
	r.cxlBuf = cdev.Bytes()[1<<20 : 2<<20]
	require.NoError(tb, r.target.e.RegisterMemory(r.cxlBuf, "cpu:0"))
	r.desc = r.target.e.LocalDesc()
	require.NoError(tb, r.desc.Validate())
	r.cxlName = r.desc.CXLName
	for _, b := range r.desc.Buffers {
		r.allowed = append(r.allowed, [2]uint64{b.Addr, b.Addr + b.Length})
	}
	oc := cfg("opener")
	oc.MetadataServer = hostileScheme + "://"
	r.opener = newNode(tb, 1<<20, oc)
	r.stack = newStack(tb, fab, dev, r.desc.Crescent.HostID)
	return r
}

// aim points a descriptor's destinations (host, port, socket, device)
// at the target, so a fuzzed descriptor never makes the test dial or
// resolve anything else. Indexes, lengths, offsets and keys stay
// hostile; destinations that no transport could use stay as they are.
func (r *hostileRig) aim(d *metadata.SegmentDesc) {
	d.TCPDataHost = "127.0.0.1"
	if d.TCPDataPort > 0 && d.TCPDataPort <= 65535 {
		d.TCPDataPort = r.desc.TCPDataPort
	}
	if x := d.Crescent; x != nil {
		if x.ShmSocket != "" && len(x.ShmSocket) <= metadata.MaxSocketPath && !strings.ContainsRune(x.ShmSocket, 0) {
			x.ShmSocket = r.desc.Crescent.ShmSocket
		}
		if x.HostID != "" {
			x.HostID = r.desc.Crescent.HostID
		}
	}
	if d.CXLName != "" {
		d.CXLName = r.cxlName
	}
}

type probe struct{ addr, n uint64 }

// probes are the remote ranges requests name: the target's real
// buffers, and each claimed buffer's first and last bytes and just past
// its end (with the wrap-around a hostile length causes).
func (r *hostileRig) probes(d *metadata.SegmentDesc) []probe {
	const n = 64
	ps := []probe{{r.target.addr(0), n}, {transport.AddrOf(r.cxlBuf) + 4096, n}, {math.MaxUint64 - n + 1, n}}
	for i, b := range d.Buffers {
		if i == 3 {
			break
		}
		ps = append(ps, probe{b.Addr, n}, probe{b.Addr + b.Length - n, n}, probe{b.Addr + b.Length, n})
	}
	return ps
}

func (r *hostileRig) inTarget(addr, n uint64) bool {
	for _, a := range r.allowed {
		if addr >= a[0] && addr < a[1] && a[1]-addr >= n {
			return true
		}
	}
	return false
}

// atOffset reports whether [addr, addr+n) lies in a buffer of d at an
// offset that some target buffer holds: where an offset-addressed copy
// (efa without FI_MR_VIRT_ADDR) may land.
func (r *hostileRig) atOffset(d *metadata.SegmentDesc, addr, n uint64) bool {
	for _, b := range d.Buffers {
		if addr < b.Addr || b.Length < n || addr-b.Addr > b.Length-n {
			continue
		}
		for _, a := range r.allowed {
			if a[1]-a[0] >= addr-b.Addr+n {
				return true
			}
		}
	}
	return false
}

// inDevice reports whether [addr, addr+n) lies in a buffer of d whose
// device range [offset, offset+length) fits the CXL device without
// wrapping: the only place a cxl copy may land.
func inDevice(d *metadata.SegmentDesc, addr, n uint64) bool {
	for _, b := range d.Buffers {
		if b.Offset == nil || addr < b.Addr || b.Length < n || addr-b.Addr > b.Length-n {
			continue
		}
		at := *b.Offset + (addr - b.Addr)
		if at >= *b.Offset && at+n >= at && at+n <= cxlDevSize {
			return true
		}
	}
	return false
}

const cxlDevSize = 4 << 20

// checkTransports feeds d, unchecked, to every stand-alone transport:
// Accepts and Submit must not panic, every task must complete once, and
// a success must have moved all its bytes within the target's memory
// (or, for cxl, within the device, which locate bounds).
func (r *hostileRig) checkTransports(t *testing.T, d *metadata.SegmentDesc) {
	p := &rawPeer{name: r.target.e.Name(), d: d}
	ps := r.probes(d)
	for _, tr := range r.stack.trs {
		type done struct {
			i   int
			n   int
			err error
		}
		results := make(chan done, len(ps))
		var tasks []*transport.Task
		for i, pr := range ps {
			tr.Accepts(p, pr.addr, pr.n)
			op := transport.Write
			if i%2 == 1 {
				op = transport.Read
			}
			local := r.stack.buf[i*64 : i*64+int(pr.n)]
			var once sync.Once
			tasks = append(tasks, transport.NewTask(op, local, pr.addr, time.Now().Add(5*time.Second), func(_ *transport.Task, n int, err error) {
				first := false
				once.Do(func() { first = true })
				require.True(t, first, "%s: task %d completed twice", tr.Name(), i)
				results <- done{i, n, err}
			}))
		}
		tr.Submit(p, tasks)
		limit := time.NewTimer(60 * time.Second)
		for range tasks {
			select {
			case res := <-results:
				pr := ps[res.i]
				if res.err == nil {
					require.Equal(t, int(pr.n), res.n, "%s: short success", tr.Name())
					switch {
					case tr.Name() == "cxl":
						require.True(t, inDevice(d, pr.addr, pr.n), "cxl: success outside the claimed buffer's device range: [%#x,+%d)", pr.addr, pr.n)
					case tr.Name() == "efa" && d.Crescent != nil && d.Crescent.EFA != nil && !d.Crescent.EFA.VirtAddr:
						// Offset addressing: the key picks a target region
						// and the provider bounds the offset in it.
						require.True(t, r.atOffset(d, pr.addr, pr.n), "efa: success at an offset no target buffer holds: [%#x,+%d)", pr.addr, pr.n)
					case tr.Name() == "tcp" && d.TCPProtoVersion < 2 && res.i%2 == 0:
						// v1 WRITEs are unacknowledged (the reference's
						// framing): the target refuses out of range ones
						// by closing, after the sender reported them done.
					default:
						require.True(t, r.inTarget(pr.addr, pr.n), "%s: success outside the target's memory: [%#x,+%d)", tr.Name(), pr.addr, pr.n)
					}
				} else {
					require.Zero(t, res.n, "%s: bytes reported with error %v", tr.Name(), res.err)
				}
			case <-limit.C:
				t.Fatalf("%s: tasks not completed within 60s", tr.Name())
			}
		}
		limit.Stop()
		tr.ClosePeer(p.name)
	}
}

// checkEngine opens the target through the hostile backend: a
// descriptor that fails Validate is refused with ErrBadDescriptor, and
// one that passes serves requests that each end in a final state.
func (r *hostileRig) checkEngine(t *testing.T, d *metadata.SegmentDesc) {
	name := r.target.e.Name()
	hostileDescs.Store(name, d)
	defer hostileDescs.Delete(name)
	e := r.opener.e
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	seg, err := e.OpenSegment(ctx, name)
	if verr := d.Validate(); verr != nil {
		require.ErrorIs(t, err, metadata.ErrBadDescriptor)
		require.ErrorIs(t, err, engine.ErrSegmentNotFound)
		return
	}
	require.NoError(t, err)
	defer e.CloseSegment(seg)
	ps := r.probes(d)
	reqs := make([]engine.Request, len(ps))
	for i, pr := range ps {
		op := engine.Write
		if i%2 == 1 {
			op = engine.Read
		}
		reqs[i] = engine.Request{Op: op, Local: r.opener.buf[i*64 : i*64+int(pr.n)], Target: seg, TargetAddr: pr.addr}
	}
	id, err := e.AllocateBatch(len(reqs))
	require.NoError(t, err)
	defer e.FreeBatch(id)
	if err := e.Submit(id, reqs); err != nil {
		return // refused as a whole: a clean error
	}
	wait(t, e, id)
	for i := range reqs {
		st, err := e.Status(id, i)
		require.NoError(t, err)
		require.True(t, st.Status.Final(), "request %d: %v", i, st.Status)
		if st.Status == engine.Completed {
			require.Equal(t, ps[i].n, st.Transferred)
		}
	}
}

func (r *hostileRig) check(t *testing.T, data []byte) {
	d, err := metadata.UnmarshalDesc(data)
	if err != nil {
		require.Nil(t, d)
		require.ErrorIs(t, err, metadata.ErrBadDescriptor)
	} else {
		require.NoError(t, d.Validate())
	}
	var raw metadata.SegmentDesc
	if json.Unmarshal(data, &raw) != nil {
		return
	}
	r.aim(&raw)
	r.checkTransports(t, &raw)
	cp := raw // the transports may cache by pointer: give the engine its own
	r.checkEngine(t, &cp)
}

// hostileSeeds are the target's own descriptor and variants of it
// that broke, or could break, a transport's arithmetic.
func hostileSeeds(r *hostileRig) [][]byte {
	var out [][]byte
	add := func(mut func(d *metadata.SegmentDesc)) {
		b, _ := json.Marshal(r.desc)
		var d metadata.SegmentDesc
		json.Unmarshal(b, &d)
		mut(&d)
		b, _ = json.Marshal(&d)
		out = append(out, b)
	}
	efaInfo := func(d *metadata.SegmentDesc) *metadata.EFAInfo {
		if d.Crescent.EFA == nil {
			d.Crescent.EFA = &metadata.EFAInfo{Provider: "tcp;ofi_rxm", VirtAddr: true, Devices: 1}
		}
		return d.Crescent.EFA
	}
	rdmaInfo := func(d *metadata.SegmentDesc) *metadata.RDMAInfo {
		if d.Crescent.RDMA == nil {
			d.Crescent.RDMA = &metadata.RDMAInfo{Devices: 1}
		}
		return d.Crescent.RDMA
	}
	add(func(d *metadata.SegmentDesc) {})
	// The efa/peer.go overflow: first_device+devices wrapped negative.
	add(func(d *metadata.SegmentDesc) { efaInfo(d).FirstDevice = math.MaxInt })
	add(func(d *metadata.SegmentDesc) { e := efaInfo(d); e.FirstDevice, e.Devices = math.MaxInt-1, 2 })
	add(func(d *metadata.SegmentDesc) { efaInfo(d).Devices = math.MaxInt })
	add(func(d *metadata.SegmentDesc) { rdmaInfo(d).FirstDevice = math.MaxInt })
	add(func(d *metadata.SegmentDesc) { r := rdmaInfo(d); r.FirstDevice, r.Devices = -1, 1 })
	add(func(d *metadata.SegmentDesc) { d.Devices = nil })
	add(func(d *metadata.SegmentDesc) {
		for i := range d.Buffers {
			d.Buffers[i].RKey = []uint64{math.MaxUint64, math.MaxUint32 + 1, 0, 1, 2, 3, 4, 5}
			d.Buffers[i].LKey = nil
		}
	})
	add(func(d *metadata.SegmentDesc) { d.Buffers[0].Length = 1 << 40 }) // claims more than registered
	add(func(d *metadata.SegmentDesc) { d.Buffers[0].Addr, d.Buffers[0].Length = math.MaxUint64-63, 128 })
	add(func(d *metadata.SegmentDesc) { d.Buffers = append(d.Buffers, d.Buffers[0]) }) // overlap
	add(func(d *metadata.SegmentDesc) {
		for i := range d.Buffers {
			o := uint64(math.MaxUint64 - 4095)
			d.Buffers[i].Offset = &o
		}
	})
	add(func(d *metadata.SegmentDesc) { d.TCPDataPort = 70000 })
	add(func(d *metadata.SegmentDesc) { d.TCPDataPort = -1 })
	add(func(d *metadata.SegmentDesc) { d.Crescent.ShmSocket = strings.Repeat("/x", 100) })
	add(func(d *metadata.SegmentDesc) { d.Crescent.ShmBuffers = []uint64{0, math.MaxUint64} })
	add(func(d *metadata.SegmentDesc) {
		for i := range d.Devices {
			d.Devices[i].GID = "zz"
		}
	})
	return out
}

// FuzzHostileDescriptor feeds descriptors to the decoder and validator,
// then to every transport's Accepts and Submit directly (unchecked) and
// through an engine that opened a segment against them. Nothing may
// panic; every request ends with a clean error or moves its bytes
// within the target's registered memory.
func FuzzHostileDescriptor(f *testing.F) {
	r := newHostileRig(f)
	for _, s := range hostileSeeds(r) {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, data []byte) { r.check(t, data) })
}

// TestHostileDescriptorSeeds runs the fuzz target's seeds, then checks
// the efa first_device overflow by itself: the engine refuses it at
// open time naming the field, and still serves the target.
func TestHostileDescriptorSeeds(t *testing.T) {
	r := newHostileRig(t)
	seeds := hostileSeeds(r)
	for i, s := range seeds {
		t.Run(fmt.Sprint(i), func(t *testing.T) { r.check(t, s) })
	}
	name := r.target.e.Name()
	var d metadata.SegmentDesc
	require.NoError(t, json.Unmarshal(seeds[1], &d))
	hostileDescs.Store(name, &d)
	_, err := r.opener.e.OpenSegment(context.Background(), name)
	var de *metadata.DescError
	require.ErrorAs(t, err, &de)
	require.Equal(t, "crescent.efa.first_device", de.Field)
	require.ErrorContains(t, err, "crescent.efa.first_device")

	good := *r.desc
	hostileDescs.Store(name, &good)
	defer hostileDescs.Delete(name)
	seg, err := r.opener.e.OpenSegment(context.Background(), name)
	require.NoError(t, err)
	defer r.opener.e.CloseSegment(seg)
	testutil.Fill(r.opener.buf[:4096], 3)
	id, _ := r.opener.e.AllocateBatch(1)
	defer r.opener.e.FreeBatch(id)
	require.NoError(t, r.opener.e.Submit(id, []engine.Request{{Op: engine.Write, Local: r.opener.buf[:4096], Target: seg, TargetAddr: r.target.addr(8192)}}))
	require.Equal(t, engine.Completed, wait(t, r.opener.e, id).Status)
	require.Equal(t, r.opener.buf[:4096], r.target.buf[8192:8192+4096])
}

// TestHostileDescriptorP2P: a handshake server answers Metadata with a
// hostile descriptor; opening it fails with the validation error naming
// the field, and the engine then opens a real peer and moves bytes.
func TestHostileDescriptorP2P(t *testing.T) {
	a := newNode(t, 4<<20, engine.Config{Protocols: []string{"tcp"}})
	b := newNode(t, 4<<20, engine.Config{Protocols: []string{"tcp"}})
	for _, h := range metatest.HostileDescs("") {
		t.Run(h.Name, func(t *testing.T) {
			var srv *metadata.Server
			srv, err := metadata.NewServer(metadata.ServerConfig{Addr: "127.0.0.1:0", Logger: quietLog, Handlers: metadata.Handlers{
				Metadata: func() *metadata.SegmentDesc { d := *h.Desc; d.Name = srv.Addr(); return &d },
			}})
			require.NoError(t, err)
			defer srv.Close()
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			_, err = a.e.OpenSegment(ctx, srv.Addr())
			metatest.CheckRefused(t, err, h.Field)
		})
	}
	seg, err := a.e.OpenSegment(context.Background(), b.e.Name())
	require.NoError(t, err)
	testutil.Fill(a.buf[:1<<20], 9)
	id, _ := a.e.AllocateBatch(1)
	defer a.e.FreeBatch(id)
	require.NoError(t, a.e.Submit(id, []engine.Request{{Op: engine.Write, Local: a.buf[:1<<20], Target: seg, TargetAddr: b.addr(4096)}}))
	require.Equal(t, engine.Completed, wait(t, a.e, id).Status)
	require.Equal(t, a.buf[:1<<20], b.buf[4096:4096+1<<20])
}

// watchScheme is hostileScheme plus a watch that delivers what the test
// sends on watchFeed.
const watchScheme = "hostile-watch-test"

var watchFeed = make(chan *metadata.SegmentDesc)

func init() {
	metadata.Register(watchScheme, func(string, metadata.Options) (metadata.Backend, error) { return watchBackend{}, nil })
}

type watchBackend struct{ hostileBackend }

func (watchBackend) Watch(ctx context.Context, name string, fn func(*metadata.SegmentDesc)) error {
	for {
		select {
		case d := <-watchFeed:
			fn(d)
			watchFeed <- nil // tell the test fn returned
		case <-ctx.Done():
			return ctx.Err()
		}
	}
}

// TestHostileRefreshAndWatch: once a segment is open, a hostile
// descriptor from a refresh or a watch is refused and the good one
// stays in use.
func TestHostileRefreshAndWatch(t *testing.T) {
	b := newNode(t, 4<<20, engine.Config{Protocols: []string{"tcp"}})
	a := newNode(t, 4<<20, engine.Config{Protocols: []string{"tcp"}, MetadataServer: watchScheme + "://"})
	name := b.e.Name()
	good := b.e.LocalDesc()
	hostileDescs.Store(name, good)
	defer hostileDescs.Delete(name)
	seg, err := a.e.OpenSegment(context.Background(), name)
	require.NoError(t, err)
	defer a.e.CloseSegment(seg)

	h := metatest.HostileDescs(name)[0]
	hostileDescs.Store(name, h.Desc)
	var de *metadata.DescError
	require.ErrorAs(t, a.e.RefreshSegment(context.Background(), seg), &de)
	require.Equal(t, h.Field, de.Field)
	watchFeed <- h.Desc
	<-watchFeed
	d, err := a.e.SegmentDesc(seg)
	require.NoError(t, err)
	require.Same(t, good, d, "a hostile descriptor replaced the good one")

	testutil.Fill(a.buf[:4096], 11)
	id, _ := a.e.AllocateBatch(1)
	defer a.e.FreeBatch(id)
	require.NoError(t, a.e.Submit(id, []engine.Request{{Op: engine.Write, Local: a.buf[:4096], Target: seg, TargetAddr: b.addr(0)}}))
	require.Equal(t, engine.Completed, wait(t, a.e, id).Status)
	require.Equal(t, a.buf[:4096], b.buf[:4096])
}
