package oplog

import (
	"context"
	"encoding/binary"
	"fmt"
	"net/url"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.etcd.io/etcd/server/v3/embed"
	"go.uber.org/goleak"
	"go.uber.org/zap"

	"github.com/crescent-kv/crescent/internal/testsvc"
)

const etcdWait = 30 * time.Second

// startEtcd starts an embedded etcd and checks, last of all cleanups,
// that the test left no goroutine behind.
func startEtcd(t testing.TB) *testsvc.Etcd {
	t.Helper()
	t.Cleanup(func() { goleak.VerifyNone(t, testsvc.GoleakIgnores()...) })
	return testsvc.StartEtcd(t)
}

func newCli(t testing.TB, e *testsvc.Etcd) *clientv3.Client {
	t.Helper()
	cli, err := clientv3.New(clientv3.Config{
		Endpoints: []string{e.Endpoint}, Logger: zap.NewNop(), DialTimeout: 5 * time.Second,
	})
	require.NoError(t, err)
	t.Cleanup(func() { cli.Close() })
	return cli
}

func openEtcd(t testing.TB, cli *clientv3.Client, opts EtcdOptions) *Etcd {
	t.Helper()
	if opts.ClusterID == "" {
		opts.ClusterID = "c1"
	}
	ctx, cancel := context.WithTimeout(context.Background(), etcdWait)
	defer cancel()
	s, err := OpenEtcd(ctx, cli, opts)
	require.NoError(t, err)
	t.Cleanup(func() { s.Close() })
	return s
}

// ents returns n sealed entries from seq first.
func ents(first uint64, n int, term uint64, payload int) []Entry {
	out := make([]Entry, n)
	for i := range out {
		seq := first + uint64(i)
		p := make([]byte, payload)
		for j := range p {
			p[j] = byte(seq) + byte(j)
		}
		out[i] = Entry{Seq: seq, Term: term, Time: int64(seq) * 1000, Kind: 1, Key: fmt.Sprintf("k%d", seq), Payload: p}
		out[i].Seal()
	}
	return out
}

func ctxT(t testing.TB) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), etcdWait)
	t.Cleanup(cancel)
	return ctx
}

func batchKeys(t testing.TB, cli *clientv3.Client, s *Etcd) int {
	t.Helper()
	resp, err := cli.Get(ctxT(t), s.batchDir, clientv3.WithPrefix(), clientv3.WithKeysOnly())
	require.NoError(t, err)
	return len(resp.Kvs)
}

func TestEtcdAppendReadReopen(t *testing.T) {
	e := startEtcd(t)
	cli := newCli(t, e)
	ctx := ctxT(t)
	s := openEtcd(t, cli, EtcdOptions{MaxBatchEntries: 4})

	last, err := s.LastSeq(ctx)
	require.NoError(t, err)
	first, err := s.FirstSeq(ctx)
	require.NoError(t, err)
	assert.Equal(t, []uint64{0, 1}, []uint64{last, first}, "an empty log")
	es, err := s.Read(ctx, 1, 10)
	require.NoError(t, err)
	assert.Empty(t, es)

	want := ents(1, 23, 1, 50)
	require.NoError(t, s.Append(ctx, 1, want[:1]))
	require.NoError(t, s.Append(ctx, 1, want[1:10])) // split: 4+4+1
	require.NoError(t, s.Append(ctx, 1, want[10:]))
	assert.Equal(t, want, readAll(t, s, 1))
	assert.Equal(t, want[5:], readAll(t, s, 6), "from inside a batch")
	es, err = s.Read(ctx, 3, 2)
	require.NoError(t, err)
	assert.Equal(t, want[2:4], es)
	es, err = s.Read(ctx, 24, 2)
	require.NoError(t, err)
	assert.Empty(t, es, "past the end")
	last, err = s.LastSeq(ctx)
	require.NoError(t, err)
	assert.EqualValues(t, 23, last)
	assert.GreaterOrEqual(t, s.Stats().Batches, uint64(6))
	require.NoError(t, s.Close())
	assert.ErrorIs(t, s.Append(ctx, 1, ents(24, 1, 1, 1)), ErrClosed)

	s2 := openEtcd(t, cli, EtcdOptions{MaxBatchEntries: 4})
	assert.Equal(t, want, readAll(t, s2, 1))
	more := ents(24, 3, 1, 10)
	require.NoError(t, s2.Append(ctx, 1, more))
	assert.Equal(t, append(want, more...), readAll(t, s2, 1))
}

