package oplog

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/crescent-kv/crescent/ha/internal/vfs"
)

// gateFS hands every segment fdatasync, while armed, to the test, which
// answers it: nil runs the real fdatasync, an error fails it without
// syncing. It records the order in which syncs start and end, and
// whether one open file was synced twice at once or closed in a sync.
type gateFS struct {
	vfs.FS
	armed    atomic.Bool
	calls    chan *syncCall
	released chan struct{} // closed by release: every held sync goes on
	once     sync.Once

	mu      sync.Mutex
	events  []string // "start NAME" / "end NAME", every file's Sync
	busy    map[*gateFile]bool
	conc    int      // segment syncs under way
	maxConc int      // the most at once
	bad     []string // misuses seen
}

type gateFile struct {
	vfs.File
	fs *gateFS
}

type syncCall struct {
	file   *gateFile
	answer chan error
}

func newGateFS() *gateFS {
	return &gateFS{FS: vfs.Default, calls: make(chan *syncCall, 16), released: make(chan struct{}), busy: map[*gateFile]bool{}}
}

func (g *gateFS) OpenFile(name string, flag int, perm os.FileMode) (vfs.File, error) {
	f, err := g.FS.OpenFile(name, flag, perm)
	if err != nil {
		return nil, err
	}
	return &gateFile{File: f, fs: g}, nil
}

func (g *gateFS) note(f *gateFile, ev string) {
	g.mu.Lock()
	defer g.mu.Unlock()
	name := filepath.Base(f.Name())
	g.events = append(g.events, ev+" "+name)
	seg := strings.HasSuffix(name, segSuffix)
	switch ev {
	case "start":
		if g.busy[f] {
			g.bad = append(g.bad, "two syncs at once on one open file of "+name)
		}
		g.busy[f] = true
		if seg {
			g.conc++
			g.maxConc = max(g.maxConc, g.conc)
		}
	case "end":
		delete(g.busy, f)
		if seg {
			g.conc--
		}
	case "close":
		if g.busy[f] {
			g.bad = append(g.bad, "closed during its sync: "+name)
		}
	}
}

func (f *gateFile) Sync() error {
	f.fs.note(f, "start")
	defer f.fs.note(f, "end")
	if strings.HasSuffix(f.Name(), segSuffix) && f.fs.armed.Load() {
		c := &syncCall{file: f, answer: make(chan error, 1)}
		select {
		case f.fs.calls <- c:
		case <-f.fs.released:
		}
		select {
		case err := <-c.answer:
			if err != nil {
				return &os.PathError{Op: "fdatasync", Path: f.Name(), Err: err}
			}
		case <-f.fs.released:
		}
	}
	return f.File.Sync()
}

func (f *gateFile) Close() error {
	f.fs.note(f, "close")
	return f.File.Close()
}

// next is the next segment fdatasync to answer.
func (g *gateFS) next(t *testing.T) *syncCall {
	t.Helper()
	select {
	case c := <-g.calls:
		return c
	case <-time.After(time.Minute): // a bound for a broken build, not a timing
		t.Fatal("no fdatasync started")
		return nil
	}
}

// misuse returns the misuses seen.
func (g *gateFS) misuse() []string {
	g.mu.Lock()
	defer g.mu.Unlock()
	return append([]string(nil), g.bad...)
}

// index is the position of the first event ev since the gate was armed.
func (g *gateFS) index(ev string) int {
	g.mu.Lock()
	defer g.mu.Unlock()
	for i, e := range g.events {
		if e == ev {
			return i
		}
	}
	return -1
}

// release lets every held sync go on (a failing test must not leave a
// writer held) and disarms the gate.
func (g *gateFS) release() {
	g.armed.Store(false)
	g.once.Do(func() { close(g.released) })
}

var errDisk = errors.New("disk gone")

// openGated opens a log whose segment fdatasyncs the test answers, with
// seq 1 durable already.
func openGated(t *testing.T, dir string, opts LocalOptions) (*Local, *gateFS) {
	t.Helper()
	g := newGateFS()
	opts.FS = g
	l := openT(t, dir, opts)
	require.NoError(t, l.Append(ctx, 1, mkEntries(1, 1, 1, 10)))
	g.mu.Lock()
	g.events, g.maxConc = nil, 0
	g.mu.Unlock()
	g.armed.Store(true)
	t.Cleanup(g.release)
	return l, g
}

