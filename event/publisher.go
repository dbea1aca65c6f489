package event

import (
	"context"
	"encoding/binary"
	"fmt"
	"log/slog"
	"net"
	"sync"
	"sync/atomic"
	"time"

	"github.com/go-zeromq/zmq4"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/crescent-kv/crescent/event/internal/zmtp"
	"github.com/crescent-kv/crescent/internal/netx"
)

// SocketMode says whether the PUB socket binds or connects.
type SocketMode uint8

const (
	// ModeAuto applies vLLM's rule: bind when the endpoint contains "*" or
	// "::" or is ipc://, otherwise connect (to a SUB that binds, as llm-d's
	// indexer does).
	ModeAuto SocketMode = iota
	// ModeBind always binds (e.g. tcp://127.0.0.1:0 on loopback only).
	ModeBind
	// ModeConnect always connects.
	ModeConnect
)

// PublisherConfig configures a Publisher. The zero value of every field
// but Endpoint has a usable default.
type PublisherConfig struct {
	// Endpoint of the PUB socket, tcp://host:port or ipc://path. Port 0
	// binds a free port (see Publisher.Endpoint). Default tcp://*:5557.
	Endpoint string
	// Mode: bind or connect; ModeAuto follows vLLM's rule.
	Mode SocketMode
	// ReplayEndpoint, when set, is bound as a ROUTER answering replay
	// requests from the last ReplayBuffer batches.
	ReplayEndpoint string
	// Topic is the first frame of every message (default empty; llm-d
	// expects kv@<pod>@<model>).
	Topic string
	// Encoding of the events inside each batch (default EncodingMap).
	Encoding Encoding
	// DataParallelRank is written into every batch; nil writes None.
	DataParallelRank *int
	// QueueSize bounds the events waiting to be sent (default 100000).
	QueueSize int
	// Overflow is what Publish does when the queue is full. The zero
	// value is Block, vLLM's behaviour: an inference engine's producer
	// loses nothing. crescent-master defaults to DropOldest instead
	// (--kv_events_overflow): a metadata RPC must not wait on a slow
	// subscriber, and what it drops shows as a sequence gap.
	Overflow OverflowPolicy
	// MaxBatchEvents bounds the events in one batch (default 64).
	MaxBatchEvents int
	// FlushInterval is how long the sender waits after the first event of
	// a batch for the batch to fill. 0 (the default) sends as soon as the
	// sender is free; batches then grow only under load.
	FlushInterval time.Duration
	// ReplayBuffer is the number of batches kept for replay (default
	// 10000); used only with ReplayEndpoint.
	ReplayBuffer int
	// SendHWM bounds the batches queued for one subscriber (default
	// 10000); past it a slow subscriber misses batches (a gap it can
	// replay) instead of holding up the others. Negative: unbounded.
	SendHWM int
	// NoDrop makes the sender wait for a slow subscriber instead of
	// dropping at SendHWM; with Overflow Block this back-pressures
	// producers end to end.
	NoDrop bool
	// ReplayWriteTimeout bounds each write to a replay client (default
	// 30s); a client that stops reading is disconnected.
	ReplayWriteTimeout time.Duration
	// MaxTopicSize bounds the topic of a subscription a subscriber sends
	// (default 256 bytes). A subscriber that sends a longer one, more
	// than MaxSubscriptions, or anything but subscribe and cancel
	// messages is disconnected.
	MaxTopicSize int
	// MaxSubscriptions bounds one subscriber's live subscriptions
	// (default 1024).
	MaxSubscriptions int
	// MaxConns caps the connections on each bound socket, PUB and replay
	// (default 4096); MaxConnsPerHost caps those from one IP (default
	// MaxConns). At a cap the connection idle longest (not subscribed, or
	// between replay requests) is closed to make room. Negative: no cap.
	MaxConns, MaxConnsPerHost int
	// Allow, when set, admits subscribers by address on both sockets
	// (netx.Config.Allow; the protected default passes loopback only).
	Allow func(net.Addr) bool
	// Now is the clock for batch timestamps (default time.Now).
	Now func() time.Time
	// Logger receives operational warnings; nil = slog.Default(), so the
	// application's slog setup applies.
	Logger *slog.Logger

	hooks *testHooks // set by this package's tests only
}

