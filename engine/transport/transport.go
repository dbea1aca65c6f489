package transport

import (
	"context"
	"encoding/json"
	"errors"
	"log/slog"
	"sync/atomic"
	"time"

	"github.com/crescent-kv/crescent/engine/metadata"
)

// Op is the direction of a request, seen from the initiator.
type Op uint8

const (
	// Read copies remote memory into local memory.
	Read Op = 0
	// Write copies local memory into remote memory.
	Write Op = 1
)

func (o Op) String() string {
	switch o {
	case Read:
		return "read"
	case Write:
		return "write"
	}
	return "op(?)"
}

// Errors transports report in Task completions. The engine maps them to
// request statuses (TIMEOUT for ErrTimeout, FAILED for the rest).
var (
	ErrTimeout        = errors.New("transport: request deadline exceeded")
	ErrRejected       = errors.New("transport: target rejected the request (address not in a registered buffer)")
	ErrPeerGone       = errors.New("transport: peer connection lost")
	ErrClosed         = errors.New("transport: closed")
	ErrUnreachable    = errors.New("transport: peer not reachable by this transport")
	ErrProtocol       = errors.New("transport: protocol error")
	ErrNotSupported   = errors.New("transport: not supported on this host")
	ErrOutOfBounds    = errors.New("transport: address range not in a registered buffer")
	ErrBufferBusy     = errors.New("transport: buffer still in use by transfers")
	ErrNotRegistered  = errors.New("transport: buffer not registered")
	ErrAlreadyExists  = errors.New("transport: buffer overlaps a registered buffer")
	ErrInvalidAddress = errors.New("transport: invalid address or length")
)

// Task is one request (or one slice of one) handed to a transport. The
// engine fills it; the transport calls Complete exactly once.
type Task struct {
	Op         Op
	Local      []byte // registered local memory; len is the transfer length
	RemoteAddr uint64 // remote virtual address (RAM segments) or offset (CXL)
	Deadline   time.Time

	done    func(t *Task, n int, err error)
	aborted atomic.Bool
	// Tag is free for the owner of the Task (the engine stores its request
	// index here); transports must not touch it.
	Tag uint64
}

// NewTask returns a task whose completion calls done.
func NewTask(op Op, local []byte, remote uint64, deadline time.Time, done func(t *Task, n int, err error)) *Task {
	return &Task{Op: op, Local: local, RemoteAddr: remote, Deadline: deadline, done: done}
}

// SetDone sets the completion callback; used by owners that reuse Tasks.
func (t *Task) SetDone(done func(t *Task, n int, err error)) { t.done = done }

// Abort tells the transport the owner no longer waits for the task; a
// transport that has not started it yet should complete it at once with
// ErrTimeout or context.Canceled instead of moving bytes.
func (t *Task) Abort() { t.aborted.Store(true) }

// Aborted reports whether Abort was called.
func (t *Task) Aborted() bool { return t.aborted.Load() }

// Reset clears the abort flag before a task is reused.
func (t *Task) Reset() { t.aborted.Store(false) }

// Complete reports the outcome: n bytes moved and a nil error on success.
func (t *Task) Complete(n int, err error) {
	if t.done != nil {
		t.done(t, n, err)
	}
}

// Env is what the engine gives a transport when it starts it.
type Env struct {
	// LocalName is the engine's segment name (host:port).
	LocalName string
	// Host is the address other hosts use to reach this one.
	Host string
	// HostID identifies this machine (boot id); equal HostIDs mean shared
	// memory is possible.
	HostID string
	// Registry holds the memory that remote peers may touch.
	Registry *Registry
	// Logger is the engine's; a transport started with nil uses
	// slog.Default().
	Logger *slog.Logger
	// Handshake lets transports exchange endpoint information with peers
	// over the engine's handshake (Connection frames). Nil in tests that
	// need none.
	Handshake Handshake
}

// Handshake is the engine's handshake, as transports use it.
type Handshake interface {
	// Handle installs the handler of Connection requests whose "protocol"
	// field is protocol; it returns the reply JSON, and an error is sent
	// to the peer as "reply_msg".
	Handle(protocol string, h func(req json.RawMessage) (json.RawMessage, error))
	// Exchange sends a Connection request to the engine of segment peer
	// and returns its reply; a reply carrying an error comes back as one.
	Exchange(ctx context.Context, peer string, req []byte) ([]byte, error)
}

// Peer is an opened remote segment as transports see it.
type Peer interface {
	// Name is the remote segment name.
	Name() string
	// Desc returns the newest known descriptor of the segment.
	Desc() *metadata.SegmentDesc
	// Refresh fetches the descriptor again (rate-limited by the engine)
	// and returns it.
	Refresh(ctx context.Context) (*metadata.SegmentDesc, error)
}

// Transport moves bytes between registered local memory and a peer
// segment. Implementations are batch-first: Submit takes many tasks at once
// and must not block on the network; every task completes exactly once,
// by its deadline or shortly after.
type Transport interface {
	// Name is the protocol name used in descriptors and configuration
	// ("tcp", "shm", "rdma", "efa", "cxl").
	Name() string
	// Start opens listeners and resources.
	Start(env Env) error
	// Describe adds this transport's fields to the local descriptor.
	Describe(d *metadata.SegmentDesc)
	// Accepts reports whether this transport can carry a request to
	// [addr, addr+length) of peer. The engine asks transports in order of
	// preference and uses the first that accepts.
	Accepts(p Peer, addr, length uint64) bool
	// Submit starts the tasks; it never waits for their completion.
	Submit(p Peer, tasks []*Task)
	// ClosePeer drops the connections and state kept for a peer.
	ClosePeer(name string)
	// Close stops the transport; pending tasks complete with ErrClosed.
	Close() error
}

// Unregisterer is implemented by transports that must act before a local
// buffer disappears (for example, to tell same-host peers to unmap it).
type Unregisterer interface {
	BeforeUnregister(ctx context.Context, addr, length uint64) error
}

// Registerer is implemented by transports that act when local memory is
// registered (for example, NIC memory registration).
type Registerer interface {
	AfterRegister(r *Region) error
}