// Two batches sync at once, each on its own open file description of
// the segment; the later one's callers are answered, and its entries
// readable, only once the earlier one is durable too.
func TestLocalOverlappedSyncs(t *testing.T) {
	defer goleak.VerifyNone(t, goleak.IgnoreCurrent())
	dir := t.TempDir()
	l, g := openGated(t, dir, LocalOptions{Syncers: 2})
	c1, err := l.AppendAsync(ctx, 1, mkEntries(2, 2, 1, 10))
	require.NoError(t, err)
	s1 := g.next(t)
	c2, err := l.AppendAsync(ctx, 1, mkEntries(4, 3, 1, 10))
	require.NoError(t, err)
	s2 := g.next(t) // while s1 is held: the syncs overlap
	assert.NotSame(t, s1.file, s2.file, "each concurrent sync has its own open()")

	before := l.Stats().Fsyncs
	s2.answer <- nil // the later one is durable first
	require.Eventually(t, func() bool { return l.Stats().Fsyncs == before+1 }, time.Minute, time.Millisecond)
	assert.Empty(t, c2, "answered before the batch ahead of it is durable")
	assert.Equal(t, uint64(1), lastSeq(t, l), "published out of order")

	s1.answer <- nil
	require.NoError(t, <-c1)
	require.NoError(t, <-c2)
	assert.Equal(t, uint64(6), lastSeq(t, l))
	checkEntries(t, readAll(t, l, 1), 1, 10)
	assert.Empty(t, g.misuse())
	require.NoError(t, l.Close())

	l = openT(t, dir, LocalOptions{})
	defer l.Close()
	all := readAll(t, l, 1)
	require.Len(t, all, 6)
	checkEntries(t, all, 1, 10)
}

// A failed sync of either of two overlapping batches stops all
// acknowledging: the batch after a failed one is refused although its
// own sync passed, and a batch not yet answered when a later one fails
// is refused too; only a batch answered before the failure stands.
func TestLocalOverlappedSyncFails(t *testing.T) {
	for _, tc := range []struct {
		name   string
		first  int // which sync is answered first: 1 (earlier) or 2
		fail   int // which one fails
		acked1 bool
	}{
		{"earlier fails, then later ok", 1, 1, false},
		{"later ok, then earlier fails", 2, 1, false},
		{"earlier ok, then later fails", 1, 2, true},
		{"later fails, then earlier ok", 2, 2, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			defer goleak.VerifyNone(t, goleak.IgnoreCurrent())
			dir := t.TempDir()
			l, g := openGated(t, dir, LocalOptions{Syncers: 2})
			c1, err := l.AppendAsync(ctx, 1, mkEntries(2, 2, 1, 10))
			require.NoError(t, err)
			s1 := g.next(t)
			c2, err := l.AppendAsync(ctx, 1, mkEntries(4, 3, 1, 10))
			require.NoError(t, err)
			s2 := g.next(t)
			calls := map[int]*syncCall{1: s1, 2: s2}
			answer := func(i int) {
				if i == tc.fail {
					calls[i].answer <- errDisk
				} else {
					calls[i].answer <- nil
				}
			}
			before := l.Stats().Fsyncs
			answer(tc.first)
			if tc.first == 2 {
				// The two syncers run at once: let the log take the later
				// answer in before the earlier one comes, or the earlier
				// batch may be durable and answered first (rightly).
				require.Eventually(t, func() bool {
					if tc.fail == 2 {
						return l.Err() != nil
					}
					return l.Stats().Fsyncs == before+1
				}, time.Minute, time.Millisecond)
			}
			if tc.first == 1 {
				if tc.acked1 {
					require.NoError(t, <-c1)
				} else {
					assert.ErrorIs(t, <-c1, ErrFailed)
				}
			}
			answer(3 - tc.first)
			if tc.first == 2 {
				assert.ErrorIs(t, <-c1, ErrFailed)
			}
			err = <-c2
			assert.ErrorIs(t, err, ErrFailed, "nothing after a failed sync is acknowledged")
			assert.ErrorIs(t, l.Err(), errDisk)
			want := uint64(1)
			if tc.acked1 {
				want = 3
			}
			assert.Equal(t, want, lastSeq(t, l))
			checkEntries(t, readAll(t, l, 1), 1, 10)

			syncs := l.Stats().Fsyncs
			assert.ErrorIs(t, l.Append(ctx, 1, mkEntries(want+1, 1, 1, 10)), ErrFailed)
			assert.Equal(t, syncs, l.Stats().Fsyncs, "no fsync after a failure")
			assert.Empty(t, g.misuse())
			require.NoError(t, l.Close())

			// What was acknowledged is there; the rest may be.
			l = openT(t, dir, LocalOptions{})
			defer l.Close()
			assert.GreaterOrEqual(t, lastSeq(t, l), want)
			checkEntries(t, readAll(t, l, 1), 1, 10)
		})
	}
}

