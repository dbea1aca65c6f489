package service

import (
	"bytes"
	"context"
	"errors"
	"io"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"golang.org/x/net/http2"
	"golang.org/x/net/http2/hpack"

	"github.com/crescent-kv/crescent/internal/crpc"
	"github.com/crescent-kv/crescent/internal/netx"
	"github.com/crescent-kv/crescent/internal/testutil"
	"github.com/crescent-kv/crescent/store/master/internal/mastertest"
	"github.com/crescent-kv/crescent/store/storepb"
)

// h2peer is a raw HTTP/2 peer that opens gRPC calls and never sends
// their requests, so each stays open on the server.
type h2peer struct {
	t   *testing.T
	c   net.Conn
	fr  *http2.Framer
	buf bytes.Buffer
	enc *hpack.Encoder
	id  uint32
}

func dialH2(t *testing.T, addr string) *h2peer {
	c, err := net.Dial("tcp", addr)
	require.NoError(t, err)
	t.Cleanup(func() { c.Close() })
	_, err = c.Write([]byte(http2.ClientPreface))
	require.NoError(t, err)
	p := &h2peer{t: t, c: c, fr: http2.NewFramer(c, c), id: 1}
	p.fr.ReadMetaHeaders = hpack.NewDecoder(4096, nil)
	p.enc = hpack.NewEncoder(&p.buf)
	require.NoError(t, p.fr.WriteSettings())
	return p
}

// open starts n calls of Ping, headers only.
func (p *h2peer) open(n int) {
	for range n {
		require.NoError(p.t, p.fr.WriteHeaders(http2.HeadersFrameParam{StreamID: p.id, BlockFragment: p.headers(), EndHeaders: true}))
		p.id += 2
	}
}

// headers encodes a Ping call's header block, with extra fields after
// gRPC's.
func (p *h2peer) headers(extra ...hpack.HeaderField) []byte {
	return p.headersFor(storepb.Master_Ping_FullMethodName, extra...)
}

// headersFor encodes a call's header block for method.
func (p *h2peer) headersFor(method string, extra ...hpack.HeaderField) []byte {
	p.buf.Reset()
	for _, f := range [][2]string{{":method", "POST"}, {":scheme", "http"}, {":path", method},
		{":authority", "master"}, {"content-type", "application/grpc"}, {"te", "trailers"}} {
		require.NoError(p.t, p.enc.WriteField(hpack.HeaderField{Name: f[0], Value: f[1]}))
	}
	for _, f := range extra {
		require.NoError(p.t, p.enc.WriteField(f))
	}
	return p.buf.Bytes()
}

// refusals reads frames until want streams were refused, by RST_STREAM
// REFUSED_STREAM (refused) or a grpc-status of RESOURCE_EXHAUSTED
// (exhausted), and returns both counts.
func (p *h2peer) refusals(want int) (refused, exhausted int) {
	require.NoError(p.t, p.c.SetReadDeadline(time.Now().Add(10*time.Second)))
	for refused+exhausted < want {
		f, err := p.fr.ReadFrame()
		require.NoError(p.t, err, "%d refused, %d exhausted of %d", refused, exhausted, want)
		switch f := f.(type) {
		case *http2.SettingsFrame:
			if !f.IsAck() {
				require.NoError(p.t, p.fr.WriteSettingsAck())
			}
		case *http2.RSTStreamFrame:
			if f.ErrCode == http2.ErrCodeRefusedStream {
				refused++
			}
		case *http2.MetaHeadersFrame:
			if hasField(f, "grpc-status", "8") {
				exhausted++
			}
		}
	}
	return refused, exhausted
}

func hasField(f *http2.MetaHeadersFrame, name, value string) bool {
	for _, hf := range f.Fields {
		if hf.Name == name && hf.Value == value {
			return true
		}
	}
	return false
}

