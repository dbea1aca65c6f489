package main

/*
#cgo CFLAGS: -I${SRCDIR}/../include
#define CRESCENT_BUILDING_LIB 1
#include <stdlib.h>
#include "crescent.h"
*/
import "C"

import (
	"fmt"
	"unsafe"

	"github.com/crescent-kv/crescent/engine"
)

//export crescent_engine_create
func crescent_engine_create(meta, name, protocols *C.char, out *C.crescent_engine_t) (rc C.int) {
	defer recoverEngine(&rc)
	if out == nil {
		return engineRC(badArg("NULL out"))
	}
	h, err := engineCreate(C.GoString(meta), C.GoString(name), C.GoString(protocols))
	if err != nil {
		return engineRC(err)
	}
	*out = C.crescent_engine_t(h)
	return 0
}

//export crescent_engine_destroy
func crescent_engine_destroy(e C.crescent_engine_t) (rc C.int) {
	defer recoverEngine(&rc)
	return engineRC(engineDestroy(uint64(e)))
}

//export crescent_engine_get_local_name
func crescent_engine_get_local_name(e C.crescent_engine_t, buf *C.char, n C.size_t) C.int {
	return onEngine(e, func(o *engineObj) error {
		return putName(o.e.Name(), buf, n)
	})
}

//export crescent_engine_register_memory
func crescent_engine_register_memory(e C.crescent_engine_t, addr unsafe.Pointer, n C.size_t, location *C.char, remote C.int) C.int {
	return onEngine(e, func(o *engineObj) error {
		return o.register(addr, uint64(n), C.GoString(location))
	})
}

//export crescent_engine_unregister_memory
func crescent_engine_unregister_memory(e C.crescent_engine_t, addr unsafe.Pointer) C.int {
	return onEngine(e, func(o *engineObj) error {
		return o.unregister(addr)
	})
}

//export crescent_engine_register_memory_batch
func crescent_engine_register_memory_batch(e C.crescent_engine_t, list *C.crescent_buffer_entry_t, count C.size_t, location *C.char) C.int {
	return onEngine(e, func(o *engineObj) error {
		n, err := items(count)
		if err != nil {
			return err
		}
		if n > 0 && list == nil {
			return badArg("NULL list")
		}
		loc := C.GoString(location)
		for _, b := range unsafe.Slice(list, n) {
			if err := o.register(b.addr, uint64(b.length), loc); err != nil {
				return err
			}
		}
		return nil
	})
}

//export crescent_engine_unregister_memory_batch
func crescent_engine_unregister_memory_batch(e C.crescent_engine_t, addrs *unsafe.Pointer, count C.size_t) C.int {
	return onEngine(e, func(o *engineObj) error {
		n, err := items(count)
		if err != nil {
			return err
		}
		if n > 0 && addrs == nil {
			return badArg("NULL list")
		}
		for _, a := range unsafe.Slice(addrs, n) {
			if err := o.unregister(a); err != nil {
				return err
			}
		}
		return nil
	})
}

//export crescent_engine_open_segment
func crescent_engine_open_segment(e C.crescent_engine_t, name *C.char, out *C.crescent_segment_t) C.int {
	return onEngine(e, func(o *engineObj) error {
		if out == nil || name == nil {
			return badArg("NULL name or out")
		}
		id, err := o.e.OpenSegment(bg(), C.GoString(name))
		if err != nil {
			return err
		}
		*out = C.crescent_segment_t(id)
		return nil
	})
}

//export crescent_engine_close_segment
func crescent_engine_close_segment(e C.crescent_engine_t, seg C.crescent_segment_t) C.int {
	return onEngine(e, func(o *engineObj) error {
		return o.e.CloseSegment(engine.SegmentID(seg))
	})
}

//export crescent_engine_allocate_batch
func crescent_engine_allocate_batch(e C.crescent_engine_t, size C.size_t, out *C.crescent_batch_t) C.int {
	return onEngine(e, func(o *engineObj) error {
		n, err := items(size)
		if err != nil {
			return err
		}
		if out == nil {
			return badArg("NULL out")
		}
		id, err := o.e.AllocateBatch(n)
		if err != nil {
			return err
		}
		*out = C.crescent_batch_t(id)
		return nil
	})
}

//export crescent_engine_free_batch
func crescent_engine_free_batch(e C.crescent_engine_t, b C.crescent_batch_t) C.int {
	return onEngine(e, func(o *engineObj) error {
		return o.e.FreeBatch(engine.BatchID(b))
	})
}

func cRequests(entries *C.crescent_transfer_request_t, count C.size_t) ([]request, error) {
	n, err := items(count)
	if err != nil {
		return nil, err
	}
	if n > 0 && entries == nil {
		return nil, badArg("NULL entries")
	}
	out := make([]request, n)
	for i, r := range unsafe.Slice(entries, n) {
		out[i] = request{op: int(r.opcode), src: r.source, target: uint64(r.target_id), addr: uint64(r.target_offset), length: uint64(r.length)}
	}
	return out, nil
}

//export crescent_engine_submit
func crescent_engine_submit(e C.crescent_engine_t, b C.crescent_batch_t, entries *C.crescent_transfer_request_t, count C.size_t) C.int {
	return onEngine(e, func(o *engineObj) error {
		reqs, err := cRequests(entries, count)
		if err != nil {
			return err
		}
		return o.submit(uint64(b), reqs, false, 0, "")
	})
}

