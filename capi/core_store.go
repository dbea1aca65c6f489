package main

import (
	"context"
	"fmt"
	"math"
	"strconv"
	"sync"
	"time"
	"unsafe"

	"github.com/crescent-kv/crescent/store"
	"github.com/crescent-kv/crescent/store/errcode"
)

// storeConfig is crescent_store_config_t in Go.
type storeConfig struct {
	MasterServerAddress, LocalHostname, MetadataServer, Protocol, DeviceName, MasterProtocol string
	GlobalSegmentSize, LocalBufferSize, RPCTimeoutMs                                         uint64
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
	c    *store.Client
	mu   sync.Mutex
	regs map[uintptr]int // RegisterBuffer: address -> length
}

func storeCreate(cfg storeConfig) (uint64, error) {
	if cfg.GlobalSegmentSize > math.MaxInt64 || cfg.LocalBufferSize > math.MaxInt64 || cfg.RPCTimeoutMs > math.MaxInt32 {
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
		RPCTimeout:        time.Duration(cfg.RPCTimeoutMs) * time.Millisecond,
		Logger:            logger,
	})
	if err != nil {
		return 0, err
	}
	return handles.add(&storeObj{c: c, regs: make(map[uintptr]int)}), nil
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
	return o.c.Close()
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

// bufferObj is a zero-copy view handed to C: in the client's own memory,
// or (when the store answered from the Go heap) a C copy in cmem.
type bufferObj struct {
	b    *store.Buffer
	cmem unsafe.Pointer
}

// getBuffer returns a handle, the data's address (outside the Go heap)
// and its size. alloc makes C memory for a heap answer.
func (o *storeObj) getBuffer(key string, alloc func(n int) unsafe.Pointer) (uint64, unsafe.Pointer, int, error) {
	b, err := o.c.GetBuffer(context.Background(), key)
	if err != nil {
		return 0, nil, 0, err
	}
	data := b.Bytes()
	obj := &bufferObj{b: b}
	var p unsafe.Pointer
	switch {
	case len(data) == 0:
	case b.Mapped():
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