// testHooks let tests stall the sender and lose live messages on purpose.
type testHooks struct {
	beforeSend func(seq uint64)      // called by the sender before each batch goes out
	dropLive   func(seq uint64) bool // true: keep the batch for replay but do not send it live
}

func (c *PublisherConfig) setDefaults() error {
	if c.Endpoint == "" {
		c.Endpoint = "tcp://*:5557"
	}
	if c.QueueSize == 0 {
		c.QueueSize = 100000
	}
	if c.MaxBatchEvents == 0 {
		c.MaxBatchEvents = 64
	}
	if c.ReplayBuffer == 0 {
		c.ReplayBuffer = 10000
	}
	if c.SendHWM == 0 {
		c.SendHWM = 10000
	}
	if c.ReplayWriteTimeout <= 0 {
		c.ReplayWriteTimeout = 30 * time.Second
	}
	if c.Now == nil {
		c.Now = time.Now
	}
	if c.Logger == nil {
		c.Logger = slog.Default()
	}
	switch {
	case c.QueueSize < 0, c.MaxBatchEvents < 0, c.ReplayBuffer < 0, c.FlushInterval < 0,
		c.MaxTopicSize < 0, c.MaxSubscriptions < 0:
		return fmt.Errorf("%w: negative size or interval", ErrConfig)
	case c.Encoding != EncodingMap && c.Encoding != EncodingArray:
		return fmt.Errorf("%w: unknown encoding %d", ErrConfig, c.Encoding)
	case c.Overflow != Block && c.Overflow != DropOldest:
		return fmt.Errorf("%w: unknown overflow policy %d", ErrConfig, c.Overflow)
	case c.Mode > ModeConnect:
		return fmt.Errorf("%w: unknown socket mode %d", ErrConfig, c.Mode)
	}
	return nil
}

// Stats is a snapshot of a Publisher's counters.
type Stats struct {
	QueueDepth       int    // events waiting in the queue now
	QueueCapacity    int    // QueueSize
	PublishedBatches uint64 // batches sent (each took one seq)
	PublishedEvents  uint64 // events in those batches
	DroppedEvents    uint64 // events dropped by DropOldest
	SkippedSeqs      uint64 // seqs burned for dropped events
	SubscriberDrops  uint64 // batches not delivered to a subscriber at SendHWM
	Subscribers      int    // connected peers with a subscription
	ReplayRequests   uint64
	NextSeq          uint64 // seq of the next batch
}

// Publisher sends event batches on a ZMQ PUB socket, vLLM-compatible on
// the wire, from a bounded queue drained by one sender goroutine.
type Publisher struct {
	cfg      PublisherConfig
	topic    []byte
	log      *slog.Logger
	q        *queue
	ring     *ring
	pub      *zmtp.Pub
	replay   *zmtp.Server
	endpoint string
	replayEP string

	sendCtx    context.Context
	cancelSend context.CancelFunc
	senderDone chan struct{}
	closeOnce  sync.Once
	closeErr   error

	nextSeq        atomic.Uint64
	batches        atomic.Uint64
	events         atomic.Uint64
	skippedSeqs    atomic.Uint64
	replayRequests atomic.Uint64
}