// One append bigger than a batch is split across batches, in order.
func TestEtcdSplitLargeAppend(t *testing.T) {
	e := startEtcd(t)
	cli := newCli(t, e)
	ctx := ctxT(t)
	s := openEtcd(t, cli, EtcdOptions{MaxBatchBytes: 4096})
	want := ents(1, 20, 1, 1000)
	require.NoError(t, s.Append(ctx, 1, want))
	assert.GreaterOrEqual(t, s.Stats().Batches, uint64(5), "about 3 entries per 4 KiB batch")
	assert.Equal(t, want, readAll(t, s, 1))

	// An entry that fits no batch is refused before anything is sent.
	big := ents(21, 1, 1, 5000)
	assert.ErrorIs(t, s.Append(ctx, 1, big), ErrTooLarge)
}

func TestEtcdGap(t *testing.T) {
	e := startEtcd(t)
	cli := newCli(t, e)
	ctx := ctxT(t)
	s := openEtcd(t, cli, EtcdOptions{})
	assert.ErrorIs(t, s.Append(ctx, 1, ents(2, 1, 1, 1)), ErrGap, "must start at 1")
	holey := append(ents(1, 2, 1, 1), ents(4, 1, 1, 1)...)
	assert.ErrorIs(t, s.Append(ctx, 1, holey), ErrGap)
	require.NoError(t, s.Append(ctx, 1, ents(1, 3, 1, 1)), "a gap does not fail the store")
	assert.ErrorIs(t, s.Append(ctx, 1, ents(3, 1, 1, 1)), ErrGap, "a seq already held")
	require.NoError(t, s.Append(ctx, 1, ents(4, 1, 1, 1)))
}

// gateKV holds the first append transaction until released.
type gateKV struct {
	clientv3.KV
	hook func(ctx context.Context, commit func() (*clientv3.TxnResponse, error)) (*clientv3.TxnResponse, error)
}

type gateTxn struct {
	clientv3.Txn
	ctx context.Context
	kv  *gateKV
}

func (k *gateKV) Txn(ctx context.Context) clientv3.Txn {
	return &gateTxn{Txn: k.KV.Txn(ctx), ctx: ctx, kv: k}
}

func (t *gateTxn) If(cs ...clientv3.Cmp) clientv3.Txn   { t.Txn = t.Txn.If(cs...); return t }
func (t *gateTxn) Then(ops ...clientv3.Op) clientv3.Txn { t.Txn = t.Txn.Then(ops...); return t }
func (t *gateTxn) Else(ops ...clientv3.Op) clientv3.Txn { t.Txn = t.Txn.Else(ops...); return t }
func (t *gateTxn) Commit() (*clientv3.TxnResponse, error) {
	if t.kv.hook == nil {
		return t.Txn.Commit()
	}
	return t.kv.hook(t.ctx, t.Txn.Commit)
}

// wrapKV installs a hook around every transaction of cli.
func wrapKV(cli *clientv3.Client, hook func(context.Context, func() (*clientv3.TxnResponse, error)) (*clientv3.TxnResponse, error)) {
	cli.KV = &gateKV{KV: cli.KV, hook: hook}
}

// Concurrent appenders share transactions: while the first batch is in
// flight, the others queue and go out together.
func TestEtcdGroupCommit(t *testing.T) {
	e := startEtcd(t)
	cli := newCli(t, e)
	ctx := ctxT(t)
	release := make(chan struct{})
	var calls atomic.Int32
	wrapKV(cli, func(_ context.Context, commit func() (*clientv3.TxnResponse, error)) (*clientv3.TxnResponse, error) {
		if calls.Add(1) == 1 {
			<-release
		}
		return commit()
	})
	s := openEtcd(t, cli, EtcdOptions{})

	const n, per = 16, 5
	var (
		mu     sync.Mutex
		next   = uint64(1)
		queued sync.WaitGroup
		wg     sync.WaitGroup
		errs   = make(chan error, n*per)
	)
	queued.Add(n)
	for g := 0; g < n; g++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; i < per; i++ {
				mu.Lock()
				wait, err := s.AppendAsync(1, ents(next, 1, 1, 200))
				next++
				mu.Unlock()
				if i == 0 {
					queued.Done()
				}
				if err != nil {
					errs <- err
					continue
				}
				errs <- wait(ctx)
			}
		}()
	}
	queued.Wait() // every appender has one append queued behind the first
	close(release)
	wg.Wait()
	close(errs)
	for err := range errs {
		require.NoError(t, err)
	}
	st := s.Stats()
	assert.EqualValues(t, n*per, st.Entries)
	assert.Less(t, st.Txns, uint64(n*per), "fewer transactions than appends")
	assert.Less(t, st.Batches, uint64(n*per))
	got := readAll(t, s, 1)
	require.Len(t, got, n*per)
	for i, e := range got {
		require.EqualValues(t, i+1, e.Seq)
	}
}

