//go:build !cgo || !verbs

package verbs

import (
	"fmt"

	"github.com/crescent-kv/crescent/engine/transport/rdma/rdmadev"
)

// Library is a loaded libibverbs. In this build (no cgo, or no verbs
// tag) it cannot be loaded.
type Library struct{}

// Load reports ErrUnavailable: this binary was built without libibverbs
// support.
func Load(name string) (*Library, error) {
	return nil, fmt.Errorf("%w: built without cgo and the verbs build tag", ErrUnavailable)
}

// Devices reports ErrUnavailable.
func (l *Library) Devices(Options) ([]rdmadev.Device, error) { return nil, ErrUnavailable }

// Close does nothing.
func (l *Library) Close() error { return nil }

// Name is the library file name ("" in this build).
func (l *Library) Name() string { return "" }
