package cxl

import (
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"

	"golang.org/x/sys/unix"

	"github.com/crescent-kv/crescent/engine/metadata"
	"github.com/crescent-kv/crescent/engine/transport"
)

// Environment variables the reference reads, honoured when Config leaves
// the fields empty.
const (
	EnvDevPath = "MC_CXL_DEV_PATH"
	EnvDevSize = "MC_CXL_DEV_SIZE"
)

// ErrNoDevice means no CXL device was configured.
var ErrNoDevice = errors.New("cxl: no device configured (set Config.Path or " + EnvDevPath + ")")

// Config names the device.
type Config struct {
	// Path of a DAX character device (/dev/dax0.0) or of a file standing
	// in for one.
	Path string
	// Size to map; 0 takes MC_CXL_DEV_SIZE, the DAX device's size in
	// sysfs, or the file's size.
	Size int64
	// Name identifies the device across hosts (cxl_name); default the
	// path's base name.
	Name string
	// Flush writes back (CLFLUSHOPT) the cache lines of every copied range,
	// for devices shared without hardware coherence. Coherent devices
	// (and files) need only the fence, the default.
	Flush bool
}

// Device is a CXL memory device mapped MAP_SHARED into this process.
// Processes (and hosts) mapping the same device see each other's writes.
type Device struct {
	name  string
	path  string
	fd    int
	mem   []byte
	flush bool
	refs  atomic.Int32
}

// Open maps the device.
func Open(cfg Config) (*Device, error) {
	if cfg.Path == "" {
		cfg.Path = os.Getenv(EnvDevPath)
	}
	if cfg.Path == "" {
		return nil, ErrNoDevice
	}
	if cfg.Flush && !flushSupported() {
		return nil, fmt.Errorf("cxl: Flush needs CLFLUSHOPT on amd64, which this CPU lacks")
	}
	fd, err := unix.Open(cfg.Path, unix.O_RDWR|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, fmt.Errorf("cxl: open %s: %w", cfg.Path, err)
	}
	size, err := deviceSize(fd, cfg)
	if err != nil {
		unix.Close(fd)
		return nil, err
	}
	mem, err := unix.Mmap(fd, 0, int(size), unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED)
	if err != nil {
		unix.Close(fd)
		return nil, fmt.Errorf("cxl: map %d bytes of %s: %w", size, cfg.Path, err)
	}
	name := cfg.Name
	if name == "" {
		name = filepath.Base(cfg.Path)
	}
	d := &Device{name: name, path: cfg.Path, fd: fd, mem: mem, flush: cfg.Flush}
	d.refs.Store(1)
	return d, nil
}

var hasFlush = sync.OnceValue(func() bool {
	b, err := os.ReadFile("/proc/cpuinfo")
	return err == nil && strings.Contains(string(b), " clflushopt")
})

func flushSupported() bool { return canFlush && hasFlush() }

func deviceSize(fd int, cfg Config) (int64, error) {
	if cfg.Size > 0 {
		return cfg.Size, nil
	}
	if s := os.Getenv(EnvDevSize); s != "" {
		n, err := strconv.ParseInt(s, 10, 64)
		if err != nil || n <= 0 {
			return 0, fmt.Errorf("cxl: bad %s=%q", EnvDevSize, s)
		}
		return n, nil
	}
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		return 0, fmt.Errorf("cxl: stat %s: %w", cfg.Path, err)
	}
	if st.Mode&unix.S_IFMT == unix.S_IFCHR {
		// A DAX device reports its size in sysfs.
		dev := filepath.Base(cfg.Path)
		b, err := os.ReadFile("/sys/bus/dax/devices/" + dev + "/size")
		if err != nil {
			return 0, fmt.Errorf("cxl: size of %s: %w (set Config.Size or %s)", cfg.Path, err, EnvDevSize)
		}
		return strconv.ParseInt(strings.TrimSpace(string(b)), 10, 64)
	}
	if st.Size <= 0 {
		return 0, fmt.Errorf("cxl: %s is empty (set Config.Size or %s)", cfg.Path, EnvDevSize)
	}
	return st.Size, nil
}

// Bytes is the whole mapped device. Register sub-slices of it with the
// engine to make them reachable over CXL.
func (d *Device) Bytes() []byte { return d.mem }

// Name is the device's name in descriptors.
func (d *Device) Name() string { return d.name }

// Base is the address of the mapping.
func (d *Device) Base() uint64 { return transport.AddrOf(d.mem) }

// Offset returns b's offset in the device, if b lies inside the mapping.
func (d *Device) Offset(b []byte) (uint64, bool) {
	return d.offsetOf(transport.AddrOf(b), uint64(len(b)))
}

func (d *Device) offsetOf(a, n uint64) (uint64, bool) {
	base, size := d.Base(), uint64(len(d.mem))
	if n == 0 || a < base || a-base > size || n > size-(a-base) {
		return 0, false
	}
	return a - base, true
}

// Close unmaps the device once every user closed it.
func (d *Device) Close() error {
	if d.refs.Add(-1) != 0 {
		return nil
	}
	err := unix.Munmap(d.mem)
	if cerr := unix.Close(d.fd); err == nil {
		err = cerr
	}
	return err
}

