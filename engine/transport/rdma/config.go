package rdma

import (
	"fmt"
	"time"

	"github.com/crescent-kv/crescent/engine/transport/rdma/rdmadev"
)

// Config tunes the RDMA transport. Zero values take the defaults, which
// are the reference engine's where it has one.
type Config struct {
	// Devices, when set, are the NICs to use instead of discovering them
	// through libibverbs (the software device of package soft, in tests
	// and crescent-bench). The caller owns them: the transport closes
	// what it created on them (PDs, CQs, QPs, MRs), never the devices.
	Devices []rdmadev.Device
	// DeviceNames restricts discovery to these NICs (all usable ones
	// when empty).
	DeviceNames []string
	// Library is the libibverbs file name to load (default
	// "libibverbs.so.1").
	Library string
	// Port is the port used on each NIC; 0 picks the first ACTIVE one.
	Port uint8
	// GIDIndex > 0 forces that GID table entry; 0 picks one (on RoCE the
	// first RoCE v2 GID holding an IPv4 address, else index 0).
	GIDIndex int
	// PriorityMatrix overrides the NIC preferences derived from NUMA
	// nodes: location ("cpu:0") → [preferred NICs, other NICs].
	PriorityMatrix map[string][2][]string

	// SliceSize cuts requests into slices of this many bytes, each one
	// work request (default 64 KiB).
	SliceSize int
	// QPsPerEndpoint is the number of RC QPs per (local NIC, peer NIC)
	// endpoint (default 2).
	QPsPerEndpoint int
	// MaxEndpoints bounds the cached endpoints of all NICs together;
	// the least recently used idle one is evicted beyond it (default
	// 256).
	MaxEndpoints int
	// MaxWR is each QP's send queue depth (default 256); MaxSGE its
	// scatter/gather entries (default 4); MaxInline its inline bytes
	// (default 64).
	MaxWR, MaxSGE, MaxInline int
	// CQDepth bounds the work requests outstanding on one NIC (default
	// 4096); the CQ is created twice as deep.
	CQDepth int
	// PollBatch is the number of completions taken per CQ poll
	// (default 64).
	PollBatch int
	// MaxMTU caps the negotiated path MTU (default 4096).
	MaxMTU rdmadev.MTU
	// Timeout, RetryCount and RNRRetry are the QP's ack timeout
	// exponent (default 14), transport retries (7) and RNR retries (7).
	Timeout, RetryCount, RNRRetry uint8

	// MaxRetries is how often a failed slice is sent again on another
	// path (default 9; -1 = never).
	MaxRetries int
	// PauseErrors errors on one (local NIC, peer NIC) pair within
	// PauseWindow pause the pair for PauseFor (defaults 5, 5s, 5s).
	PauseErrors int
	PauseWindow time.Duration
	PauseFor    time.Duration

	// HandshakeTimeout bounds one endpoint handshake (default 5s).
	HandshakeTimeout time.Duration
	// FlushTimeout bounds how long a QP moved to ERR may take to flush
	// its work requests before it is reset (default 1s).
	FlushTimeout time.Duration
	// SweepInterval is how often deadlines, flushes and paused NICs are
	// checked (default 50ms).
	SweepInterval time.Duration
	// PortCheckInterval is how often a NIC whose port went down is
	// queried again (default 1s).
	PortCheckInterval time.Duration
}

func (c *Config) setDefaults() error {
	def := func(v *int, d int) {
		if *v == 0 {
			*v = d
		}
	}
	defDur := func(v *time.Duration, d time.Duration) {
		if *v == 0 {
			*v = d
		}
	}
	if c.Library == "" {
		c.Library = "libibverbs.so.1"
	}
	def(&c.SliceSize, 64<<10)
	def(&c.QPsPerEndpoint, 2)
	def(&c.MaxEndpoints, 256)
	def(&c.MaxWR, 256)
	def(&c.MaxSGE, 4)
	def(&c.MaxInline, 64)
	def(&c.CQDepth, 4096)
	def(&c.PollBatch, 64)
	def(&c.MaxRetries, 9)
	def(&c.PauseErrors, 5)
	defDur(&c.PauseWindow, 5*time.Second)
	defDur(&c.PauseFor, 5*time.Second)
	defDur(&c.HandshakeTimeout, 5*time.Second)
	defDur(&c.FlushTimeout, time.Second)
	defDur(&c.SweepInterval, 50*time.Millisecond)
	defDur(&c.PortCheckInterval, time.Second)
	if c.MaxMTU == 0 {
		c.MaxMTU = rdmadev.MTU4096
	}
	if c.Timeout == 0 {
		c.Timeout = 14
	}
	if c.RetryCount == 0 {
		c.RetryCount = 7
	}
	if c.RNRRetry == 0 {
		c.RNRRetry = 7
	}
	if c.MaxRetries < 0 {
		c.MaxRetries = 0
	}
	switch {
	case c.SliceSize < 0 || c.SliceSize > 1<<30:
		return fmt.Errorf("%w: slice size %d", ErrConfig, c.SliceSize)
	case c.QPsPerEndpoint < 0 || c.QPsPerEndpoint > maxQPsPerEndpoint:
		return fmt.Errorf("%w: %d QPs per endpoint (1..%d)", ErrConfig, c.QPsPerEndpoint, maxQPsPerEndpoint)
	case c.MaxEndpoints < 0, c.MaxWR < 0, c.MaxSGE < 0, c.MaxInline < 0, c.PollBatch < 0, c.PauseErrors < 0:
		return fmt.Errorf("%w: negative size in %+v", ErrConfig, *c)
	case c.CQDepth < c.MaxWR:
		return fmt.Errorf("%w: CQ depth %d below max_wr %d", ErrConfig, c.CQDepth, c.MaxWR)
	case !c.MaxMTU.Valid():
		return fmt.Errorf("%w: MTU %d", ErrConfig, c.MaxMTU)
	case c.GIDIndex < 0:
		return fmt.Errorf("%w: GID index %d", ErrConfig, c.GIDIndex)
	}
	return nil
}

// maxQPsPerEndpoint bounds the QPs a handshake may ask for.
const maxQPsPerEndpoint = 64
