package oplog

import (
	"bufio"
	"context"
	"encoding/binary"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/crescent-kv/crescent/ha/internal/vfs"
	"github.com/crescent-kv/crescent/ha/internal/vfs/errorfs"
)

// testPayload is a deterministic function of seq, so any reader can
// check content.
func testPayload(seq uint64, n int) []byte {
	p := make([]byte, n)
	x := seq*0x9E3779B97F4A7C15 + 1
	for i := range p {
		x ^= x << 13
		x ^= x >> 7
		x ^= x << 17
		p[i] = byte(x)
	}
	return p
}

func mkEntries(first uint64, n int, term uint64, size int) []Entry {
	es := make([]Entry, n)
	for i := range es {
		seq := first + uint64(i)
		es[i] = Entry{Seq: seq, Term: term, Time: int64(seq) * 1000, Kind: uint8(seq % 7), Key: "key/" + strconv.FormatUint(seq, 10), Payload: testPayload(seq, size)}
		es[i].Seal()
	}
	return es
}

func checkEntries(t *testing.T, es []Entry, first uint64, size int) {
	t.Helper()
	for i, e := range es {
		require.Equal(t, first+uint64(i), e.Seq)
		require.NoError(t, e.Verify())
		require.Equal(t, testPayload(e.Seq, size), e.Payload, "seq %d", e.Seq)
		require.Equal(t, "key/"+strconv.FormatUint(e.Seq, 10), e.Key)
	}
}

func openT(t *testing.T, dir string, opts LocalOptions) *Local {
	t.Helper()
	l, err := OpenLocal(dir, opts)
	require.NoError(t, err)
	return l
}

func lastSeq(t *testing.T, l *Local) uint64 {
	s, err := l.LastSeq(context.Background())
	require.NoError(t, err)
	return s
}

func firstSeq(t *testing.T, l *Local) uint64 {
	s, err := l.FirstSeq(context.Background())
	require.NoError(t, err)
	return s
}

func segFiles(t *testing.T, dir string) []string {
	t.Helper()
	m, err := filepath.Glob(filepath.Join(dir, "*.log"))
	require.NoError(t, err)
	slices.Sort(m)
	return m
}

var ctx = context.Background()

func TestLocalAppendReadReopen(t *testing.T) {
	defer goleak.VerifyNone(t, goleak.IgnoreCurrent())
	dir := t.TempDir()
	l := openT(t, dir, LocalOptions{})
	assert.Equal(t, uint64(0), lastSeq(t, l))
	assert.Equal(t, uint64(1), firstSeq(t, l))
	es, err := l.Read(ctx, 1, 10)
	require.NoError(t, err)
	assert.Empty(t, es)
	for seq := uint64(1); seq <= 100; seq += 10 {
		require.NoError(t, l.Append(ctx, 1, mkEntries(seq, 10, 1, 50)))
	}
	require.NoError(t, l.Append(ctx, 1, nil))
	assert.Equal(t, uint64(100), lastSeq(t, l))
	checkEntries(t, readAll(t, l, 1), 1, 50)
	checkEntries(t, readAll(t, l, 42), 42, 50)
	es, err = l.Read(ctx, 0, 3)
	require.NoError(t, err)
	checkEntries(t, es, 1, 50)
	assert.Len(t, es, 3)
	st := l.Stats()
	assert.Equal(t, uint64(100), st.Entries)
	assert.Equal(t, uint64(100), st.DurableSeq)
	require.NoError(t, l.Close())
	assert.ErrorIs(t, l.Close(), ErrClosed)
	assert.ErrorIs(t, l.Append(ctx, 1, mkEntries(101, 1, 1, 50)), ErrClosed)
	_, err = l.Read(ctx, 1, 1)
	assert.ErrorIs(t, err, ErrClosed)

	l = openT(t, dir, LocalOptions{})
	defer l.Close()
	assert.Equal(t, uint64(100), lastSeq(t, l))
	all := readAll(t, l, 1)
	require.Len(t, all, 100)
	checkEntries(t, all, 1, 50)
	require.NoError(t, l.Append(ctx, 1, mkEntries(101, 1, 1, 50)))
}

func TestLocalBadInput(t *testing.T) {
	defer goleak.VerifyNone(t, goleak.IgnoreCurrent())
	l := openT(t, t.TempDir(), LocalOptions{})
	defer l.Close()
	es := mkEntries(1, 3, 1, 10)
	es[1].Payload[0] ^= 1
	assert.ErrorIs(t, l.Append(ctx, 1, es), ErrCorrupt, "an unsealed or damaged entry")
	es = mkEntries(1, 3, 1, 10)
	es[2] = mkEntries(4, 1, 1, 10)[0]
	assert.ErrorIs(t, l.Append(ctx, 1, es), ErrGap, "a gap inside the batch")
	// Refused input wrote nothing and did not fail the store.
	require.NoError(t, l.Append(ctx, 1, mkEntries(1, 3, 1, 10)))
	assert.NoError(t, l.Err())
}