// A writer with a higher term takes over; the deposed one acknowledges
// nothing more.
func TestEtcdFencedByHigherTerm(t *testing.T) {
	e := startEtcd(t)
	cli := newCli(t, e)
	ctx := ctxT(t)
	old := openEtcd(t, cli, EtcdOptions{})
	require.NoError(t, old.Append(ctx, 1, ents(1, 5, 1, 10)))

	// Claimed at open: the old writer is fenced before its next append.
	nw := openEtcd(t, newCli(t, e), EtcdOptions{Term: 2})
	err := old.Append(ctx, 1, ents(6, 1, 1, 10))
	assert.ErrorIs(t, err, ErrFenced)
	assert.ErrorIs(t, err, ErrFailed)
	err = old.Append(ctx, 1, ents(7, 1, 1, 10))
	assert.ErrorIs(t, err, ErrFailed, "fail-stop")
	assert.ErrorIs(t, err, ErrFenced, "wrapping the first failure")
	assert.ErrorIs(t, old.Compact(ctx, 3), ErrFailed)

	require.NoError(t, nw.Append(ctx, 2, ents(6, 2, 2, 20)))
	got := readAll(t, nw, 1)
	require.Len(t, got, 7)
	assert.EqualValues(t, 2, got[5].Term, "seq 6 is the new writer's")
	got, err = old.Read(ctx, 1, 100) // reads keep working
	require.NoError(t, err)
	require.Len(t, got, 7)

	// A lower term is refused at open, and by Append.
	_, err = OpenEtcd(ctx, cli, EtcdOptions{ClusterID: "c1", Term: 1})
	assert.ErrorIs(t, err, ErrFenced)
	third := openEtcd(t, newCli(t, e), EtcdOptions{})
	assert.ErrorIs(t, third.Append(ctx, 1, ents(8, 1, 1, 1)), ErrFenced)
}

// Taking over by appending with a higher term (no claim at open).
func TestEtcdFencedByAppendTerm(t *testing.T) {
	e := startEtcd(t)
	cli := newCli(t, e)
	ctx := ctxT(t)
	old := openEtcd(t, cli, EtcdOptions{})
	require.NoError(t, old.Append(ctx, 1, ents(1, 2, 1, 10)))
	nw := openEtcd(t, cli, EtcdOptions{})
	require.NoError(t, nw.Append(ctx, 2, ents(3, 1, 2, 10)))
	assert.ErrorIs(t, old.Append(ctx, 1, ents(3, 1, 1, 10)), ErrFenced)
	assert.ErrorIs(t, nw.Append(ctx, 1, ents(4, 1, 1, 10)), ErrFenced, "a term below the store's own")
}

// Two writers at the same term: the second's prefix is stale.
func TestEtcdSameTermConflict(t *testing.T) {
	e := startEtcd(t)
	cli := newCli(t, e)
	ctx := ctxT(t)
	a := openEtcd(t, cli, EtcdOptions{})
	b := openEtcd(t, cli, EtcdOptions{})
	require.NoError(t, a.Append(ctx, 1, ents(1, 3, 1, 10)))
	err := b.Append(ctx, 1, ents(1, 1, 1, 99))
	assert.ErrorIs(t, err, ErrFenced)
	assert.ErrorIs(t, b.Append(ctx, 1, ents(2, 1, 1, 1)), ErrFailed)
	got := readAll(t, a, 1)
	assert.Equal(t, ents(1, 3, 1, 10), got, "b wrote nothing")
}

// The transaction lands but the client reports a timeout: the retry
// finds the identical batch under the prefix and succeeds.
func TestEtcdAmbiguousLanded(t *testing.T) {
	e := startEtcd(t)
	cli := newCli(t, e)
	ctx := ctxT(t)
	var calls atomic.Int32
	wrapKV(cli, func(_ context.Context, commit func() (*clientv3.TxnResponse, error)) (*clientv3.TxnResponse, error) {
		resp, err := commit()
		if calls.Add(1) == 1 {
			return nil, context.DeadlineExceeded
		}
		return resp, err
	})
	s := openEtcd(t, cli, EtcdOptions{})
	want := ents(1, 3, 1, 10)
	require.NoError(t, s.Append(ctx, 1, want))
	assert.EqualValues(t, 2, s.Stats().Txns, "one retry")
	require.NoError(t, s.Append(ctx, 1, ents(4, 1, 1, 10)), "the writer knows the new prefix")
	assert.Equal(t, append(want, ents(4, 1, 1, 10)...), readAll(t, s, 1))
}

