package store

import (
	"context"
	"errors"
	"slices"
	"sync"
	"time"

	"google.golang.org/protobuf/proto"

	"github.com/crescent-kv/crescent/store/errcode"
	"github.com/crescent-kv/crescent/store/rpcerr"
	"github.com/crescent-kv/crescent/store/storepb"
)

// Put-ahead: a put costs two master round trips (PutStart, PutEnd) unless
// the client already holds space for it. The client keeps a few
// reservations (ReservePut) for each value size it puts repeatedly with
// one ReplicateConfig, a class; a put of that class writes into one and
// commits it with CommitPut, which also asks for replacements (in
// chunks: see askLocked). A
// steady stream of puts of one size, as KV-cache blocks are, then costs
// one round trip each.
//
// A class gets reservations after its second put that found none, so
// one-off sizes never hold space. A class keeps perClass reservations,
// one more for every put that found none while replacements were on
// their way (more puts of it run at once than perClass covers), up to
// maxAheadPerClass and the bytes budget; an idle class starts over. Reservations are used only while
// younger than half the master's TTL and given back when older, when the
// client closes, and when the pool is full (a put that fails with
// NO_AVAILABLE_HANDLE gives every reservation back and retries).

// Defaults of Config.PutAhead and Config.PutAheadBytes.
const (
	DefaultPutAhead      = 8
	DefaultPutAheadBytes = 64 << 20
)

// resvClass is the size and replicate config reservations are placed for.
type resvClass struct {
	size uint64
	rc   string // deterministic encoding of the config
}

type heldResv struct {
	id    uint64
	reps  []*storepb.ReplicaDescriptor
	at    time.Time
	epoch uint64 // putAhead.epoch it was made in: ids mean nothing to another leader
}

type resvQueue struct {
	// free[head:] are the reservations held, oldest first. Taking from
	// the front advances head instead of reslicing, so the array is kept
	// and refilled (push) rather than reallocated every few top-ups.
	free     []heldResv
	head     int
	inflight int       // asked for, not answered yet
	misses   int       // puts that found none
	noRoom   time.Time // the master had no room: ask again after this
	// extra raises the class's target above perClass: more puts of it
	// run at once than perClass covers (each found none while
	// replacements were on their way and paid two round trips, two
	// durability waits on a durable master).
	extra int
}

// len is the number of reservations held.
func (q *resvQueue) len() int { return len(q.free) - q.head }

// pop removes and returns the oldest (len > 0).
func (q *resvQueue) pop() heldResv {
	h := q.free[q.head]
	q.free[q.head] = heldResv{}
	if q.head++; q.head == len(q.free) {
		q.free, q.head = q.free[:0], 0
	}
	return h
}

// push appends h. A full array whose front half is spent is compacted
// instead of grown, so each element is moved at most once per push
// on average.
func (q *resvQueue) push(h heldResv) {
	if len(q.free) == cap(q.free) && q.head > 0 && q.head >= len(q.free)/2 {
		n := copy(q.free, q.free[q.head:])
		clear(q.free[n:])
		q.free, q.head = q.free[:n], 0
	}
	q.free = append(q.free, h)
}

// pushFront puts h back in front (it was taken and not used).
func (q *resvQueue) pushFront(h heldResv) {
	if q.head > 0 {
		q.head--
		q.free[q.head] = h
		return
	}
	q.free = append([]heldResv{h}, q.free...)
}

// filter keeps the reservations keep returns true for, in order.
func (q *resvQueue) filter(keep func(heldResv) bool) {
	kept := q.free[:0]
	for _, h := range q.free[q.head:] {
		if keep(h) {
			kept = append(kept, h) // never past the element read
		}
	}
	clear(q.free[len(kept):])
	q.free, q.head = kept, 0
}

// maxAheadPerClass bounds a class's adaptive target (perClass+extra);
// maxBytes bounds it too.
const maxAheadPerClass = 256