func TestLocalGap(t *testing.T) {
	defer goleak.VerifyNone(t, goleak.IgnoreCurrent())
	l := openT(t, t.TempDir(), LocalOptions{})
	defer l.Close()
	assert.ErrorIs(t, l.Append(ctx, 1, mkEntries(2, 1, 1, 10)), ErrGap, "the first seq is 1")
	require.NoError(t, l.Append(ctx, 1, mkEntries(1, 5, 1, 10)))
	assert.ErrorIs(t, l.Append(ctx, 1, mkEntries(7, 1, 1, 10)), ErrGap)
	// ErrGap does not fail the store.
	require.NoError(t, l.Append(ctx, 1, mkEntries(6, 1, 1, 10)))
	assert.Equal(t, uint64(6), lastSeq(t, l))
}

func TestLocalFencing(t *testing.T) {
	defer goleak.VerifyNone(t, goleak.IgnoreCurrent())
	t.Run("lower term", func(t *testing.T) {
		dir := t.TempDir()
		l := openT(t, dir, LocalOptions{})
		require.NoError(t, l.Append(ctx, 3, mkEntries(1, 2, 3, 10)))
		err := l.Append(ctx, 2, mkEntries(3, 1, 2, 10))
		assert.ErrorIs(t, err, ErrFenced)
		err = l.Append(ctx, 3, mkEntries(3, 1, 3, 10))
		assert.ErrorIs(t, err, ErrFailed, "fencing fails the store")
		assert.ErrorIs(t, err, ErrFenced)
		require.NoError(t, l.Close())

		l = openT(t, dir, LocalOptions{})
		defer l.Close()
		assert.Equal(t, uint64(2), lastSeq(t, l))
		assert.ErrorIs(t, l.Append(ctx, 2, mkEntries(3, 1, 2, 10)), ErrFenced, "the term comes back from the entries")
	})
	t.Run("term persisted without entries of it", func(t *testing.T) {
		dir := t.TempDir()
		l := openT(t, dir, LocalOptions{})
		// The producer's term is 9 although the entries say 1: it is
		// kept in META.
		require.NoError(t, l.Append(ctx, 9, mkEntries(1, 2, 1, 10)))
		require.NoError(t, l.Close())
		l = openT(t, dir, LocalOptions{})
		defer l.Close()
		assert.ErrorIs(t, l.Append(ctx, 8, mkEntries(3, 1, 1, 10)), ErrFenced)
	})
	t.Run("rewrite", func(t *testing.T) {
		l := openT(t, t.TempDir(), LocalOptions{})
		defer l.Close()
		require.NoError(t, l.Append(ctx, 1, mkEntries(1, 5, 1, 10)))
		require.NoError(t, l.Append(ctx, 1, mkEntries(2, 3, 1, 10)), "identical bytes: idempotent")
		require.NoError(t, l.Append(ctx, 1, mkEntries(4, 4, 1, 10)), "overlap plus new: the new part is appended")
		assert.Equal(t, uint64(7), lastSeq(t, l))
		checkEntries(t, readAll(t, l, 1), 1, 10)
		other := mkEntries(3, 1, 1, 11)
		assert.ErrorIs(t, l.Append(ctx, 1, other), ErrFenced, "same seq, other bytes")
		assert.ErrorIs(t, l.Append(ctx, 1, mkEntries(8, 1, 1, 10)), ErrFailed)
		checkEntries(t, readAll(t, l, 1), 1, 10) // reads keep working
	})
	t.Run("rewrite in one batch", func(t *testing.T) {
		// A resend queued behind the original, in the same group commit.
		fs := newBlockFS()
		l := openT(t, t.TempDir(), LocalOptions{FS: fs})
		defer l.Close()
		require.NoError(t, l.Append(ctx, 1, mkEntries(1, 1, 1, 10)))
		fs.block()
		c1, err := l.AppendAsync(ctx, 1, mkEntries(2, 1, 1, 10))
		require.NoError(t, err)
		fs.waitBlocked()
		c2, err := l.AppendAsync(ctx, 1, mkEntries(3, 2, 1, 10))
		require.NoError(t, err)
		c3, err := l.AppendAsync(ctx, 1, mkEntries(3, 2, 1, 10))
		require.NoError(t, err)
		c4, err := l.AppendAsync(ctx, 1, mkEntries(4, 1, 1, 12))
		require.NoError(t, err)
		fs.unblock()
		require.NoError(t, <-c1)
		require.NoError(t, <-c2)
		require.NoError(t, <-c3)
		assert.ErrorIs(t, <-c4, ErrFenced)
		checkEntries(t, readAll(t, l, 1), 1, 10)
		assert.Equal(t, uint64(4), lastSeq(t, l))
	})
}

