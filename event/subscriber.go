package event

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/go-zeromq/zmq4"

	"github.com/crescent-kv/crescent/event/internal/zmtp"
)

// Source is one publisher a Subscriber follows.
type Source struct {
	// ID names the publisher in deliveries (default: Endpoint).
	ID string
	// Endpoint of the publisher's PUB socket; the subscriber connects.
	Endpoint string
	// ReplayEndpoint of its ROUTER socket; without it gaps cannot be
	// filled and are reported at once.
	ReplayEndpoint string
	// Topic is the subscription prefix (default "": everything).
	Topic string
	// StartSeq, when set, is the first seq to deliver: on connect the
	// subscriber replays from it. Nil starts with the first live batch.
	StartSeq *uint64
}

// Delivery is one batch, delivered in seq order per publisher.
type Delivery struct {
	Publisher string
	Topic     string
	Seq       uint64
	Batch     *EventBatch
	Replayed  bool // came from the replay socket, not the live stream
}

// Gap reports batches that will never be delivered: seqs From..To
// (inclusive) were missed and the replay socket no longer has them (or
// there is none). An indexer should treat its view of that publisher as
// incomplete.
type Gap struct {
	Publisher string
	From, To  uint64
}

// Restart reports that a publisher's seq went backwards: it restarted and
// its previous state is gone. Delivery continues with the new stream.
type Restart struct {
	Publisher string
	LastSeq   uint64 // last seq delivered from the old stream
	Seq       uint64 // first seq seen from the new one
}

// SubscriberConfig configures a Subscriber.
type SubscriberConfig struct {
	Sources []Source
	// OnBatch receives every batch, in seq order per publisher, from that
	// publisher's goroutine (callbacks for different publishers run
	// concurrently). Required.
	OnBatch func(Delivery)
	// OnGap receives unrecoverable gaps (optional).
	OnGap func(Gap)
	// OnRestart receives publisher restarts (optional).
	OnRestart func(Restart)
	// OnError receives connection, replay and decode errors (optional);
	// the subscriber keeps going.
	OnError func(publisher string, err error)
	// ReplayTimeout bounds one replay request (default 10s).
	ReplayTimeout time.Duration
	// ResyncInterval is the first wait, after (re)connecting with a replay
	// endpoint, before asking the replay socket again while no live batch
	// has arrived (default 100ms, doubling up to 5s). A PUB registers a
	// subscription some time after the connection (ZeroMQ's slow joiner);
	// batches sent in between reach the subscriber only through replay,
	// and only the first live batch proves the subscription is active.
	ResyncInterval time.Duration
	// MaxMessageSize bounds one message from a publisher, live or
	// replayed, in bytes (all frames; default 64 MiB); MaxFrames bounds
	// its frames (default 16, at least 4). A publisher that sends more is
	// disconnected (OnError gets an error wrapping ErrMalformed) and
	// reconnected with backoff.
	MaxMessageSize, MaxFrames int
}

// SourceStats are one publisher's counters.
type SourceStats struct {
	Publisher    string
	Delivered    uint64 // batches delivered
	Replayed     uint64 // of which from replay
	Gaps         uint64 // Gap reports
	MissedSeqs   uint64 // seqs in those gaps
	Restarts     uint64
	DecodeErrors uint64
	Connects     uint64
	NextSeq      uint64
}

// Subscriber follows publishers over SUB sockets, fills sequence gaps
// from their replay sockets and delivers decoded batches in order.
type Subscriber struct {
	cfg     SubscriberConfig
	lim     zmtp.Limits
	cancel  context.CancelFunc
	wg      sync.WaitGroup
	streams []*stream
}

type stream struct {
	s   *Subscriber
	src Source
	ep  zmtp.Endpoint
	rep string

	next    uint64
	started bool

	delivered, replayed, gaps, missed atomic.Uint64
	restarts, decodeErrs, connects    atomic.Uint64
	nextSeq                           atomic.Uint64
}