// maxReserveAsk is the most reservations one request asks for: the
// master refuses a spec of more (master.MaxReserveCount); a class whose
// target is higher fills up over several requests.
const maxReserveAsk = 64

type putAhead struct {
	perClass int
	maxBytes uint64

	mu      sync.Mutex
	classes map[resvClass]*resvQueue
	bytes   uint64   // held and asked for
	release []uint64 // ids to give back with the next RPC
	ttl     time.Duration
	closed  bool
	wg      sync.WaitGroup
	// epoch counts forgets (leader switches): an answer to a request
	// booked in an earlier epoch came from the old leader and is dropped.
	epoch uint64
}

func newPutAhead(perClass int, maxBytes int64) *putAhead {
	return &putAhead{perClass: perClass, maxBytes: uint64(maxBytes), classes: map[resvClass]*resvQueue{}}
}

func classOf(size uint64, rc *storepb.ReplicateConfig) resvClass {
	b, _ := proto.MarshalOptions{Deterministic: true}.Marshal(rc)
	return resvClass{size: size, rc: string(b)}
}

// usable reports whether h may still be written and committed.
func (a *putAhead) usable(h heldResv, now time.Time) bool {
	return a.ttl > 0 && now.Sub(h.at) < a.ttl/2
}

// take returns a reservation of class k, or false; refill > 0 is the
// number of reservations booked for the caller to ask for in the
// background (Client.refill), booked in epoch.
func (a *putAhead) take(k resvClass, now time.Time) (h heldResv, ok bool, refill int, epoch uint64) {
	a.mu.Lock()
	defer a.mu.Unlock()
	epoch = a.epoch
	if a.closed {
		return heldResv{}, false, 0, epoch
	}
	q := a.classes[k]
	if q == nil {
		q = &resvQueue{}
		a.classes[k] = q
	}
	for q.len() > 0 {
		h = q.pop()
		if a.usable(h, now) {
			a.bytes -= k.size
			return h, true, 0, epoch
		}
		a.dropLocked(k, h)
	}
	q.misses++
	if q.inflight > 0 && a.perClass+q.extra < maxAheadPerClass {
		q.extra++ // the next commit asks for one more
	}
	if q.misses < 2 || q.inflight > 0 {
		return heldResv{}, false, 0, epoch
	}
	return heldResv{}, false, a.askLocked(k, now), epoch
}

// room is how many more reservations of k fit the budgets.
func (a *putAhead) room(k resvClass) int {
	q := a.classes[k]
	n := a.perClass + q.extra - q.len() - q.inflight
	if a.bytes >= a.maxBytes {
		return 0
	}
	return max(0, min(n, int((a.maxBytes-a.bytes)/k.size)))
}

// ask books the reservations of k to request with the next RPC, in
// epoch.
func (a *putAhead) ask(k resvClass) (n int, epoch uint64) {
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.closed || a.classes[k] == nil {
		return 0, a.epoch
	}
	return a.askLocked(k, time.Now()), a.epoch
}

func (a *putAhead) askLocked(k resvClass, now time.Time) int {
	q := a.classes[k]
	if now.Before(q.noRoom) {
		return 0
	}
	n := min(a.room(k), maxReserveAsk)
	// Top up in chunks: each spec costs the master a Reserve call and
	// both sides its encoding, so a class that still holds some asks
	// only once half its target (or of one request's most) is missing.
	if chunk := min(a.perClass+q.extra, maxReserveAsk) / 2; q.len() > 0 && n < max(1, chunk) {
		return 0
	}
	q.inflight += n
	a.bytes += uint64(n) * k.size
	return n
}