// The transaction does not land, the client reports a timeout, and
// another writer moves the prefix meanwhile: the retry is fenced, the
// append is not acknowledged.
func TestEtcdAmbiguousNotLanded(t *testing.T) {
	e := startEtcd(t)
	cli := newCli(t, e)
	ctx := ctxT(t)
	other := openEtcd(t, newCli(t, e), EtcdOptions{})
	var calls atomic.Int32
	wrapKV(cli, func(_ context.Context, commit func() (*clientv3.TxnResponse, error)) (*clientv3.TxnResponse, error) {
		if calls.Add(1) == 1 {
			if err := other.Append(ctx, 1, ents(1, 1, 1, 77)); err != nil {
				return nil, err
			}
			return nil, context.DeadlineExceeded
		}
		return commit()
	})
	s := openEtcd(t, cli, EtcdOptions{})
	err := s.Append(ctx, 1, ents(1, 1, 1, 10))
	assert.ErrorIs(t, err, ErrFenced)
	got := readAll(t, other, 1)
	assert.Equal(t, ents(1, 1, 1, 77), got)
}

func TestEtcdCompactReopen(t *testing.T) {
	e := startEtcd(t)
	cli := newCli(t, e)
	ctx := ctxT(t)
	opts := EtcdOptions{MaxBatchEntries: 4}
	s := openEtcd(t, cli, opts)
	s.deleteChunk = 2
	want := ents(1, 20, 1, 10)
	for i := range want { // one append at a time: one batch each
		require.NoError(t, s.Append(ctx, 1, want[i:i+1]))
	}
	require.EqualValues(t, 20, batchKeys(t, cli, s))

	require.NoError(t, s.Compact(ctx, 10))
	first, err := s.FirstSeq(ctx)
	require.NoError(t, err)
	assert.EqualValues(t, 10, first)
	_, err = s.Read(ctx, 9, 1)
	assert.ErrorIs(t, err, ErrCompacted)
	assert.Equal(t, want[9:], readAll(t, s, 10))
	assert.EqualValues(t, 11, batchKeys(t, cli, s), "batches 1..9 deleted")
	require.NoError(t, s.Compact(ctx, 5), "below the cut: nothing to do")
	require.NoError(t, s.Close())

	s2 := openEtcd(t, cli, opts)
	first, err = s2.FirstSeq(ctx)
	require.NoError(t, err)
	assert.EqualValues(t, 10, first)
	_, err = s2.Read(ctx, 3, 1)
	assert.ErrorIs(t, err, ErrCompacted)
	assert.Equal(t, want[9:], readAll(t, s2, 10))

	require.NoError(t, s2.Compact(ctx, 1000), "everything")
	assert.Zero(t, batchKeys(t, cli, s2))
	first, err = s2.FirstSeq(ctx)
	require.NoError(t, err)
	last, err := s2.LastSeq(ctx)
	require.NoError(t, err)
	assert.Equal(t, []uint64{21, 20}, []uint64{first, last})
	require.NoError(t, s2.Append(ctx, 1, ents(21, 6, 1, 10)))
	require.NoError(t, s2.Close())

	s3 := openEtcd(t, cli, opts)
	assert.Equal(t, ents(21, 6, 1, 10), readAll(t, s3, 21))
	_, err = s3.Read(ctx, 20, 1)
	assert.ErrorIs(t, err, ErrCompacted)
	require.NoError(t, s3.Compact(ctx, 23), "inside batch 21..24: it stays")
	assert.EqualValues(t, 2, batchKeys(t, cli, s3))
	assert.Equal(t, ents(23, 4, 1, 10), readAll(t, s3, 23))
}

// A follower-style store (not the writer) sees what another appends.
func TestEtcdReaderFollows(t *testing.T) {
	e := startEtcd(t)
	cli := newCli(t, e)
	ctx := ctxT(t)
	w := openEtcd(t, cli, EtcdOptions{MaxBatchEntries: 3})
	r := openEtcd(t, cli, EtcdOptions{MaxBatchEntries: 3})
	require.NoError(t, w.Append(ctx, 1, ents(1, 7, 1, 10)))
	last, err := r.LastSeq(ctx)
	require.NoError(t, err)
	assert.EqualValues(t, 7, last)
	assert.Equal(t, ents(1, 7, 1, 10), readAll(t, r, 1))
	require.NoError(t, w.Append(ctx, 1, ents(8, 2, 1, 10)))
	assert.Equal(t, ents(8, 2, 1, 10), readAll(t, r, 8))
}