//export crescent_engine_submit_with_notify
func crescent_engine_submit_with_notify(e C.crescent_engine_t, b C.crescent_batch_t, entries *C.crescent_transfer_request_t, count C.size_t, target C.crescent_segment_t, msg *C.char) C.int {
	return onEngine(e, func(o *engineObj) error {
		reqs, err := cRequests(entries, count)
		if err != nil {
			return err
		}
		return o.submit(uint64(b), reqs, true, uint64(target), C.GoString(msg))
	})
}

//export crescent_engine_get_transfer_status
func crescent_engine_get_transfer_status(e C.crescent_engine_t, b C.crescent_batch_t, task C.size_t, st *C.crescent_transfer_status_t) C.int {
	return onEngine(e, func(o *engineObj) error {
		if st == nil || task > maxItems {
			return badArg("NULL status or task out of range")
		}
		ts, err := o.e.Status(engine.BatchID(b), int(task))
		if err != nil {
			return err
		}
		st.status = C.int(ts.Status)
		st.transferred_bytes = C.uint64_t(ts.Transferred)
		return nil
	})
}

func fillBatch(st *C.crescent_batch_status_t, bs engine.BatchStatus) {
	st.status = C.int(bs.Status)
	st.requests = C.uint64_t(bs.Requests)
	st.completed = C.uint64_t(bs.Completed)
	st.failed = C.uint64_t(bs.Failed)
	st.timed_out = C.uint64_t(bs.TimedOut)
	st.canceled = C.uint64_t(bs.Canceled)
	st.pending = C.uint64_t(bs.Pending)
	st.transferred_bytes = C.uint64_t(bs.Transferred)
}

//export crescent_engine_get_batch_status
func crescent_engine_get_batch_status(e C.crescent_engine_t, b C.crescent_batch_t, st *C.crescent_batch_status_t) C.int {
	return onEngine(e, func(o *engineObj) error {
		if st == nil {
			return badArg("NULL status")
		}
		bs, err := o.e.BatchStatus(engine.BatchID(b))
		if err != nil {
			return err
		}
		fillBatch(st, bs)
		return nil
	})
}

//export crescent_engine_wait
func crescent_engine_wait(e C.crescent_engine_t, b C.crescent_batch_t, timeoutMs C.int64_t, st *C.crescent_batch_status_t) C.int {
	return onEngine(e, func(o *engineObj) error {
		if st == nil {
			return badArg("NULL status")
		}
		bs, err := o.wait(uint64(b), int64(timeoutMs))
		if err != nil {
			return err
		}
		fillBatch(st, bs)
		return nil
	})
}

//export crescent_engine_get_notifs
func crescent_engine_get_notifs(e C.crescent_engine_t, out **C.crescent_notify_msg_t, count *C.size_t) C.int {
	return onEngine(e, func(o *engineObj) error {
		if out == nil || count == nil {
			return badArg("NULL out or count")
		}
		*out, *count = nil, 0
		ns := o.e.Notifications()
		if len(ns) == 0 {
			return nil
		}
		arr := (*C.crescent_notify_msg_t)(C.calloc(C.size_t(len(ns)), C.size_t(unsafe.Sizeof(C.crescent_notify_msg_t{}))))
		if arr == nil {
			return fmt.Errorf("%w for notifications", errNoMemory) // they are lost
		}
		msgs := unsafe.Slice(arr, len(ns))
		for i, n := range ns {
			msgs[i].name = C.CString(n.From)
			msgs[i].msg = C.CString(n.Msg)
		}
		*out, *count = arr, C.size_t(len(ns))
		return nil
	})
}

//export crescent_engine_notify
func crescent_engine_notify(e C.crescent_engine_t, target C.crescent_segment_t, msg *C.char) C.int {
	return onEngine(e, func(o *engineObj) error {
		if msg == nil {
			return badArg("NULL msg")
		}
		return o.e.Notify(engine.SegmentID(target), C.GoString(msg))
	})
}

//export crescent_engine_open_segment_no_cache
func crescent_engine_open_segment_no_cache(e C.crescent_engine_t, name *C.char, out *C.crescent_segment_t) C.int {
	return onEngine(e, func(o *engineObj) error {
		if out == nil || name == nil {
			return badArg("NULL name or out")
		}
		id, err := o.openNoCache(C.GoString(name))
		if err != nil {
			return err
		}
		*out = C.crescent_segment_t(id)
		return nil
	})
}

//export crescent_engine_sync_segment_cache
func crescent_engine_sync_segment_cache(e C.crescent_engine_t) C.int {
	return onEngine(e, func(o *engineObj) error {
		return o.e.RefreshSegments(bg())
	})
}

//export crescent_engine_install_transport
func crescent_engine_install_transport(e C.crescent_engine_t, proto *C.char) C.int {
	return onEngine(e, func(o *engineObj) error {
		return o.installTransport(C.GoString(proto))
	})
}

//export crescent_engine_uninstall_transport
func crescent_engine_uninstall_transport(e C.crescent_engine_t, proto *C.char) C.int {
	return onEngine(e, func(o *engineObj) error {
		return o.uninstallTransport(C.GoString(proto))
	})
}
