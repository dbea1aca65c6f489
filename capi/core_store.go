package main

import (
	"context"
	"fmt"
	"math"
	"os"
	"strconv"
	"sync"
	"time"
	"unsafe"

	"github.com/crescent-kv/crescent/engine/mempool"
	"github.com/crescent-kv/crescent/store"
	"github.com/crescent-kv/crescent/store/errcode"
	"github.com/crescent-kv/crescent/store/local"
)

// storeConfig is crescent_store_config_t in Go.
type storeConfig struct {
	MasterServerAddress, LocalHostname, MetadataServer, Protocol, DeviceName, MasterProtocol string
	GlobalSegmentSize, LocalBufferSize, RPCTimeoutMs                                         uint64
	PutAheadBytes, LocationCache                                                             uint64 // key/value form only
	TokenFile, AdminTokenFile, TLSCA, TLSCert, TLSKey                                        string
}

// parseKV fills a storeConfig from key/value strings named as the C
// struct's fields.
func parseKV(keys, values []string) (storeConfig, error) {
	var c storeConfig
	for i, k := range keys {
		v := values[i]
		num := func(dst *uint64) error {
			n, err := strconv.ParseUint(v, 10, 64)
			if err != nil {
				return errcode.New(errcode.InvalidParams, "config %s=%q: not a decimal number", k, v)
			}
			*dst = n
			return nil
		}
		var err error
		switch k {
		case "master_server_address", "master_server_addr":
			c.MasterServerAddress = v
		case "local_hostname":
			c.LocalHostname = v
		case "metadata_server":
			c.MetadataServer = v
		case "protocol":
			c.Protocol = v
		case "device_name", "rdma_devices":
			c.DeviceName = v
		case "master_protocol":
			c.MasterProtocol = v
		case "global_segment_size":
			err = num(&c.GlobalSegmentSize)
		case "local_buffer_size":
			err = num(&c.LocalBufferSize)
		case "rpc_timeout_ms":
			err = num(&c.RPCTimeoutMs)
		case "put_ahead_bytes":
			err = num(&c.PutAheadBytes)
		case "location_cache":
			err = num(&c.LocationCache)
		case "token_file":
			c.TokenFile = v
		case "admin_token_file":
			c.AdminTokenFile = v
		case "tls_ca":
			c.TLSCA = v
		case "tls_cert":
			c.TLSCert = v
		case "tls_key":
			c.TLSKey = v
		default:
			err = errcode.New(errcode.InvalidParams, "unknown config key %q", k)
		}
		if err != nil {
			return c, err
		}
	}
	return c, nil
}

type storeObj struct {
	c     kv
	mu    sync.Mutex
	regs  map[uintptr]int           // RegisterBuffer: address -> length
	pools map[uintptr]*mempool.Pool // AllocBuffer: address -> its pool
}

func newStoreObj(c kv) *storeObj {
	return &storeObj{c: c, regs: make(map[uintptr]int), pools: make(map[uintptr]*mempool.Pool)}
}

// kv is what the exports call: a real client (store.Client) or a dummy
// client of one on this host (local.Dummy), behind small adapters.
type kv interface {
	Put(ctx context.Context, key string, value []byte, rc store.ReplicateConfig) error
	PutFrom(ctx context.Context, key string, src []byte, rc store.ReplicateConfig) error
	GetInto(ctx context.Context, key string, dst []byte) (int, error)
	BatchPut(ctx context.Context, keys []string, values [][]byte, rc store.ReplicateConfig) []error
	BatchGet(ctx context.Context, keys []string) ([][]byte, []error)
	BatchGetInto(ctx context.Context, keys []string, dsts [][]byte) ([]int, []error)
	IsExist(ctx context.Context, key string) (bool, error)
	BatchIsExist(ctx context.Context, keys []string) ([]bool, []error)
	Remove(ctx context.Context, key string, force bool) error
	BatchRemove(ctx context.Context, keys []string, force bool) []error
	RemoveAll(ctx context.Context, force bool) (uint64, error)
	RemoveByRegex(ctx context.Context, regex string, force bool) (uint64, error)
	RegisterBuffer(b []byte) error
	UnregisterBuffer(b []byte) error
	// registerPool/unregisterPool share a pool from AllocBuffer.
	registerPool(p *mempool.Pool, mem []byte) error
	unregisterPool(p *mempool.Pool, mem []byte) error
	SegmentName() (string, error)
	Close() error
	// view reads key for GetBuffer; inPlace says its bytes are outside
	// the Go heap (in a segment, a staging pool or a shared cache).
	view(ctx context.Context, key string) (b view, inPlace bool, err error)
}