// Whatever sits in etcd is checked: bad records are ErrCorrupt, an
// oversized one is refused before it is decoded.
func TestEtcdCorrupt(t *testing.T) {
	e := startEtcd(t)
	cli := newCli(t, e)
	ctx := ctxT(t)
	s := openEtcd(t, cli, EtcdOptions{MaxBatchBytes: 8 << 10})
	require.NoError(t, s.Append(ctx, 1, ents(1, 2, 1, 10)))
	key := s.batchKey(1)
	resp, err := cli.Get(ctx, key)
	require.NoError(t, err)
	good := resp.Kvs[0].Value

	flip := append([]byte(nil), good...)
	flip[len(flip)-3] ^= 1
	// A valid record holding an entry whose own crc fails.
	bad := ents(1, 2, 1, 10)
	bad[1].Payload[0] ^= 1
	var encs [][]byte
	for i := range bad {
		b, err := bad[i].MarshalMsg(nil)
		require.NoError(t, err)
		encs = append(encs, b)
	}
	entryFlip := encodeBatch(1, 1, encs)
	// A well-formed record over MaxBatchBytes.
	var bigEncs [][]byte
	for _, e := range ents(1, 2, 1, 5000) {
		b, err := e.MarshalMsg(nil)
		require.NoError(t, err)
		bigEncs = append(bigEncs, b)
	}
	for name, val := range map[string][]byte{
		"record bit flip": flip,
		"entry bit flip":  entryFlip,
		"truncated":       good[:len(good)-5],
		"garbage":         []byte("hello"),
		"oversized":       encodeBatch(1, 1, bigEncs),
	} {
		_, err := cli.Put(ctx, key, string(val))
		require.NoError(t, err)
		_, err = s.Read(ctx, 1, 10)
		assert.ErrorIs(t, err, ErrCorrupt, name)
	}
	_, err = cli.Put(ctx, key, string(good))
	require.NoError(t, err)
	_, err = s.Read(ctx, 1, 10)
	require.NoError(t, err)

	_, err = cli.Put(ctx, s.prefixKey, "bogus")
	require.NoError(t, err)
	_, err = OpenEtcd(ctx, cli, EtcdOptions{ClusterID: "c1"})
	assert.ErrorIs(t, err, ErrCorrupt)
}

func TestEtcdOptions(t *testing.T) {
	e := startEtcd(t)
	cli := newCli(t, e)
	ctx := ctxT(t)
	for _, o := range []EtcdOptions{
		{},
		{ClusterID: "a/b"},
		{ClusterID: "c", MaxBatchBytes: 2 << 20},
		{ClusterID: "c", MaxBatchEntries: -1},
	} {
		_, err := OpenEtcd(ctx, cli, o)
		assert.Error(t, err, "%+v", o)
	}
	_, err := OpenEtcd(ctx, nil, EtcdOptions{ClusterID: "c"})
	assert.Error(t, err)
}

// A stopped etcd: Append fails within its ctx with ErrFailed, and nothing
// later succeeds.
func TestEtcdStoppedServer(t *testing.T) {
	e := startEtcd(t)
	cli := newCli(t, e)
	ctx := ctxT(t)
	s := openEtcd(t, cli, EtcdOptions{RequestTimeout: 500 * time.Millisecond})
	require.NoError(t, s.Append(ctx, 1, ents(1, 2, 1, 10)))
	e.Stop()

	actx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	err := s.Append(actx, 1, ents(3, 1, 1, 10))
	require.ErrorIs(t, err, ErrFailed)
	assert.ErrorIs(t, s.Append(ctx, 1, ents(4, 1, 1, 10)), ErrFailed)
	require.NoError(t, s.Close())
}

// An Append whose ctx ends while its batch is in flight fails the store:
// the batch may still land, so nothing after it is acknowledged.
func TestEtcdAbandonedAppend(t *testing.T) {
	e := startEtcd(t)
	cli := newCli(t, e)
	ctx := ctxT(t)
	release, entered := make(chan struct{}), make(chan struct{})
	var calls atomic.Int32
	wrapKV(cli, func(_ context.Context, commit func() (*clientv3.TxnResponse, error)) (*clientv3.TxnResponse, error) {
		if calls.Add(1) == 1 {
			close(entered)
			<-release
		}
		return commit()
	})
	s := openEtcd(t, cli, EtcdOptions{})
	actx, cancel := context.WithCancel(ctx)
	res := make(chan error, 1)
	go func() { res <- s.Append(actx, 1, ents(1, 1, 1, 10)) }()
	<-entered
	wait, err := s.AppendAsync(1, ents(2, 1, 1, 10))
	require.NoError(t, err)
	cancel()
	err = <-res
	assert.ErrorIs(t, err, ErrFailed)
	assert.ErrorIs(t, err, context.Canceled)
	close(release)
	assert.ErrorIs(t, wait(ctx), ErrFailed, "queued behind: not acknowledged")
	assert.ErrorIs(t, s.Append(ctx, 1, ents(3, 1, 1, 10)), ErrFailed)
}