// NewPublisher binds or connects the sockets and starts the sender.
func NewPublisher(cfg PublisherConfig) (*Publisher, error) {
	if err := cfg.setDefaults(); err != nil {
		return nil, err
	}
	ep, err := zmtp.Parse(cfg.Endpoint)
	if err != nil {
		return nil, fmt.Errorf("%w: %w", ErrEndpoint, err)
	}
	p := &Publisher{
		cfg:        cfg,
		topic:      []byte(cfg.Topic),
		log:        cfg.Logger,
		q:          newQueue(cfg.QueueSize, cfg.Overflow),
		senderDone: make(chan struct{}),
	}
	if cfg.ReplayEndpoint != "" {
		p.ring = newRing(cfg.ReplayBuffer)
	} else {
		p.ring = newRing(0)
	}
	hwm := cfg.SendHWM
	if hwm < 0 {
		hwm = 0
	}
	listener := func(name string) netx.Config {
		return netx.Config{MaxConns: cfg.MaxConns, MaxConnsPerHost: cfg.MaxConnsPerHost, Name: name, Logger: cfg.Logger, Allow: cfg.Allow}
	}
	p.pub = zmtp.NewPub(zmtp.PubConfig{HWM: hwm, NoDrop: cfg.NoDrop, MaxTopic: cfg.MaxTopicSize,
		MaxSubscriptions: cfg.MaxSubscriptions, Listener: listener("kv events pub"), Logger: cfg.Logger})
	bind := cfg.Mode == ModeBind || (cfg.Mode == ModeAuto && zmtp.ShouldBind(cfg.Endpoint))
	if bind {
		ln, err := zmtp.Listen(ep)
		if err != nil {
			_ = p.pub.Close()
			return nil, fmt.Errorf("%w: %w", ErrEndpoint, err)
		}
		p.endpoint = zmtp.BoundEndpoint(ln, ep)
		p.pub.Serve(ln)
	} else {
		p.endpoint = cfg.Endpoint
		p.pub.Connect(ep)
	}
	if cfg.ReplayEndpoint != "" {
		rep, err := zmtp.Parse(cfg.ReplayEndpoint)
		if err == nil {
			var l net.Listener
			if l, err = zmtp.Listen(rep); err == nil {
				p.replayEP = zmtp.BoundEndpoint(l, rep)
				p.replay = zmtp.Serve(l, zmtp.ServerConfig{Type: zmq4.Router, Limits: replayRequestLimits,
					Listener: listener("kv events replay")}, p.serveReplay)
			}
		}
		if err != nil {
			_ = p.pub.Close()
			return nil, fmt.Errorf("%w: replay: %w", ErrEndpoint, err)
		}
	}
	p.sendCtx, p.cancelSend = context.WithCancel(context.Background())
	go p.run()
	return p, nil
}

// Endpoint returns the PUB endpoint: for a bind, a dialable address with
// the port actually chosen (port 0) and loopback for a wildcard host.
func (p *Publisher) Endpoint() string { return p.endpoint }

// ReplayEndpoint returns the bound replay endpoint, or "".
func (p *Publisher) ReplayEndpoint() string { return p.replayEP }

// Publish queues events for the next batches, in order. It never waits
// for the network: under DropOldest it never waits at all; under Block it
// waits only for queue room. Events must not be modified afterwards.
func (p *Publisher) Publish(events ...Event) error {
	return p.PublishContext(context.Background(), events...)
}

// PublishContext is Publish whose wait for queue room (Block) ends with
// ctx. On error, the events before the first one not queued were queued.
func (p *Publisher) PublishContext(ctx context.Context, events ...Event) error {
	for i, ev := range events {
		if err := validate(ev); err != nil {
			return fmt.Errorf("event %d: %w", i, err)
		}
	}
	n, err := p.q.push(ctx, events)
	if err != nil {
		return fmt.Errorf("event: %d of %d events not queued: %w", len(events)-n, len(events), err)
	}
	return nil
}

func (p *Publisher) run() {
	defer close(p.senderDone)
	var (
		evs     = make([]Event, 0, p.cfg.MaxBatchEvents)
		scratch = make([]byte, 0, 64<<10)
		timer   = time.NewTimer(time.Hour)
		batch   = EventBatch{DataParallelRank: p.cfg.DataParallelRank}
		seqBuf  [8]byte
	)
	timer.Stop()
	for {
		var dropped uint64
		var ok bool
		evs, dropped, ok = p.q.pop(evs[:0], p.cfg.MaxBatchEvents, p.cfg.FlushInterval, timer)
		if !ok {
			return
		}
		seq := p.nextSeq.Load()
		if dropped > 0 {
			// The dropped events' batch number is never sent: a gap the
			// subscribers can see and cannot replay.
			seq++
			p.skippedSeqs.Add(1)
		}
		batch.Timestamp = float64(p.cfg.Now().UnixNano()) / 1e9
		batch.Events = evs
		var err error
		scratch, err = AppendBatch(scratch[:0], &batch, p.cfg.Encoding)
		if err != nil {
			// validate() makes this unreachable; never lose the seq order.
			p.log.Error("event: batch not encodable, dropped", "err", err, "events", len(evs))
			clear(evs)
			continue
		}
		binary.BigEndian.PutUint64(seqBuf[:], seq)
		// One allocation per batch: the ring and every subscriber queue
		// share these bytes, which are never modified.
		size := zmtp.HeaderLen(len(p.topic)) + len(p.topic) + zmtp.HeaderLen(8) + 8 + zmtp.HeaderLen(len(scratch)) + len(scratch)
		wire := zmtp.AppendMsg(make([]byte, 0, size), p.topic, seqBuf[:], scratch)
		if h := p.cfg.hooks; h != nil && h.beforeSend != nil {
			h.beforeSend(seq)
		}
		p.ring.add(ringEntry{seq: seq, wire: wire, off: len(wire) - len(scratch)})
		// Counted before the send: a subscriber never holds a batch that
		// Stats does not count yet.
		p.nextSeq.Store(seq + 1)
		p.batches.Add(1)
		p.events.Add(uint64(len(evs)))
		if h := p.cfg.hooks; h == nil || h.dropLive == nil || !h.dropLive(seq) {
			p.pub.Send(p.sendCtx, p.cfg.Topic, wire)
		}
		clear(evs)
	}
}