// blockFS holds a segment Sync when armed, to build a queue behind it.
type blockFS struct {
	vfs.FS
	mu      sync.Mutex
	armed   bool
	blocked chan struct{}
	release chan struct{}
}

func newBlockFS() *blockFS { return &blockFS{FS: vfs.Default} }

func (b *blockFS) block() {
	b.mu.Lock()
	b.armed, b.blocked, b.release = true, make(chan struct{}), make(chan struct{})
	b.mu.Unlock()
}
func (b *blockFS) waitBlocked() { <-b.blocked }
func (b *blockFS) unblock()     { close(b.release) }

func (b *blockFS) OpenFile(name string, flag int, perm os.FileMode) (vfs.File, error) {
	f, err := b.FS.OpenFile(name, flag, perm)
	if err != nil {
		return nil, err
	}
	return &blockFile{File: f, fs: b}, nil
}

type blockFile struct {
	vfs.File
	fs *blockFS
}

func (f *blockFile) Sync() error {
	f.fs.mu.Lock()
	armed := f.fs.armed
	f.fs.armed = false
	blocked, release := f.fs.blocked, f.fs.release
	f.fs.mu.Unlock()
	if armed {
		close(blocked)
		<-release
	}
	return f.File.Sync()
}

func TestLocalGroupCommit(t *testing.T) {
	defer goleak.VerifyNone(t, goleak.IgnoreCurrent())
	dir := t.TempDir()
	fs := newBlockFS()
	l := openT(t, dir, LocalOptions{FS: fs})
	const appenders, per = 16, 20
	require.NoError(t, l.Append(ctx, 1, mkEntries(1, 1, 1, 200)))
	before := l.Stats()
	// Hold the first fsync so the others queue behind it: then the
	// batching is certain, not a matter of timing.
	fs.block()
	var (
		mu      sync.Mutex
		next    = uint64(2)
		queued  sync.WaitGroup
		done    sync.WaitGroup
		errs    = make(chan error, appenders*per)
		started = make(chan struct{})
	)
	for g := 0; g < appenders; g++ {
		queued.Add(per)
		done.Add(1)
		go func() {
			defer done.Done()
			<-started
			var chans []<-chan error
			for i := 0; i < per; i++ {
				mu.Lock()
				seq := next
				next++
				c, err := l.AppendAsync(ctx, 1, mkEntries(seq, 1, 1, 200))
				mu.Unlock()
				queued.Done()
				if err != nil {
					errs <- err
					continue
				}
				chans = append(chans, c)
			}
			for _, c := range chans {
				errs <- <-c
			}
		}()
	}
	close(started)
	fs.waitBlocked()
	queued.Wait()
	fs.unblock()
	done.Wait()
	close(errs)
	for err := range errs {
		require.NoError(t, err)
	}
	st := l.Stats()
	n := uint64(appenders * per)
	assert.Equal(t, n, st.Entries-before.Entries)
	assert.Less(t, st.Fsyncs-before.Fsyncs, uint64(appenders), "many entries share an fsync")
	assert.Less(t, st.Batches-before.Batches, n)
	require.NoError(t, l.Close())

	l = openT(t, dir, LocalOptions{})
	defer l.Close()
	all := readAll(t, l, 1)
	require.Len(t, all, int(n)+1)
	checkEntries(t, all, 1, 200)
}

func TestLocalBackpressure(t *testing.T) {
	defer goleak.VerifyNone(t, goleak.IgnoreCurrent())
	fs := newBlockFS()
	l := openT(t, t.TempDir(), LocalOptions{FS: fs, MaxQueuedEntries: 4})
	defer l.Close()
	fs.block()
	c1, err := l.AppendAsync(ctx, 1, mkEntries(1, 2, 1, 10))
	require.NoError(t, err)
	fs.waitBlocked() // the writer holds 2 entries
	c2, err := l.AppendAsync(ctx, 1, mkEntries(3, 2, 1, 10))
	require.NoError(t, err)
	cctx, cancel := context.WithCancel(ctx)
	cancel()
	_, err = l.AppendAsync(cctx, 1, mkEntries(5, 1, 1, 10))
	assert.ErrorIs(t, err, context.Canceled, "the queue is full: the caller waits")
	fs.unblock()
	require.NoError(t, <-c1)
	require.NoError(t, <-c2)
	require.NoError(t, l.Append(ctx, 1, mkEntries(5, 1, 1, 10)))
	// One request above the bound passes alone.
	require.NoError(t, l.Append(ctx, 1, mkEntries(6, 10, 1, 10)))
	assert.NoError(t, l.Err())
}

