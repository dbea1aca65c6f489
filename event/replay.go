package event

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"net"
	"time"

	"github.com/go-zeromq/zmq4"

	"github.com/crescent-kv/crescent/event/internal/zmtp"
)

// EndSeq is the sequence number of the replay end marker.
const EndSeq = ^uint64(0)

var emptyFrame = []byte{}

// replayRequestLimits bound what a replay client may send: a request is
// ["", start] (8 bytes); a client that sends more is disconnected.
var replayRequestLimits = zmtp.Limits{MaxMessage: 64, MaxFrames: 4}

// serveReplay answers replay requests on one ROUTER connection until the
// peer goes away. A request is [start] or ["", start] (a REQ or DEALER
// peer; the ROUTER identity never crosses the wire); the reply mirrors
// the envelope: one message [topic, seq, payload] per buffered batch with
// seq >= start, then [ "", 0xFFFFFFFFFFFFFFFF, "" ] (empty topic, as vLLM
// sends), each prefixed with "" when the request was.
func (p *Publisher) serveReplay(ctx context.Context, c *zmtp.Conn) {
	var ents []ringEntry
	var scratch []byte
	var bufs net.Buffers
	for ctx.Err() == nil {
		c.Idle()
		msg, err := c.ReadMsg()
		if err != nil {
			if errors.Is(err, zmtp.ErrLimit) || errors.Is(err, zmtp.ErrProtocol) {
				p.log.Warn("event: replay client disconnected", "peer", c.RemoteAddr(), "err", err)
			}
			return
		}
		c.Busy()
		delim := len(msg) == 2 && len(msg[0]) == 0
		var start []byte
		switch {
		case delim:
			start = msg[1]
		case len(msg) == 1:
			start = msg[0]
		}
		p.replayRequests.Add(1)
		ents = ents[:0]
		if len(start) == 8 {
			ents = p.ring.since(binary.BigEndian.Uint64(start), ents)
		} else {
			p.log.Warn("event: malformed replay request", "peer", c.RemoteAddr(), "frames", len(msg))
		}
		// Write in chunks so one request does not pin a huge iovec.
		const chunk = 256
		for i := 0; i <= len(ents); i += chunk {
			scratch, bufs = scratch[:0], bufs[:0]
			end := min(i+chunk, len(ents))
			offs := make([]int, 0, 2*(end-i)+2)
			for _, e := range ents[i:end] {
				offs = append(offs, len(scratch))
				if delim {
					scratch = zmtp.AppendHeader(scratch, 0, true)
				}
				scratch = zmtp.AppendHeader(scratch, len(p.topic), true)
				scratch = append(scratch, p.topic...)
				scratch = zmtp.AppendHeader(scratch, 8, true)
				scratch = binary.BigEndian.AppendUint64(scratch, e.seq)
				scratch = zmtp.AppendHeader(scratch, len(e.payload()), false)
				offs = append(offs, len(scratch))
			}
			if end == len(ents) {
				offs = append(offs, len(scratch))
				if delim {
					scratch = zmtp.AppendHeader(scratch, 0, true)
				}
				scratch = zmtp.AppendMsg(scratch, emptyFrame, binary.BigEndian.AppendUint64(nil, EndSeq), emptyFrame)
				offs = append(offs, len(scratch))
			}
			// Slices are cut only now: scratch no longer moves.
			for j, e := range ents[i:end] {
				bufs = append(bufs, scratch[offs[2*j]:offs[2*j+1]], e.payload())
			}
			if end == len(ents) {
				bufs = append(bufs, scratch[offs[len(offs)-2]:offs[len(offs)-1]])
			}
			_ = c.SetWriteDeadline(time.Now().Add(p.cfg.ReplayWriteTimeout))
			if err := c.WriteBuffers(bufs); err != nil {
				return
			}
			if end == len(ents) {
				break
			}
		}
		clear(ents)
	}
}

// ReplayFunc receives one replayed batch. topic is nil when the server is
// an older vLLM that omits it. payload is only valid during the call.
type ReplayFunc func(topic []byte, seq uint64, payload []byte) error

// Replay asks the replay (ROUTER) socket at endpoint for every buffered
// batch with seq >= start and calls fn for each, in order, until the end
// marker. It speaks as a DEALER sending ["", start], so it works against
// vLLM's publisher as well as ours, with or without the topic frame.
// Replies are read with the default SubscriberConfig limits.
func Replay(ctx context.Context, endpoint string, start uint64, fn ReplayFunc) error {
	return replay(ctx, endpoint, start, zmtp.Limits{}, fn)
}

func replay(ctx context.Context, endpoint string, start uint64, lim zmtp.Limits, fn ReplayFunc) error {
	e, err := zmtp.Parse(endpoint)
	if err != nil {
		return fmt.Errorf("%w: %w", ErrEndpoint, err)
	}
	c, err := zmtp.DialConn(ctx, e, zmq4.Dealer)
	if err != nil {
		return fmt.Errorf("%w: %w", ErrReplay, err)
	}
	defer c.Close()
	c.SetLimits(lim)
	stop := context.AfterFunc(ctx, func() { _ = c.Close() })
	defer stop()
	req := zmtp.AppendMsg(nil, emptyFrame, binary.BigEndian.AppendUint64(nil, start))
	if err := c.Write(req); err != nil {
		return fmt.Errorf("%w: send request: %w", ErrReplay, ctxErr(ctx, err))
	}
	for {
		msg, err := c.ReadMsg()
		if err != nil {
			return fmt.Errorf("%w: %w", ErrReplay, ctxErr(ctx, err))
		}
		if len(msg) > 0 && len(msg[0]) == 0 {
			msg = msg[1:] // the envelope delimiter
		}
		var topic, seqb, payload []byte
		switch len(msg) {
		case 3:
			topic, seqb, payload = msg[0], msg[1], msg[2]
		case 2:
			seqb, payload = msg[0], msg[1]
		default:
			return fmt.Errorf("%w: reply has %d frames", ErrReplay, len(msg))
		}
		if len(seqb) != 8 {
			return fmt.Errorf("%w: sequence frame of %d bytes", ErrReplay, len(seqb))
		}
		seq := binary.BigEndian.Uint64(seqb)
		if seq == EndSeq || len(payload) == 0 {
			return nil
		}
		if err := fn(topic, seq, payload); err != nil {
			return err
		}
	}
}

func ctxErr(ctx context.Context, err error) error {
	if ctx.Err() != nil {
		return ctx.Err()
	}
	return err
}