// got files the answer to a request for asked reservations of k booked
// in epoch (res nil when the RPC failed).
func (a *putAhead) got(k resvClass, asked int, res *storepb.ReserveResult, ttl time.Duration, epoch uint64) {
	now := time.Now()
	a.mu.Lock()
	defer a.mu.Unlock()
	if epoch != a.epoch {
		return // the old leader's: forget dropped the booking too
	}
	if ttl > 0 {
		a.ttl = ttl
	}
	q := a.classes[k]
	q.inflight -= asked
	a.bytes -= uint64(asked) * k.size
	if res.GetErrorCode() != 0 {
		q.noRoom = now.Add(time.Second)
	}
	if p := res.GetPacked(); p != nil {
		// A packed answer that does not decode is given back whole.
		reps, err := p.Unpack(len(res.PackedIds))
		for j, id := range res.PackedIds {
			if err != nil || a.closed || res.PackedSize != k.size {
				a.release = append(a.release, id)
				continue
			}
			q.push(heldResv{id: id, reps: reps[j], at: now, epoch: epoch})
			a.bytes += k.size
		}
		if err != nil {
			q.noRoom = now.Add(time.Second)
		}
		return
	}
	for _, r := range res.GetReservations() {
		if a.closed || r.Size != k.size {
			a.release = append(a.release, r.Id)
			continue
		}
		q.push(heldResv{id: r.Id, reps: r.Replicas, at: now, epoch: epoch})
		a.bytes += k.size
	}
}

// putBack returns an unused reservation (its put found the key stored),
// or gives it back when its replacement already came.
func (a *putAhead) putBack(k resvClass, h heldResv) {
	a.mu.Lock()
	defer a.mu.Unlock()
	if h.epoch != a.epoch {
		return // the old leader's
	}
	if q := a.classes[k]; q != nil && !a.closed && a.usable(h, time.Now()) && q.len()+q.inflight < a.perClass+q.extra {
		q.pushFront(h)
		a.bytes += k.size
		return
	}
	a.release = append(a.release, h.id)
}

// drop gives a taken reservation back with the next RPC, unless it was
// the old leader's: the new one may have given its id to another.
func (a *putAhead) drop(h heldResv) {
	a.mu.Lock()
	if h.epoch == a.epoch {
		a.release = append(a.release, h.id)
	}
	a.mu.Unlock()
}

func (a *putAhead) dropLocked(k resvClass, h heldResv) {
	a.release = append(a.release, h.id)
	a.bytes -= k.size
}

// takeReleaseEpoch returns the ids to give back, and the epoch they
// belong to, and forgets them.
func (a *putAhead) takeReleaseEpoch() ([]uint64, uint64) {
	a.mu.Lock()
	defer a.mu.Unlock()
	r := a.release
	a.release = nil
	return r, a.epoch
}

// requeueRelease puts back ids of epoch that were not sent; ids of an
// earlier epoch mean nothing to the leader now and are dropped.
func (a *putAhead) requeueRelease(ids []uint64, epoch uint64) {
	a.mu.Lock()
	defer a.mu.Unlock()
	if epoch == a.epoch && !a.closed {
		a.release = append(a.release, ids...)
	}
}

// age moves reservations past their use-by time, and with all set every
// one, to the release list. It reports whether anything is to be given
// back.
func (a *putAhead) age(all bool) bool {
	now := time.Now()
	a.mu.Lock()
	defer a.mu.Unlock()
	for k, q := range a.classes {
		q.filter(func(h heldResv) bool {
			if all || !a.usable(h, now) {
				a.dropLocked(k, h)
				return false
			}
			return true
		})
		if q.len() == 0 && q.inflight == 0 {
			delete(a.classes, k) // idle: it must earn reservations again
		}
	}
	return len(a.release) > 0
}

// forget drops every reservation and every request in flight without
// giving anything back: they were made on a master that no longer leads.
// The answers of those requests are dropped when they come (epoch).
func (a *putAhead) forget() uint64 {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.epoch++
	a.classes = map[resvClass]*resvQueue{}
	a.bytes, a.release = 0, nil
	return a.epoch
}