type view interface {
	Bytes() []byte
	Release()
}

// real adapts store.Client.
type real struct{ *store.Client }

func (r real) IsExist(ctx context.Context, key string) (bool, error) {
	return r.Client.IsExist(ctx, key)
}
func (r real) BatchIsExist(ctx context.Context, keys []string) ([]bool, []error) {
	return r.Client.BatchIsExist(ctx, keys)
}
func (r real) SegmentName() (string, error)                     { return r.Client.SegmentName(), nil }
func (r real) registerPool(_ *mempool.Pool, mem []byte) error   { return r.RegisterBuffer(mem) }
func (r real) unregisterPool(_ *mempool.Pool, mem []byte) error { return r.UnregisterBuffer(mem) }
func (r real) view(ctx context.Context, key string) (view, bool, error) {
	b, err := r.GetBuffer(ctx, key)
	if err != nil {
		return nil, false, err
	}
	return b, b.Mapped(), nil
}

// dummy adapts local.Dummy. Memory given to RegisterBuffer is only
// recorded (a dummy shares memfd pools, not arbitrary memory): its values
// travel in the socket's frames; AllocBuffer's pools move by reference.
type dummy struct{ *local.Dummy }

var errDummyUnsupported = errcode.New(errcode.NotSupported, "not supported by a dummy client (crescent_store_dial_local): call the real client")

func (d dummy) RemoveAll(context.Context, bool) (uint64, error) { return 0, errDummyUnsupported }
func (d dummy) RemoveByRegex(context.Context, string, bool) (uint64, error) {
	return 0, errDummyUnsupported
}
func (d dummy) RegisterBuffer([]byte) error                    { return nil }
func (d dummy) UnregisterBuffer([]byte) error                  { return nil }
func (d dummy) SegmentName() (string, error)                   { return "", errDummyUnsupported }
func (d dummy) registerPool(p *mempool.Pool, _ []byte) error   { return d.RegisterPool(bg(), p) }
func (d dummy) unregisterPool(p *mempool.Pool, _ []byte) error { return d.UnregisterPool(bg(), p) }
func (d dummy) view(ctx context.Context, key string) (view, bool, error) {
	b, err := d.GetBuffer(ctx, key)
	if err != nil {
		return nil, false, err
	}
	return b, b.Shared(), nil
}

// storeDialLocal connects a dummy client to the real client serving the
// Unix socket path (crescent-client --local_socket).
func storeDialLocal(path string) (uint64, error) {
	if path == "" {
		return 0, errcode.New(errcode.InvalidParams, "empty socket path")
	}
	d, err := local.Dial(context.Background(), path)
	if err != nil {
		return 0, err
	}
	return handles.add(newStoreObj(dummy{d})), nil
}

// orEnv is v, or the environment variable name when v is empty: code
// written for Mooncake (the compat module) passes no credentials.
func orEnv(v, name string) string {
	if v != "" {
		return v
	}
	return os.Getenv(name)
}

// defaultPollWait is how long a C thread waiting for the master's reply
// polls in its own thread before it parks (store.Config.MasterPollWait):
// a cgo call runs on a goroutine locked to its thread, which Go's
// netpoller can only wake through another thread. python/bench.py:
// less CPU per operation and a higher Python/Go ratio with it.
const defaultPollWait = 200 * time.Microsecond

// pollWait is defaultPollWait, or CRESCENT_POLL_WAIT_US (0: off).
func pollWait() time.Duration {
	if v := os.Getenv("CRESCENT_POLL_WAIT_US"); v != "" {
		if us, err := strconv.ParseUint(v, 10, 32); err == nil {
			return time.Duration(us) * time.Microsecond
		}
		logger.Warn("capi: CRESCENT_POLL_WAIT_US is not a number of microseconds; using the default", "value", v, "default", defaultPollWait)
	}
	return defaultPollWait
}

