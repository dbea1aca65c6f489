package grpctune

import (
	"bytes"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
	"google.golang.org/grpc/encoding"
	"google.golang.org/grpc/mem"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/crescent-kv/crescent/internal/pbcodec"
	"github.com/crescent-kv/crescent/internal/testutil"
	"github.com/crescent-kv/crescent/store/storepb"
)

// TestCodec: small and large messages round-trip through the pooled
// codec; a value that is not a protobuf message is refused.
func TestCodec(t *testing.T) {
	var c pooledCodec
	require.Equal(t, "proto", c.Name())
	for _, v := range []string{"", "k", strings.Repeat("x", 100<<10)} {
		in := wrapperspb.String(v)
		data, err := c.Marshal(in)
		require.NoError(t, err)
		want, _ := proto.Marshal(in)
		require.True(t, bytes.Equal(want, data.Materialize()))
		out := new(wrapperspb.StringValue)
		require.NoError(t, c.Unmarshal(data, out))
		require.Equal(t, v, out.Value)
		data.Free()
	}
	_, err := c.Marshal(struct{}{})
	require.ErrorContains(t, err, "not a protobuf message")
	require.Error(t, c.Unmarshal(nil, struct{}{}))
	require.NotEmpty(t, DialOptions())
	require.NotEmpty(t, ServerOptions())
}

// TestServerCodecsBoundExpansion: the server codecs (tuned and not)
// refuse a request of empty messages before decoding it, and decode
// ordinary ones.
func TestServerCodecsBoundExpansion(t *testing.T) {
	// 1.5 M empty segments (2 bytes each), as unknown fields so that
	// building the request costs nothing.
	raw := testutil.EmptyMessages(2, 3<<19)
	req := &storepb.ReMountSegmentRequest{}
	req.ProtoReflect().SetUnknown(raw)
	b, err := proto.Marshal(req)
	require.NoError(t, err)
	for name, c := range map[string]encoding.CodecV2{"tuned": pooledCodec{request: true}, "plain": RequestCodec()} {
		require.Equal(t, "proto", c.Name())
		err := c.Unmarshal(mem.BufferSlice{mem.SliceBuffer(b)}, new(storepb.ReMountSegmentRequest))
		require.ErrorIs(t, err, pbcodec.ErrExpansion, name)
		small := &storepb.ReMountSegmentRequest{Segments: []*storepb.Segment{{Name: "a"}}}
		sb, _ := proto.Marshal(small)
		out := new(storepb.ReMountSegmentRequest)
		require.NoError(t, c.Unmarshal(mem.BufferSlice{mem.SliceBuffer(sb)}, out), name)
		require.True(t, proto.Equal(small, out), name)
	}
}