func TestLocalFailStop(t *testing.T) {
	defer goleak.VerifyNone(t, goleak.IgnoreCurrent())
	for _, op := range []errorfs.Op{errorfs.OpSync, errorfs.OpWrite} {
		t.Run(fmt.Sprint(op), func(t *testing.T) {
			dir := t.TempDir()
			fs := errorfs.New(nil)
			l := openT(t, dir, LocalOptions{FS: fs})
			require.NoError(t, l.Append(ctx, 1, mkEntries(1, 5, 1, 10)))
			fs.FailNth(op, 1, false, nil) // only once: a retry would pass
			err := l.Append(ctx, 1, mkEntries(6, 5, 1, 10))
			assert.ErrorIs(t, err, ErrFailed)
			assert.ErrorIs(t, err, errorfs.ErrInjected, "the first cause is wrapped")
			syncs := fs.Count(errorfs.OpSync)
			for i := 0; i < 3; i++ {
				err = l.Append(ctx, 1, mkEntries(6, 1, 1, 10))
				assert.ErrorIs(t, err, ErrFailed, "nothing later is acknowledged")
				assert.ErrorIs(t, err, errorfs.ErrInjected)
			}
			assert.Equal(t, syncs, fs.Count(errorfs.OpSync), "no fsync is retried")
			assert.ErrorIs(t, l.Err(), ErrFailed)
			assert.True(t, l.Stats().Failed)
			assert.Equal(t, uint64(5), lastSeq(t, l))
			checkEntries(t, readAll(t, l, 1), 1, 10) // reads still work
			require.NoError(t, l.Close())

			// What was acknowledged is there; the rest may be.
			l = openT(t, dir, LocalOptions{})
			defer l.Close()
			last := lastSeq(t, l)
			assert.GreaterOrEqual(t, last, uint64(5))
			checkEntries(t, readAll(t, l, 1), 1, 10)
		})
	}
	t.Run("segment roll", func(t *testing.T) {
		fs := errorfs.New(nil)
		l := openT(t, t.TempDir(), LocalOptions{FS: fs, SegmentBytes: 200})
		defer l.Close()
		require.NoError(t, l.Append(ctx, 1, mkEntries(1, 1, 1, 100)))
		fs.FailNth(errorfs.OpSyncDir, 1, false, nil)
		assert.ErrorIs(t, l.Append(ctx, 1, mkEntries(2, 1, 1, 100)), ErrFailed)
		assert.ErrorIs(t, l.Append(ctx, 1, mkEntries(2, 1, 1, 100)), ErrFailed)
	})
}

// buildLog writes n entries (payload size) into a fresh dir and returns
// the only segment's bytes and each record's start offset.
func buildLog(t *testing.T, n, size int) (seg []byte, offs []int64) {
	t.Helper()
	dir := t.TempDir()
	l := openT(t, dir, LocalOptions{SegmentBytes: testSegBytes})
	off := int64(segHeaderLen)
	for _, e := range mkEntries(1, n, 1, size) {
		require.NoError(t, l.Append(ctx, 1, []Entry{e}))
		offs = append(offs, off)
		off += int64(len(appendRecord(nil, &e)))
	}
	require.NoError(t, l.Close())
	files := segFiles(t, dir)
	require.Len(t, files, 1)
	seg, err := os.ReadFile(files[0])
	require.NoError(t, err)
	// The preallocated rest of the segment is zeros.
	require.Equal(t, int64(testSegBytes), int64(len(seg)))
	require.Equal(t, make([]byte, len(seg)-int(off)), seg[off:])
	return seg[:off], offs
}

// testSegBytes keeps the preallocated segments of the torn-tail tests
// small (each open allocates and reads them whole).
const testSegBytes = 64 << 10

func writeSeg(t *testing.T, b []byte) string {
	dir := t.TempDir()
	require.NoError(t, os.WriteFile(filepath.Join(dir, segName(1)), b, 0o644))
	return dir
}

