package shm

import (
	"errors"
	"fmt"
	"math"
	"net"
	"slices"
	"sort"
	"sync"
	"time"

	"golang.org/x/sys/unix"

	"github.com/crescent-kv/crescent/engine/transport"
	"github.com/crescent-kv/crescent/internal/auth"
)

// Bounds of what a target's listing makes us hold before any of it is
// mapped: its packets come without limit otherwise.
const (
	// maxListRegions: each region is one mapping, and a process gets
	// 65530 by default (vm.max_map_count).
	maxListRegions = 1 << 16
	// maxListFDs counts distinct memfds (one a pool); above maxFDs, so
	// one full packet always fits.
	maxListFDs = 256
	// maxRevoked ranges are kept while listing; past it they merge into
	// one range covering all (stricter, never looser).
	maxRevoked = 1024
)

// mapping is a target region mapped into this process.
type mapping struct {
	addr, end uint64
	mem       []byte // the region's bytes
	whole     []byte // the page-aligned mapping to unmap
}

// peer is our connection to a same-host target and its mapped regions.
type peer struct {
	t    *Transport
	name string
	path string

	connMu  sync.Mutex
	conn    *net.UnixConn
	failed  time.Time // last failed connect; retried after RetryAfter
	listMu  sync.Mutex
	replies chan listReply

	// mu guards maps: copies hold it shared, revocation exclusively, so
	// a revoked region is never touched after its owner is told it is
	// unmapped.
	mu     sync.RWMutex
	maps   []*mapping // sorted by addr
	closed bool
	// While a listing is in flight, revocations are also kept here so
	// that regions of a reply that crossed them are not mapped.
	listing bool
	revoked []mapping
}

type listReply struct {
	id      uint64   // the list request answered
	regions []region // FD indexes fds
	fds     []int    // one per memfd
	files   []fileID // of fds
	err     error
}

type fileID struct{ dev, ino uint64 }

// add appends one "regions" packet and takes its fds: one is kept per
// memfd, the others and those no region refers to are closed at once.
// Past the bounds it fails; the caller then drops l.
func (l *listReply) add(m *message, fds []int) error {
	idx := make([]int, len(fds)) // in l.fds, or -1
	for i := range idx {
		idx[i] = -1
	}
	used := make([]bool, len(fds))
	for _, r := range m.Regions {
		if r.FD >= 0 && r.FD < len(fds) {
			used[r.FD] = true
		}
	}
	var err error
	for i, fd := range fds {
		var st unix.Stat_t
		if !used[i] || err != nil || unix.Fstat(fd, &st) != nil {
			unix.Close(fd) // unused, past the cap, or unusable (its regions then fail)
			continue
		}
		id := fileID{dev: st.Dev, ino: st.Ino}
		if j := slices.Index(l.files, id); j >= 0 {
			unix.Close(fd)
			idx[i] = j
			continue
		}
		if len(l.fds) == maxListFDs {
			unix.Close(fd)
			err = fmt.Errorf("%w: listing with more than %d memfds", errBadMessage, maxListFDs)
			continue
		}
		l.fds, l.files = append(l.fds, fd), append(l.files, id)
		idx[i] = len(l.fds) - 1
	}
	if err != nil {
		return err
	}
	if len(l.regions)+len(m.Regions) > maxListRegions {
		return fmt.Errorf("%w: listing with more than %d regions", errBadMessage, maxListRegions)
	}
	for _, r := range m.Regions {
		if r.FD >= 0 && r.FD < len(fds) {
			r.FD = idx[r.FD]
		} else {
			r.FD = -1
		}
		l.regions = append(l.regions, r)
	}
	return nil
}

func newPeer(t *Transport, name, path string) *peer {
	return &peer{t: t, name: name, path: path}
}

// ready returns p if it is connected, nil otherwise.
func (p *peer) ready() *peer {
	p.connMu.Lock()
	defer p.connMu.Unlock()
	if p.conn == nil {
		if time.Since(p.failed) < p.t.cfg.RetryAfter {
			return nil
		}
		if err := p.connectLocked(); err != nil {
			return nil
		}
	}
	return p
}

func (p *peer) connectOnce() {
	p.connMu.Lock()
	defer p.connMu.Unlock()
	if p.conn == nil && p.failed.IsZero() {
		p.connectLocked()
	}
}

