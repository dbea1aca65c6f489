package oplog

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"hash/crc32"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/crescent-kv/crescent/internal/logx"
)

// EtcdOptions configures OpenEtcd. Zero values take the defaults.
type EtcdOptions struct {
	Prefix    string // key prefix; default "crescent/oplog"
	ClusterID string // required; keys live under <Prefix>/<ClusterID>/

	// Term, when set, claims the log at open: the durable prefix is
	// rewritten with this term, so any writer with a lower term is fenced
	// before the caller reads the log to its end. A prefix with a higher
	// term makes OpenEtcd fail with ErrFenced.
	Term uint64

	MaxBatchEntries int // entries per batch record; default 1024
	// MaxBatchBytes bounds one batch record (header included) and so one
	// transaction; default 1 MiB, at most EtcdMaxBatchBytes (etcd refuses
	// requests over 1.5 MiB by default).
	MaxBatchBytes int

	RequestTimeout time.Duration // one etcd request; default 5s
	// WriteTimeout bounds the retries of one batch after ambiguous
	// errors; past it the store is failed. Default 30s.
	WriteTimeout time.Duration
}

// Limits and defaults of the etcd backend.
const (
	EtcdMaxBatchBytes     = 1<<20 + 256<<10 // 1.25 MiB, under etcd's 1.5 MiB request limit
	etcdDefaultBatchBytes = 1 << 20
	etcdDefaultEntries    = 1024
	etcdMaxEntries        = 1 << 16
	etcdDeleteChunk       = 256     // batch keys per compaction delete
	etcdListPage          = 10000   // keys per page when listing batches at open
	etcdReadPageBytes     = 2 << 20 // bytes a Read asks etcd for in one page, going by the largest batch seen
	etcdReadPageMax       = 1024    // batches per page of a Read
)

// Etcd is the etcd Store: batch records plus a durable prefix, written
// together in one transaction guarded by the previous prefix (see the
// "etcd format" section of the package doc).
type Etcd struct {
	cli       *clientv3.Client
	opts      EtcdOptions
	prefixKey string
	batchDir  string // "<prefix>/<cluster>/batches/"

	ctx    context.Context // the writer's; cancelled by Close
	cancel context.CancelFunc
	done   chan struct{}

	mu      sync.Mutex
	wake    chan struct{} // 1-buffered: the writer has work
	queue   []*etcdReq
	next    uint64 // seq the next enqueued entry must carry
	term    uint64 // highest term accepted for the queue
	failErr error  // first failure; set once
	closed  bool
	view    etcdPrefix // last known durable prefix
	viewRev int64      // its ModRevision
	index   []uint64   // batch ids (= first seq of each batch), ascending

	// Writer-owned: what the next transaction compares against.
	wPrefix etcdPrefix
	wRev    int64

	deleteChunk int // batch keys per compaction delete (tests lower it)

	readLargest atomic.Int64 // largest batch of the last Read's last page; 0 before any

	txns, batches, entries atomic.Uint64
	bytes, txnNanos        atomic.Uint64
	txnBuckets             [len(FsyncBounds) + 1]atomic.Uint64
}

// EtcdStats counts the writer's work since open.
type EtcdStats struct {
	Txns    uint64 // transactions sent for appends (retries included)
	Batches uint64 // batch records committed
	Entries uint64 // entries committed
	Bytes   uint64 // batch record bytes committed
	// TxnNanos and TxnBuckets time the append transactions (each
	// attempt), in FsyncBounds's buckets.
	TxnNanos   uint64
	TxnBuckets [len(FsyncBounds) + 1]uint64
}

type etcdReq struct {
	term    uint64
	first   uint64   // seq of encs[0]
	encs    [][]byte // msgp encoding of each entry
	off     int      // entries already taken into a batch
	left    int      // entries not yet durable
	compact uint64   // a compaction request when non-zero
	err     error
	done    chan struct{}
}

// etcdPrefix is the decoded durable_prefix value.
type etcdPrefix struct {
	batch uint64 // id of the last batch written (its first seq); 0 = none
	first uint64 // first seq still held
	last  uint64 // last durable seq
	term  uint64
}

const (
	prefixMagic   = "CRLP"
	batchMagic    = "CRLB"
	etcdSchema    = 1
	prefixLen     = 44
	batchHdrLen   = 32
	minEntryBytes = 40 // a msgp Entry with empty key and payload is 41 bytes
)

func (p etcdPrefix) encode() []byte {
	b := make([]byte, prefixLen)
	copy(b, prefixMagic)
	binary.BigEndian.PutUint16(b[4:], etcdSchema)
	binary.BigEndian.PutUint64(b[8:], p.batch)
	binary.BigEndian.PutUint64(b[16:], p.first)
	binary.BigEndian.PutUint64(b[24:], p.last)
	binary.BigEndian.PutUint64(b[32:], p.term)
	binary.BigEndian.PutUint32(b[40:], crc32.Checksum(b[:40], castagnoli))
	return b
}

