package main

/*
#cgo CFLAGS: -I${SRCDIR}/../include
#define CRESCENT_BUILDING_LIB 1
#include <stdlib.h>
#include <string.h>
#include "crescent.h"
*/
import "C"

import (
	"unsafe"

	"github.com/crescent-kv/crescent/store/errcode"
)

func goConfig(c *C.crescent_store_config_t) storeConfig {
	return storeConfig{
		MasterServerAddress: C.GoString(c.master_server_address),
		LocalHostname:       C.GoString(c.local_hostname),
		MetadataServer:      C.GoString(c.metadata_server),
		Protocol:            C.GoString(c.protocol),
		DeviceName:          C.GoString(c.device_name),
		MasterProtocol:      C.GoString(c.master_protocol),
		GlobalSegmentSize:   uint64(c.global_segment_size),
		LocalBufferSize:     uint64(c.local_buffer_size),
		RPCTimeoutMs:        uint64(c.rpc_timeout_ms),
		TokenFile:           C.GoString(c.token_file),
		AdminTokenFile:      C.GoString(c.admin_token_file),
		TLSCA:               C.GoString(c.tls_ca),
		TLSCert:             C.GoString(c.tls_cert),
		TLSKey:              C.GoString(c.tls_key),
	}
}

func goReplicate(c *C.crescent_replicate_config_t) *replicate {
	if c == nil {
		return nil
	}
	return &replicate{
		replicas: int(c.replica_num), soft: c.with_soft_pin != 0, hard: c.with_hard_pin != 0,
		same: c.prefer_alloc_in_same_node != 0, preferred: C.GoString(c.preferred_segment),
	}
}

func cAlloc(n int) unsafe.Pointer { return C.malloc(C.size_t(n)) }
func cFree(p unsafe.Pointer)      { C.free(p) }

// cBytes copies b into C memory the caller frees (nil when out of memory).
func cBytes(b []byte) unsafe.Pointer {
	p := C.malloc(C.size_t(max(len(b), 1)))
	if p != nil {
		copy(unsafe.Slice((*byte)(p), len(b)), b)
	}
	return p
}

// batchRC fills results with per-item codes and returns the first
// failure's code.
func batchRC(errs []error, set func(i int, code int)) C.int {
	var rc C.int
	for i, err := range errs {
		code := storeCode(err)
		set(i, code)
		if code != 0 && rc == 0 {
			rc = fail(code, err)
		}
	}
	return rc
}

// storeKeys reads a C array of count keys, bounded first.
func storeKeys(keys **C.char, count C.size_t) ([]string, error) {
	n, err := items(count)
	if err != nil {
		return nil, err
	}
	return cStrings(keys, n)
}

func needOut(ok bool) error {
	if !ok {
		return badArg("NULL output pointer")
	}
	return nil
}

//export crescent_store_create
func crescent_store_create(cfg *C.crescent_store_config_t, out *C.crescent_store_t) (rc C.int) {
	defer recoverStore(&rc)
	if cfg == nil || out == nil {
		return storeRC(badArg("NULL config or out"))
	}
	h, err := storeCreate(goConfig(cfg))
	if err != nil {
		return storeRC(err)
	}
	*out = C.crescent_store_t(h)
	return 0
}

//export crescent_store_create_kv
func crescent_store_create_kv(keys, values **C.char, count C.size_t, out *C.crescent_store_t) (rc C.int) {
	defer recoverStore(&rc)
	if out == nil {
		return storeRC(badArg("NULL out"))
	}
	n, err := items(count)
	if err != nil {
		return storeRC(err)
	}
	ks, err := cStrings(keys, n)
	if err != nil {
		return storeRC(err)
	}
	vs, err := cStrings(values, n)
	if err != nil {
		return storeRC(err)
	}
	cfg, err := parseKV(ks, vs)
	if err != nil {
		return storeRC(err)
	}
	h, err := storeCreate(cfg)
	if err != nil {
		return storeRC(err)
	}
	*out = C.crescent_store_t(h)
	return 0
}

