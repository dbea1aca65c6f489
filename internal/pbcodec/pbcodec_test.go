package pbcodec

import (
	"fmt"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"
	"google.golang.org/protobuf/reflect/protoregistry"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/crescent-kv/crescent/store/storepb"
)

func batchStart() *storepb.BatchPutStartRequest {
	r := &storepb.BatchPutStartRequest{
		ClientId: &storepb.UUID{High: 1, Low: 2},
		Config:   &storepb.ReplicateConfig{ReplicaNum: 2, PreferredSegments: []string{"seg-a", "ségment-b"}},
		Packed:   true,
		Session:  []byte("session"),
	}
	for i := range 128 {
		r.Keys = append(r.Keys, fmt.Sprintf("model/layer-%d/block-%08x", i%32, i*7919))
		r.Sizes = append(r.Sizes, uint64(4096+i))
	}
	return r
}

func batchReply() *storepb.BatchPutStartResponse {
	p := &storepb.PackedReplicas{Segments: []*storepb.MemorySegment{{Name: "client-1", Protocol: "tcp", Id: &storepb.UUID{High: 3}}}}
	res := &storepb.PackedResults{}
	for i := range 128 {
		p.Counts = append(p.Counts, 1)
		p.Segment = append(p.Segment, 0)
		p.Address = append(p.Address, uint64(i)<<20)
		p.Size = append(p.Size, 4096)
		p.Status = append(p.Status, storepb.ReplicaStatus(1))
		res.Codes = append(res.Codes, int32(i%3))
		res.Values = append(res.Values, uint64(i)<<32|1)
	}
	res.Messages = []string{"exists", "no space"}
	return &storepb.BatchPutStartResponse{Packed: p, PackedResults: res}
}

// The fast code and the reference library read each other's bytes.
func TestInteroperates(t *testing.T) {
	for _, m := range []proto.Message{batchStart(), batchReply(), &storepb.BatchPutStartRequest{}} {
		ours, err := Marshal(m)
		require.NoError(t, err)
		assert.Equal(t, proto.Size(m), len(ours))
		assert.Equal(t, Size(m), len(ours))
		ref, err := proto.Marshal(m)
		require.NoError(t, err)

		a := m.ProtoReflect().New().Interface()
		require.NoError(t, proto.Unmarshal(ours, a))
		assert.True(t, proto.Equal(m, a), "the reference decoder reads what we encode")
		b := m.ProtoReflect().New().Interface()
		require.NoError(t, Unmarshal(ref, b))
		assert.True(t, proto.Equal(m, b), "we decode what the reference encodes")
	}
}

func TestAppendKeepsPrefix(t *testing.T) {
	m := batchStart()
	for _, b := range [][]byte{[]byte("hdr"), make([]byte, 3, 3+Size(m))} {
		out, err := Append(b, m)
		require.NoError(t, err)
		assert.Equal(t, b[:3], out[:3])
		got := &storepb.BatchPutStartRequest{}
		require.NoError(t, Unmarshal(out[3:], got))
		assert.True(t, proto.Equal(m, got))
	}
}

// Unmarshal resets, as proto.Unmarshal does: no field of an earlier
// message survives into the next.
func TestUnmarshalResets(t *testing.T) {
	m := batchStart()
	b, err := Marshal(&storepb.BatchPutStartRequest{Keys: []string{"only"}, Sizes: []uint64{1}})
	require.NoError(t, err)
	require.NoError(t, Unmarshal(b, m))
	assert.Equal(t, []string{"only"}, m.Keys)
	assert.Nil(t, m.Config)
	assert.False(t, m.Packed)
}

// A message without generated fast code goes through the reference
// library both ways.
func TestFallback(t *testing.T) {
	m := wrapperspb.String("x")
	b, err := Marshal(m)
	require.NoError(t, err)
	got := &wrapperspb.StringValue{}
	require.NoError(t, Unmarshal(b, got))
	assert.Equal(t, "x", got.Value)
	require.Error(t, Unmarshal(append(protowire.AppendTag(nil, 1, protowire.BytesType), 1, 0xff), got))
}

func TestTruncatedInput(t *testing.T) {
	b, err := Marshal(batchStart())
	require.NoError(t, err)
	for _, n := range []int{1, len(b) / 2, len(b) - 1} {
		err := Unmarshal(b[:n], &storepb.BatchPutStartRequest{})
		require.Error(t, err, "%d of %d bytes", n, len(b))
		require.Error(t, proto.Unmarshal(b[:n], &storepb.BatchPutStartRequest{}))
	}
}