func storeCreate(cfg storeConfig) (uint64, error) {
	if cfg.GlobalSegmentSize > math.MaxInt64 || cfg.LocalBufferSize > math.MaxInt64 || cfg.PutAheadBytes > math.MaxInt64 || cfg.LocationCache > math.MaxInt32 || cfg.RPCTimeoutMs > math.MaxInt32 {
		return 0, errcode.New(errcode.InvalidParams, "size or timeout out of range")
	}
	meta := cfg.MetadataServer
	c, err := store.New(context.Background(), store.Config{
		MasterAddr:        cfg.MasterServerAddress,
		MasterProtocol:    cfg.MasterProtocol,
		LocalHostname:     cfg.LocalHostname,
		MetadataServer:    meta,
		Protocols:         splitList(cfg.Protocol),
		GlobalSegmentSize: int64(cfg.GlobalSegmentSize),
		LocalBufferSize:   int64(cfg.LocalBufferSize),
		PutAheadBytes:     int64(cfg.PutAheadBytes),
		LocationCache:     int(cfg.LocationCache),
		RPCTimeout:        time.Duration(cfg.RPCTimeoutMs) * time.Millisecond,
		Logger:            logger,
		TokenFile:         orEnv(cfg.TokenFile, "CRESCENT_TOKEN_FILE"),
		AdminTokenFile:    orEnv(cfg.AdminTokenFile, "CRESCENT_ADMIN_TOKEN_FILE"),
		TLSCA:             orEnv(cfg.TLSCA, "CRESCENT_TLS_CA"),
		TLSCert:           orEnv(cfg.TLSCert, "CRESCENT_TLS_CERT"),
		TLSKey:            orEnv(cfg.TLSKey, "CRESCENT_TLS_KEY"),
		MasterPollWait:    pollWait(),
	})
	if err != nil {
		return 0, err
	}
	return handles.add(newStoreObj(real{c})), nil
}

func getStore(h uint64) (*storeObj, error) {
	o, ok := lookup[*storeObj](&handles, h)
	if !ok {
		return nil, fmt.Errorf("%w: store %d", errBadHandle, h)
	}
	return o, nil
}

func storeClose(h uint64) error {
	o, ok := take[*storeObj](&handles, h)
	if !ok {
		return fmt.Errorf("%w: store %d", errBadHandle, h)
	}
	err := o.c.Close()
	o.mu.Lock()
	defer o.mu.Unlock()
	for a, p := range o.pools { // the client is gone: nothing uses them now
		delete(o.pools, a)
		p.Close()
	}
	return err
}

// replicate is crescent_replicate_config_t in Go.
type replicate struct {
	replicas         int
	soft, hard, same bool
	preferred        string
}

func (r *replicate) config() store.ReplicateConfig {
	if r == nil {
		return store.ReplicateConfig{}
	}
	return store.ReplicateConfig{
		Replicas: r.replicas, SoftPin: r.soft, HardPin: r.hard,
		SameNode: r.same, Preferred: splitList(r.preferred),
	}
}

// value views caller memory as a value (an empty value is the store's
// INVALID_PARAMS, so NULL with size 0 passes through to say so).
func value(p unsafe.Pointer, n uint64) ([]byte, error) {
	if n == 0 {
		return nil, nil
	}
	b, err := cMem(p, n)
	if err != nil {
		return nil, errcode.New(errcode.InvalidParams, "%v", err)
	}
	return b, nil
}

func (o *storeObj) register(p unsafe.Pointer, n uint64) error {
	mem, err := cMem(p, n)
	if err != nil {
		return errcode.New(errcode.InvalidParams, "%v", err)
	}
	o.mu.Lock()
	defer o.mu.Unlock()
	if _, dup := o.regs[uintptr(p)]; dup {
		return errcode.New(errcode.InvalidParams, "buffer at %p already registered", p)
	}
	if err := o.c.RegisterBuffer(mem); err != nil {
		return err
	}
	o.regs[uintptr(p)] = int(n)
	return nil
}