func (p *peer) connectLocked() error {
	c, err := net.DialUnix("unixpacket", nil, &net.UnixAddr{Name: p.path, Net: "unixpacket"})
	if err != nil {
		p.failed = time.Now()
		p.t.log.Debug("shm: peer not reachable; using other transports", "peer", p.name, "err", err)
		return err
	}
	if p.t.cfg.Token != nil {
		if err := auth.Client(packets{c}, p.t.cfg.Token, auth.PurposeShmControl, 0); err != nil {
			c.Close()
			p.failed = time.Now()
			p.t.log.Warn("shm: peer refused authentication; using other transports", "peer", p.name, "err", err)
			return err
		}
	}
	p.conn = c
	p.replies = make(chan listReply, 1)
	p.t.wg.Add(1)
	go p.readLoop(c, p.replies)
	if err := p.listLocked(); err != nil {
		c.Close()
		p.conn = nil
		p.failed = time.Now()
		return err
	}
	return nil
}

// list fetches the target's regions again and maps new ones.
func (p *peer) list() error {
	p.connMu.Lock()
	defer p.connMu.Unlock()
	if p.conn == nil {
		return transport.ErrUnreachable
	}
	return p.listLocked()
}

func (p *peer) listLocked() error {
	p.listMu.Lock()
	defer p.listMu.Unlock()
	p.mu.Lock()
	p.listing, p.revoked = true, p.revoked[:0]
	p.mu.Unlock()
	defer func() {
		p.mu.Lock()
		p.listing = false
		p.mu.Unlock()
	}()
	// The id ties the reply to this request: a late reply to an earlier,
	// timed-out list is dropped, not mapped.
	id := p.t.nextID.Add(1)
	if err := send(p.conn, &message{Op: "list", ID: id}, nil); err != nil {
		return err
	}
	timeout := time.NewTimer(p.t.cfg.RevokeTimeout)
	defer timeout.Stop()
	var rep listReply
	for {
		select {
		case rep = <-p.replies:
		case <-timeout.C:
			return fmt.Errorf("shm: %s did not list its regions", p.name)
		}
		if rep.err != nil || rep.id == id {
			break
		}
		closeAll(rep.fds)
	}
	if rep.err != nil {
		return rep.err
	}
	defer closeAll(rep.fds)
	var fresh []*mapping
	for _, r := range rep.regions {
		if p.has(r.Addr, r.Len) {
			continue
		}
		if r.FD < 0 || r.FD >= len(rep.fds) || r.Len == 0 || r.Addr+r.Len < r.Addr {
			for _, f := range fresh {
				unix.Munmap(f.whole)
			}
			return fmt.Errorf("%w: region %+v", errBadMessage, r)
		}
		mp, err := p.mapRegion(rep.fds[r.FD], r)
		if err != nil {
			for _, f := range fresh {
				unix.Munmap(f.whole)
			}
			return err
		}
		fresh = append(fresh, mp)
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed {
		for _, f := range fresh {
			unix.Munmap(f.whole)
		}
		return transport.ErrClosed
	}
	for _, f := range fresh {
		if slices.ContainsFunc(p.revoked, func(r mapping) bool { return f.addr < r.end && r.addr < f.end }) {
			unix.Munmap(f.whole)
			continue
		}
		p.maps = append(p.maps, f)
	}
	sort.Slice(p.maps, func(i, j int) bool { return p.maps[i].addr < p.maps[j].addr })
	return nil
}

func (p *peer) has(addr, n uint64) bool {
	p.mu.RLock()
	defer p.mu.RUnlock()
	_, ok := p.findLocked(addr, n)
	return ok
}

// mapRegion maps the pages holding one region, prefaulted.
func (p *peer) mapRegion(fd int, r region) (*mapping, error) {
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		return nil, fmt.Errorf("shm: fstat memfd: %w", err)
	}
	// Off and Len come from the peer: check them against the file before
	// adding them (int64(Len) may be negative, Off+Len may wrap).
	if r.Off < 0 || r.Off > st.Size || r.Len > uint64(st.Size-r.Off) {
		return nil, fmt.Errorf("%w: region [%d,+%d) beyond memfd size %d", errBadMessage, r.Off, r.Len, st.Size)
	}
	page := int64(unix.Getpagesize())
	start := r.Off &^ (page - 1)
	end := (r.Off + int64(r.Len) + page - 1) &^ (page - 1)
	if end > st.Size {
		return nil, fmt.Errorf("%w: region [%d,+%d) beyond memfd size %d", errBadMessage, r.Off, r.Len, st.Size)
	}
	flags := unix.MAP_SHARED
	// Prefault only a memfd whose pages all exist: faulting in a sparse
	// one's holes would allocate, in this process, memory the target
	// named but never had (a listed region may be as large as it likes).
	if !p.t.cfg.NoPrefault && st.Blocks*512 >= st.Size {
		flags |= unix.MAP_POPULATE
	}
	whole, err := unix.Mmap(fd, start, int(end-start), unix.PROT_READ|unix.PROT_WRITE, flags)
	if err != nil {
		return nil, fmt.Errorf("shm: map region of %s: %w", p.name, err)
	}
	off := r.Off - start
	return &mapping{addr: r.Addr, end: r.Addr + r.Len, mem: whole[off : off+int64(r.Len) : off+int64(r.Len)], whole: whole}, nil
}

