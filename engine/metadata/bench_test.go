package metadata

import (
	"bytes"
	"context"
	"fmt"
	"testing"
)

// benchDesc is a descriptor with n buffers, as a segment with n
// registrations publishes it.
func benchDesc(n int) *SegmentDesc {
	d := testDesc("127.0.0.1:15001")
	d.Buffers = d.Buffers[:0]
	for i := range n {
		d.Buffers = append(d.Buffers, Buffer{Name: "cpu:0", Addr: 0x7f00_0000_0000 + uint64(i)<<24, Length: 1 << 24})
	}
	return d
}

func BenchmarkFrameRoundTrip(b *testing.B) {
	body, _ := benchDesc(16).Marshal()
	var buf bytes.Buffer
	b.SetBytes(int64(9 + len(body)))
	b.ReportAllocs()
	for b.Loop() {
		buf.Reset()
		if err := WriteFrame(&buf, Metadata, body); err != nil {
			b.Fatal(err)
		}
		if _, _, err := ReadFrame(&buf, DefaultMaxFrame); err != nil {
			b.Fatal(err)
		}
	}
}

func BenchmarkDescMarshalUnmarshal(b *testing.B) {
	for _, n := range []int{1, 64} {
		b.Run(fmt.Sprintf("buffers=%d", n), func(b *testing.B) {
			d := benchDesc(n)
			body, _ := d.Marshal()
			b.SetBytes(int64(len(body)))
			b.ReportAllocs()
			for b.Loop() {
				out, err := d.Marshal()
				if err != nil {
					b.Fatal(err)
				}
				if _, err := UnmarshalDesc(out); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

// BenchmarkExchange is one full handshake exchange over loopback TCP
// (connect, request, reply, close), as every OpenSegment and notify pays.
func BenchmarkExchange(b *testing.B) {
	desc := benchDesc(16)
	s := startServer(b, ServerConfig{Handlers: Handlers{Metadata: func() *SegmentDesc { return desc }, Notify: func(string, string) {}}})
	ctx := context.Background()
	b.Run("probe", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			if err := SendProbe(ctx, s.Addr()); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("metadata", func(b *testing.B) {
		body, _ := desc.Marshal()
		b.SetBytes(int64(len(body)))
		b.ReportAllocs()
		for b.Loop() {
			if _, err := FetchDesc(ctx, s.Addr(), desc); err != nil {
				b.Fatal(err)
			}
		}
	})
}