func TestLocalTornTail(t *testing.T) {
	defer goleak.VerifyNone(t, goleak.IgnoreCurrent())
	const n = 5
	seg, offs := buildLog(t, n, 100)
	lastOff := offs[n-1]
	check := func(t *testing.T, dir string, wantLast uint64) {
		t.Helper()
		l := openT(t, dir, LocalOptions{Logger: discard(), SegmentBytes: testSegBytes})
		require.Equal(t, wantLast, lastSeq(t, l))
		checkEntries(t, readAll(t, l, 1), 1, 100)
		// The log goes on from there, with other bytes for the torn seq.
		next := mkEntries(wantLast+1, 1, 1, 100)
		next[0].Key += "/new"
		next[0].Seal()
		require.NoError(t, l.Append(ctx, 1, next))
		require.NoError(t, l.Close())
		l = openT(t, dir, LocalOptions{SegmentBytes: testSegBytes})
		defer l.Close()
		all := readAll(t, l, 1)
		require.Len(t, all, int(wantLast)+1)
		checkEntries(t, all[:wantLast], 1, 100)
		assert.Equal(t, next[0], all[wantLast])
	}
	t.Run("every cut", func(t *testing.T) {
		for cut := lastOff; cut < int64(len(seg)); cut++ {
			dir := writeSeg(t, seg[:cut])
			check(t, dir, n-1)
			fi, err := os.Stat(filepath.Join(dir, segName(1)))
			require.NoError(t, err)
			require.Greater(t, fi.Size(), lastOff, "truncated, then appended")
		}
	})
	t.Run("checksum of the last record", func(t *testing.T) {
		for _, at := range []int64{lastOff + 4, lastOff + 20, int64(len(seg)) - 1} {
			b := slices.Clone(seg)
			b[at] ^= 0x40
			check(t, writeSeg(t, b), n-1)
		}
	})
	t.Run("zeros after the last record", func(t *testing.T) {
		b := append(slices.Clone(seg), make([]byte, 300)...)
		check(t, writeSeg(t, b), n)
		// The last record zeroed (space allocated, never written).
		b = slices.Clone(seg)
		clear(b[lastOff:])
		check(t, writeSeg(t, b), n-1)
	})
	t.Run("header-only and torn header", func(t *testing.T) {
		check(t, writeSeg(t, seg[:segHeaderLen]), 0)
		for cut := 0; cut < segHeaderLen; cut++ {
			dir := writeSeg(t, seg[:cut])
			check(t, dir, 0)
		}
	})
}

func discard() *slog.Logger { return slog.New(slog.DiscardHandler) }

func TestLocalCorruptMiddle(t *testing.T) {
	defer goleak.VerifyNone(t, goleak.IgnoreCurrent())
	const n = 5
	seg, offs := buildLog(t, n, 100)
	for _, rec := range []int{0, 2, n - 2} {
		// Every byte of the length (a high one makes the record run past
		// the end of the file: not a torn tail while records follow).
		for _, at := range []int64{0, 1, 2, 3, 4, 30, offs[rec+1] - offs[rec] - 1} {
			b := slices.Clone(seg)
			b[offs[rec]+at] ^= 0x01
			_, err := OpenLocal(writeSeg(t, b), LocalOptions{Logger: discard()})
			assert.ErrorIs(t, err, ErrCorrupt, "record %d byte %d", rec, at)
		}
	}
	t.Run("header", func(t *testing.T) {
		for at := 0; at < segHeaderLen; at++ {
			b := slices.Clone(seg)
			b[at] ^= 0x01
			_, err := OpenLocal(writeSeg(t, b), LocalOptions{Logger: discard()})
			assert.ErrorIs(t, err, ErrCorrupt, "header byte %d", at)
		}
	})
	t.Run("not the last segment", func(t *testing.T) {
		dir := t.TempDir()
		l := openT(t, dir, LocalOptions{SegmentBytes: 300})
		require.NoError(t, l.Append(ctx, 1, mkEntries(1, 1, 1, 100)))
		require.NoError(t, l.Append(ctx, 1, mkEntries(2, 1, 1, 100)))
		require.NoError(t, l.Append(ctx, 1, mkEntries(3, 1, 1, 100)))
		require.NoError(t, l.Close())
		files := segFiles(t, dir)
		require.Greater(t, len(files), 1)
		// A torn-looking tail in a segment that is not the last is
		// corruption: records after it were acknowledged. The segment
		// holds one record; cut its last byte (the zeros after it, the
		// preallocated rest, are not a record).
		e := mkEntries(1, 1, 1, 100)
		end := int64(segHeaderLen + len(appendRecord(nil, &e[0])))
		require.NoError(t, os.Truncate(files[0], end-1))
		l, err := OpenLocal(dir, LocalOptions{Logger: discard()})
		if err == nil {
			l.Close()
		}
		assert.ErrorIs(t, err, ErrCorrupt)
	})
	t.Run("missing segment", func(t *testing.T) {
		dir := t.TempDir()
		l := openT(t, dir, LocalOptions{SegmentBytes: 300})
		for s := uint64(1); s <= 4; s++ {
			require.NoError(t, l.Append(ctx, 1, mkEntries(s, 1, 1, 100)))
		}
		require.NoError(t, l.Close())
		files := segFiles(t, dir)
		require.Greater(t, len(files), 2)
		require.NoError(t, os.Remove(files[1]))
		_, err := OpenLocal(dir, LocalOptions{})
		assert.ErrorIs(t, err, ErrCorrupt)
		require.NoError(t, os.Remove(files[0]))
		_, err = OpenLocal(dir, LocalOptions{})
		assert.ErrorIs(t, err, ErrCorrupt, "the start is missing and no compaction says so")
	})
}

