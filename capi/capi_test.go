package main

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"
	"unsafe"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/crescent-kv/crescent/engine"
	"github.com/crescent-kv/crescent/engine/mempool"
	"github.com/crescent-kv/crescent/store"
	"github.com/crescent-kv/crescent/store/errcode"
	"github.com/crescent-kv/crescent/store/local"
	"github.com/crescent-kv/crescent/store/master"
	"github.com/crescent-kv/crescent/store/master/service"
)

func header(t *testing.T) string {
	b, err := os.ReadFile("../include/crescent.h")
	require.NoError(t, err)
	return string(b)
}

// Every store code is in the header under its reference name and value,
// and nothing else is.
func TestHeaderStoreCodesMatchErrcode(t *testing.T) {
	h := header(t)
	re := regexp.MustCompile(`#define CRESCENT_([A-Z_]+) \((-?\d+)\)`)
	defined := map[string]int{}
	for _, m := range re.FindAllStringSubmatch(h, -1) {
		v, _ := strconv.Atoi(m[2])
		defined[m[1]] = v
	}
	n := 0
	for c := errcode.Code(0); c >= -1502; c-- {
		if !c.Known() || c == errcode.OK {
			continue
		}
		n++
		v, ok := defined[c.String()]
		if assert.True(t, ok, "CRESCENT_%s missing", c) {
			assert.Equal(t, int(c), v, c.String())
		}
	}
	store := 0
	for name := range defined {
		if !strings.HasPrefix(name, "ERR_") {
			store++
		}
	}
	assert.Equal(t, n, store, "store codes in the header that errcode lacks")
	// The engine codes used here are the header's.
	for name, v := range map[string]int{
		"ERR_INVALID_ARGUMENT": errInvalidArgument, "ERR_TOO_MANY_REQUESTS": errTooManyRequests,
		"ERR_ADDRESS_NOT_REGISTERED": errAddressNotRegistered, "ERR_BATCH_BUSY": errBatchBusy,
		"ERR_ADDRESS_OVERLAPPED": errAddressOverlapped, "ERR_QUARANTINED": errQuarantined,
		"ERR_DNS": errDNS, "ERR_SOCKET": errSocket, "ERR_METADATA": errMetadata,
		"ERR_ENDPOINT": errEndpoint, "ERR_CONTEXT": errContext, "ERR_MEMORY": errMemory,
	} {
		assert.Equal(t, v, defined[name], name)
	}
}

// Every function the header declares is exported by this package or
// defined in errbuf.c, and every export is declared.
func TestHeaderDeclaresEveryExport(t *testing.T) {
	decl := map[string]bool{}
	for _, m := range regexp.MustCompile(`(?m)^[a-z_0-9 ]+[ *](crescent_[a-z_0-9]+)\(`).FindAllStringSubmatch(header(t), -1) {
		decl[m[1]] = true
	}
	impl := map[string]bool{}
	files, _ := os.ReadDir(".")
	for _, f := range files {
		b, err := os.ReadFile(f.Name())
		require.NoError(t, err)
		for _, m := range regexp.MustCompile(`//export (crescent_\w+)|(?m)^[a-z_ ]+[ *](crescent_[a-z_0-9]+)\([^)]*\) \{`).FindAllStringSubmatch(string(b), -1) {
			impl[m[1]+m[2]] = true
		}
	}
	delete(impl, "crescent_set_error_") // internal
	assert.Equal(t, decl, impl)
}

func TestHandlesNeverReuseAndCheckKind(t *testing.T) {
	var tb handleTable
	a := tb.add(&engineObj{})
	b := tb.add(&storeObj{})
	assert.NotEqual(t, a, b)
	_, ok := lookup[*storeObj](&tb, a)
	assert.False(t, ok, "an engine handle is not a store")
	_, ok = take[*engineObj](&tb, a)
	assert.True(t, ok)
	_, ok = take[*engineObj](&tb, a)
	assert.False(t, ok, "taken twice")
	c := tb.add(&engineObj{})
	assert.Greater(t, c, b)
	_, ok = lookup[*engineObj](&tb, 0)
	assert.False(t, ok)

	// Of racing destroys exactly one wins.
	h := tb.add(&engineObj{})
	var wins sync.WaitGroup
	var mu sync.Mutex
	won := 0
	for range 8 {
		wins.Go(func() {
			if _, ok := take[*engineObj](&tb, h); ok {
				mu.Lock()
				won++
				mu.Unlock()
			}
		})
	}
	wins.Wait()
	assert.Equal(t, 1, won)
}