// A batch that rolls the log to a new segment waits for the syncs under
// way on the old one (whose files the roll closes): the new segment is
// created only after they ended, and everything reads back in order.
func TestLocalRollDuringOverlap(t *testing.T) {
	defer goleak.VerifyNone(t, goleak.IgnoreCurrent())
	dir := t.TempDir()
	const size = 1000
	opts := LocalOptions{Syncers: 2, SegmentBytes: 4 << 10}
	l, g := openGated(t, dir, opts)
	c1, err := l.AppendAsync(ctx, 1, mkEntries(2, 2, 1, size))
	require.NoError(t, err)
	s1 := g.next(t)
	// Does not fit: rolls to segment 4 once seqs 2-3 are durable.
	c2, err := l.AppendAsync(ctx, 1, mkEntries(4, 3, 1, size))
	require.NoError(t, err)
	s1.answer <- nil
	require.NoError(t, <-c1)
	hdr := g.next(t) // the new segment's header
	assert.Equal(t, segName(4), filepath.Base(hdr.file.Name()))
	hdr.answer <- nil
	s2 := g.next(t)
	assert.Equal(t, segName(4), filepath.Base(s2.file.Name()))
	s2.answer <- nil
	require.NoError(t, <-c2)

	first := fmt.Sprintf("end %s", segName(1))
	assert.Less(t, g.index(first), g.index("start "+segName(4)), "the roll waited for the old segment's sync")
	assert.Empty(t, g.misuse())
	require.Len(t, segFiles(t, dir), 2)
	checkEntries(t, readAll(t, l, 1)[1:], 2, size)
	require.NoError(t, l.Close())

	l = openT(t, dir, LocalOptions{SegmentBytes: 4 << 10})
	defer l.Close()
	all := readAll(t, l, 2)
	require.Len(t, all, 5)
	checkEntries(t, all, 2, size)
}

// A term change waits for the syncs under way before META records the
// new term, as a roll does.
func TestLocalTermChangeDuringOverlap(t *testing.T) {
	defer goleak.VerifyNone(t, goleak.IgnoreCurrent())
	dir := t.TempDir()
	l, g := openGated(t, dir, LocalOptions{Syncers: 2})
	c1, err := l.AppendAsync(ctx, 1, mkEntries(2, 2, 1, 10))
	require.NoError(t, err)
	s1 := g.next(t)
	c2, err := l.AppendAsync(ctx, 2, mkEntries(4, 1, 2, 10))
	require.NoError(t, err)
	s1.answer <- nil
	require.NoError(t, <-c1)
	s2 := g.next(t)
	s2.answer <- nil
	require.NoError(t, <-c2)
	assert.Less(t, g.index("end "+segName(1)), g.index("start "+metaName+".tmp"))
	assert.Equal(t, uint64(2), l.Term())
	assert.Empty(t, g.misuse())
	require.NoError(t, l.Close())
}

// With Syncers 1 the syncs never overlap (the old behaviour).
func TestLocalOneSyncer(t *testing.T) {
	defer goleak.VerifyNone(t, goleak.IgnoreCurrent())
	l, g := openGated(t, t.TempDir(), LocalOptions{Syncers: 1})
	c1, err := l.AppendAsync(ctx, 1, mkEntries(2, 1, 1, 10))
	require.NoError(t, err)
	s1 := g.next(t)
	c2, err := l.AppendAsync(ctx, 1, mkEntries(3, 1, 1, 10))
	require.NoError(t, err)
	s1.answer <- nil
	require.NoError(t, <-c1)
	g.next(t).answer <- nil
	require.NoError(t, <-c2)
	g.mu.Lock()
	assert.Equal(t, 1, g.maxConc, "one sync at a time")
	g.mu.Unlock()
	require.NoError(t, l.Close())

	_, err = OpenLocal(t.TempDir(), LocalOptions{Syncers: MaxSyncers + 1})
	assert.ErrorContains(t, err, "Syncers")
}

// The sink writes the next batch while the one before syncs: two
// handlers' commits overlap, and the later handler is answered only
// once the earlier batch is durable too.
func TestSinkOverlappedCommits(t *testing.T) {
	leakCheck(t)
	l, g := openGated(t, t.TempDir(), LocalOptions{Syncers: 2})
	t.Cleanup(func() { require.NoError(t, l.Close()) })
	s := newSinkForTest(t, l, SinkConfig{Term: 1})
	t.Cleanup(g.release) // before the sink's Close
	wctx := sinkTestCtx(t)
	wait := func() chan error {
		s.Append(sinkOp(int(s.Appended())))
		seq := s.Appended()
		ch := make(chan error, 1)
		go func() { ch <- s.WaitDurable(wctx, seq) }()
		return ch
	}
	w1 := wait()
	s1 := g.next(t)
	w2 := wait()
	s2 := g.next(t) // the second commit syncs while the first is held
	before := l.Stats().Fsyncs
	s2.answer <- nil
	require.Eventually(t, func() bool { return l.Stats().Fsyncs == before+1 }, time.Minute, time.Millisecond)
	assert.Empty(t, w2)
	assert.Equal(t, uint64(1), s.Durable())
	s1.answer <- nil
	require.NoError(t, <-w1)
	require.NoError(t, <-w2)
	assert.Equal(t, uint64(3), s.Durable())
	assert.Empty(t, g.misuse())
}