// dropOn gives back the reservations held with a replica on one of the
// segments ids (writes there failed).
func (a *putAhead) dropOn(ids []*storepb.UUID) {
	on := func(h heldResv) bool {
		for _, r := range h.reps {
			if s := r.GetMemory().GetSegmentId(); s != nil {
				for _, id := range ids {
					if s.High == id.High && s.Low == id.Low {
						return true
					}
				}
			}
		}
		return false
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	for k, q := range a.classes {
		q.filter(func(h heldResv) bool {
			if on(h) {
				a.dropLocked(k, h)
				return false
			}
			return true
		})
	}
}

// held is the number of reservations held now.
func (a *putAhead) held() int {
	a.mu.Lock()
	defer a.mu.Unlock()
	n := 0
	for _, q := range a.classes {
		n += q.len()
	}
	return n
}

// takeAhead takes a reservation for a value of size bytes placed by rc,
// starting a refill of its class when take booked one.
func (c *Client) takeAhead(size uint64, rc *storepb.ReplicateConfig) (resvClass, heldResv, bool) {
	k := classOf(size, rc)
	h, ok := c.takeClass(k, rc, time.Now())
	return k, h, ok
}

// takeClass is takeAhead of class k at now (a batch computes both once).
func (c *Client) takeClass(k resvClass, rc *storepb.ReplicateConfig, now time.Time) (heldResv, bool) {
	h, ok, refill, epoch := c.ahead.take(k, now)
	if refill > 0 {
		c.refill(k, rc, refill, epoch)
	}
	return h, ok
}

// refill asks the master in the background for the n reservations of k
// that take booked.
func (c *Client) refill(k resvClass, rc *storepb.ReplicateConfig, n int, epoch uint64) {
	a := c.ahead
	a.wg.Add(1)
	go func() {
		defer a.wg.Done()
		var res *storepb.ReserveResult
		var ttl time.Duration
		release, rep := a.takeReleaseEpoch()
		var resp *storepb.ReservePutResponse
		err := errStaleReservations // booked with the leader before the current one
		if rep == epoch {
			ctx, cancel := context.WithTimeout(c.guardEpoch(context.Background(), epoch), c.cfg.RPCTimeout)
			resp, err = c.master.ReservePut(ctx, &storepb.ReservePutRequest{ClientId: c.id.pb(), Session: c.session,
				Specs:   []*storepb.ReserveSpec{{Size: k.size, Config: rc, Count: uint32(n), Packed: true}},
				Release: release})
			cancel()
		}
		if errors.Is(err, errStaleReservations) {
			a.requeueRelease(release, rep)
		}
		if err != nil {
			c.log.Debug("reserving space ahead of puts failed", "err", rpcerr.FromStatus(err))
		} else if len(resp.Results) == 1 {
			res, ttl = resp.Results[0], time.Duration(resp.TtlMs)*time.Millisecond
		}
		a.got(k, n, res, ttl, epoch)
	}()
}

// giveBack sends the release list to the master now.
func (c *Client) giveBack(ctx context.Context) {
	ids, ep := c.ahead.takeReleaseEpoch()
	if len(ids) == 0 {
		return
	}
	rctx, cancel := c.rpcCtx(c.guardEpoch(ctx, ep))
	defer cancel()
	// Refused (errStaleReservations) after a switch: the ids were the
	// old leader's, and the new one must not free its own by them.
	if _, err := c.master.ReservePut(rctx, &storepb.ReservePutRequest{ClientId: c.id.pb(), Session: c.session, Release: ids}); err != nil {
		// The master frees them at its release timeout.
		c.log.Debug("giving reservations back failed", "n", len(ids), "err", rpcerr.FromStatus(err))
	}
}

// aheadLoop gives back reservations past their use-by time.
func (c *Client) aheadLoop(ctx context.Context) {
	defer c.ahead.wg.Done()
	t := time.NewTicker(time.Second)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		if c.ahead.age(false) {
			c.giveBack(ctx)
		}
	}
}