// TestGRPCCallsBounded: gRPC calls open on the master's port are bounded
// like crpc's: per connection (streams past it are refused) and in all
// (calls past it answered RESOURCE_EXHAUSTED before their request is
// read); a call that ends gives its place back.
func TestGRPCCallsBounded(t *testing.T) {
	e := mastertest.New(t, nil)
	addr, svc := serveAddr(t, e.M, WithCRPC(crpc.ServerConfig{MaxCallsPerConn: 4, MaxCalls: 6}, netx.Config{}))
	a := dialH2(t, addr)
	a.open(6)
	refused, exhausted := a.refusals(2)
	require.Equal(t, 2, refused, "streams past the per-connection bound")
	require.Zero(t, exhausted)

	b := dialH2(t, addr)
	b.open(4)
	refused, exhausted = b.refusals(2)
	require.Zero(t, refused)
	require.Equal(t, 2, exhausted, "calls past the bound across connections")
	require.EqualValues(t, 2, svc.GRPCCallsRefused())

	// a's four calls end with its connection; ten calls one after
	// another then fit in the two places b leaves.
	a.c.Close()
	mc := dialSigned(t, addr)
	cctx, ccancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer ccancel()
	for i := range 10 {
		// The server may not have seen a's close yet: wait for it.
		require.Eventually(t, func() bool {
			_, err := mc.Ping(cctx, &storepb.PingRequest{ClientId: pbID(mastertest.Client(1))})
			return err == nil
		}, 10*time.Second, 10*time.Millisecond, "call %d", i)
	}
	b.c.Close()
}

// TestGRPCHeaderBounded: a call whose headers exceed maxGRPCHeaderBytes
// is not held open (gRPC's default bound would keep 16 MiB of them for
// the call's life): gRPC drops the connection that sent it, and the port
// serves other connections.
func TestGRPCHeaderBounded(t *testing.T) {
	e := mastertest.New(t, nil)
	addr, _ := serveAddr(t, e.M)
	p := dialH2(t, addr)
	var pads []hpack.HeaderField
	for i := range 8 {
		pads = append(pads, hpack.HeaderField{Name: "x-pad", Value: strings.Repeat(string(rune('a'+i)), 12<<10), Sensitive: true})
	}
	block := p.headers(pads...)
	require.Greater(t, len(block), maxGRPCHeaderBytes)
	const frag = 16 << 10
	require.NoError(t, p.fr.WriteHeaders(http2.HeadersFrameParam{StreamID: 1, BlockFragment: block[:frag]}))
	for off := frag; off < len(block); off += frag {
		end := min(off+frag, len(block))
		require.NoError(t, p.fr.WriteContinuation(1, end == len(block), block[off:end]))
	}
	require.NoError(t, p.c.SetReadDeadline(time.Now().Add(10*time.Second)))
	for {
		f, err := p.fr.ReadFrame()
		if errors.Is(err, io.EOF) {
			break // dropped
		}
		require.NoError(t, err, "the call with %d bytes of headers is still open", len(block))
		if f, ok := f.(*http2.RSTStreamFrame); ok && f.StreamID == 1 {
			break
		}
		if f, ok := f.(*http2.SettingsFrame); ok && !f.IsAck() {
			require.NoError(t, p.fr.WriteSettingsAck())
		}
	}

	cctx, ccancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer ccancel()
	_, err := dialSigned(t, addr).Ping(cctx, &storepb.PingRequest{ClientId: pbID(mastertest.Client(1))})
	require.NoError(t, err)
}

// TestRequestExpansionRefused: a request of empty messages (2 bytes
// each on the wire, a struct each decoded) is refused before it is
// decoded, over gRPC and crpc: its error is the expansion bound's, not
// the handler's.
func TestRequestExpansionRefused(t *testing.T) {
	e := mastertest.New(t, nil)
	addr, _ := serveAddr(t, e.M)
	// 1.5 M empty segments (2 bytes each), as unknown fields so that
	// building the request costs nothing.
	raw := testutil.EmptyMessages(2, 3<<19)
	req := &storepb.ReMountSegmentRequest{ClientId: pbID(mastertest.Client(1))}
	req.ProtoReflect().SetUnknown(raw)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	cc, err := crpc.Dial(ctx, addr)
	require.NoError(t, err)
	defer cc.Close()
	for name, c := range map[string]storepb.MasterClient{"grpc": dialSigned(t, addr), "crpc": storepb.NewMasterClient(cc)} {
		_, err := c.ReMountSegment(ctx, req)
		require.ErrorContains(t, err, "would decode to too much memory", name)
		_, err = c.ServiceReady(ctx, &storepb.ServiceReadyRequest{})
		require.NoError(t, err, name)
	}
}