//export crescent_store_dial_local
func crescent_store_dial_local(path *C.char, out *C.crescent_store_t) (rc C.int) {
	defer recoverStore(&rc)
	if path == nil || out == nil {
		return storeRC(badArg("NULL path or out"))
	}
	h, err := storeDialLocal(C.GoString(path))
	if err != nil {
		return storeRC(err)
	}
	*out = C.crescent_store_t(h)
	return 0
}

//export crescent_store_close
func crescent_store_close(s C.crescent_store_t) (rc C.int) {
	defer recoverStore(&rc)
	return storeRC(storeClose(uint64(s)))
}

//export crescent_store_get_hostname
func crescent_store_get_hostname(s C.crescent_store_t, buf *C.char, n C.size_t) C.int {
	return onStoreErr(s, func(o *storeObj) error {
		name, err := o.c.SegmentName()
		if err != nil {
			return err
		}
		return putName(name, buf, n)
	})
}

func put(s C.crescent_store_t, key *C.char, v unsafe.Pointer, n C.size_t, cfg *C.crescent_replicate_config_t, from bool) C.int {
	return onStoreErr(s, func(o *storeObj) error {
		val, err := value(v, uint64(n))
		if err != nil {
			return err
		}
		rc := goReplicate(cfg).config()
		if from {
			return o.c.PutFrom(bg(), C.GoString(key), val, rc)
		}
		return o.c.Put(bg(), C.GoString(key), val, rc)
	})
}

//export crescent_store_put
func crescent_store_put(s C.crescent_store_t, key *C.char, v unsafe.Pointer, n C.size_t, cfg *C.crescent_replicate_config_t) C.int {
	return put(s, key, v, n, cfg, false)
}

//export crescent_store_put_from
func crescent_store_put_from(s C.crescent_store_t, key *C.char, v unsafe.Pointer, n C.size_t, cfg *C.crescent_replicate_config_t) C.int {
	return put(s, key, v, n, cfg, true)
}

//export crescent_store_get_into
func crescent_store_get_into(s C.crescent_store_t, key *C.char, dst unsafe.Pointer, capacity C.size_t) C.int64_t {
	return onStore(s, func(o *storeObj) (C.int64_t, error) {
		d, err := cMem(dst, uint64(capacity))
		if err != nil {
			return 0, errcode.New(errcode.InvalidParams, "%v", err)
		}
		n, err := o.c.GetInto(bg(), C.GoString(key), d)
		if err != nil {
			return 0, err
		}
		return C.int64_t(n), nil
	})
}

//export crescent_store_get
func crescent_store_get(s C.crescent_store_t, key *C.char, out *unsafe.Pointer, size *C.size_t) C.int {
	return onStoreErr(s, func(o *storeObj) error {
		if err := needOut(out != nil && size != nil); err != nil {
			return err
		}
		p, n, err := o.getBufferCopy(C.GoString(key))
		if err != nil {
			return err
		}
		*out, *size = p, C.size_t(n)
		return nil
	})
}

// getBufferCopy reads key into C memory the caller frees.
func (o *storeObj) getBufferCopy(key string) (unsafe.Pointer, int, error) {
	b, _, err := o.c.view(bg(), key)
	if err != nil {
		return nil, 0, err
	}
	defer b.Release()
	data := b.Bytes()
	p := cBytes(data)
	if p == nil {
		return nil, 0, errcode.New(errcode.InternalError, "out of memory for %d bytes", len(data))
	}
	return p, len(data), nil
}