func TestEngineCodes(t *testing.T) {
	for _, tc := range []struct {
		err  error
		want int
	}{
		{nil, 0},
		{errBadHandle, errInvalidArgument},
		{badArg("x"), errInvalidArgument},
		{fmt.Errorf("w: %w", engine.ErrBatchFull), errTooManyRequests},
		{&engine.RequestError{Index: 1, Err: engine.ErrNotRegistered}, errAddressNotRegistered},
		{engine.ErrBatchBusy, errBatchBusy},
		{engine.ErrUnregisterBusy, errBatchBusy},
		{engine.ErrAlreadyRegistered, errAddressOverlapped},
		{&engine.QuarantineError{Err: errors.New("x")}, errQuarantined},
		{engine.ErrSegmentNotFound, errMetadata},
		{engine.ErrNoTransport, errEndpoint},
		{engine.ErrClosed, errContext},
		{context.DeadlineExceeded, errSocket},
	} {
		assert.Equal(t, tc.want, engineCode(tc.err), "%v", tc.err)
	}
}

func TestStoreCodes(t *testing.T) {
	assert.Equal(t, 0, storeCode(nil))
	assert.Equal(t, -704, storeCode(fmt.Errorf("get: %w", errcode.New(errcode.ObjectNotFound, "k"))))
	assert.Equal(t, -600, storeCode(errBadHandle))
	assert.Equal(t, -600, storeCode(fmt.Errorf("%w: x", store.ErrInvalidConfig)))
	assert.Equal(t, -1010, storeCode(store.ErrClosed))
	assert.Equal(t, -901, storeCode(context.DeadlineExceeded))
	assert.Equal(t, -1, storeCode(errors.New("other")))
}

func TestParseKV(t *testing.T) {
	c, err := parseKV([]string{"master_server_addr", "global_segment_size", "protocol", "rdma_devices", "put_ahead_bytes", "location_cache"},
		[]string{"h:1", "1024", "tcp", "mlx5_0", "268435456", "65536"})
	require.NoError(t, err)
	assert.Equal(t, storeConfig{MasterServerAddress: "h:1", GlobalSegmentSize: 1024, Protocol: "tcp", DeviceName: "mlx5_0", PutAheadBytes: 256 << 20,
		LocationCache: 65536}, c)
	_, err = parseKV([]string{"local_buffer_size"}, []string{"-1"})
	assert.ErrorIs(t, err, errcode.ErrInvalidParams)
	_, err = parseKV([]string{"nope"}, []string{"1"})
	assert.ErrorContains(t, err, `unknown config key "nope"`)
}

func TestCMemBounds(t *testing.T) {
	var x [8]byte
	_, err := cMem(nil, 8)
	assert.Error(t, err)
	_, err = cMem(unsafe.Pointer(&x[0]), 0)
	assert.Error(t, err)
	_, err = cMem(unsafe.Pointer(&x[0]), 1<<60)
	assert.Error(t, err)
	b, err := cMem(unsafe.Pointer(&x[0]), 8)
	require.NoError(t, err)
	assert.Len(t, b, 8)
}

