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