// The client is closed while the transaction is on its way (it landed):
// the writer cannot settle the outcome and fails the store without
// acknowledging; a reopened store sees the batch.
func TestEtcdClientClosedAfterSend(t *testing.T) {
	e := startEtcd(t)
	cli := newCli(t, e)
	ctx := ctxT(t)
	var calls atomic.Int32
	wrapKV(cli, func(_ context.Context, commit func() (*clientv3.TxnResponse, error)) (*clientv3.TxnResponse, error) {
		resp, err := commit()
		if calls.Add(1) == 2 {
			cli.Close()
			return nil, context.Canceled
		}
		return resp, err
	})
	s := openEtcd(t, cli, EtcdOptions{RequestTimeout: 200 * time.Millisecond, WriteTimeout: time.Second})
	require.NoError(t, s.Append(ctx, 1, ents(1, 1, 1, 10)))
	assert.ErrorIs(t, s.Append(ctx, 1, ents(2, 1, 1, 10)), ErrFailed)

	r := openEtcd(t, newCli(t, e), EtcdOptions{})
	assert.Equal(t, ents(1, 2, 1, 10), readAll(t, r, 1), "it had landed; only never acknowledged")
}

var benchLogs atomic.Int64 // a fresh log per benchmark run

func BenchmarkEtcdAppend(b *testing.B) {
	e := testsvc.StartEtcd(b)
	for _, conc := range []int{1, 16} {
		b.Run(fmt.Sprintf("appenders=%d", conc), func(b *testing.B) {
			cli := newCli(b, e)
			ctx := context.Background()
			enc, err := ents(1, 1, 1, 200)[0].MarshalMsg(nil)
			require.NoError(b, err)
			val := string(enc)

			// Baseline: the same bytes, one raw Put each, same concurrency.
			start := time.Now()
			var n atomic.Int64
			var wg sync.WaitGroup
			for g := 0; g < conc; g++ {
				wg.Add(1)
				go func() {
					defer wg.Done()
					for i := n.Add(1); i <= int64(b.N); i = n.Add(1) {
						if _, err := cli.Put(ctx, fmt.Sprintf("raw/%d/%d", conc, i), val); err != nil {
							b.Error(err)
							return
						}
					}
				}()
			}
			wg.Wait()
			raw := float64(b.N) / time.Since(start).Seconds()

			s := openEtcd(b, cli, EtcdOptions{ClusterID: fmt.Sprintf("bench-%d", benchLogs.Add(1))})
			es := ents(1, b.N, 1, 200)
			var (
				mu   sync.Mutex
				next int
			)
			b.ReportAllocs()
			b.SetBytes(200)
			b.ResetTimer()
			start = time.Now()
			for g := 0; g < conc; g++ {
				wg.Add(1)
				go func() {
					defer wg.Done()
					for {
						mu.Lock()
						if next == b.N {
							mu.Unlock()
							return
						}
						wait, err := s.AppendAsync(1, es[next:next+1])
						next++
						mu.Unlock()
						if err == nil {
							err = wait(ctx)
						}
						if err != nil {
							b.Error(err)
							return
						}
					}
				}()
			}
			wg.Wait()
			el := time.Since(start)
			b.StopTimer()
			rate := float64(b.N) / el.Seconds()
			st := s.Stats()
			b.ReportMetric(rate, "entries/s")
			b.ReportMetric(raw, "raw_puts/s")
			b.ReportMetric(rate/raw, "ratio")
			b.ReportMetric(float64(st.Txns)/float64(b.N), "txns/entry")
		})
	}
}