// The Go core behind the engine exports, on loopback: registration
// bookkeeping and a transfer, with no C in between.
func TestEngineCore(t *testing.T) {
	pool, err := mempool.New(mempool.Options{Size: 4 << 20})
	require.NoError(t, err)
	defer pool.Close()
	src, _ := pool.Alloc(1 << 20)
	dst, _ := pool.Alloc(1 << 20)
	copy(src, "crescent")

	h, err := engineCreate("", "127.0.0.1", "tcp")
	require.NoError(t, err)
	o, err := getEngine(h)
	require.NoError(t, err)
	ps, pd := unsafe.Pointer(&src[0]), unsafe.Pointer(&dst[0])
	require.NoError(t, o.register(ps, 1<<20, ""))
	require.NoError(t, o.register(pd, 1<<20, "cpu:0"))
	assert.Equal(t, errAddressOverlapped, engineCode(o.register(ps, 1<<20, "")))
	seg, err := o.e.OpenSegment(context.Background(), o.e.Name())
	require.NoError(t, err)
	b, err := o.e.AllocateBatch(2)
	require.NoError(t, err)
	err = o.submit(uint64(b), []request{{op: 5, src: ps, target: uint64(seg), addr: uint64(uintptr(pd)), length: 8}}, false, 0, "")
	assert.Equal(t, errInvalidArgument, engineCode(err))
	require.NoError(t, o.submit(uint64(b), []request{{op: 1, src: ps, target: uint64(seg), addr: uint64(uintptr(pd)), length: 8}}, true, uint64(seg), "m"))
	st, err := o.wait(uint64(b), 10000)
	require.NoError(t, err)
	assert.Equal(t, engine.Completed, st.Status)
	assert.Equal(t, "crescent", string(dst[:8]))
	_, err = o.wait(12345, 10)
	assert.Equal(t, errInvalidArgument, engineCode(err))
	require.NoError(t, o.e.FreeBatch(b))
	require.NoError(t, o.unregister(ps))
	assert.Equal(t, errAddressNotRegistered, engineCode(o.unregister(ps)))
	require.NoError(t, o.unregister(pd))
	require.NoError(t, engineDestroy(h))
	assert.Equal(t, errInvalidArgument, engineCode(engineDestroy(h)))
	_, err = getEngine(h)
	assert.ErrorIs(t, err, errBadHandle)
}

func startMaster(t *testing.T) string {
	m, err := master.New(master.Config{})
	require.NoError(t, err)
	require.NoError(t, m.Start())
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- service.New(m, service.WithGracePeriod(100*time.Millisecond)).Serve(ctx, lis) }()
	t.Cleanup(func() {
		cancel()
		assert.NoError(t, <-done)
		m.Close()
	})
	return lis.Addr().String()
}

// A value the store answers from the Go heap (its staging pool too small)
// is copied into memory from alloc, never shown to C in place; one in the
// staging pool is shown in place.
func TestStoreCoreGetBufferNeverShowsGoHeap(t *testing.T) {
	addr := startMaster(t)
	holder, err := store.New(context.Background(), store.Config{MasterAddr: addr, LocalHostname: "127.0.0.1",
		GlobalSegmentSize: 16 << 20, LocalBufferSize: 1 << 20, Logger: logger})
	require.NoError(t, err)
	defer holder.Close()

	pool, err := mempool.New(mempool.Options{Size: 4 << 20})
	require.NoError(t, err)
	defer pool.Close()
	var allocs []unsafe.Pointer
	alloc := func(n int) unsafe.Pointer {
		b, err := pool.Alloc(n)
		require.NoError(t, err)
		allocs = append(allocs, unsafe.Pointer(&b[0]))
		return allocs[len(allocs)-1]
	}
	var freed []unsafe.Pointer
	free := func(p unsafe.Pointer) { freed = append(freed, p) }

	value := make([]byte, 1<<20)
	for i := range value {
		value[i] = byte(i * 7)
	}
	for _, tc := range []struct {
		name    string
		staging uint64
		copied  bool
	}{{"heap answer", 64 << 10, true}, {"staging answer", 8 << 20, false}} {
		t.Run(tc.name, func(t *testing.T) {
			allocs, freed = nil, nil
			h, err := storeCreate(storeConfig{MasterServerAddress: addr, LocalHostname: "127.0.0.1", LocalBufferSize: tc.staging})
			require.NoError(t, err)
			o, err := getStore(h)
			require.NoError(t, err)
			key := "k/" + tc.name
			require.NoError(t, o.c.Put(context.Background(), key, value, store.ReplicateConfig{}))
			bh, p, n, err := o.getBuffer(key, alloc)
			require.NoError(t, err)
			require.Equal(t, len(value), n)
			assert.Equal(t, value, unsafe.Slice((*byte)(p), n))
			if tc.copied {
				require.Len(t, allocs, 1)
				assert.Equal(t, allocs[0], p, "the C copy is what C sees")
			} else {
				assert.Empty(t, allocs, "a staging view needs no copy")
			}
			require.NoError(t, releaseBuffer(bh, free))
			assert.Equal(t, allocs, freed)
			assert.ErrorIs(t, releaseBuffer(bh, free), errBadHandle)
			_, _, _, err = o.getBuffer("missing", alloc)
			assert.Equal(t, -704, storeCode(err))
			require.NoError(t, storeClose(h))
			assert.Equal(t, -600, storeCode(storeClose(h)))
		})
	}
}