func decodePrefix(b []byte) (etcdPrefix, error) {
	if len(b) != prefixLen || string(b[:4]) != prefixMagic {
		return etcdPrefix{}, fmt.Errorf("%w: durable prefix: %d bytes, not a prefix record", ErrCorrupt, len(b))
	}
	if v := binary.BigEndian.Uint16(b[4:]); v != etcdSchema {
		return etcdPrefix{}, fmt.Errorf("%w: durable prefix: schema version %d, want %d", ErrCorrupt, v, etcdSchema)
	}
	if c := crc32.Checksum(b[:40], castagnoli); c != binary.BigEndian.Uint32(b[40:]) {
		return etcdPrefix{}, fmt.Errorf("%w: durable prefix: crc mismatch", ErrCorrupt)
	}
	p := etcdPrefix{
		batch: binary.BigEndian.Uint64(b[8:]),
		first: binary.BigEndian.Uint64(b[16:]),
		last:  binary.BigEndian.Uint64(b[24:]),
		term:  binary.BigEndian.Uint64(b[32:]),
	}
	if p.first == 0 || p.first > p.last+1 || p.batch > p.last || (p.last > 0 && p.batch == 0) {
		return etcdPrefix{}, fmt.Errorf("%w: durable prefix: batch %d first %d last %d", ErrCorrupt, p.batch, p.first, p.last)
	}
	return p, nil
}

// encodeBatch builds a batch record from encoded entries.
func encodeBatch(term, first uint64, encs [][]byte) []byte {
	n := batchHdrLen
	for _, e := range encs {
		n += len(e)
	}
	b := make([]byte, batchHdrLen, n)
	copy(b, batchMagic)
	binary.BigEndian.PutUint16(b[4:], etcdSchema)
	binary.BigEndian.PutUint64(b[8:], term)
	binary.BigEndian.PutUint64(b[16:], first)
	binary.BigEndian.PutUint32(b[24:], uint32(len(encs)))
	for _, e := range encs {
		b = append(b, e...)
	}
	c := crc32.Update(crc32.Checksum(b[:28], castagnoli), castagnoli, b[batchHdrLen:])
	binary.BigEndian.PutUint32(b[28:], c)
	return b
}

// decodeBatch checks a batch record stored under id and returns its
// entries, each verified. max bounds the record before anything is
// allocated for it.
func decodeBatch(id uint64, b []byte, max int) ([]Entry, error) {
	if len(b) > max {
		return nil, fmt.Errorf("%w: batch %d: %d bytes, limit %d", ErrCorrupt, id, len(b), max)
	}
	if len(b) < batchHdrLen || string(b[:4]) != batchMagic {
		return nil, fmt.Errorf("%w: batch %d: not a batch record", ErrCorrupt, id)
	}
	if v := binary.BigEndian.Uint16(b[4:]); v != etcdSchema {
		return nil, fmt.Errorf("%w: batch %d: schema version %d", ErrCorrupt, id, v)
	}
	c := crc32.Update(crc32.Checksum(b[:28], castagnoli), castagnoli, b[batchHdrLen:])
	if c != binary.BigEndian.Uint32(b[28:]) {
		return nil, fmt.Errorf("%w: batch %d: record crc mismatch", ErrCorrupt, id)
	}
	first := binary.BigEndian.Uint64(b[16:])
	count := int(binary.BigEndian.Uint32(b[24:]))
	if first != id || count == 0 || count > (len(b)-batchHdrLen)/minEntryBytes {
		return nil, fmt.Errorf("%w: batch %d: header first %d count %d", ErrCorrupt, id, first, count)
	}
	out := make([]Entry, count)
	rest := b[batchHdrLen:]
	for i := range out {
		var err error
		if rest, err = out[i].UnmarshalMsg(rest); err != nil {
			return nil, fmt.Errorf("%w: batch %d entry %d: %v", ErrCorrupt, id, i, err)
		}
		if err := out[i].Verify(); err != nil {
			return nil, err
		}
		if out[i].Seq != first+uint64(i) {
			return nil, fmt.Errorf("%w: batch %d entry %d has seq %d", ErrCorrupt, id, i, out[i].Seq)
		}
	}
	if len(rest) != 0 {
		return nil, fmt.Errorf("%w: batch %d: %d trailing bytes", ErrCorrupt, id, len(rest))
	}
	return out, nil
}