// cluster3 starts a 3-member etcd in-process.
func cluster3(t *testing.T) ([]*embed.Etcd, []func()) {
	t.Helper()
	// Members in one process dial each other over HTTP; the peer
	// transports' keep-alive connections (both ends here) end a few
	// seconds after Close: wait for them, longer than goleak's default.
	t.Cleanup(func() {
		for end := time.Now().Add(time.Minute); time.Now().Before(end); time.Sleep(100 * time.Millisecond) {
			if goleak.Find(testsvc.GoleakIgnores()...) == nil {
				break
			}
		}
		goleak.VerifyNone(t, testsvc.GoleakIgnores()...)
	})
	var cfgs []*embed.Config
	var initial []string
	for i := 0; i < 3; i++ {
		cfg := embed.NewConfig()
		cfg.Name = fmt.Sprintf("m%d", i)
		cfg.Dir = t.TempDir()
		cfg.ZapLoggerBuilder = embed.NewZapLoggerBuilder(zap.NewNop())
		cfg.UnsafeNoFsync = true
		cu := url.URL{Scheme: "http", Host: fmt.Sprintf("127.0.0.1:%d", testsvc.FreePort(t))}
		pu := url.URL{Scheme: "http", Host: fmt.Sprintf("127.0.0.1:%d", testsvc.FreePort(t))}
		cfg.ListenClientUrls, cfg.AdvertiseClientUrls = []url.URL{cu}, []url.URL{cu}
		cfg.ListenPeerUrls, cfg.AdvertisePeerUrls = []url.URL{pu}, []url.URL{pu}
		initial = append(initial, cfg.Name+"="+pu.String())
		cfgs = append(cfgs, cfg)
	}
	members := make([]*embed.Etcd, 3)
	stops := make([]func(), 3)
	for i, cfg := range cfgs {
		cfg.InitialCluster = strings.Join(initial, ",")
		e, err := embed.StartEtcd(cfg)
		require.NoError(t, err)
		members[i], stops[i] = e, sync.OnceFunc(e.Close)
		t.Cleanup(stops[i])
	}
	for _, e := range members {
		select {
		case <-e.Server.ReadyNotify():
		case err := <-e.Err():
			t.Fatal(err)
		case <-time.After(etcdWait):
			t.Fatal("etcd cluster not ready")
		}
	}
	return members, stops
}

// The etcd leader member dies under load: appends retry through the
// election; each one either succeeds or fails the store, and every
// acknowledged entry is in the log, which stays contiguous.
func TestEtcdLeaderKilled(t *testing.T) {
	members, stops := cluster3(t)
	var eps []string
	for _, m := range members {
		eps = append(eps, m.Clients[0].Addr().String())
	}
	cfg := EtcdClientConfig(eps)
	cfg.Logger = zap.NewNop()
	cli, err := clientv3.New(cfg)
	require.NoError(t, err)
	t.Cleanup(func() { cli.Close() })
	ctx := ctxT(t)
	s := openEtcd(t, cli, EtcdOptions{RequestTimeout: 2 * time.Second})

	acked := uint64(0)
	seq := uint64(1)
	for ; seq <= 50; seq++ {
		require.NoError(t, s.Append(ctx, 1, ents(seq, 1, 1, 100)))
		acked = seq
	}
	for i, m := range members {
		if m.Server.Leader() == m.Server.MemberID() {
			stops[i]()
			eps = append(eps[:i:i], eps[i+1:]...)
			break
		}
	}
	require.Len(t, eps, 2, "a leader was found and stopped")
	for ; seq <= 100; seq++ {
		if err := s.Append(ctx, 1, ents(seq, 1, 1, 100)); err != nil {
			require.ErrorIs(t, err, ErrFailed)
			break
		}
		acked = seq
	}
	assert.EqualValues(t, 100, acked, "the survivors elect a leader well within WriteTimeout")

	cli2, err := clientv3.New(clientv3.Config{Endpoints: eps, Logger: zap.NewNop(), DialTimeout: 5 * time.Second})
	require.NoError(t, err)
	t.Cleanup(func() { cli2.Close() })
	r := openEtcd(t, cli2, EtcdOptions{})
	got := readAll(t, r, 1)
	require.GreaterOrEqual(t, uint64(len(got)), acked)
	for i, e := range got {
		require.EqualValues(t, i+1, e.Seq)
	}
}

func TestParseEtcdURL(t *testing.T) {
	eps, err := ParseEtcdURL("etcd://h1:2379,10.0.0.2:2380;h3:1")
	require.NoError(t, err)
	assert.Equal(t, []string{"h1:2379", "10.0.0.2:2380", "h3:1"}, eps)
	for _, bad := range []string{"", "etcd://", "http://h:1", "etcd://h", "etcd://h:x", "etcd://h:1/p", "etcd://:1", "etcd://h:70000"} {
		_, err := ParseEtcdURL(bad)
		assert.Error(t, err, bad)
	}
	cfg := EtcdClientConfig(eps)
	assert.Equal(t, eps, cfg.Endpoints)
	assert.Greater(t, cfg.MaxCallRecvMsgSize, EtcdMaxBatchBytes)
}

