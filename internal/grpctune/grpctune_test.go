package grpctune

import (
	"bytes"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/wrapperspb"
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
