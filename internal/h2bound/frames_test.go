package h2bound

import (
	"bytes"
	"math/rand/v2"
	"testing"

	"github.com/stretchr/testify/require"
	"golang.org/x/net/http2"
)

// TestFramesAnyChunking: the frame walk sees the same frames, DATA bytes
// and flags however the stream is cut into reads.
func TestFramesAnyChunking(t *testing.T) {
	var buf bytes.Buffer
	buf.WriteString(clientPreface)
	fr := http2.NewFramer(&buf, nil)
	require.NoError(t, fr.WriteSettings())
	wantData := map[uint32]int{}
	for sid := uint32(1); sid < 40; sid += 2 {
		require.NoError(t, fr.WriteHeaders(http2.HeadersFrameParam{StreamID: sid, BlockFragment: []byte{0x82}, EndHeaders: true}))
		n := int(sid) * 997 % 40000
		for off := 0; off < n; off += 16384 {
			m := min(16384, n-off)
			require.NoError(t, fr.WriteData(sid, off+m == n, make([]byte, m)))
			wantData[sid] += m
		}
		if n == 0 {
			require.NoError(t, fr.WriteData(sid, true, nil))
		}
		if sid%7 == 0 {
			require.NoError(t, fr.WriteRSTStream(sid, http2.ErrCodeCancel))
		}
	}
	stream := buf.Bytes()
	r := rand.New(rand.NewPCG(1, 2))
	for round := range 200 {
		f := frames{preface: len(clientPreface)}
		gotData := map[uint32]int{}
		ended := map[uint32]bool{}
		headers, rsts := 0, 0
		for p := stream; len(p) > 0; {
			cut := min(len(p), 1+r.IntN(1+round*50))
			chunk := p[:cut]
			p = p[cut:]
			for len(chunk) > 0 {
				adv, ev := f.step(chunk)
				require.Positive(t, adv)
				chunk = chunk[adv:]
				switch {
				case ev.kind == evHeader && ev.typ == frameHeaders:
					headers++
				case ev.kind == evHeader && ev.typ == frameRSTStream:
					rsts++
				case ev.typ == frameData && ev.kind != evNone:
					gotData[ev.sid] += ev.n
					if ev.end && ev.flags&flagEndStream != 0 {
						ended[ev.sid] = true
					}
				}
			}
		}
		require.Equal(t, 20, headers)
		require.Equal(t, 3, rsts) // streams 7, 21, 35
		require.Len(t, ended, 20)
		for sid, n := range wantData {
			require.Equal(t, n, gotData[sid], "stream %d, round %d", sid, round)
		}
	}
}