// The etcd record decoders never panic, and what they accept re-encodes
// to the same entries (a prefix to the same bytes).
func FuzzEtcdRecords(f *testing.F) {
	var encs [][]byte
	for _, e := range ents(5, 3, 2, 20) {
		b, err := e.MarshalMsg(nil)
		require.NoError(f, err)
		encs = append(encs, b)
	}
	f.Add(encodeBatch(2, 5, encs))
	f.Add(etcdPrefix{batch: 5, first: 1, last: 7, term: 2}.encode())
	f.Add([]byte("CRLB"))
	f.Fuzz(func(t *testing.T, b []byte) {
		if es, err := decodeBatch(5, b, 64<<10); err == nil {
			var again [][]byte
			for _, e := range es {
				enc, err := e.MarshalMsg(nil)
				require.NoError(t, err)
				again = append(again, enc)
			}
			// msgp may accept a wider encoding than it writes: compare
			// entries, not bytes.
			back, err := decodeBatch(5, encodeBatch(binary.BigEndian.Uint64(b[8:]), 5, again), 64<<10)
			require.NoError(t, err)
			assert.Equal(t, es, back)
		}
		if p, err := decodePrefix(b); err == nil {
			assert.Equal(t, b, p.encode())
		}
	})
}

// countKV counts range reads of the batch directory and the bytes each
// answer carried.
type countKV struct {
	clientv3.KV
	dir   string
	mu    sync.Mutex
	gets  int
	sizes []int
}

func (k *countKV) Get(ctx context.Context, key string, opts ...clientv3.OpOption) (*clientv3.GetResponse, error) {
	resp, err := k.KV.Get(ctx, key, opts...)
	if err == nil && strings.HasPrefix(key, k.dir) {
		n := 0
		for _, kv := range resp.Kvs {
			n += len(kv.Value)
		}
		k.mu.Lock()
		k.gets++
		k.sizes = append(k.sizes, n)
		k.mu.Unlock()
	}
	return resp, err
}

func (k *countKV) take() (int, []int) {
	k.mu.Lock()
	defer k.mu.Unlock()
	g, s := k.gets, k.sizes
	k.gets, k.sizes = 0, nil
	return g, s
}

// Read fetches many batches per etcd request (recovery read one request
// per batch: seconds for a few thousand small batches), keeps a page near
// etcdReadPageBytes when batches are large, and still names a batch
// deleted under it.
func TestEtcdReadPages(t *testing.T) {
	e := startEtcd(t)
	cfg := EtcdClientConfig([]string{e.Endpoint}) // its 4 MiB receive limit
	cfg.Logger = zap.NewNop()
	cli, err := clientv3.New(cfg)
	require.NoError(t, err)
	defer cli.Close()
	ctx := ctxT(t)
	s := openEtcd(t, cli, EtcdOptions{})
	want := ents(1, 600, 1, 40)
	for i := range want {
		require.NoError(t, s.Append(ctx, 1, want[i:i+1]), "one batch per entry")
	}
	big := ents(601, 30, 1, 900<<10)
	for i := range big {
		require.NoError(t, s.Append(ctx, 1, big[i:i+1]))
	}
	want = append(want, big...)
	ck := &countKV{KV: cli.KV, dir: s.batchDir}
	cli.KV = ck

	es, err := s.Read(ctx, 1, 600)
	require.NoError(t, err)
	require.Equal(t, want[:600], es)
	gets, _ := ck.take()
	assert.LessOrEqual(t, gets, 10, "600 one-entry batches in a few pages, not 600 reads")

	es, err = s.Read(ctx, 250, 10)
	require.NoError(t, err)
	require.Equal(t, want[249:259], es)
	gets, sizes := ck.take()
	assert.LessOrEqual(t, gets, 2)
	total := 0
	for _, n := range sizes {
		total += n
	}
	assert.Less(t, total, 10*200, "only the batches asked for")

	// Pages going by small batches meet 27 MB of large ones: a page over
	// the receive limit is asked again smaller.
	es, err = s.Read(ctx, 590, 1000)
	require.NoError(t, err)
	require.Equal(t, want[589:], es)
	ck.take()
	es, err = s.Read(ctx, 601, 1000)
	require.NoError(t, err)
	require.Equal(t, want[600:], es)
	gets, sizes = ck.take()
	assert.GreaterOrEqual(t, gets, 4, "27 MB of batches in pages")
	for _, n := range sizes {
		assert.LessOrEqual(t, n, etcdReadPageBytes+1<<20, "a page stays near its budget")
	}

	// A batch deleted under the index is named, not skipped.
	_, err = cli.Delete(ctx, s.batchKey(300))
	require.NoError(t, err)
	_, err = s.Read(ctx, 290, 20)
	require.ErrorIs(t, err, ErrCorrupt)
	assert.Contains(t, err.Error(), "batch 300 missing")
	es, err = s.Read(ctx, 301, 5)
	require.NoError(t, err, "the batches after it still read")
	require.Equal(t, want[300:305], es)
}