func TestLocalSegmentRoll(t *testing.T) {
	defer goleak.VerifyNone(t, goleak.IgnoreCurrent())
	dir := t.TempDir()
	const size = 500
	l := openT(t, dir, LocalOptions{SegmentBytes: 256 << 10})
	for seq := uint64(1); seq <= 3000; seq += 50 {
		require.NoError(t, l.Append(ctx, 1, mkEntries(seq, 50, 1, size)))
	}
	files := segFiles(t, dir)
	require.Greater(t, len(files), 3)
	var prevFirst uint64
	for _, f := range files {
		b, err := os.ReadFile(f)
		require.NoError(t, err)
		first := binary.LittleEndian.Uint64(b[16:])
		assert.Equal(t, segName(first), filepath.Base(f))
		assert.Greater(t, first, prevFirst)
		assert.LessOrEqual(t, len(b), 256<<10+50*(size+100), "rolls at the limit")
		prevFirst = first
	}
	// Reads from anywhere go through the sparse index.
	for _, from := range []uint64{1, 2, 777, 1500, 2999, 3000} {
		es, err := l.Read(ctx, from, 3)
		require.NoError(t, err)
		checkEntries(t, es, from, size)
	}
	require.NoError(t, l.Close())
	l = openT(t, dir, LocalOptions{SegmentBytes: 256 << 10})
	defer l.Close()
	all := readAll(t, l, 1)
	require.Len(t, all, 3000)
	checkEntries(t, all, 1, size)
	es, err := l.Read(ctx, 1234, 1000)
	require.NoError(t, err)
	require.Len(t, es, 1000)
	checkEntries(t, es, 1234, size)
}

func TestLocalCompact(t *testing.T) {
	defer goleak.VerifyNone(t, goleak.IgnoreCurrent())
	dir := t.TempDir()
	opts := LocalOptions{SegmentBytes: 4 << 10}
	l := openT(t, dir, opts)
	for seq := uint64(1); seq <= 200; seq += 5 {
		require.NoError(t, l.Append(ctx, 1, mkEntries(seq, 5, 1, 100)))
	}
	nfiles := len(segFiles(t, dir))
	require.Greater(t, nfiles, 5)
	require.NoError(t, l.Compact(ctx, 100))
	check := func(l *Local) {
		assert.Equal(t, uint64(100), firstSeq(t, l))
		_, err := l.Read(ctx, 99, 1)
		assert.ErrorIs(t, err, ErrCompacted)
		_, err = l.Read(ctx, 1, 1)
		assert.ErrorIs(t, err, ErrCompacted)
		all := readAll(t, l, 100)
		require.Len(t, all, 101)
		checkEntries(t, all, 100, 100)
		files := segFiles(t, dir)
		assert.Less(t, len(files), nfiles)
		first, err := strconv.ParseUint(strings.TrimSuffix(filepath.Base(files[0]), ".log"), 10, 64)
		require.NoError(t, err)
		assert.LessOrEqual(t, first, uint64(100), "the segment holding 100 stays")
		if len(files) > 1 {
			second, _ := strconv.ParseUint(strings.TrimSuffix(filepath.Base(files[1]), ".log"), 10, 64)
			assert.Greater(t, second, uint64(100), "every segment wholly below 100 is gone")
		}
	}
	check(l)
	require.NoError(t, l.Compact(ctx, 50), "an older point is a no-op")
	check(l)
	require.NoError(t, l.Close())
	l = openT(t, dir, opts)
	check(l)

	// Everything: the active segment stays, the log goes on.
	require.NoError(t, l.Compact(ctx, 1000))
	assert.Equal(t, uint64(201), firstSeq(t, l))
	assert.Equal(t, uint64(200), lastSeq(t, l))
	_, err := l.Read(ctx, 200, 1)
	assert.ErrorIs(t, err, ErrCompacted)
	assert.NotEmpty(t, segFiles(t, dir))
	require.NoError(t, l.Append(ctx, 1, mkEntries(201, 1, 1, 100)))
	require.NoError(t, l.Close())
	l = openT(t, dir, opts)
	defer l.Close()
	assert.Equal(t, uint64(201), firstSeq(t, l))
	checkEntries(t, readAll(t, l, 201), 201, 100)
}