// readLoop receives list replies and handles revocations.
func (p *peer) readLoop(c *net.UnixConn, replies chan listReply) {
	defer p.t.wg.Done()
	buf := make([]byte, maxPacket)
	oob := make([]byte, unix.CmsgSpace(4*maxFDs))
	var pending listReply
	for {
		m, fds, err := recv(c, buf, oob)
		if err != nil {
			closeAll(pending.fds) // a listing cut short
			select {
			case replies <- listReply{err: fmt.Errorf("%w: %w", transport.ErrPeerGone, err)}:
			default:
			}
			// The target is gone or cut us off: stop using its memory.
			p.dropAll()
			return
		}
		switch m.Op {
		case "regions":
			pending.id = m.ID
			if err := pending.add(m, fds); err != nil {
				closeAll(pending.fds)
				p.t.log.Warn("shm: target broke the listing bounds; dropping it", "peer", p.name, "err", err)
				select {
				case replies <- listReply{id: m.ID, err: err}:
				default:
				}
				p.dropAll()
				return
			}
			if !m.More {
				select {
				case replies <- pending:
				default: // nobody asked (a timed-out list): drop it
					closeAll(pending.fds)
				}
				pending = listReply{}
			}
		case "revoke":
			closeAll(fds)
			p.revoke(m.Addr, m.Len)
			send(c, &message{Op: "revoked", ID: m.ID}, nil)
		case "error":
			closeAll(fds)
			select {
			case replies <- listReply{err: fmt.Errorf("%w: %s", ErrPermission, m.Error)}:
			default:
			}
		default:
			closeAll(fds)
		}
	}
}

// revoke unmaps every mapping overlapping [addr, addr+n), after copies in
// progress finish.
func (p *peer) revoke(addr, n uint64) {
	end := addr + n
	if end < addr {
		end = math.MaxUint64 // a wrapping range revokes up to the top
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.listing {
		r := mapping{addr: addr, end: end}
		if len(p.revoked) == maxRevoked {
			for _, o := range p.revoked {
				r.addr, r.end = min(r.addr, o.addr), max(r.end, o.end)
			}
			p.revoked = p.revoked[:0]
		}
		p.revoked = append(p.revoked, r)
	}
	kept := p.maps[:0]
	for _, m := range p.maps {
		if m.addr < end && addr < m.end {
			unix.Munmap(m.whole)
			continue
		}
		kept = append(kept, m)
	}
	clear(p.maps[len(kept):])
	p.maps = kept
}

func (p *peer) dropAll() {
	p.mu.Lock()
	for _, m := range p.maps {
		unix.Munmap(m.whole)
	}
	p.maps = nil
	p.mu.Unlock()
	p.connMu.Lock()
	if p.conn != nil {
		p.conn.Close()
		p.conn = nil
		p.failed = time.Now()
	}
	p.connMu.Unlock()
}

func (p *peer) close() {
	p.mu.Lock()
	p.closed = true
	p.mu.Unlock()
	p.dropAll()
}

func (p *peer) findLocked(addr, n uint64) (*mapping, bool) {
	i := sort.Search(len(p.maps), func(i int) bool { return p.maps[i].end > addr })
	if i < len(p.maps) {
		m := p.maps[i]
		if addr >= m.addr && m.end-addr >= n {
			return m, true
		}
	}
	return nil, false
}

func (p *peer) covers(addr, n uint64) bool { return p.has(addr, n) }

var errNotMapped = errors.New("shm: target range not in a shared buffer")

// copy runs the tasks' copies under the shared lock.
func (p *peer) copy(tasks []*transport.Task) {
	p.mu.RLock()
	for _, tk := range tasks {
		n := uint64(len(tk.Local))
		m, ok := p.findLocked(tk.RemoteAddr, n)
		if !ok || p.closed {
			p.mu.RUnlock()
			tk.Complete(0, fmt.Errorf("%w: [%#x,+%d) of %s: %w", transport.ErrOutOfBounds, tk.RemoteAddr, n, p.name, errNotMapped))
			p.mu.RLock()
			continue
		}
		if tk.Aborted() {
			p.mu.RUnlock()
			tk.Complete(0, transport.ErrTimeout)
			p.mu.RLock()
			continue
		}
		off := tk.RemoteAddr - m.addr
		remote := m.mem[off : off+n]
		if tk.Op == transport.Write {
			copy(remote, tk.Local)
		} else {
			copy(tk.Local, remote)
		}
		// Complete outside the lock: completion may run user code.
		p.mu.RUnlock()
		tk.Complete(int(n), nil)
		p.mu.RLock()
	}
	p.mu.RUnlock()
}