// Subscribe starts following every source; it returns at once (connection
// attempts happen in the background and are retried until Close).
func Subscribe(cfg SubscriberConfig) (*Subscriber, error) {
	if cfg.OnBatch == nil {
		return nil, fmt.Errorf("%w: OnBatch is required", ErrConfig)
	}
	if len(cfg.Sources) == 0 {
		return nil, fmt.Errorf("%w: no sources", ErrConfig)
	}
	if cfg.ReplayTimeout <= 0 {
		cfg.ReplayTimeout = 10 * time.Second
	}
	if cfg.ResyncInterval <= 0 {
		cfg.ResyncInterval = 100 * time.Millisecond
	}
	if cfg.MaxMessageSize < 0 || cfg.MaxFrames < 0 || cfg.MaxFrames > 0 && cfg.MaxFrames < 4 {
		return nil, fmt.Errorf("%w: MaxMessageSize %d, MaxFrames %d (replay replies have 4 frames)",
			ErrConfig, cfg.MaxMessageSize, cfg.MaxFrames)
	}
	s := &Subscriber{cfg: cfg, lim: zmtp.Limits{MaxMessage: cfg.MaxMessageSize, MaxFrames: cfg.MaxFrames}}
	ids := map[string]bool{}
	for _, src := range cfg.Sources {
		ep, err := zmtp.Parse(src.Endpoint)
		if err != nil {
			return nil, fmt.Errorf("%w: %w", ErrEndpoint, err)
		}
		if src.ReplayEndpoint != "" {
			if _, err := zmtp.Parse(src.ReplayEndpoint); err != nil {
				return nil, fmt.Errorf("%w: %w", ErrEndpoint, err)
			}
		}
		if src.ID == "" {
			src.ID = src.Endpoint
		}
		if ids[src.ID] {
			return nil, fmt.Errorf("%w: duplicate source %q", ErrConfig, src.ID)
		}
		ids[src.ID] = true
		st := &stream{s: s, src: src, ep: ep, rep: src.ReplayEndpoint}
		if src.StartSeq != nil {
			st.next, st.started = *src.StartSeq, true
			st.nextSeq.Store(st.next)
		}
		s.streams = append(s.streams, st)
	}
	ctx, cancel := context.WithCancel(context.Background())
	s.cancel = cancel
	for _, st := range s.streams {
		s.wg.Add(1)
		go func() {
			defer s.wg.Done()
			st.run(ctx)
		}()
	}
	return s, nil
}

// Close disconnects and waits until no callback is running.
func (s *Subscriber) Close() error {
	s.cancel()
	s.wg.Wait()
	return nil
}

// Stats returns per-publisher counters, in Sources order.
func (s *Subscriber) Stats() []SourceStats {
	out := make([]SourceStats, 0, len(s.streams))
	for _, st := range s.streams {
		out = append(out, SourceStats{
			Publisher: st.src.ID, Delivered: st.delivered.Load(), Replayed: st.replayed.Load(),
			Gaps: st.gaps.Load(), MissedSeqs: st.missed.Load(), Restarts: st.restarts.Load(),
			DecodeErrors: st.decodeErrs.Load(), Connects: st.connects.Load(), NextSeq: st.nextSeq.Load(),
		})
	}
	return out
}

func (st *stream) fail(err error) {
	if st.s.cfg.OnError != nil {
		st.s.cfg.OnError(st.src.ID, err)
	}
}

func (st *stream) run(ctx context.Context) {
	sub := zmtp.AppendMsg(nil, append([]byte{1}, st.src.Topic...))
	for attempt := 0; ctx.Err() == nil; attempt++ {
		c, err := zmtp.DialConn(ctx, st.ep, zmq4.Sub)
		if err == nil {
			c.SetLimits(st.s.lim)
			if err = c.Write(sub); err == nil {
				attempt = 0
				st.connects.Add(1)
				err = st.follow(ctx, c)
			}
			_ = c.Close()
		}
		if ctx.Err() != nil {
			return
		}
		st.fail(err)
		select {
		case <-ctx.Done():
			return
		case <-time.After(min(10*time.Millisecond<<min(attempt, 7), time.Second)):
		}
	}
}