//export crescent_store_get_buffer
func crescent_store_get_buffer(s C.crescent_store_t, key *C.char, out *C.crescent_buffer_t, data *unsafe.Pointer, size *C.size_t) C.int {
	return onStoreErr(s, func(o *storeObj) error {
		if err := needOut(out != nil && data != nil && size != nil); err != nil {
			return err
		}
		h, p, n, err := o.getBuffer(C.GoString(key), cAlloc)
		if err != nil {
			return err
		}
		*out, *data, *size = C.crescent_buffer_t(h), p, C.size_t(n)
		return nil
	})
}

//export crescent_buffer_release
func crescent_buffer_release(b C.crescent_buffer_t) (rc C.int) {
	defer recoverStore(&rc)
	return storeRC(releaseBuffer(uint64(b), cFree))
}

//export crescent_store_batch_put
func crescent_store_batch_put(s C.crescent_store_t, keys **C.char, values *unsafe.Pointer, sizes *C.size_t, count C.size_t, cfg *C.crescent_replicate_config_t, results *C.int) C.int {
	return onStore(s, func(o *storeObj) (C.int, error) {
		ks, err := storeKeys(keys, count)
		if err != nil {
			return 0, err
		}
		n := len(ks)
		if err := needOut(n == 0 || (values != nil && sizes != nil && results != nil)); err != nil {
			return 0, err
		}
		vs := make([][]byte, n)
		ps, ns := unsafe.Slice(values, n), unsafe.Slice(sizes, n)
		for i := range vs {
			if vs[i], err = value(ps[i], uint64(ns[i])); err != nil {
				return 0, err
			}
		}
		res := unsafe.Slice(results, n)
		errs := o.c.BatchPut(bg(), ks, vs, goReplicate(cfg).config())
		return batchRC(errs, func(i, code int) { res[i] = C.int(code) }), nil
	})
}

//export crescent_store_batch_get_into
func crescent_store_batch_get_into(s C.crescent_store_t, keys **C.char, dsts *unsafe.Pointer, caps *C.size_t, count C.size_t, results *C.int64_t) C.int {
	return onStore(s, func(o *storeObj) (C.int, error) {
		ks, err := storeKeys(keys, count)
		if err != nil {
			return 0, err
		}
		n := len(ks)
		if err := needOut(n == 0 || (dsts != nil && caps != nil && results != nil)); err != nil {
			return 0, err
		}
		bufs := make([][]byte, n)
		ps, cs := unsafe.Slice(dsts, n), unsafe.Slice(caps, n)
		for i := range bufs {
			if bufs[i], err = cMem(ps[i], uint64(cs[i])); err != nil {
				return 0, errcode.New(errcode.InvalidParams, "item %d: %v", i, err)
			}
		}
		res := unsafe.Slice(results, n)
		got, errs := o.c.BatchGetInto(bg(), ks, bufs)
		return batchRC(errs, func(i, code int) {
			res[i] = C.int64_t(code)
			if code == 0 {
				res[i] = C.int64_t(got[i])
			}
		}), nil
	})
}

//export crescent_store_batch_get
func crescent_store_batch_get(s C.crescent_store_t, keys **C.char, count C.size_t, values *unsafe.Pointer, sizes *C.size_t, results *C.int) C.int {
	return onStore(s, func(o *storeObj) (C.int, error) {
		ks, err := storeKeys(keys, count)
		if err != nil {
			return 0, err
		}
		n := len(ks)
		if err := needOut(n == 0 || (values != nil && sizes != nil && results != nil)); err != nil {
			return 0, err
		}
		vals, errs := o.c.BatchGet(bg(), ks)
		vp, sz, res := unsafe.Slice(values, n), unsafe.Slice(sizes, n), unsafe.Slice(results, n)
		for i := range vp {
			vp[i], sz[i] = nil, 0
			if errs[i] == nil {
				if vp[i] = cBytes(vals[i]); vp[i] == nil {
					errs[i] = errcode.New(errcode.InternalError, "out of memory for %d bytes", len(vals[i]))
				} else {
					sz[i] = C.size_t(len(vals[i]))
				}
			}
		}
		return batchRC(errs, func(i, code int) { res[i] = C.int(code) }), nil
	})
}