func TestLocalCompactInterrupted(t *testing.T) {
	defer goleak.VerifyNone(t, goleak.IgnoreCurrent())
	dir := t.TempDir()
	fs := errorfs.New(nil)
	opts := LocalOptions{SegmentBytes: 1 << 10, FS: fs}
	l := openT(t, dir, opts)
	for seq := uint64(1); seq <= 40; seq += 2 {
		require.NoError(t, l.Append(ctx, 1, mkEntries(seq, 2, 1, 100)))
	}
	n := len(segFiles(t, dir))
	fs.FailNth(errorfs.OpRemove, 1, true, nil) // a crash after META, before the removals
	assert.Error(t, l.Compact(ctx, 30))
	assert.Equal(t, uint64(30), firstSeq(t, l))
	assert.Len(t, segFiles(t, dir), n)
	require.NoError(t, l.Close())
	l = openT(t, dir, LocalOptions{SegmentBytes: 1 << 10})
	defer l.Close()
	assert.Equal(t, uint64(30), firstSeq(t, l))
	assert.Less(t, len(segFiles(t, dir)), n, "the open finishes the removals")
	checkEntries(t, readAll(t, l, 30), 30, 100)
}

func TestLocalReadDuringCompact(t *testing.T) {
	defer goleak.VerifyNone(t, goleak.IgnoreCurrent())
	dir := t.TempDir()
	l := openT(t, dir, LocalOptions{SegmentBytes: 2 << 10})
	defer l.Close()
	for seq := uint64(1); seq <= 300; seq += 3 {
		require.NoError(t, l.Append(ctx, 1, mkEntries(seq, 3, 1, 100)))
	}
	var wg sync.WaitGroup
	for g := 0; g < 4; g++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for from := uint64(1); from < 300; from += 7 {
				es, err := l.Read(ctx, from, 20)
				if err != nil {
					assert.ErrorIs(t, err, ErrCompacted)
					continue
				}
				checkEntries(t, es, from, 100)
			}
		}()
	}
	for before := uint64(10); before <= 290; before += 10 {
		require.NoError(t, l.Compact(ctx, before))
	}
	wg.Wait()
}

func TestLocalReadDuringClose(t *testing.T) {
	defer goleak.VerifyNone(t, goleak.IgnoreCurrent())
	l := openT(t, t.TempDir(), LocalOptions{})
	require.NoError(t, l.Append(ctx, 1, mkEntries(1, 2000, 1, 100)))
	var wg, reading sync.WaitGroup
	for g := 0; g < 4; g++ {
		wg.Add(1)
		reading.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; ; i++ {
				if i == 1 {
					reading.Done()
				}
				es, err := l.Read(ctx, 1, 2000)
				if err != nil {
					assert.ErrorIs(t, err, ErrClosed, "a Read racing Close is not corruption")
					if i == 0 {
						reading.Done()
					}
					return
				}
				if !assert.Len(t, es, 2000) {
					return
				}
			}
		}()
	}
	reading.Wait()
	require.NoError(t, l.Close())
	wg.Wait()
}

func TestLocalLock(t *testing.T) {
	defer goleak.VerifyNone(t, goleak.IgnoreCurrent())
	dir := t.TempDir()
	l := openT(t, dir, LocalOptions{})
	_, err := OpenLocal(dir, LocalOptions{})
	require.ErrorIs(t, err, ErrLocked)
	assert.Contains(t, err.Error(), dir)
	require.NoError(t, l.Close())
	l = openT(t, dir, LocalOptions{})
	require.NoError(t, l.Close())
}

// The crash test: a child process (this test binary) appends in a loop
// and prints each acknowledged seq; it is killed with SIGKILL at a random
// moment; after each reopen every acknowledged seq is there, intact.

const crashChildEnv = "CRESCENT_OPLOG_CRASH_DIR"