// OpenEtcd opens (or creates) the log of opts.ClusterID on cli. The
// client stays the caller's; Close does not close it.
func OpenEtcd(ctx context.Context, cli *clientv3.Client, opts EtcdOptions) (*Etcd, error) {
	if cli == nil {
		return nil, errors.New("oplog: etcd: nil client")
	}
	if opts.ClusterID == "" || strings.Contains(opts.ClusterID, "/") {
		return nil, fmt.Errorf("oplog: etcd: cluster id %q must be non-empty and hold no '/'", opts.ClusterID)
	}
	if opts.Prefix == "" {
		opts.Prefix = "crescent/oplog"
	}
	opts.Prefix = strings.TrimSuffix(opts.Prefix, "/")
	if opts.MaxBatchEntries == 0 {
		opts.MaxBatchEntries = etcdDefaultEntries
	}
	if opts.MaxBatchBytes == 0 {
		opts.MaxBatchBytes = etcdDefaultBatchBytes
	}
	if opts.MaxBatchEntries < 1 || opts.MaxBatchEntries > etcdMaxEntries {
		return nil, fmt.Errorf("oplog: etcd: MaxBatchEntries %d out of [1, %d]", opts.MaxBatchEntries, etcdMaxEntries)
	}
	if opts.MaxBatchBytes < 4<<10 || opts.MaxBatchBytes > EtcdMaxBatchBytes {
		return nil, fmt.Errorf("oplog: etcd: MaxBatchBytes %d out of [4096, %d]", opts.MaxBatchBytes, EtcdMaxBatchBytes)
	}
	if opts.RequestTimeout <= 0 {
		opts.RequestTimeout = 5 * time.Second
	}
	if opts.WriteTimeout <= 0 {
		opts.WriteTimeout = 30 * time.Second
	}
	base := opts.Prefix + "/" + opts.ClusterID + "/"
	s := &Etcd{
		cli:         cli,
		opts:        opts,
		prefixKey:   base + "durable_prefix",
		batchDir:    base + "batches/",
		wake:        make(chan struct{}, 1),
		done:        make(chan struct{}),
		deleteChunk: etcdDeleteChunk,
	}
	p, rev, index, err := s.load(ctx)
	if err != nil {
		return nil, err
	}
	s.view, s.viewRev, s.index = p, rev, index
	s.wPrefix, s.wRev = p, rev
	s.next, s.term = p.last+1, p.term
	if opts.Term < p.term && opts.Term != 0 {
		return nil, fmt.Errorf("%w: open with term %d, the log has term %d", ErrFenced, opts.Term, p.term)
	}
	s.ctx, s.cancel = context.WithCancel(context.Background())
	if opts.Term > p.term {
		np := p
		np.term = opts.Term
		cctx, cancel := context.WithTimeout(ctx, opts.WriteTimeout)
		rev, err := s.commit(cctx, np, "", nil)
		cancel()
		if err != nil {
			s.cancel()
			return nil, err
		}
		s.wPrefix, s.wRev, s.term = np, rev, np.term
		s.view, s.viewRev = np, rev
	}
	go s.writer()
	return s, nil
}

func (s *Etcd) batchKey(id uint64) string { return fmt.Sprintf("%s%020d", s.batchDir, id) }

// load reads the prefix and, at the same revision, the keys of every
// batch up to the one it names.
func (s *Etcd) load(ctx context.Context) (etcdPrefix, int64, []uint64, error) {
	resp, err := s.cli.Get(ctx, s.prefixKey)
	if err != nil {
		return etcdPrefix{}, 0, nil, fmt.Errorf("oplog: etcd: read prefix: %w", err)
	}
	if len(resp.Kvs) == 0 {
		return etcdPrefix{first: 1}, 0, nil, nil
	}
	p, err := decodePrefix(resp.Kvs[0].Value)
	if err != nil {
		return etcdPrefix{}, 0, nil, err
	}
	index, err := s.listBatches(ctx, 0, p, resp.Header.Revision)
	if err != nil {
		return etcdPrefix{}, 0, nil, err
	}
	return p, resp.Kvs[0].ModRevision, index, nil
}

// listBatches returns the ids of the batches from id from up to p.batch,
// read at revision rev, dropping those wholly below p.first.
func (s *Etcd) listBatches(ctx context.Context, from uint64, p etcdPrefix, rev int64) ([]uint64, error) {
	if p.last == 0 {
		return nil, nil
	}
	var ids []uint64
	key, end := s.batchKey(from), s.batchKey(p.batch)+"\x00"
	for {
		resp, err := s.cli.Get(ctx, key, clientv3.WithRange(end), clientv3.WithKeysOnly(),
			clientv3.WithLimit(etcdListPage), clientv3.WithRev(rev))
		if err != nil {
			return nil, fmt.Errorf("oplog: etcd: list batches: %w", err)
		}
		for _, kv := range resp.Kvs {
			k := string(kv.Key)
			digits := strings.TrimPrefix(k, s.batchDir)
			id, err := strconv.ParseUint(digits, 10, 64)
			if err != nil || len(digits) != 20 {
				return nil, fmt.Errorf("%w: batch key %q", ErrCorrupt, k)
			}
			ids = append(ids, id)
		}
		if !resp.More || len(resp.Kvs) == 0 {
			break
		}
		key = string(resp.Kvs[len(resp.Kvs)-1].Key) + "\x00"
	}
	// Drop batches wholly below first (left by an interrupted compaction).
	i := sort.Search(len(ids), func(i int) bool { return ids[i] > p.first }) - 1
	if i > 0 {
		ids = ids[i:]
	}
	if p.first <= p.last {
		if len(ids) == 0 || ids[len(ids)-1] != p.batch || ids[0] > max(p.first, from) {
			return nil, fmt.Errorf("%w: batches for seqs %d..%d missing (prefix names batch %d, found %d keys)",
				ErrCorrupt, max(p.first, from), p.last, p.batch, len(ids))
		}
	}
	return ids, nil
}