// Every string field of every storepb message, at any depth up to 3
// messages down, refuses invalid UTF-8 as the reference decoder does:
// the generated CheckUTF8 covers every field the fast decoder fills.
func TestEveryStringFieldChecked(t *testing.T) {
	msgs := storepb.File_master_proto.Messages()
	checked := 0
	for i := range msgs.Len() {
		md := msgs.Get(i)
		mt, err := protoregistry.GlobalTypes.FindMessageByName(md.FullName())
		require.NoError(t, err)
		_, isFast := mt.New().Interface().(fast)
		require.True(t, isFast, "%s has no fast code: run make proto", md.FullName())
		for _, c := range badStrings(md, 3) {
			ref := proto.Unmarshal(c.b, mt.New().Interface())
			require.Error(t, ref, "%s.%s: the reference accepts it", md.FullName(), c.path)
			err := Unmarshal(c.b, mt.New().Interface())
			require.Error(t, err, "%s.%s: invalid UTF-8 accepted", md.FullName(), c.path)
			assert.Contains(t, err.Error(), "invalid UTF-8")
			checked++
		}
	}
	assert.Greater(t, checked, 30)
}

type bad struct {
	path string
	b    []byte
}

// badStrings encodes, for each string field reachable from md within
// depth messages, a message of md's type whose only content is that
// field holding "\xff" (inside the messages that lead to it).
func badStrings(md protoreflect.MessageDescriptor, depth int) []bad {
	if depth == 0 {
		return nil
	}
	var out []bad
	fs := md.Fields()
	for i := range fs.Len() {
		fd := fs.Get(i)
		switch {
		case fd.Kind() == protoreflect.StringKind:
			b := protowire.AppendTag(nil, fd.Number(), protowire.BytesType)
			out = append(out, bad{string(fd.Name()), protowire.AppendBytes(b, []byte("ok\xff"))})
		case fd.Message() != nil:
			for _, in := range badStrings(fd.Message(), depth-1) {
				b := protowire.AppendTag(nil, fd.Number(), protowire.BytesType)
				out = append(out, bad{string(fd.Name()) + "." + in.path, protowire.AppendBytes(b, in.b)})
			}
		}
	}
	return out
}

func BenchmarkDecode(b *testing.B) {
	for _, tc := range []struct {
		name string
		m    proto.Message
	}{{"BatchPutStartRequest", batchStart()}, {"BatchPutStartResponse", batchReply()}} {
		buf, err := proto.Marshal(tc.m)
		require.NoError(b, err)
		b.Run(tc.name+"/reference", func(b *testing.B) {
			for b.Loop() {
				if err := proto.Unmarshal(buf, tc.m.ProtoReflect().New().Interface()); err != nil {
					b.Fatal(err)
				}
			}
		})
		b.Run(tc.name+"/pbcodec", func(b *testing.B) {
			for b.Loop() {
				if err := Unmarshal(buf, tc.m.ProtoReflect().New().Interface()); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

func BenchmarkEncode(b *testing.B) {
	for _, tc := range []struct {
		name string
		m    proto.Message
	}{{"BatchPutStartRequest", batchStart()}, {"BatchPutStartResponse", batchReply()}} {
		buf := make([]byte, 0, proto.Size(tc.m))
		b.Run(tc.name+"/reference", func(b *testing.B) {
			for b.Loop() {
				if _, err := (proto.MarshalOptions{}).MarshalAppend(buf[:0], tc.m); err != nil {
					b.Fatal(err)
				}
			}
		})
		b.Run(tc.name+"/pbcodec", func(b *testing.B) {
			for b.Loop() {
				if _, err := Append(buf[:0], tc.m); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

// TestPresized: the key slice of a batch is allocated once, at its final
// size, instead of growing entry by entry.
func TestPresized(t *testing.T) {
	m := batchStart()
	b, err := Marshal(m)
	require.NoError(t, err)
	got := &storepb.BatchPutStartRequest{}
	require.NoError(t, Unmarshal(b, got))
	require.True(t, proto.Equal(m, got))
	assert.Equal(t, len(m.Keys), cap(got.Keys))
	// One allocation per key string, plus the key and size slices, the
	// config and its preferred list and strings, the client id, the
	// session, the reset: none for growing a slice.
	allocs := testing.AllocsPerRun(50, func() {
		if err := Unmarshal(b, got); err != nil {
			t.Fatal(err)
		}
	})
	assert.LessOrEqual(t, allocs, float64(len(m.Keys)+9))
}