func TestLocalCrashChild(t *testing.T) {
	dir := os.Getenv(crashChildEnv)
	if dir == "" {
		t.Skip("the crash test's child")
	}
	l, err := OpenLocal(dir, LocalOptions{SegmentBytes: 64 << 10})
	if err != nil {
		fmt.Println("ERR", err)
		os.Exit(1)
	}
	out := bufio.NewWriter(os.Stdout)
	var outMu, seqMu sync.Mutex
	next := lastSeq(t, l) + 1
	fmt.Fprintln(out, "START", next)
	out.Flush()
	for g := 0; g < 4; g++ {
		go func() {
			for {
				seqMu.Lock()
				seq := next
				n := 1 + int(seq%3)
				next += uint64(n)
				c, err := l.AppendAsync(ctx, 1, mkEntries(seq, n, 1, int(seq%300)))
				seqMu.Unlock()
				if err == nil {
					err = <-c
				}
				outMu.Lock()
				if err != nil {
					fmt.Fprintln(out, "ERR", err)
				} else {
					fmt.Fprintln(out, "ACK", seq+uint64(n)-1)
				}
				out.Flush()
				outMu.Unlock()
				if err != nil {
					os.Exit(1)
				}
			}
		}()
	}
	select {}
}

func TestLocalCrash(t *testing.T) {
	if testing.Short() {
		t.Skip("re-executes the test binary")
	}
	defer goleak.VerifyNone(t, goleak.IgnoreCurrent())
	dir := t.TempDir()
	rng := rand.New(rand.NewPCG(rand.Uint64(), 1))
	var acked uint64
	for round := 0; round < 10; round++ {
		cmd := exec.Command(os.Args[0], "-test.run=^TestLocalCrashChild$", "-test.count=1")
		cmd.Env = append(os.Environ(), crashChildEnv+"="+dir)
		cmd.Stderr = os.Stderr
		stdout, err := cmd.StdoutPipe()
		require.NoError(t, err)
		require.NoError(t, cmd.Start())
		sc := bufio.NewScanner(stdout)
		killAt := 1 + rng.IntN(400)
		acks := 0
		for acks < killAt && sc.Scan() {
			f := strings.Fields(sc.Text())
			if len(f) < 2 {
				continue
			}
			switch f[0] {
			case "ERR":
				t.Fatalf("round %d: child: %s", round, sc.Text())
			case "START":
				s, err := strconv.ParseUint(f[1], 10, 64)
				require.NoError(t, err)
				require.GreaterOrEqual(t, s, acked+1, "round %d: the log lost acknowledged seqs", round)
			case "ACK":
				s, err := strconv.ParseUint(f[1], 10, 64)
				require.NoError(t, err)
				acked = max(acked, s)
				acks++
			}
		}
		require.NoError(t, cmd.Process.Signal(syscall.SIGKILL))
		// Acks printed before the kill landed count too.
		for sc.Scan() {
			if f := strings.Fields(sc.Text()); len(f) == 2 && f[0] == "ACK" {
				s, _ := strconv.ParseUint(f[1], 10, 64)
				acked = max(acked, s)
			}
		}
		_ = cmd.Wait()

		l := openT(t, dir, LocalOptions{SegmentBytes: 64 << 10, Logger: discard()})
		last := lastSeq(t, l)
		require.GreaterOrEqual(t, last, acked, "round %d: acknowledged seq %d missing (log ends at %d)", round, acked, last)
		all := readAll(t, l, 1)
		require.Len(t, all, int(last))
		for i, e := range all {
			require.Equal(t, uint64(i+1), e.Seq)
			require.NoError(t, e.Verify())
		}
		require.NoError(t, l.Close())
		t.Logf("round %d: %d acked, log ends at %d", round, acked, last)
	}
}

// FuzzLocalRecover feeds arbitrary segment bytes to recovery: it must
// not panic or over-allocate; what it accepts must read back verified.
func FuzzLocalRecover(f *testing.F) {
	f.Add(makeHeader(1))
	var seed []byte
	seed = append(seed, makeHeader(1)...)
	for _, e := range mkEntries(1, 3, 1, 20) {
		seed = appendRecord(seed, &e)
	}
	f.Add(seed)
	f.Add(seed[:len(seed)-5])
	f.Fuzz(func(t *testing.T, b []byte) {
		dir := t.TempDir()
		require.NoError(t, os.WriteFile(filepath.Join(dir, segName(1)), b, 0o644))
		l, err := OpenLocal(dir, LocalOptions{Logger: discard()})
		if err != nil {
			return
		}
		defer l.Close()
		last := lastSeq(t, l)
		es, err := l.Read(ctx, 1, int(last)+1)
		require.NoError(t, err)
		require.Len(t, es, int(last))
		for i, e := range es {
			require.Equal(t, uint64(i+1), e.Seq)
			require.NoError(t, e.Verify())
		}
		require.NoError(t, l.Append(ctx, 1<<62, mkEntries(last+1, 1, 1<<62, 10)))
	})
}
