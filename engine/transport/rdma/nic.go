package rdma

import (
	"fmt"
	"sync"
	"sync/atomic"

	"github.com/crescent-kv/crescent/engine/transport/rdma/rdmadev"
)

// nic is one local NIC: its PD and CQ, the table of posted slices (the
// work request id is a slot index and a generation, so a stale or
// duplicated completion never reaches the wrong slice) and the CQ
// poller.
type nic struct {
	t    *Transport
	idx  int
	dev  rdmadev.Device
	name string
	numa int
	port rdmadev.PortInfo // as found at start (LID, GID, MTU)
	path string
	pd   rdmadev.PD
	cq   rdmadev.CQ

	up            atomic.Bool  // port ACTIVE and CQ healthy
	broken        atomic.Bool  // CQ failed: out of service for good
	nextPortCheck atomic.Int64 // unix ns of the next port query while down

	mu      sync.Mutex
	slots   []*slice
	gens    []uint32
	free    []uint32
	waiting map[*endpoint]struct{} // blocked on this NIC's budget
}

func newNIC(t *Transport, idx int, dev rdmadev.Device, info rdmadev.DeviceInfo, port rdmadev.PortInfo) (*nic, error) {
	n := &nic{t: t, idx: idx, dev: dev, name: info.Name, numa: info.NUMANode, port: port,
		path: nicPath(t.env.LocalName, info.Name), waiting: make(map[*endpoint]struct{})}
	var err error
	if n.pd, err = dev.AllocPD(); err != nil {
		return nil, fmt.Errorf("rdma: %s: alloc PD: %w", info.Name, err)
	}
	// The CQ is twice the budget: completions of reset QPs may linger.
	if n.cq, err = dev.CreateCQ(2 * t.cfg.CQDepth); err != nil {
		n.pd.Close()
		return nil, fmt.Errorf("rdma: %s: create CQ: %w", info.Name, err)
	}
	size := t.cfg.CQDepth
	n.slots = make([]*slice, size)
	n.gens = make([]uint32, size)
	n.free = make([]uint32, size)
	for i := range size {
		n.gens[i] = 1
		n.free[i] = uint32(size - 1 - i)
	}
	n.up.Store(port.State == rdmadev.PortActive)
	return n, nil
}

func (n *nic) allocLocked(s *slice) uint64 {
	i := n.free[len(n.free)-1]
	n.free = n.free[:len(n.free)-1]
	n.slots[i] = s
	return uint64(n.gens[i])<<32 | uint64(i)
}

// takeLocked frees the slot of a work request id and returns its slice,
// or nil for a stale id.
func (n *nic) takeLocked(id uint64) *slice {
	i, g := uint32(id), uint32(id>>32)
	if int(i) >= len(n.slots) || n.gens[i] != g || n.slots[i] == nil {
		return nil
	}
	s := n.slots[i]
	n.slots[i] = nil
	if n.gens[i]++; n.gens[i] == 0 {
		n.gens[i] = 1
	}
	n.free = append(n.free, i)
	return s
}

// poll drains the CQ, PollBatch completions per call; when it is empty
// it arms the CQ, polls once more (a completion may have slipped in) and
// waits for the event, never inside C.
func (n *nic) poll() {
	t := n.t
	wcs := make([]rdmadev.Completion, t.cfg.PollBatch)
	got := make([]*slice, len(wcs))
	for {
		k, err := n.cq.Poll(wcs)
		t.st.pollCalls.Add(1)
		if err == nil && k == 0 {
			if t.ctx.Err() != nil {
				return
			}
			if err = n.cq.Arm(); err == nil {
				k, err = n.cq.Poll(wcs)
				t.st.pollCalls.Add(1)
				if err == nil && k == 0 {
					err = n.cq.Wait(t.ctx)
					if t.ctx.Err() != nil {
						return
					}
					if err == nil {
						continue
					}
				}
			}
		}
		if err != nil {
			if t.ctx.Err() != nil {
				return
			}
			t.log.Error("rdma: completion queue failed; NIC taken out of service", "nic", n.path, "err", err)
			n.broken.Store(true)
			n.up.Store(false)
			t.failNIC(n)
			return
		}
		n.handle(wcs[:k], got[:k])
	}
}

// handle processes a batch of completions, then routes failed slices
// again and lets blocked endpoints post.
func (n *nic) handle(wcs []rdmadev.Completion, got []*slice) {
	t := n.t
	n.mu.Lock()
	for i, wc := range wcs {
		got[i] = n.takeLocked(wc.ID)
	}
	var waiting []*endpoint
	if len(n.waiting) > 0 {
		for ep := range n.waiting {
			waiting = append(waiting, ep)
		}
		clear(n.waiting)
	}
	n.mu.Unlock()
	var redo, retry []*slice
	var lastErr error
	kick := waiting
	for i, wc := range wcs {
		s := got[i]
		got[i] = nil
		if s == nil {
			continue // stale: its QP was reset and the slice handled
		}
		ep := s.ep
		t.complete(s, wc.Status, wc.VendorErr, &redo, &retry, &lastErr)
		if !containsEP(kick, ep) {
			kick = append(kick, ep)
		}
	}
	t.resend(redo, false, nil)
	t.resend(retry, true, lastErr)
	for _, ep := range kick {
		ep.kick()
	}
}

func containsEP(eps []*endpoint, ep *endpoint) bool {
	for _, x := range eps {
		if x == ep {
			return true
		}
	}
	return false
}

// checkPort queries the port after an error; a port that is not ACTIVE
// takes the NIC out of path choice until the sweeper sees it back.
func (t *Transport) checkPort(n *nic) {
	pi, err := n.dev.QueryPort(n.port.Num)
	if err == nil && pi.State == rdmadev.PortActive {
		return
	}
	if n.up.Swap(false) {
		t.log.Warn("rdma: port not active; NIC out of service", "nic", n.path, "state", pi.State, "err", err)
	}
	n.nextPortCheck.Store(0)
}

// failNIC takes every endpoint of a NIC out of service.
func (t *Transport) failNIC(n *nic) {
	live, _ := t.cache.snapshot()
	for _, ep := range live {
		if ep.n == n {
			t.resend(ep.fail(fmt.Errorf("rdma: NIC %s out of service", n.path)), false, nil)
		}
	}
}