// closeAhead stops put-ahead and gives every reservation back.
func (c *Client) closeAhead() {
	a := c.ahead
	if a == nil {
		return
	}
	a.mu.Lock()
	a.closed = true
	a.mu.Unlock()
	if c.aheadStop != nil {
		c.aheadStop()
	}
	a.wg.Wait()
	a.age(true)
	c.giveBack(context.Background())
}

// commitQ is one put's CommitPut item.
type commitQ struct {
	key   string
	id    uint64
	epoch uint64 // the putAhead epoch the reservation was made in
	block *storepb.BlockMetadata
	class resvClass
	rc    *storepb.ReplicateConfig // the class's config, to ask for more
}

// rpcCommit commits items and, in the same RPC, asks for replacements of
// their classes and gives back what is to be released.
func (c *Client) rpcCommit(ctx context.Context, qs []commitQ) ([]struct{}, []error) {
	if len(qs) > storepb.MaxBatchItems {
		return inPieces(len(qs), func(lo, hi int) ([]struct{}, []error) { return c.rpcCommit(ctx, qs[lo:hi]) })
	}
	a := c.ahead
	release, ep := a.takeReleaseEpoch()
	stale := false // an item or booking of another epoch than the release list's
	req := &storepb.CommitPutRequest{ClientId: c.id.pb(), Session: c.session, Items: make([]*storepb.CommitItem, len(qs)), Release: release, Packed: true}
	// What was booked per class asked for, in req.Reserve's order.
	type booking struct {
		k     resvClass
		n     int
		epoch uint64
	}
	var booked []booking
	items := make([]storepb.CommitItem, len(qs))
	for i, q := range qs {
		it := &items[i]
		it.Key, it.ReservationId, it.Block = q.key, q.id, q.block
		req.Items[i] = it
		stale = stale || q.epoch != ep
		if !slices.ContainsFunc(booked, func(b booking) bool { return b.k == q.class }) {
			if n, bep := a.ask(q.class); n > 0 {
				booked = append(booked, booking{q.class, n, bep})
				stale = stale || bep != ep
				req.Reserve = append(req.Reserve, &storepb.ReserveSpec{Size: q.class.size, Config: q.rc, Count: uint32(n), Packed: true})
			}
		}
	}
	var resp *storepb.CommitPutResponse
	var err error
	if stale {
		err = errStaleReservations
	} else {
		rctx, cancel := c.rpcCtx(c.guardEpoch(ctx, ep))
		resp, err = c.master.CommitPut(rctx, req)
		cancel()
	}
	if errors.Is(err, errStaleReservations) {
		// Made with another leader: never sent to this one, where the
		// ids could name other reservations. The items are put again.
		a.requeueRelease(release, ep)
		err = errcode.New(errcode.ReplicaIsGone, "reservations of a previous master leader")
	}
	ierrs, _, err := batchOutcomes("CommitPut", err, len(qs), resp.GetPackedResults(), len(resp.GetResults()), false,
		func(i int) (int32, string, uint64) { r := resp.Results[i]; return r.ErrorCode, r.Message, 0 })
	if err == nil && len(resp.Reserved) != len(req.Reserve) {
		err = errcode.New(errcode.InternalError, "CommitPut answered %d reservations for %d specs", len(resp.Reserved), len(req.Reserve))
	}
	ttl := time.Duration(resp.GetTtlMs()) * time.Millisecond
	for j, b := range booked {
		var res *storepb.ReserveResult
		if err == nil {
			res = resp.Reserved[j]
		}
		a.got(b.k, b.n, res, ttl, b.epoch)
	}
	if err != nil {
		ierrs = make([]error, len(qs))
		fill(ierrs, err)
	}
	return make([]struct{}, len(qs)), ierrs
}