// The Go side of crescent_engine_get_transfer_status without the
// crossing from C (csrc/bench_abi.c measures the whole call from C; the
// difference is the crossing).
func BenchmarkTransferStatusGoSide(b *testing.B) {
	h, err := engineCreate("", "127.0.0.1", "tcp")
	require.NoError(b, err)
	defer engineDestroy(h)
	o, _ := getEngine(h)
	id, err := o.e.AllocateBatch(1)
	require.NoError(b, err)
	defer o.e.FreeBatch(id)
	b.ReportAllocs()
	for b.Loop() {
		o, err := getEngine(h)
		if err != nil {
			b.Fatal(err)
		}
		if _, err := o.e.Status(id, 0); err != nil {
			b.Fatal(err)
		}
	}
}

// The reference's genNotifyInEngine, openSegmentNoCache, syncSegmentCache
// and install/uninstallTransport, as the exports call them.
func TestEngineCoreReferenceExtras(t *testing.T) {
	ha, err := engineCreate("", "127.0.0.1", "tcp")
	require.NoError(t, err)
	defer engineDestroy(ha)
	hb, err := engineCreate("", "127.0.0.1", "tcp")
	require.NoError(t, err)
	a, _ := getEngine(ha)
	b, _ := getEngine(hb)

	seg, err := a.e.OpenSegment(bg(), b.e.Name())
	require.NoError(t, err)
	require.NoError(t, a.e.Notify(seg, "hello"))
	assert.Equal(t, []engine.Notification{{From: a.e.Name(), Msg: "hello"}}, b.e.Notifications())

	// b registers memory after a opened it: no-cache open and sync see it.
	pool, err := mempool.New(mempool.Options{Size: 1 << 20})
	require.NoError(t, err)
	defer pool.Close()
	mem, _ := pool.Alloc(1 << 20)
	require.NoError(t, b.register(unsafe.Pointer(&mem[0]), 1<<20, ""))
	sees := func(id engine.SegmentID) bool {
		d, err := a.e.SegmentDesc(id)
		require.NoError(t, err)
		return len(d.Buffers) == 1
	}
	require.False(t, sees(seg))
	again, err := a.openNoCache(b.e.Name())
	require.NoError(t, err)
	assert.Equal(t, seg, again)
	assert.True(t, sees(seg))
	require.NoError(t, a.e.CloseSegment(again))
	require.NoError(t, b.unregister(unsafe.Pointer(&mem[0])))
	require.NoError(t, a.e.RefreshSegments(bg()))
	assert.False(t, sees(seg))
	_, err = a.openNoCache("127.0.0.1:1")
	assert.Equal(t, errMetadata, engineCode(err))

	assert.NoError(t, a.installTransport("tcp"))
	assert.Equal(t, errInvalidArgument, engineCode(a.installTransport("")))
	assert.Equal(t, errInvalidArgument, engineCode(a.installTransport("nvmeof")))
	assert.Equal(t, errNotImpl, engineCode(a.installTransport("cxl")), "no CXL device here")
	assert.Equal(t, errInvalidArgument, engineCode(a.uninstallTransport("shm")), "not running")

	// Uninstalled: a transfer to b is refused (the endpoint code); installed
	// again it moves bytes.
	local := make([]byte, 4096)
	require.NoError(t, a.register(unsafe.Pointer(&local[0]), uint64(len(local)), ""))
	require.NoError(t, b.register(unsafe.Pointer(&mem[0]), 1<<20, ""))
	require.NoError(t, a.e.RefreshSegment(bg(), seg))
	write := func() error {
		id, err := a.e.AllocateBatch(1)
		require.NoError(t, err)
		defer a.e.FreeBatch(id)
		if err := a.e.Submit(id, []engine.Request{{Op: engine.Write, Local: local, Target: seg, TargetAddr: uint64(uintptr(unsafe.Pointer(&mem[0])))}}); err != nil {
			return err
		}
		_, err = a.e.Wait(bg(), id)
		return err
	}
	require.NoError(t, write())
	require.NoError(t, a.uninstallTransport("tcp"))
	err = write()
	assert.Equal(t, errEndpoint, engineCode(err))
	assert.ErrorContains(t, err, "not installed: tcp")
	assert.Equal(t, errInvalidArgument, engineCode(a.uninstallTransport("tcp")))
	require.NoError(t, a.installTransport("tcp"))
	require.NoError(t, write())
	require.NoError(t, b.unregister(unsafe.Pointer(&mem[0])))
	require.NoError(t, a.unregister(unsafe.Pointer(&local[0])))

	// A peer gone: sync reports it (its handshake port refuses).
	require.NoError(t, engineDestroy(hb))
	assert.Equal(t, errSocket, engineCode(a.e.RefreshSegments(bg())))
}