//export crescent_store_batch_exist
func crescent_store_batch_exist(s C.crescent_store_t, keys **C.char, count C.size_t, results *C.int) C.int {
	return onStore(s, func(o *storeObj) (C.int, error) {
		ks, err := storeKeys(keys, count)
		if err != nil {
			return 0, err
		}
		if err := needOut(len(ks) == 0 || results != nil); err != nil {
			return 0, err
		}
		found, errs := o.c.BatchIsExist(bg(), ks)
		res := unsafe.Slice(results, len(ks))
		return batchRC(errs, func(i, code int) {
			res[i] = C.int(code)
			if code == 0 && found[i] {
				res[i] = 1
			}
		}), nil
	})
}

//export crescent_store_batch_remove
func crescent_store_batch_remove(s C.crescent_store_t, keys **C.char, count C.size_t, force C.int, results *C.int) C.int {
	return onStore(s, func(o *storeObj) (C.int, error) {
		ks, err := storeKeys(keys, count)
		if err != nil {
			return 0, err
		}
		if err := needOut(len(ks) == 0 || results != nil); err != nil {
			return 0, err
		}
		res := unsafe.Slice(results, len(ks))
		return batchRC(o.c.BatchRemove(bg(), ks, force != 0), func(i, code int) { res[i] = C.int(code) }), nil
	})
}

//export crescent_store_exist
func crescent_store_exist(s C.crescent_store_t, key *C.char) C.int {
	return onStore(s, func(o *storeObj) (C.int, error) {
		ok, err := o.c.IsExist(bg(), C.GoString(key))
		if ok {
			return 1, err
		}
		return 0, err
	})
}

//export crescent_store_remove
func crescent_store_remove(s C.crescent_store_t, key *C.char, force C.int) C.int {
	return onStoreErr(s, func(o *storeObj) error {
		return o.c.Remove(bg(), C.GoString(key), force != 0)
	})
}

func count64(n uint64, err error) (C.int64_t, error) {
	return C.int64_t(min(n, 1<<62)), err
}

//export crescent_store_remove_all
func crescent_store_remove_all(s C.crescent_store_t, force C.int) C.int64_t {
	return onStore(s, func(o *storeObj) (C.int64_t, error) {
		return count64(o.c.RemoveAll(bg(), force != 0))
	})
}

//export crescent_store_remove_by_regex
func crescent_store_remove_by_regex(s C.crescent_store_t, regex *C.char, force C.int) C.int64_t {
	return onStore(s, func(o *storeObj) (C.int64_t, error) {
		return count64(o.c.RemoveByRegex(bg(), C.GoString(regex), force != 0))
	})
}

//export crescent_store_register_buffer
func crescent_store_register_buffer(s C.crescent_store_t, addr unsafe.Pointer, size C.size_t) C.int {
	return onStoreErr(s, func(o *storeObj) error {
		return o.register(addr, uint64(size))
	})
}

//export crescent_store_unregister_buffer
func crescent_store_unregister_buffer(s C.crescent_store_t, addr unsafe.Pointer) C.int {
	return onStoreErr(s, func(o *storeObj) error {
		return o.unregister(addr)
	})
}

//export crescent_store_alloc_buffer
func crescent_store_alloc_buffer(s C.crescent_store_t, size C.size_t, out *unsafe.Pointer) C.int {
	return onStoreErr(s, func(o *storeObj) error {
		if out == nil {
			return badArg("NULL out")
		}
		p, err := o.allocBuffer(uint64(size))
		if err != nil {
			return err
		}
		*out = p
		return nil
	})
}

//export crescent_store_free_buffer
func crescent_store_free_buffer(s C.crescent_store_t, addr unsafe.Pointer) C.int {
	return onStoreErr(s, func(o *storeObj) error { return o.freeBuffer(addr) })
}
