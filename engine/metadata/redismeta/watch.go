package redismeta

import (
	"context"
	"errors"
	"fmt"
	"net"
	"strings"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/crescent-kv/crescent/engine/metadata"
)

// NotifyFlags is the notify-keyspace-events setting that lets watches
// use notifications instead of polling: keyspace channel (K), string
// commands (set), generic commands (del) and expiry (x).
const NotifyFlags = "K$gx"

// Watch modes, decided once per backend from the server's
// notify-keyspace-events.
const (
	modeUnknown = iota
	modeNotify
	modePoll
)

// watchHub shares one pub/sub connection among the backend's watches.
// Every keyspace event of a watched key, and every (re)subscription
// confirmation, wakes the key's watches, which then GET the key; so a
// reconnect, which may have lost events, is followed by a fresh read.
type watchHub struct {
	b      *Backend
	mu     sync.Mutex
	closed bool
	mode   int
	ps     *redis.PubSub
	subs   map[string]map[*watcher]struct{} // keyspace channel → watches
}

type watcher struct{ kick chan struct{} }

func (h *watchHub) init(b *Backend) {
	h.b = b
	h.subs = make(map[string]map[*watcher]struct{})
}

// notifyEnabled reports whether flags (a notify-keyspace-events value)
// cover the events watches need.
func notifyEnabled(flags string) bool {
	if !strings.Contains(flags, "K") {
		return false
	}
	return strings.Contains(flags, "A") || (strings.Contains(flags, "$") && strings.Contains(flags, "g") && strings.Contains(flags, "x"))
}

// decideLocked settles the watch mode. A server that refuses CONFIG GET
// (managed services often do) or has notifications off is polled; a
// network error leaves the question open for the next watch.
func (h *watchHub) decideLocked(ctx context.Context) int {
	if h.mode != modeUnknown {
		return h.mode
	}
	ctx, cancel := h.b.opCtx(ctx)
	defer cancel()
	res, err := h.b.cli.ConfigGet(ctx, "notify-keyspace-events").Result()
	var rerr redis.Error
	switch {
	case err == nil && notifyEnabled(res["notify-keyspace-events"]):
		h.mode = modeNotify
		h.b.opts.Logger.Debug("redismeta: watching with keyspace notifications", "redis", h.b.addr)
	case err == nil:
		h.mode = modePoll
		h.b.opts.Logger.Info("redismeta: keyspace notifications are off; watching by polling",
			"redis", h.b.addr, "notify-keyspace-events", res["notify-keyspace-events"], "interval", h.b.opts.PollInterval,
			"enable", "CONFIG SET notify-keyspace-events "+NotifyFlags)
	case errors.As(err, &rerr):
		h.mode = modePoll
		h.b.opts.Logger.Info("redismeta: cannot read notify-keyspace-events; watching by polling",
			"redis", h.b.addr, "err", err, "interval", h.b.opts.PollInterval)
	default:
		return modePoll // unreachable now: poll this watch, ask again next time
	}
	return h.mode
}

// add registers w for channel ch; false means the caller must poll.
func (h *watchHub) add(ctx context.Context, ch string, w *watcher) (bool, error) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.closed {
		return false, ErrClosed
	}
	if h.decideLocked(ctx) != modeNotify {
		return false, nil
	}
	if h.ps == nil {
		h.ps = h.b.cli.Subscribe(h.b.ctx)
		h.b.wg.Add(1)
		go h.dispatch()
	}
	if h.subs[ch] == nil {
		h.subs[ch] = make(map[*watcher]struct{})
		// On failure go-redis keeps the channel and subscribes when it
		// reconnects; the confirmation then wakes the watch.
		sctx, cancel := h.b.opCtx(ctx)
		if err := h.ps.Subscribe(sctx, ch); err != nil {
			h.b.opts.Logger.Debug("redismeta: subscribe failed; retried on reconnect", "channel", ch, "err", err)
		}
		cancel()
	}
	h.subs[ch][w] = struct{}{}
	return true, nil
}

func (h *watchHub) remove(ch string, w *watcher) {
	h.mu.Lock()
	defer h.mu.Unlock()
	ws := h.subs[ch]
	delete(ws, w)
	if len(ws) > 0 || ws == nil {
		return
	}
	delete(h.subs, ch)
	if h.ps != nil && !h.closed {
		ctx, cancel := h.b.opCtx(context.Background())
		h.ps.Unsubscribe(ctx, ch)
		cancel()
	}
}