// follow reads one connection until it fails.
func (st *stream) follow(ctx context.Context, c *zmtp.Conn) error {
	stop := context.AfterFunc(ctx, func() { _ = c.Close() })
	defer stop()
	base, fresh := st.next, true
	var lastLive uint64
	resync := st.started && st.rep != ""
	wait := st.s.cfg.ResyncInterval
	if st.started {
		// Catch up on what was published while we were away (or before
		// we first connected, for StartSeq).
		st.catchUp(ctx, EndSeq)
	}
	for {
		if resync {
			ready, err := c.WaitReadable(wait)
			if err != nil {
				return err
			}
			if !ready {
				// No live batch yet: our subscription may not have been
				// active for what was published since the last catch-up.
				st.catchUp(ctx, EndSeq)
				wait = min(2*wait, 5*time.Second)
				continue
			}
			resync = false
		}
		msg, err := c.ReadMsg()
		if err != nil {
			if errors.Is(err, zmtp.ErrLimit) {
				return fmt.Errorf("%w: %s: %w (SubscriberConfig.MaxMessageSize, MaxFrames)", ErrMalformed, st.src.ID, err)
			}
			return err
		}
		if len(msg) != 3 || len(msg[1]) != 8 {
			st.fail(fmt.Errorf("%w: live message with %d frames", ErrMalformed, len(msg)))
			continue
		}
		seq := binary.BigEndian.Uint64(msg[1])
		restarted := false
		switch {
		case !st.started:
			st.started, st.next = true, seq
		case fresh:
			// A live publisher only sends seqs newer than anything it
			// sent before we reconnected.
			restarted = seq < base
		default:
			restarted = seq <= lastLive
		}
		fresh, lastLive = false, seq
		if restarted {
			st.restarts.Add(1)
			if st.s.cfg.OnRestart != nil {
				st.s.cfg.OnRestart(Restart{Publisher: st.src.ID, LastSeq: st.next - 1, Seq: seq})
			}
			st.setNext(0)
		}
		if seq < st.next {
			continue // already delivered through replay
		}
		if seq > st.next {
			st.catchUp(ctx, seq)
		}
		if seq < st.next {
			continue
		}
		if seq > st.next {
			st.gap(st.next, seq-1)
		}
		st.deliver(string(msg[0]), seq, msg[2], false)
	}
}

func (st *stream) setNext(v uint64) {
	st.next = v
	st.nextSeq.Store(v)
}

var errStopReplay = errors.New("event: replay done")

// catchUp delivers what the replay socket has from st.next up to (not
// including) until, reporting holes in what it returns as gaps.
func (st *stream) catchUp(ctx context.Context, until uint64) {
	if st.rep == "" {
		return
	}
	rctx, cancel := context.WithTimeout(ctx, st.s.cfg.ReplayTimeout)
	defer cancel()
	err := replay(rctx, st.rep, st.next, st.s.lim, func(topic []byte, seq uint64, payload []byte) error {
		if seq >= until {
			return errStopReplay // the live stream has it
		}
		if seq < st.next {
			return nil
		}
		if seq > st.next {
			st.gap(st.next, seq-1)
		}
		st.deliver(string(topic), seq, payload, true)
		return nil
	})
	if err != nil && !errors.Is(err, errStopReplay) && ctx.Err() == nil {
		st.fail(err)
	}
}

func (st *stream) gap(from, to uint64) {
	st.gaps.Add(1)
	st.missed.Add(to - from + 1)
	if st.s.cfg.OnGap != nil {
		st.s.cfg.OnGap(Gap{Publisher: st.src.ID, From: from, To: to})
	}
	st.setNext(to + 1)
}

func (st *stream) deliver(topic string, seq uint64, payload []byte, replayed bool) {
	st.setNext(seq + 1)
	b, err := DecodeBatch(payload)
	if err != nil {
		st.decodeErrs.Add(1)
		st.fail(&DecodeError{Publisher: st.src.ID, Seq: seq, Err: err})
		return
	}
	st.delivered.Add(1)
	if replayed {
		st.replayed.Add(1)
	}
	st.s.cfg.OnBatch(Delivery{Publisher: st.src.ID, Topic: topic, Seq: seq, Batch: b, Replayed: replayed})
}

// DecodeError reports a batch that arrived but could not be decoded; its
// seq counts as consumed.
type DecodeError struct {
	Publisher string
	Seq       uint64
	Err       error
}

func (e *DecodeError) Error() string {
	return fmt.Sprintf("event: %s seq %d: %v", e.Publisher, e.Seq, e.Err)
}

func (e *DecodeError) Unwrap() error { return e.Err }