// Transport moves bytes through a CXL device that this engine and its peer
// both map: a copy into (or out of) the shared mapping, then a fence.
type Transport struct {
	cfg Config
	dev *Device
	env transport.Env
	log *slog.Logger

	mu    sync.Mutex
	index map[*metadata.SegmentDesc][]span // per descriptor, sorted by addr
}

// span is a peer buffer that lives in the device.
type span struct{ addr, end, off uint64 }

var _ transport.Transport = (*Transport)(nil)

// New returns a CXL transport; Start maps the device from cfg.
func New(cfg Config) *Transport {
	return &Transport{cfg: cfg, index: map[*metadata.SegmentDesc][]span{}}
}

// NewWithDevice returns a transport over an already opened device (which
// the caller also uses to allocate registered buffers); it takes a
// reference, released by Close.
func NewWithDevice(d *Device) *Transport {
	d.refs.Add(1)
	return &Transport{dev: d, index: map[*metadata.SegmentDesc][]span{}}
}

// Name implements transport.Transport.
func (t *Transport) Name() string { return "cxl" }

// Device is the mapped device.
func (t *Transport) Device() *Device { return t.dev }

// Start implements transport.Transport.
func (t *Transport) Start(env transport.Env) error {
	t.env, t.log = env, env.Logger
	if t.log == nil {
		t.log = slog.Default()
	}
	if t.dev == nil {
		d, err := Open(t.cfg)
		if err != nil {
			return err
		}
		t.dev = d
	}
	return nil
}

// Describe implements transport.Transport: the device name, the mapping
// base, and each registered buffer inside the device with its offset.
func (t *Transport) Describe(d *metadata.SegmentDesc) {
	d.CXLName = t.dev.name
	d.CXLBaseAddr = t.dev.Base()
	for i := range d.Buffers {
		b := &d.Buffers[i]
		if off, ok := t.dev.offsetOf(b.Addr, b.Length); ok {
			o := off
			b.Offset = &o
		}
	}
}

// spans returns the device-resident buffers of a descriptor.
func (t *Transport) spans(d *metadata.SegmentDesc) []span {
	t.mu.Lock()
	defer t.mu.Unlock()
	if s, ok := t.index[d]; ok {
		return s
	}
	var s []span
	for _, b := range d.Buffers {
		if b.Offset != nil && b.Length > 0 && b.Addr+b.Length >= b.Addr {
			s = append(s, span{addr: b.Addr, end: b.Addr + b.Length, off: *b.Offset})
		}
	}
	sort.Slice(s, func(i, j int) bool { return s[i].addr < s[j].addr })
	if len(t.index) > 1024 {
		clear(t.index) // descriptors are replaced on refresh; keep the cache small
	}
	t.index[d] = s
	return s
}

// locate maps a peer range to a device offset.
func (t *Transport) locate(d *metadata.SegmentDesc, addr, n uint64) (uint64, bool) {
	if d == nil || d.CXLName != t.dev.name {
		return 0, false
	}
	s := t.spans(d)
	i := sort.Search(len(s), func(i int) bool { return s[i].end > addr })
	if i == len(s) || addr < s[i].addr || s[i].end-addr < n {
		return 0, false
	}
	// The offset comes from the peer: add only what cannot wrap.
	size, base, delta := uint64(len(t.dev.mem)), s[i].off, addr-s[i].addr
	if base > size || delta > size-base || n > size-base-delta {
		return 0, false
	}
	return base + delta, true
}

// Accepts implements transport.Transport: the peer names the same device
// and the range lies in one of its device-resident buffers.
func (t *Transport) Accepts(p transport.Peer, addr, length uint64) bool {
	_, ok := t.locate(p.Desc(), addr, length)
	return ok
}

// Submit implements transport.Transport. The copies run inline; a fence
// after each makes a WRITE visible before its completion is reported.
func (t *Transport) Submit(p transport.Peer, tasks []*transport.Task) {
	d := p.Desc()
	for _, tk := range tasks {
		n := uint64(len(tk.Local))
		off, ok := t.locate(d, tk.RemoteAddr, n)
		if !ok {
			tk.Complete(0, fmt.Errorf("%w: [%#x,+%d) not in a buffer of %s on device %s", transport.ErrOutOfBounds, tk.RemoteAddr, n, p.Name(), t.dev.name))
			continue
		}
		if tk.Aborted() {
			tk.Complete(0, transport.ErrTimeout)
			continue
		}
		dev := t.dev.mem[off : off+n]
		if tk.Op == transport.Write {
			copy(dev, tk.Local)
			if t.dev.flush {
				flushRange(dev) // write back: peers without coherence read memory
			}
			fence()
		} else {
			if t.dev.flush {
				flushRange(dev) // drop lines a peer may have changed under us
			}
			fence()
			copy(tk.Local, dev)
		}
		tk.Complete(int(n), nil)
	}
}

// ClosePeer implements transport.Transport.
func (t *Transport) ClosePeer(string) {}

// Close implements transport.Transport.
func (t *Transport) Close() error {
	if t.dev == nil {
		return nil
	}
	return t.dev.Close()
}