func (h *watchHub) kick(ch string) {
	h.mu.Lock()
	defer h.mu.Unlock()
	for w := range h.subs[ch] {
		select {
		case w.kick <- struct{}{}:
		default: // already pending: one read serves both
		}
	}
}

// dispatch reads the pub/sub connection until Close. Silence longer than
// the health interval is answered with a PING; a second silent interval
// means the connection is dead, and a new one subscribes everything
// again.
func (h *watchHub) dispatch() {
	defer h.b.wg.Done()
	health := max(h.b.opts.TTL/2, time.Second)
	pinged := false
	delay := 50 * time.Millisecond
	for {
		h.mu.Lock()
		ps, closed := h.ps, h.closed
		h.mu.Unlock()
		if closed {
			return
		}
		msg, err := ps.ReceiveTimeout(h.b.ctx, health)
		if h.b.ctx.Err() != nil {
			return
		}
		var ne net.Error
		switch {
		case err != nil && errors.As(err, &ne) && ne.Timeout():
			if pinged {
				h.b.opts.Logger.Warn("redismeta: pub/sub connection silent; reconnecting", "redis", h.b.addr)
				h.renew()
				pinged = false
				continue
			}
			ctx, cancel := h.b.opCtx(h.b.ctx)
			ps.Ping(ctx)
			cancel()
			pinged = true
			continue
		case err != nil:
			// go-redis reconnects (and subscribes again) on the next call.
			select {
			case <-h.b.ctx.Done():
				return
			case <-time.After(delay):
			}
			delay = min(2*delay, 2*time.Second)
			continue
		}
		delay, pinged = 50*time.Millisecond, false
		switch m := msg.(type) {
		case *redis.Subscription:
			if m.Kind == "subscribe" {
				h.kick(m.Channel)
			}
		case *redis.Message:
			// A refresh's PEXPIRE changes nothing a watcher sees.
			if m.Payload != "expire" && m.Payload != "persist" {
				h.kick(m.Channel)
			}
		}
	}
}

func (h *watchHub) renew() {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.closed {
		return
	}
	old := h.ps
	chans := make([]string, 0, len(h.subs))
	for ch := range h.subs {
		chans = append(chans, ch)
	}
	ctx, cancel := h.b.opCtx(h.b.ctx)
	h.ps = h.b.cli.Subscribe(ctx, chans...)
	cancel()
	old.Close()
}

func (h *watchHub) close() {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.closed = true
	if h.ps != nil {
		h.ps.Close() // unblocks the dispatcher's read
	}
}

// Watch reports segment name's descriptor and its changes. With keyspace
// notifications on (notify-keyspace-events containing K$gx or KA) it
// reads the key only when Redis reports an event on it; otherwise it
// polls every Options.PollInterval. See metadata.Watcher.
func (b *Backend) Watch(ctx context.Context, name string, fn func(*metadata.SegmentDesc)) error {
	key := b.keys.Segment(name)
	ch := fmt.Sprintf("__keyspace@%d__:%s", b.db, key)
	w := &watcher{kick: make(chan struct{}, 1)}
	notify, err := b.w.add(ctx, ch, w)
	if err != nil {
		return err
	}
	if notify {
		defer b.w.remove(ch, w)
	}
	var last []byte
	delivered := false
	read := func() bool {
		v, _, err := b.get(ctx, key)
		if err != nil {
			if ctx.Err() == nil && b.ctx.Err() == nil {
				b.opts.Logger.Debug("redismeta: watch read failed; retrying", "key", key, "err", err)
			}
			return false
		}
		if delivered && sameValue(v, last) {
			return true
		}
		var d *metadata.SegmentDesc
		if v != nil {
			if d, err = metadata.UnmarshalDesc(v); err != nil {
				b.opts.Logger.Warn("redismeta: watched descriptor is invalid; ignored", "key", key, "err", err)
				return true
			}
			metadata.FillDataHost(d, func() (string, error) { return b.RPCAddr(ctx, name) })
		}
		last, delivered = v, true
		fn(d)
		return true
	}
	poll := time.NewTicker(b.opts.PollInterval)
	defer poll.Stop()
	failed := !read()
	for {
		var tick <-chan time.Time
		if !notify || failed {
			tick = poll.C
		}
		select {
		case <-ctx.Done():
			if b.ctx.Err() != nil {
				return ErrClosed
			}
			return ctx.Err()
		case <-b.ctx.Done():
			return ErrClosed
		case <-w.kick:
			failed = !read()
		case <-tick:
			failed = !read()
		}
	}
}
