//go:build cgo && verbs

package verbs

/*
#include "fake.h"
*/
import "C"

import (
	"errors"
	"unsafe"

	"github.com/crescent-kv/crescent/engine/transport/rdma/rdmadev"
)

// fakeHW is a QP and a CQ of the fake provider (fake.h), wrapped by the
// same Go types as real ones: tests drive the real cgo data path with
// it. Used by tests only.
type fakeHW struct {
	f   *C.cv_fake
	lib *Library
	cq  *cq
	qp  *qp
}

func newFakeHW(capacity int) (*fakeHW, error) {
	f := C.fake_new()
	if f == nil || f.ch.fd < 0 {
		return nil, errors.New("fake: allocation failed")
	}
	h := &fakeHW{f: f, lib: &Library{name: "fake", c: (*C.cv_lib)(unsafe.Pointer(C.fake_lib()))}}
	c, err := newCQ(h.lib, (*C.cv_cq)(unsafe.Pointer(C.fake_cq(f, C.int(capacity)))))
	if err != nil {
		return nil, err
	}
	h.cq = c
	h.qp = newQP(h.lib, nil, (*C.cv_qp)(unsafe.Pointer(C.fake_qp(f, C.int(capacity)))))
	return h, nil
}

func (h *fakeHW) close() {
	h.cq.Close()
	h.qp.Close()
	C.free(unsafe.Pointer(h.lib.c))
	C.fake_free(h.f)
}

func (h *fakeHW) failAt(i int, errno int) {
	h.f.fail_at, h.f.fail_errno = C.int(i), C.int(errno)
}

// recorded returns the work requests the provider received, with their
// send flags and SGE counts.
func (h *fakeHW) recorded() (wrs []rdmadev.SendWR, flags, nsge []int) {
	for i := 0; i < int(h.f.nrec); i++ {
		r := h.f.rec[i]
		wrs = append(wrs, rdmadev.SendWR{ID: uint64(r.id), Op: rdmadev.Opcode(r.op), Local: uint64(r.local), Length: uint32(r.len),
			LKey: uint32(r.lkey), Remote: uint64(r.remote), RKey: uint32(r.rkey)})
		flags = append(flags, int(h.f.rec_flags[i]))
		nsge = append(nsge, int(h.f.rec_nsge[i]))
	}
	return wrs, flags, nsge
}

func (h *fakeHW) counts() (posts, polls, arms int) {
	return int(h.f.posts), int(h.f.polls), int(h.f.arms)
}

func (h *fakeHW) push(id uint64, status rdmadev.WCStatus, wcOpcode int, n, qpn, vendor uint32) {
	C.fake_push(h.f, C.uint64_t(id), C.int(status), C.int(wcOpcode), C.uint32_t(n), C.uint32_t(qpn), C.uint32_t(vendor))
}

func (h *fakeHW) signal() { C.fake_signal(h.f) }

const sendSignaled = C.IBV_SEND_SIGNALED
