package oplog

import (
	"bytes"
	"context"
	"log/slog"
	"os"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"
	"golang.org/x/sys/unix"
)

// recordsEnd is where the records of a one-segment log of es end.
func recordsEnd(es []Entry) int64 {
	n := int64(segHeaderLen)
	for i := range es {
		n += int64(len(appendRecord(nil, &es[i])))
	}
	return n
}

// Segments are allocated whole when created (an fdatasync then has no
// size change to journal); the zeros after the last record are the
// segment's end, not a torn tail: reopening keeps the records, logs no
// truncation and goes on writing right after them.
func TestLocalPreallocates(t *testing.T) {
	defer goleak.VerifyNone(t, goleak.IgnoreCurrent())
	dir := t.TempDir()
	const segBytes = 64 << 10
	var logs bytes.Buffer
	opts := LocalOptions{SegmentBytes: segBytes, Logger: slog.New(slog.NewTextHandler(&logs, nil))}
	l := openT(t, dir, opts)
	es := mkEntries(1, 10, 1, 100)
	require.NoError(t, l.Append(ctx, 1, es[:5]))
	files := segFiles(t, dir)
	require.Len(t, files, 1)
	fi, err := os.Stat(files[0])
	require.NoError(t, err)
	assert.Equal(t, int64(segBytes), fi.Size(), "the segment is allocated up front")
	require.NoError(t, l.Close())

	l = openT(t, dir, opts)
	require.Equal(t, uint64(5), lastSeq(t, l))
	require.NoError(t, l.Append(ctx, 1, es[5:]))
	require.NoError(t, l.Close())
	assert.NotContains(t, logs.String(), "torn", "a preallocated end is not a torn tail")

	b, err := os.ReadFile(files[0])
	require.NoError(t, err)
	end := recordsEnd(es)
	require.Len(t, b, segBytes)
	assert.Equal(t, make([]byte, segBytes-end), b[end:], "records back to back, zeros after")

	l = openT(t, dir, opts)
	defer l.Close()
	checkEntries(t, readAll(t, l, 1), 1, 100)
	assert.Len(t, readAll(t, l, 1), 10)
}

// Rolling keeps every segment preallocated and readable; a log written
// preallocated opens without preallocation too (the zeros are cut off
// the last segment so appends land after the records).
func TestLocalPreallocatedRollAndAppendMode(t *testing.T) {
	defer goleak.VerifyNone(t, goleak.IgnoreCurrent())
	dir := t.TempDir()
	const segBytes = 4 << 10
	l := openT(t, dir, LocalOptions{SegmentBytes: segBytes})
	for seq := uint64(1); seq <= 100; seq += 5 {
		require.NoError(t, l.Append(ctx, 1, mkEntries(seq, 5, 1, 200)))
	}
	require.NoError(t, l.Close())
	files := segFiles(t, dir)
	require.Greater(t, len(files), 3)
	for _, f := range files {
		fi, err := os.Stat(f)
		require.NoError(t, err)
		assert.Equal(t, int64(segBytes), fi.Size(), f)
	}

	l = openT(t, dir, LocalOptions{SegmentBytes: segBytes, NoPreallocate: true})
	require.NoError(t, l.Append(ctx, 1, mkEntries(101, 5, 1, 200)))
	all := readAll(t, l, 1)
	require.Len(t, all, 105)
	checkEntries(t, all, 1, 200)
	require.NoError(t, l.Close())
	l = openT(t, dir, LocalOptions{SegmentBytes: segBytes})
	defer l.Close()
	all = readAll(t, l, 1)
	require.Len(t, all, 105)
	checkEntries(t, all, 1, 200)
}

// appendSync (the sink's path: it commits on the caller's goroutine)
// keeps call order with requests already queued for the writer: what
// was queued first is written first, so no seq arrives before its
// predecessor (that would be ErrGap).
func TestLocalAppendSyncAfterQueued(t *testing.T) {
	defer goleak.VerifyNone(t, goleak.IgnoreCurrent())
	fs := newHoldFS()
	l := openT(t, t.TempDir(), LocalOptions{FS: fs})
	defer l.Close()
	defer fs.unhold()
	fs.hold()
	c1, err := l.AppendAsync(context.Background(), 1, mkEntries(1, 1, 1, 10))
	require.NoError(t, err)
	<-fs.entered // the writer is in fsync with seq 1
	c2, err := l.AppendAsync(context.Background(), 1, mkEntries(2, 2, 1, 10))
	require.NoError(t, err)
	done := make(chan error, 1)
	go func() { done <- l.appendSync(1, mkEntries(4, 3, 1, 10)) }()
	fs.unhold()
	require.NoError(t, <-c1)
	require.NoError(t, <-c2)
	require.NoError(t, <-done)
	all := readAll(t, l, 1)
	require.Len(t, all, 6)
	checkEntries(t, all, 1, 10)
}

// A new segment's space is written with zeros, not only allocated: ext4
// reports fallocate's unwritten extents as holes to SEEK_HOLE (and each
// record's fdatasync would convert one, a journal commit), written zeros
// as data. On a filesystem without unwritten extents this holds either
// way.
func TestLocalNewSegmentZeroFilled(t *testing.T) {
	defer goleak.VerifyNone(t, goleak.IgnoreCurrent())
	dir := t.TempDir()
	const segBytes = 1 << 20
	l := openT(t, dir, LocalOptions{SegmentBytes: segBytes})
	defer l.Close()
	files := segFiles(t, dir)
	require.Len(t, files, 1)
	f, err := os.Open(files[0])
	require.NoError(t, err)
	defer f.Close()
	hole, err := unix.Seek(int(f.Fd()), segHeaderLen, unix.SEEK_HOLE)
	require.NoError(t, err)
	assert.Equal(t, int64(segBytes), hole, "no unwritten space after the header")
}
