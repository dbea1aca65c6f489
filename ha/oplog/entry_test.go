package oplog

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestEntrySealVerify(t *testing.T) {
	e := Entry{Seq: 7, Term: 3, Time: 1e18, Kind: 2, Key: "k", Payload: []byte("op")}
	e.Seal()
	require.NoError(t, e.Verify())

	b, err := e.MarshalMsg(nil)
	require.NoError(t, err)
	var d Entry
	_, err = d.UnmarshalMsg(b)
	require.NoError(t, err)
	assert.Equal(t, e, d)
	require.NoError(t, d.Verify())

	d.Payload[0] ^= 1
	assert.ErrorIs(t, d.Verify(), ErrCorrupt)
	d.Payload[0] ^= 1
	d.Seq++
	assert.ErrorIs(t, d.Verify(), ErrCorrupt, "the seq is covered too")

	big := Entry{Seq: 1, Key: string(make([]byte, MaxKey+1))}
	big.Seal()
	assert.ErrorIs(t, big.Verify(), ErrTooLarge)
}

// sealedRecordCases are entries at the edges of msgp's encodings (fixint
// and widest integers, empty and long strings and payloads).
var sealedRecordCases = []Entry{
	{},
	{Seq: 1, Term: 1, Time: 1, Kind: 1, Key: "k", Payload: []byte("op")},
	{Seq: 127, Term: 128, Time: -1, Kind: 255, Key: string(make([]byte, 31)), Payload: make([]byte, 255)},
	{Seq: 1<<64 - 1, Term: 1<<32 + 5, Time: -1 << 63, Kind: 18, Key: string(make([]byte, MaxKey)), Payload: make([]byte, 70000)},
}

// TestSealedRecordMatches: the one-pass encoder of the sink's records
// gives the same CRC and the same bytes as Seal then appendRecord, so
// the log's format and what recovery verifies do not change.
func TestSealedRecordMatches(t *testing.T) {
	for i, c := range sealedRecordCases {
		checkSealedRecord(t, c, i)
	}
}

func checkSealedRecord(t *testing.T, e Entry, name any) {
	want := e
	want.Seal()
	wantRec := appendRecord([]byte("prefix"), &want)
	got := e
	got.CRC = 12345 // overwritten: the checksum is of the entry with CRC 0
	gotRec := appendSealedRecord([]byte("prefix"), &got)
	require.Equal(t, want.CRC, got.CRC, "case %v", name)
	require.Equal(t, wantRec, gotRec, "case %v", name)
	var back Entry
	require.NoError(t, decodeRecord(gotRec[len("prefix"):], &back), "case %v", name)
	require.Equal(t, want.Seq, back.Seq)
	require.Equal(t, want.CRC, back.CRC)
}

func FuzzSealedRecord(f *testing.F) {
	for _, c := range sealedRecordCases[:3] {
		f.Add(c.Seq, c.Term, c.Time, c.Kind, c.Key, c.Payload)
	}
	f.Fuzz(func(t *testing.T, seq, term uint64, tm int64, kind uint8, key string, payload []byte) {
		checkSealedRecord(t, Entry{Seq: seq, Term: term, Time: tm, Kind: kind, Key: key, Payload: payload}, seq)
	})
}
