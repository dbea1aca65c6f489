package rdma

import (
	"context"
	"errors"
	"fmt"
	"sort"
	"sync"

	"github.com/crescent-kv/crescent/engine/transport"
	"github.com/crescent-kv/crescent/engine/transport/rdma/rdmadev"
)

// region is a registered local buffer with one MR per NIC.
type region struct {
	addr, end uint64
	loc       string
	mrs       []rdmadev.MR
	lkeys     []uint32
	rkeys     []uint32

	mu      sync.Mutex
	users   int // jobs using it as their local buffer
	closing bool
	idle    chan struct{} // closed when closing and users reaches 0
}

// acquire pins the region for one job; false once it is being removed.
func (r *region) acquire() bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.closing {
		return false
	}
	r.users++
	return true
}

func (r *region) release() {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.users--
	if r.closing && r.users == 0 {
		close(r.idle)
	}
}

// regions is the transport's copy-on-write table of registered buffers.
type regions struct {
	mu   sync.Mutex
	list []*region // sorted by addr; replaced, never modified
}

func (rs *regions) snapshot() []*region {
	rs.mu.Lock()
	defer rs.mu.Unlock()
	return rs.list
}

// find returns the region holding [addr, addr+n).
func (rs *regions) find(addr, n uint64) *region {
	l := rs.snapshot()
	i := sort.Search(len(l), func(i int) bool { return l[i].end > addr })
	if i < len(l) && addr >= l[i].addr && l[i].end-addr >= n {
		return l[i]
	}
	return nil
}

func (rs *regions) add(r *region) {
	rs.mu.Lock()
	defer rs.mu.Unlock()
	next := make([]*region, 0, len(rs.list)+1)
	i := sort.Search(len(rs.list), func(i int) bool { return rs.list[i].addr >= r.addr })
	next = append(next, rs.list[:i]...)
	next = append(next, r)
	next = append(next, rs.list[i:]...)
	rs.list = next
}

func (rs *regions) remove(r *region) {
	rs.mu.Lock()
	defer rs.mu.Unlock()
	next := make([]*region, 0, len(rs.list))
	for _, x := range rs.list {
		if x != r {
			next = append(next, x)
		}
	}
	rs.list = next
}

// AfterRegister implements transport.Registerer: the buffer is registered
// on every NIC, for local write and remote read and write.
func (t *Transport) AfterRegister(r *transport.Region) error {
	if t.isClosed() {
		return transport.ErrClosed
	}
	reg := &region{addr: r.Addr, end: r.End(), loc: r.Location}
	const access = rdmadev.AccessLocalWrite | rdmadev.AccessRemoteWrite | rdmadev.AccessRemoteRead
	for _, n := range t.nics {
		mr, err := n.pd.RegMR(r.Mem, access)
		if err != nil {
			for _, m := range reg.mrs {
				m.Close()
			}
			return fmt.Errorf("rdma: register [%#x,+%d) on %s: %w", r.Addr, r.Len(), n.name, err)
		}
		reg.mrs = append(reg.mrs, mr)
		reg.lkeys = append(reg.lkeys, mr.LKey())
		reg.rkeys = append(reg.rkeys, mr.RKey())
	}
	t.regs.add(reg)
	return nil
}

// BeforeUnregister implements transport.Unregisterer: new transfers from
// the buffer are refused, running ones are waited for (until ctx ends),
// then its MRs are deregistered so no peer can reach it any more.
func (t *Transport) BeforeUnregister(ctx context.Context, addr, length uint64) error {
	var reg *region
	for _, r := range t.regs.snapshot() {
		if r.addr == addr {
			reg = r
			break
		}
	}
	if reg == nil {
		return nil
	}
	reg.mu.Lock()
	if reg.closing {
		reg.mu.Unlock()
		return nil
	}
	reg.closing = true
	reg.idle = make(chan struct{})
	if reg.users == 0 {
		close(reg.idle)
	}
	reg.mu.Unlock()
	var err error
	select {
	case <-reg.idle:
	case <-ctx.Done():
		// Deregister anyway: the memory is about to go away, and no NIC
		// may touch it afterwards; transfers still using it fail.
		err = fmt.Errorf("rdma: transfers still using [%#x,+%d): %w", addr, length, ctx.Err())
	}
	t.regs.remove(reg)
	if errs := reg.closeMRs(); len(errs) > 0 {
		return errors.Join(append([]error{err}, errs...)...)
	}
	return err
}

// closeMRs deregisters the region's MRs once.
func (r *region) closeMRs() []error {
	r.mu.Lock()
	mrs := r.mrs
	r.mrs = nil
	r.mu.Unlock()
	var errs []error
	for _, m := range mrs {
		if e := m.Close(); e != nil {
			errs = append(errs, e)
		}
	}
	return errs
}