func (o *storeObj) unregister(p unsafe.Pointer) error {
	o.mu.Lock()
	n, ok := o.regs[uintptr(p)]
	o.mu.Unlock()
	if !ok {
		return errcode.New(errcode.InvalidParams, "no buffer registered at %p", p)
	}
	if err := o.c.UnregisterBuffer(unsafe.Slice((*byte)(p), n)); err != nil {
		return err
	}
	o.mu.Lock()
	delete(o.regs, uintptr(p))
	o.mu.Unlock()
	return nil
}

// bufferObj is a zero-copy view handed to C: in memory outside the Go
// heap, or (when the store answered from the Go heap) a C copy in cmem.
type bufferObj struct {
	b    view
	cmem unsafe.Pointer
}

// getBuffer returns a handle, the data's address (outside the Go heap)
// and its size. alloc makes C memory for a heap answer.
func (o *storeObj) getBuffer(key string, alloc func(n int) unsafe.Pointer) (uint64, unsafe.Pointer, int, error) {
	b, inPlace, err := o.c.view(context.Background(), key)
	if err != nil {
		return 0, nil, 0, err
	}
	data := b.Bytes()
	obj := &bufferObj{b: b}
	var p unsafe.Pointer
	switch {
	case len(data) == 0:
	case inPlace:
		p = unsafe.Pointer(unsafe.SliceData(data))
	default:
		obj.cmem = alloc(len(data))
		if obj.cmem == nil {
			b.Release()
			return 0, nil, 0, errcode.New(errcode.InternalError, "out of memory for %d bytes", len(data))
		}
		copy(unsafe.Slice((*byte)(obj.cmem), len(data)), data)
		b.Release()
		obj.b = nil
		p = obj.cmem
	}
	return handles.add(obj), p, len(data), nil
}

// releaseBuffer ends a view; free frees a C copy.
func releaseBuffer(h uint64, free func(unsafe.Pointer)) error {
	obj, ok := take[*bufferObj](&handles, h)
	if !ok {
		return fmt.Errorf("%w: buffer %d", errBadHandle, h)
	}
	if obj.b != nil {
		obj.b.Release()
	}
	if obj.cmem != nil {
		free(obj.cmem)
	}
	return nil
}

// allocBuffer makes n bytes of memfd memory shared with the client (a
// real client registers it with its engine; a dummy passes its memfd to
// the real client), so put_from and get_into move values in it with no
// copy in either mode.
func (o *storeObj) allocBuffer(n uint64) (unsafe.Pointer, error) {
	if n == 0 || n > 1<<40 {
		return nil, errcode.New(errcode.InvalidParams, "buffer of %d bytes: 1 byte to 1 TiB", n)
	}
	p, err := mempool.New(mempool.Options{Size: int64(n), Name: "crescent-capi-buffer"})
	if err != nil {
		return nil, errcode.New(errcode.InternalError, "allocate %d bytes: %v", n, err)
	}
	mem := p.Bytes() // n rounded up to the pool's slab size
	if err := o.c.registerPool(p, mem); err != nil {
		p.Close()
		return nil, err
	}
	addr := unsafe.Pointer(unsafe.SliceData(mem))
	o.mu.Lock()
	o.pools[uintptr(addr)] = p
	o.mu.Unlock()
	return addr, nil
}

// freeBuffer withdraws and unmaps memory from allocBuffer.
func (o *storeObj) freeBuffer(addr unsafe.Pointer) error {
	o.mu.Lock()
	p, ok := o.pools[uintptr(addr)]
	delete(o.pools, uintptr(addr))
	o.mu.Unlock()
	if !ok {
		return errcode.New(errcode.InvalidParams, "no buffer from alloc_buffer at %p", addr)
	}
	if err := o.c.unregisterPool(p, p.Bytes()); err != nil {
		o.mu.Lock()
		o.pools[uintptr(addr)] = p // still in use: keep it mapped
		o.mu.Unlock()
		return err
	}
	return p.Close()
}
