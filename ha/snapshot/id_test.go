package snapshot

import (
	"bytes"
	"math"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestIDRoundTrip(t *testing.T) {
	for _, c := range []struct{ seq, term uint64 }{
		{0, 0}, {1, 1}, {42, 7}, {math.MaxUint64, math.MaxUint64}, {1 << 53, 3},
	} {
		id := IDFor(c.seq, c.term)
		require.Len(t, id, idLen)
		seq, term, err := ParseID(id)
		require.NoError(t, err, id)
		assert.Equal(t, c.seq, seq)
		assert.Equal(t, c.term, term)
	}
	assert.Equal(t, "00000000000000000042-00000000000000000007", IDFor(42, 7))
}

func TestIDsSortBySeqThenTerm(t *testing.T) {
	ids := []string{IDFor(9, 1), IDFor(10, 0), IDFor(10, 2), IDFor(100, 1), IDFor(math.MaxUint64, 0)}
	for i := 1; i < len(ids); i++ {
		assert.Less(t, ids[i-1], ids[i])
	}
}

func TestParseIDRefusesOtherShapes(t *testing.T) {
	for _, id := range []string{
		"",
		"1-2",
		"../../../etc/passwd",
		"00000000000000000001/0000000000000000001",
		"00000000000000000001-0000000000000000001",   // 19-digit term
		"00000000000000000001-000000000000000000001", // 21-digit term
		"00000000000000000001_00000000000000000001",
		"0000000000000000000a-00000000000000000001",
		"+0000000000000000001-00000000000000000001",
		"99999999999999999999-00000000000000000001", // above uint64
		"00000000000000000001-00000000000000000001.snap",
		"00000000000000000001-00000000000000000001\n",
		strings.Repeat("9", 1000),
	} {
		_, _, err := ParseID(id)
		require.ErrorIs(t, err, ErrBadID, "%q", id)
	}
}

func testMeta(seq, term uint64) Meta {
	return Meta{ID: IDFor(seq, term), Seq: seq, Term: term,
		Created: time.Unix(1_700_000_000+int64(seq%1000), 123456789).UTC(), Size: int64(seq%1000) * 10, Checksum: uint32(seq*7 + term)}
}

func TestMetaCodecRoundTrip(t *testing.T) {
	m := testMeta(12, 3)
	m.Created = m.Created.In(time.FixedZone("x", 3600))
	got, err := decodeMeta(encodeMeta(m), m.ID)
	require.NoError(t, err)
	assert.True(t, got.Created.Equal(m.Created))
	m.Created = m.Created.UTC()
	assert.Equal(t, m, got)
	assert.Equal(t, encodeMeta(m), encodeMeta(got), "equal metas encode to equal bytes")
}

func TestMetaCodecRefusesCorruption(t *testing.T) {
	good := encodeMeta(testMeta(12, 3))
	flip := append([]byte(nil), good...)
	flip[10] ^= 0x01
	// Still valid JSON of a valid Meta: only the checksum tells.
	sizeFlip := bytes.Replace(good, []byte(`"size":120`), []byte(`"size":121`), 1)
	require.NotEqual(t, good, sizeFlip)
	other := encodeMeta(testMeta(13, 3))
	mismatch := testMeta(12, 3)
	mismatch.Seq = 99 // the id says 12
	for name, b := range map[string][]byte{
		"empty":         nil,
		"bit flip":      flip,
		"size changed":  sizeFlip,
		"truncated":     good[:len(good)-3],
		"no newline":    good[:len(good)-1],
		"no crc line":   append([]byte(`{"v":1}`), '\n'),
		"too long":      append(append([]byte(nil), good...), make([]byte, maxMetaSize)...),
		"other id":      other,
		"id mismatch":   encodeMeta(mismatch),
		"wrong version": reencode(t, strings.Replace(string(good[:len(good)-10]), `"v":1`, `"v":2`, 1)),
		"not json":      reencode(t, "hello"),
	} {
		_, err := decodeMeta(b, IDFor(12, 3))
		require.ErrorIs(t, err, ErrCorrupt, name)
	}
}

// reencode gives body a correct checksum line.
func reencode(t *testing.T, body string) []byte {
	t.Helper()
	b := append([]byte(body), '\n')
	return append(b, encodeCRC(b[:len(b)-1])...)
}

func FuzzDecodeMeta(f *testing.F) {
	f.Add(encodeMeta(testMeta(1, 1)), IDFor(1, 1))
	f.Add([]byte("x\n00000000\n"), "")
	f.Fuzz(func(t *testing.T, b []byte, id string) {
		m, err := decodeMeta(b, id)
		if err != nil {
			return
		}
		// What decodes re-encodes to a record that decodes the same.
		m2, err := decodeMeta(encodeMeta(m), m.ID)
		require.NoError(t, err)
		require.Equal(t, m.ID, m2.ID)
		require.NoError(t, checkMeta(m))
	})
}

func FuzzParseID(f *testing.F) {
	f.Add(IDFor(5, 6))
	f.Add("../x")
	f.Fuzz(func(t *testing.T, id string) {
		seq, term, err := ParseID(id)
		if err == nil {
			require.Equal(t, id, IDFor(seq, term))
		}
	})
}
