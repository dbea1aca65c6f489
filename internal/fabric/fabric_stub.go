//go:build !cgo || !fabric

package fabric

import "fmt"

// Built reports whether this build has the libfabric code (tag fabric,
// cgo on).
const Built = false

var errNotBuilt = fmt.Errorf("%w: built without the fabric tag or without cgo (make build sets it where libfabric-dev is installed)", ErrNotSupported)

// Load reports ErrNotSupported: this build has no libfabric code.
func Load(path string) error { return errNotBuilt }

// Version is "" in this build.
func Version() string { return "" }

// Discover reports ErrNotSupported.
func Discover(provider string, txSize int) ([]Info, error) { return nil, errNotBuilt }

// Endpoint is unavailable in this build.
type Endpoint struct{}

// MR is unavailable in this build.
type MR struct{}

// Open reports ErrNotSupported.
func Open(info Info, o Options) (*Endpoint, error) { return nil, errNotBuilt }

// Info is the zero Info.
func (e *Endpoint) Info() Info { return Info{} }

// Name is nil.
func (e *Endpoint) Name() []byte { return nil }

// Slots is 0.
func (e *Endpoint) Slots() int { return 0 }

// MaxBatch is 0.
func (e *Endpoint) MaxBatch() int { return 0 }

// WaitFD is -1.
func (e *Endpoint) WaitFD() int { return -1 }

// RegisterMR reports ErrNotSupported.
func (e *Endpoint) RegisterMR(mem []byte, key uint64) (*MR, error) { return nil, errNotBuilt }

// Key is 0.
func (m *MR) Key() uint64 { return 0 }

// Close does nothing.
func (m *MR) Close() error { return nil }

// Insert reports ErrNotSupported.
func (e *Endpoint) Insert(addr []byte) (Addr, error) { return 0, errNotBuilt }

// Remove reports ErrNotSupported.
func (e *Endpoint) Remove(a Addr) error { return errNotBuilt }

// Cancel reports ErrNotSupported.
func (e *Endpoint) Cancel(slot uint32) error { return errNotBuilt }

// Progress reports ErrNotSupported.
func (e *Endpoint) Progress(ops []Op, wantWait bool) (Result, []Completion, error) {
	return Result{}, nil, errNotBuilt
}

// Reset reports ErrNotSupported.
func (e *Endpoint) Reset() ([]Completion, error) { return nil, errNotBuilt }

// Close does nothing.
func (e *Endpoint) Close() error { return nil }