// Stats reports the writer's counters.
func (s *Etcd) Stats() EtcdStats {
	st := EtcdStats{Txns: s.txns.Load(), Batches: s.batches.Load(), Entries: s.entries.Load(),
		Bytes: s.bytes.Load(), TxnNanos: s.txnNanos.Load()}
	for i := range st.TxnBuckets {
		st.TxnBuckets[i] = s.txnBuckets[i].Load()
	}
	return st
}

// Append implements Store: it returns once every entry is committed in
// etcd, or with the error that failed the store.
func (s *Etcd) Append(ctx context.Context, term uint64, entries []Entry) error {
	wait, err := s.AppendAsync(term, entries)
	if err != nil {
		return err
	}
	return wait(ctx)
}

// AppendAsync queues entries for the writer and returns a wait that
// reports their durability, so a producer can queue in seq order under
// its own lock and wait outside it. Entries are checked against the
// last queued seq (ErrGap). A wait whose ctx ends first fails the store:
// the entries may still become durable, so nothing after them may be
// acknowledged.
func (s *Etcd) AppendAsync(term uint64, entries []Entry) (func(context.Context) error, error) {
	if len(entries) == 0 {
		return func(context.Context) error { return nil }, nil
	}
	encs := make([][]byte, len(entries))
	limit := s.opts.MaxBatchBytes - batchHdrLen
	for i := range entries {
		e := &entries[i]
		if i > 0 && e.Seq != entries[i-1].Seq+1 {
			return nil, fmt.Errorf("%w: entry %d has seq %d after %d", ErrGap, i, e.Seq, entries[i-1].Seq)
		}
		var err error
		if err = e.Verify(); err == nil {
			if encs[i], err = e.MarshalMsg(nil); err == nil && len(encs[i]) > limit {
				err = fmt.Errorf("%w: seq %d encodes to %d bytes, an etcd batch holds %d", ErrTooLarge, e.Seq, len(encs[i]), limit)
			}
		}
		if err != nil {
			s.mu.Lock()
			s.failLocked(err)
			s.mu.Unlock()
			return nil, s.failedErr()
		}
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	switch {
	case s.closed:
		return nil, ErrClosed
	case s.failErr != nil:
		return nil, s.failedErrLocked()
	case entries[0].Seq != s.next:
		return nil, fmt.Errorf("%w: first seq %d, want %d", ErrGap, entries[0].Seq, s.next)
	case term < s.term:
		s.failLocked(fmt.Errorf("%w: append with term %d after term %d", ErrFenced, term, s.term))
		return nil, s.failedErrLocked()
	}
	r := &etcdReq{term: term, first: entries[0].Seq, encs: encs, left: len(encs), done: make(chan struct{})}
	s.term = term
	s.next += uint64(len(entries))
	s.queue = append(s.queue, r)
	s.kick()
	return func(ctx context.Context) error { return s.wait(ctx, r) }, nil
}

func (s *Etcd) kick() {
	select {
	case s.wake <- struct{}{}:
	default:
	}
}

func (s *Etcd) wait(ctx context.Context, r *etcdReq) error {
	select {
	case <-r.done:
		return r.err
	case <-ctx.Done():
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	select {
	case <-r.done: // raced with the writer
		return r.err
	default:
	}
	s.failLocked(fmt.Errorf("append of seqs from %d abandoned: %w", r.first, ctx.Err()))
	return s.failedErrLocked()
}

// failLocked records the first failure.
func (s *Etcd) failLocked(err error) {
	if s.failErr == nil {
		s.failErr = err
		s.kick() // the writer fails what is queued
	}
}

func (s *Etcd) failedErr() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.failedErrLocked()
}

func (s *Etcd) failedErrLocked() error {
	if s.closed && s.failErr == nil {
		return ErrClosed
	}
	return fmt.Errorf("%w: %w", ErrFailed, s.failErr)
}

// writer commits the queue one batch at a time.
func (s *Etcd) writer() {
	defer close(s.done)
	for {
		s.mu.Lock()
		for len(s.queue) == 0 && !s.closed && s.failErr == nil {
			s.mu.Unlock()
			select {
			case <-s.wake:
			case <-s.ctx.Done():
			}
			s.mu.Lock()
			if s.ctx.Err() != nil {
				s.closed = true
			}
		}
		if s.closed || s.failErr != nil {
			var err error = ErrClosed
			if s.failErr != nil {
				err = s.failedErrLocked()
			}
			q := s.queue
			s.queue = nil
			s.mu.Unlock()
			for _, r := range q {
				finish(r, err)
			}
			if s.ctx.Err() != nil {
				return
			}
			<-s.ctx.Done() // failed: wait for Close
			continue
		}
		if r := s.queue[0]; r.compact != 0 {
			s.queue = s.queue[1:]
			s.mu.Unlock()
			s.doCompact(r)
			continue
		}
		// Take whole or partial requests of one term up to the limits.
		var (
			encs  [][]byte
			parts []*etcdReq
			takes []int
			size  = batchHdrLen
			term  = s.queue[0].term
			first = s.queue[0].first + uint64(s.queue[0].off)
		)
	fill:
		for _, r := range s.queue {
			if r.compact != 0 || r.term != term {
				break
			}
			n := 0
			for r.off < len(r.encs) {
				e := r.encs[r.off]
				if len(encs) == s.opts.MaxBatchEntries || size+len(e) > s.opts.MaxBatchBytes {
					break
				}
				encs, size = append(encs, e), size+len(e)
				r.off++
				n++
			}
			if n > 0 {
				parts, takes = append(parts, r), append(takes, n)
			}
			if r.off < len(r.encs) {
				break fill
			}
		}
		for len(s.queue) > 0 && s.queue[0].compact == 0 && s.queue[0].off == len(s.queue[0].encs) {
			s.queue = s.queue[1:]
		}
		s.mu.Unlock()

		err := s.appendBatch(term, first, encs)
		s.mu.Lock()
		if err != nil {
			s.failLocked(err)
		}
		if s.failErr != nil { // strict fail-stop: nothing after a failure is acknowledged
			err = s.failedErrLocked()
		}
		s.mu.Unlock()
		for i, r := range parts {
			if err != nil {
				finish(r, err)
				continue
			}
			r.left -= takes[i]
			if r.left == 0 {
				finish(r, nil)
			}
		}
	}
}

func finish(r *etcdReq, err error) {
	select {
	case <-r.done:
	default:
		r.err = err
		close(r.done)
	}
}

// appendBatch writes one batch record and the prefix naming it.
func (s *Etcd) appendBatch(term, first uint64, encs [][]byte) error {
	if term < s.wPrefix.term {
		return fmt.Errorf("%w: term %d, the log has term %d", ErrFenced, term, s.wPrefix.term)
	}
	np := etcdPrefix{batch: first, first: s.wPrefix.first, last: first + uint64(len(encs)) - 1, term: term}
	val := encodeBatch(term, first, encs)
	ctx, cancel := context.WithTimeout(s.ctx, s.opts.WriteTimeout)
	defer cancel()
	rev, err := s.commit(ctx, np, s.batchKey(first), val)
	if err != nil {
		return err
	}
	s.wPrefix, s.wRev = np, rev
	s.batches.Add(1)
	s.entries.Add(uint64(len(encs)))
	s.bytes.Add(uint64(len(val)))
	s.mu.Lock()
	if rev > s.viewRev {
		s.view, s.viewRev = np, rev
	}
	if n := len(s.index); n == 0 || s.index[n-1] < first {
		s.index = append(s.index, first)
	}
	s.mu.Unlock()
	return nil
}

// commit writes the prefix np (and the batch key=val when key is set) in
// one transaction guarded by the writer's prefix revision. An error that
// leaves the outcome unknown is retried with the same bytes until ctx
// ends; a failed compare is success only when the stored prefix is np
// and the stored batch is byte-identical (an earlier attempt landed),
// and ErrFenced otherwise. It returns the prefix's new ModRevision.
func (s *Etcd) commit(ctx context.Context, np etcdPrefix, key string, val []byte) (int64, error) {
	pv := np.encode()
	then := []clientv3.Op{clientv3.OpPut(s.prefixKey, string(pv))}
	els := []clientv3.Op{clientv3.OpGet(s.prefixKey)}
	if key != "" {
		then = append(then, clientv3.OpPut(key, string(val)))
		els = append(els, clientv3.OpGet(key))
	}
	backoff := 10 * time.Millisecond
	var lastErr error
	for {
		actx, cancel := context.WithTimeout(ctx, s.opts.RequestTimeout)
		if key != "" {
			s.txns.Add(1)
		}
		t0 := time.Now()
		resp, err := s.cli.Txn(actx).
			If(clientv3.Compare(clientv3.ModRevision(s.prefixKey), "=", s.wRev)).
			Then(then...).Else(els...).Commit()
		cancel()
		if key != "" {
			d := time.Since(t0)
			s.txnNanos.Add(uint64(d))
			s.txnBuckets[sort.Search(len(FsyncBounds), func(i int) bool { return d <= FsyncBounds[i] })].Add(1)
		}
		if err == nil && resp.Succeeded {
			return resp.Header.Revision, nil
		}
		if err == nil {
			return s.settle(resp, pv, key, val)
		}
		lastErr = err
		if permanent(err) {
			return 0, fmt.Errorf("oplog: etcd: write seqs to %d: %w", np.last, err)
		}
		select {
		case <-ctx.Done():
			return 0, fmt.Errorf("oplog: etcd: write seqs to %d unresolved: %w (last: %w)", np.last, ctx.Err(), lastErr)
		case <-time.After(backoff):
		}
		backoff = min(2*backoff, time.Second)
	}
}

// settle decides a failed compare from the Else reads.
func (s *Etcd) settle(resp *clientv3.TxnResponse, pv []byte, key string, val []byte) (int64, error) {
	var (
		got  []byte
		rev  int64
		same = true
	)
	if r := resp.Responses[0].GetResponseRange(); r != nil && len(r.Kvs) == 1 {
		got, rev = r.Kvs[0].Value, r.Kvs[0].ModRevision
	}
	if key != "" {
		r := resp.Responses[1].GetResponseRange()
		same = r != nil && len(r.Kvs) == 1 && string(r.Kvs[0].Value) == string(val)
	}
	if same && string(got) == string(pv) {
		return rev, nil // an earlier attempt landed
	}
	what := "a missing prefix"
	if p, err := decodePrefix(got); err == nil {
		what = fmt.Sprintf("term %d, last seq %d", p.term, p.last)
	} else if got != nil {
		what = err.Error()
	}
	return 0, fmt.Errorf("%w: durable prefix moved (revision %d, expected %d): %s", ErrFenced, rev, s.wRev, what)
}

// permanent reports errors that a retry cannot fix.
func permanent(err error) bool {
	switch status.Code(err) {
	case codes.InvalidArgument, codes.FailedPrecondition, codes.PermissionDenied,
		codes.Unauthenticated, codes.ResourceExhausted, codes.OutOfRange, codes.Unimplemented:
		return true
	}
	return false
}

// refresh merges the stored prefix into the view (another writer may
// have moved it, or this store only reads).
func (s *Etcd) refresh(ctx context.Context) error {
	resp, err := s.cli.Get(ctx, s.prefixKey)
	if err != nil {
		return fmt.Errorf("oplog: etcd: read prefix: %w", err)
	}
	if len(resp.Kvs) == 0 {
		s.mu.Lock()
		defer s.mu.Unlock()
		if s.viewRev != 0 {
			return fmt.Errorf("%w: durable prefix vanished", ErrCorrupt)
		}
		return nil
	}
	kv := resp.Kvs[0]
	p, err := decodePrefix(kv.Value)
	if err != nil {
		return err
	}
	s.mu.Lock()
	known, from := s.view, uint64(0)
	if n := len(s.index); n > 0 {
		from = s.index[n-1] + 1
	}
	stale := kv.ModRevision > s.viewRev
	s.mu.Unlock()
	if !stale {
		return nil
	}
	if p.last < known.last || p.first < known.first {
		return fmt.Errorf("%w: durable prefix regressed (last %d < %d or first %d < %d)", ErrCorrupt, p.last, known.last, p.first, known.first)
	}
	var ids []uint64
	if p.last > known.last {
		q := p
		q.first = max(p.first, known.last+1)
		if ids, err = s.listBatches(ctx, from, q, resp.Header.Revision); err != nil {
			return err
		}
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if kv.ModRevision > s.viewRev {
		s.view, s.viewRev = p, kv.ModRevision
		for _, id := range ids {
			if n := len(s.index); n == 0 || s.index[n-1] < id {
				s.index = append(s.index, id)
			}
		}
	}
	return nil
}

func (s *Etcd) snapshot() (etcdPrefix, []uint64, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return etcdPrefix{}, nil, ErrClosed
	}
	return s.view, s.index, nil
}

// LastSeq implements Store, from the stored prefix.
func (s *Etcd) LastSeq(ctx context.Context) (uint64, error) {
	if err := s.refresh(ctx); err != nil {
		return 0, err
	}
	p, _, err := s.snapshot()
	return p.last, err
}

// FirstSeq implements Store, from the stored prefix: LastSeq+1 when
// the log holds nothing.
func (s *Etcd) FirstSeq(ctx context.Context) (uint64, error) {
	if err := s.refresh(ctx); err != nil {
		return 0, err
	}
	p, _, err := s.snapshot()
	return p.first, err
}

// Read implements Store.
func (s *Etcd) Read(ctx context.Context, from uint64, max int) ([]Entry, error) {
	if max < 0 || from == 0 {
		return nil, fmt.Errorf("oplog: read from %d max %d: bad arguments", from, max)
	}
	p, index, err := s.snapshot()
	if err != nil {
		return nil, err
	}
	// Past what this store knows: another writer may have appended.
	if from < p.first || from > p.last || uint64(max) > p.last-from+1 {
		if err := s.refresh(ctx); err != nil {
			return nil, err
		}
		if p, index, err = s.snapshot(); err != nil {
			return nil, err
		}
	}
	if from < p.first {
		return nil, fmt.Errorf("%w: seq %d, the log starts at %d", ErrCompacted, from, p.first)
	}
	if from > p.last || max == 0 {
		return nil, nil
	}
	i := sort.Search(len(index), func(i int) bool { return index[i] > from }) - 1
	if i < 0 {
		return nil, fmt.Errorf("%w: no batch holds seq %d", ErrCorrupt, from)
	}
	// The batches holding from..want, fetched by key range a page at a
	// time: one linearizable read per page instead of one per batch. A
	// page aims at etcdReadPageBytes; what it holds is part of what the
	// caller asked for, so max bounds the memory either way.
	want := p.last
	if uint64(max) <= p.last-from {
		want = from + uint64(max) - 1
	}
	j := sort.Search(len(index), func(k int) bool { return index[k] > want }) - 1
	out := make([]Entry, 0, min(max, 1024))
	// The first page goes by the last Read's batches (recovery reads 1024
	// entries per call), else by the largest a batch may be.
	largest := int(s.readLargest.Load())
	if largest <= 0 {
		largest = s.opts.MaxBatchBytes
	}
	limit := min(etcdReadPageMax, int64(etcdReadPageBytes/largest)) // largest <= 1.25 MiB
	for i <= j {
		resp, err := s.cli.Get(ctx, s.batchKey(index[i]), clientv3.WithRange(s.batchKey(index[j])+"\x00"),
			clientv3.WithLimit(limit))
		if status.Code(err) == codes.ResourceExhausted && limit > 1 {
			// Over the client's receive limit (EtcdClientConfig: 4 MiB):
			// batches grew past what the page went by. One batch always fits.
			limit = (limit + 7) / 8
			continue
		}
		if err != nil {
			return out, fmt.Errorf("oplog: etcd: read batches %d..%d: %w", index[i], index[j], err)
		}
		largest = 1
		for _, kv := range resp.Kvs {
			id := index[i]
			if string(kv.Key) != s.batchKey(id) {
				return out, s.missing(ctx, from, id)
			}
			if len(kv.Value) > largest {
				largest = len(kv.Value)
			}
			last := p.last
			if i+1 < len(index) {
				last = index[i+1] - 1
			}
			es, err := decodeBatch(id, kv.Value, s.opts.MaxBatchBytes)
			if err != nil {
				return out, err
			}
			if id+uint64(len(es))-1 != last {
				return out, fmt.Errorf("%w: batch %d holds seqs to %d, the log says %d", ErrCorrupt, id, id+uint64(len(es))-1, last)
			}
			for _, e := range es {
				if e.Seq >= from && len(out) < max {
					out = append(out, e)
				}
			}
			i++
		}
		if len(resp.Kvs) == 0 || (!resp.More && i <= j) {
			return out, s.missing(ctx, from, index[i])
		}
		// Grow by doubling: batches near the end may be larger than
		// those seen so far.
		limit = min(2*limit, etcdReadPageMax, int64(etcdReadPageBytes/largest))
		s.readLargest.Store(int64(largest))
	}
	return out, nil
}

// missing explains a batch the index names that etcd does not hold: the
// log was compacted past from meanwhile, or it is corrupt.
func (s *Etcd) missing(ctx context.Context, from, id uint64) error {
	if err := s.refresh(ctx); err == nil {
		if q, _, _ := s.snapshot(); from < q.first {
			return fmt.Errorf("%w: seq %d, the log starts at %d", ErrCompacted, from, q.first)
		}
	}
	return fmt.Errorf("%w: batch %d missing", ErrCorrupt, id)
}

// Compact implements Store: the prefix records the new first seq, then
// the batches wholly below it are deleted, etcdDeleteChunk keys per
// transaction, each guarded by the prefix so a deposed writer stops.
func (s *Etcd) Compact(ctx context.Context, before uint64) error {
	if before == 0 {
		return nil
	}
	s.mu.Lock()
	switch {
	case s.closed:
		s.mu.Unlock()
		return ErrClosed
	case s.failErr != nil:
		defer s.mu.Unlock()
		return s.failedErrLocked()
	}
	r := &etcdReq{compact: before, done: make(chan struct{})}
	s.queue = append(s.queue, r)
	s.kick()
	s.mu.Unlock()
	return s.wait(ctx, r)
}

func (s *Etcd) doCompact(r *etcdReq) {
	ctx, cancel := context.WithTimeout(s.ctx, s.opts.WriteTimeout)
	defer cancel()
	err := s.compact(ctx, r.compact)
	s.mu.Lock()
	if err != nil {
		s.failLocked(err)
		err = s.failedErrLocked()
	}
	s.mu.Unlock()
	finish(r, err)
}

func (s *Etcd) compact(ctx context.Context, before uint64) error {
	np := s.wPrefix
	np.first = max(np.first, min(before, np.last+1))
	if np.first != s.wPrefix.first {
		rev, err := s.commit(ctx, np, "", nil)
		if err != nil {
			return err
		}
		s.wPrefix, s.wRev = np, rev
		s.mu.Lock()
		if rev > s.viewRev {
			s.view, s.viewRev = np, rev
		}
		s.mu.Unlock()
	}
	// Batches wholly below np.first: all but the one holding it (all of
	// them when the log is empty).
	s.mu.Lock()
	index := s.index
	s.mu.Unlock()
	keep := sort.Search(len(index), func(i int) bool { return index[i] > np.first }) - 1
	if np.first > np.last {
		keep = len(index)
	}
	start := s.batchKey(0)
	for done := 0; done < keep; {
		n := min(keep-done, s.deleteChunk)
		end := s.batchDir + "\xff"
		if done+n < len(index) {
			end = s.batchKey(index[done+n])
		}
		if err := s.deleteRange(ctx, start, end); err != nil {
			return err
		}
		done += n
		start = end
		s.mu.Lock()
		s.index = s.index[n:]
		s.mu.Unlock()
	}
	return nil
}

func (s *Etcd) deleteRange(ctx context.Context, start, end string) error {
	backoff := 10 * time.Millisecond
	for {
		actx, cancel := context.WithTimeout(ctx, s.opts.RequestTimeout)
		resp, err := s.cli.Txn(actx).
			If(clientv3.Compare(clientv3.ModRevision(s.prefixKey), "=", s.wRev)).
			Then(clientv3.OpDelete(start, clientv3.WithRange(end))).Commit()
		cancel()
		switch {
		case err == nil && resp.Succeeded:
			return nil
		case err == nil:
			return fmt.Errorf("%w: durable prefix moved during compaction", ErrFenced)
		case permanent(err):
			return fmt.Errorf("oplog: etcd: compact: %w", err)
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("oplog: etcd: compact unresolved: %w (last: %w)", ctx.Err(), err)
		case <-time.After(backoff):
		}
		backoff = min(2*backoff, time.Second)
	}
}

// Close stops the writer; queued appends fail with ErrClosed (or the
// store's failure). The client is not closed.
func (s *Etcd) Close() error {
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		<-s.done
		return nil
	}
	s.closed = true
	s.mu.Unlock()
	s.cancel()
	<-s.done
	return nil
}