// A dummy client handle (crescent_store_dial_local) serves the store
// calls through a real client's socket: get_buffer views its shared
// cache in place, alloc_buffer memory moves by reference, and what a
// dummy cannot do says NOT_SUPPORTED.
func TestStoreCoreDummy(t *testing.T) {
	addr := startMaster(t)
	real, err := store.New(context.Background(), store.Config{MasterAddr: addr, LocalHostname: "127.0.0.1",
		GlobalSegmentSize: 16 << 20, LocalBufferSize: 4 << 20, Logger: logger})
	require.NoError(t, err)
	defer real.Close()
	sock := t.TempDir() + "/c.sock"
	srv, err := local.Serve(real, sock, local.Options{CacheSize: 4 << 20, BlockSize: 1 << 20, Shm: true,
		AdmissionThreshold: 1, Logger: logger})
	require.NoError(t, err)
	defer srv.Close()

	_, err = storeDialLocal(t.TempDir() + "/none.sock")
	assert.Equal(t, int(errcode.RPCFail), storeCode(err))
	_, err = storeDialLocal("")
	assert.Equal(t, int(errcode.InvalidParams), storeCode(err))

	h, err := storeDialLocal(sock)
	require.NoError(t, err)
	o, err := getStore(h)
	require.NoError(t, err)
	ctx := context.Background()
	value := make([]byte, 512<<10)
	for i := range value {
		value[i] = byte(i * 13)
	}
	require.NoError(t, real.Put(ctx, "d/v", value, store.ReplicateConfig{}))
	never := func(int) unsafe.Pointer { t.Fatal("a shared-cache view needs no copy"); return nil }
	// The first read is a miss that fills a block; the next are hits in place.
	bh, _, _, err := o.getBuffer("d/v", never)
	require.NoError(t, err)
	require.NoError(t, releaseBuffer(bh, nil))
	b1, p1, n1, err := o.getBuffer("d/v", never)
	require.NoError(t, err)
	b2, p2, _, err := o.getBuffer("d/v", never)
	require.NoError(t, err)
	assert.Equal(t, p1, p2, "both views are the cache block")
	assert.Equal(t, value, unsafe.Slice((*byte)(p1), n1))
	require.NoError(t, releaseBuffer(b1, nil))
	require.NoError(t, releaseBuffer(b2, nil))

	p, err := o.allocBuffer(1 << 20)
	require.NoError(t, err)
	mem := unsafe.Slice((*byte)(p), 1<<20)
	copy(mem, value)
	require.NoError(t, o.c.PutFrom(ctx, "d/zc", mem[:len(value)], store.ReplicateConfig{}))
	got, err := real.Get(ctx, "d/zc")
	require.NoError(t, err)
	assert.Equal(t, value, got)
	require.NoError(t, o.freeBuffer(p))
	assert.Equal(t, -600, storeCode(o.freeBuffer(p)))
	_, err = o.allocBuffer(0)
	assert.Equal(t, -600, storeCode(err))

	_, err = o.c.RemoveAll(ctx, true)
	assert.Equal(t, int(errcode.NotSupported), storeCode(err))
	_, err = o.c.SegmentName()
	assert.Equal(t, int(errcode.NotSupported), storeCode(err))
	_, err = o.allocBuffer(4096) // left for close to unmap
	require.NoError(t, err)
	require.NoError(t, storeClose(h))
	assert.Equal(t, -600, storeCode(storeClose(h)))
}
