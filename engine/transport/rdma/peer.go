package rdma

import (
	"fmt"
	"math"
	"sort"
	"sync/atomic"

	"github.com/crescent-kv/crescent/engine/metadata"
	"github.com/crescent-kv/crescent/engine/transport/rdma/rdmadev"
)

// peerNIC is one NIC of a peer segment, from its descriptor.
type peerNIC struct {
	name string
	path string // "segment@device"
	lid  uint16
	gid  rdmadev.GID
}

// peerBuf is a peer buffer with one rkey per peer NIC.
type peerBuf struct {
	addr, end uint64
	loc       string
	rkeys     []uint32
}

// peerState is what the transport knows of a peer segment, parsed from
// one version of its descriptor.
type peerState struct {
	name   string
	desc   *metadata.SegmentDesc
	nics   []peerNIC
	bufs   []peerBuf // sorted by addr
	matrix matrix
	err    error // why this peer cannot be reached over rdma
	closed atomic.Bool
}

// parsePeer reads a descriptor's rdma fields: devices, per-buffer rkeys
// (one per device, in device order) and the priority matrix.
func parsePeer(name string, d *metadata.SegmentDesc) *peerState {
	ps := &peerState{name: name, desc: d}
	if d == nil {
		ps.err = fmt.Errorf("%w: %s: no descriptor", ErrPeerDescriptor, name)
		return ps
	}
	if !d.HasProtocol(protocolName) {
		ps.err = fmt.Errorf("%w: %s does not serve rdma", ErrPeerDescriptor, name)
		return ps
	}
	if len(d.Devices) == 0 {
		ps.err = fmt.Errorf("%w: %s lists no devices", ErrPeerDescriptor, name)
		return ps
	}
	// A Crescent descriptor says where its rdma NICs are among the
	// devices (other transports list theirs too); a reference one
	// lists only rdma NICs when its protocol is rdma.
	first, count := 0, len(d.Devices)
	switch {
	case d.Crescent != nil && d.Crescent.RDMA != nil:
		first, count = d.Crescent.RDMA.FirstDevice, d.Crescent.RDMA.Devices
	case d.Protocol != protocolName:
		ps.err = fmt.Errorf("%w: %s lists no rdma devices", ErrPeerDescriptor, name)
		return ps
	}
	if count <= 0 || first < 0 || first > len(d.Devices)-count {
		ps.err = fmt.Errorf("%w: %s: rdma devices [%d,+%d) of %d", ErrPeerDescriptor, name, first, count, len(d.Devices))
		return ps
	}
	devs := d.Devices[first : first+count]
	names := make([]string, len(devs))
	for i, dev := range devs {
		if dev.Name == "" {
			ps.err = fmt.Errorf("%w: %s: device %d has no name", ErrPeerDescriptor, name, first+i)
			return ps
		}
		gid, err := rdmadev.ParseGID(dev.GID)
		if err != nil {
			ps.err = fmt.Errorf("%w: %s: device %s: %v", ErrPeerDescriptor, name, dev.Name, err)
			return ps
		}
		names[i] = dev.Name
		ps.nics = append(ps.nics, peerNIC{name: dev.Name, path: nicPath(name, dev.Name), lid: dev.LID, gid: gid})
	}
	for _, b := range d.Buffers {
		if len(b.RKey) < first+count || b.Length == 0 || b.Addr+b.Length < b.Addr {
			continue // not reachable over rdma
		}
		keys := make([]uint32, count)
		ok := true
		for i, k := range b.RKey[first : first+count] {
			if k > math.MaxUint32 {
				ok = false
				break
			}
			keys[i] = uint32(k)
		}
		if ok {
			ps.bufs = append(ps.bufs, peerBuf{addr: b.Addr, end: b.Addr + b.Length, loc: b.Name, rkeys: keys})
		}
	}
	sort.Slice(ps.bufs, func(i, j int) bool { return ps.bufs[i].addr < ps.bufs[j].addr })
	ps.matrix, _ = resolveMatrix(names, d.PriorityMatrix, false)
	return ps
}

// find returns the buffer holding [addr, addr+n).
func (ps *peerState) find(addr, n uint64) *peerBuf {
	i := sort.Search(len(ps.bufs), func(i int) bool { return ps.bufs[i].end > addr })
	if i < len(ps.bufs) && addr >= ps.bufs[i].addr && ps.bufs[i].end-addr >= n {
		return &ps.bufs[i]
	}
	return nil
}