var _ Store = (*Etcd)(nil)

// ParseEtcdURL splits "etcd://host:port[,host2:port2...]" (';' also
// separates, as in the reference's master addresses) into endpoints.
func ParseEtcdURL(s string) ([]string, error) {
	rest, ok := strings.CutPrefix(s, "etcd://")
	if !ok {
		return nil, fmt.Errorf("oplog: %q: want etcd://host:port[,host:port...]", s)
	}
	var eps []string
	for _, ep := range strings.FieldsFunc(rest, func(r rune) bool { return r == ',' || r == ';' }) {
		h, p, found := strings.Cut(ep, ":")
		if !found || h == "" || p == "" || strings.ContainsAny(ep, "/ ") {
			return nil, fmt.Errorf("oplog: %q: endpoint %q is not host:port", s, ep)
		}
		if _, err := strconv.ParseUint(p, 10, 16); err != nil {
			return nil, fmt.Errorf("oplog: %q: endpoint %q: bad port", s, ep)
		}
		eps = append(eps, ep)
	}
	if len(eps) == 0 {
		return nil, fmt.Errorf("oplog: %q: no endpoints", s)
	}
	return eps, nil
}

// EtcdClientConfig is a client configuration suited to the log: dial
// keep-alives so a hung member is left (the reference's stalled-view
// bug), and responses bounded to what the log ever reads (a batch of at
// most EtcdMaxBatchBytes, or a page of keys).
func EtcdClientConfig(endpoints []string) clientv3.Config {
	return clientv3.Config{
		Endpoints:            endpoints,
		DialTimeout:          5 * time.Second,
		DialKeepAliveTime:    5 * time.Second,
		DialKeepAliveTimeout: 3 * time.Second,
		MaxCallSendMsgSize:   2 << 20,
		MaxCallRecvMsgSize:   4 << 20,
		Logger:               logx.Zap(nil, "etcd"), // slog.Default(), not zap's own JSON
	}
}

// Watched is what a follower watches to learn that the log grew: the
// client and the durable prefix's key.
func (s *Etcd) Watched() (*clientv3.Client, string) { return s.cli, s.prefixKey }

// Term is the highest term in the stored prefix, as last read or written.
func (s *Etcd) Term() uint64 {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.view.term
}

// Err is the store's failure (ErrFailed wrapping the cause, or ErrClosed),
// nil while it works.
func (s *Etcd) Err() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.failErr == nil && !s.closed {
		return nil
	}
	return s.failedErrLocked()
}