// Close stops accepting events, sends everything queued, writes it out to
// the connected subscribers and closes the sockets. If ctx ends first,
// what is left is discarded and Close returns an error wrapping ctx.Err()
// that counts it. Close is idempotent.
func (p *Publisher) Close(ctx context.Context) error {
	p.closeOnce.Do(func() {
		p.q.close()
		select {
		case <-p.senderDone:
		case <-ctx.Done():
			p.cancelSend()
			lost := p.q.discard()
			<-p.senderDone
			p.closeErr = fmt.Errorf("event: close: %d queued events not sent: %w", lost, ctx.Err())
		}
		if err := p.pub.Flush(ctx); err != nil && p.closeErr == nil {
			p.closeErr = fmt.Errorf("event: close: subscribers not flushed: %w", err)
		}
		p.cancelSend()
		_ = p.pub.Close()
		if p.replay != nil {
			_ = p.replay.Close()
		}
	})
	return p.closeErr
}

// WaitSubscribers returns once n peers are connected and subscribed: a
// batch published afterwards reaches them (ZeroMQ's slow joiner).
func (p *Publisher) WaitSubscribers(ctx context.Context, n int) error {
	return p.pub.WaitSubscribers(ctx, n)
}

// Stats returns the current counters.
func (p *Publisher) Stats() Stats {
	depth, dropped := p.q.depth()
	return Stats{
		QueueDepth:       depth,
		QueueCapacity:    p.cfg.QueueSize,
		PublishedBatches: p.batches.Load(),
		PublishedEvents:  p.events.Load(),
		DroppedEvents:    dropped,
		SkippedSeqs:      p.skippedSeqs.Load(),
		SubscriberDrops:  p.pub.Dropped(),
		Subscribers:      p.pub.Subscribers(),
		ReplayRequests:   p.replayRequests.Load(),
		NextSeq:          p.nextSeq.Load(),
	}
}

// Collector returns a Prometheus collector of Stats. It is not registered
// anywhere; the caller registers it (with prometheus.WrapRegistererWith
// for labels such as the topic when running several publishers).
func (p *Publisher) Collector() prometheus.Collector { return &collector{p: p} }

// validate rejects, at Publish time, what the sender could not encode.
func validate(ev Event) error {
	switch e := ev.(type) {
	case *BlockStored:
		if e == nil {
			break
		}
		for i, k := range e.ExtraKeys {
			for j, v := range k {
				if err := checkValue(v, 0); err != nil {
					return fmt.Errorf("extra_keys[%d][%d]: %w", i, j, err)
				}
			}
		}
		return nil
	case *BlockRemoved:
		if e != nil {
			return nil
		}
	case *AllBlocksCleared:
		if e != nil {
			return nil
		}
	case *BlockUpdate:
		if e != nil {
			return nil
		}
	}
	return fmt.Errorf("%w: nil or unknown event %T", ErrUnencodable, ev)
}

func checkValue(v any, depth int) error {
	var scratch [16]byte
	_, err := appendValue(scratch[:0], v, depth)
	return err
}
