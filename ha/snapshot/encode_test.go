package snapshot

import (
	"bytes"
	"encoding/binary"
	"flag"
	"fmt"
	"hash/crc32"
	"os"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"github.com/tinylib/msgp/msgp"

	"github.com/crescent-kv/crescent/internal/clock"
	"github.com/crescent-kv/crescent/store/alloc"
	"github.com/crescent-kv/crescent/store/master"
)

var update = flag.Bool("update", false, "rewrite testdata/v1.snap and v1.state from the fixed scenario")

var t0 = time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)

func uid(hi, lo uint64) master.UUID { return master.UUID{Hi: hi, Lo: lo} }

// scenario builds a master holding one of everything a snapshot
// records: objects complete and not, pins (hard, soft with and without a
// TTL), several replicas, a reservation, a quarantined put, a released
// segment index, an unmounting segment, clients.
func scenario(t testing.TB) *master.Master {
	clk := clock.NewFake(t0)
	m, err := master.New(master.Config{Shards: 4, Clock: clk, Seed: 1, Strategy: alloc.FreeRatioFirst})
	require.NoError(t, err)
	t.Cleanup(func() { m.Close() })
	c1, c2 := uid(0xc1, 1), uid(0xc1, 2)
	segs := []alloc.Segment{
		{ID: uid(0x5e, 1), Name: "h1", Base: 1 << 40, Size: 1 << 20, Protocol: "tcp", TEEndpoint: "10.0.0.1:1"},
		{ID: uid(0x5e, 2), Name: "h2", Base: 2 << 40, Size: 1 << 20, Protocol: "tcp", TEEndpoint: "10.0.0.2:1"},
		{ID: uid(0x5e, 3), Name: "h1", Base: 3 << 40, Size: 1 << 19, Protocol: "rdma"},
		{ID: uid(0x5e, 4), Name: "h2", Base: 4 << 40, Size: 1 << 19, Protocol: "tcp"},
	}
	require.NoError(t, m.MountSegment(c1, segs[0]))
	require.NoError(t, m.MountSegment(c2, segs[1]))
	require.NoError(t, m.MountSegment(c1, segs[2]))
	require.NoError(t, m.MountSegment(c2, segs[3]))
	put := func(c master.UUID, k string, size uint64, rc master.ReplicateConfig, end bool) {
		_, err := m.PutStart(c, k, size, rc)
		require.NoError(t, err)
		if end {
			require.NoError(t, m.PutEnd(c, k, master.Memory, &master.BlockMeta{BlockHashes: []uint64{uint64(len(k))}}))
		}
		clk.Advance(time.Millisecond)
	}
	for i := range 30 {
		put(c1, fmt.Sprint("plain", i), uint64(1000+i*137), master.ReplicateConfig{Replicas: 1 + i%2}, true)
	}
	put(c1, "hard", 5000, master.ReplicateConfig{HardPin: true}, true)
	put(c2, "soft", 6000, master.ReplicateConfig{SoftPin: true}, true)
	put(c2, "soft-ttl", 7000, master.ReplicateConfig{SoftPin: true, SoftPinTTL: 42 * time.Second, Replicas: 2}, true)
	put(c1, "unfinished", 8000, master.ReplicateConfig{Replicas: 2}, false)
	put(c2, "quarantined", 9000, master.ReplicateConfig{}, false)
	require.NoError(t, m.Remove("quarantined", true))
	for i := 0; i < 30; i += 4 {
		require.NoError(t, m.Remove(fmt.Sprint("plain", i), false))
	}
	// Segment 2 leaves a hole in the index table; segment 3 is unmounting.
	require.NoError(t, m.UnmountSegment(c1, segs[2].ID))
	res := m.Reserve(c2, master.ReserveSpec{Size: 3000, Count: 3, Config: master.ReplicateConfig{HardPin: true, Replicas: 2}})
	require.NoError(t, res.Err)
	require.Equal(t, 1, m.Unreserve(c2, []uint64{res.Reservations[0].ID}))
	require.NoError(t, m.Replay(&master.Op{Kind: master.OpUnmountStart, Time: clk.Now().UnixNano(), Segments: []uint32{3}, Segment: &segs[3]}))
	return m
}

func dump(t testing.TB, m *master.Master) string {
	var b bytes.Buffer
	require.NoError(t, m.DumpState(&b))
	return b.String()
}

// encode exports m into a snapshot body.
func encode(t testing.TB, m *master.Master, h Header) []byte {
	t.Helper()
	var n uint64
	_, err := m.Export(func(*master.Record) error { n++; return nil })
	require.NoError(t, err)
	h.Records = n
	var b bytes.Buffer
	e, err := NewEncoder(&b, h)
	require.NoError(t, err)
	_, err = m.Export(e.Write)
	require.NoError(t, err)
	require.NoError(t, e.Close())
	return b.Bytes()
}

// decodeInto imports a body into a fresh master.
func decodeInto(body []byte) (*master.Master, Header, error) {
	d, err := NewDecoder(bytes.NewReader(body))
	if err != nil {
		return nil, Header{}, err
	}
	m, err := master.New(master.Config{Shards: 3, Clock: clock.NewFake(t0)})
	if err != nil {
		return nil, Header{}, err
	}
	if err := m.Import(d.Next); err != nil {
		m.Close()
		return nil, Header{}, err
	}
	return m, d.Header(), nil
}

func TestEncodeDecode(t *testing.T) {
	m := scenario(t)
	h := Header{ClusterID: "c1", Seq: 77, Term: 3, Created: t0}
	body := encode(t, m, h)
	got, gh, err := decodeInto(body)
	require.NoError(t, err)
	defer got.Close()
	require.Equal(t, dump(t, m), dump(t, got))
	require.Equal(t, uint32(Version), gh.Version)
	require.Equal(t, "c1", gh.ClusterID)
	require.Equal(t, uint64(77), gh.Seq)
	require.Equal(t, uint64(3), gh.Term)
	require.True(t, gh.Created.Equal(t0))
}

// TestEncodeManyFrames: records spread over many frames, and a record
// bigger than FrameTarget, still decode.
func TestEncodeManyFrames(t *testing.T) {
	var recs []*master.Record
	recs = append(recs, &master.Record{Kind: master.RecordTable, TableLen: 1})
	for i := range 5000 {
		recs = append(recs, &master.Record{Kind: master.RecordClient, Client: uid(1, uint64(i))})
	}
	big := &master.Record{Kind: master.RecordObject, Key: "big", Hashes: make([]uint64, MaxHashes), Size: 1, Segs: []uint32{0}, Addrs: []uint64{0}}
	for i := range big.Hashes {
		big.Hashes[i] = ^uint64(i)
	}
	recs = append(recs, big)
	var b bytes.Buffer
	e, err := NewEncoder(&b, Header{Records: uint64(len(recs))})
	require.NoError(t, err)
	for _, r := range recs {
		require.NoError(t, e.Write(r))
	}
	require.NoError(t, e.Close())
	d, err := NewDecoder(&b)
	require.NoError(t, err)
	for i := range recs {
		r, err := d.Next()
		require.NoError(t, err)
		require.NotNil(t, r, "record %d", i)
		require.Equal(t, recs[i].Kind, r.Kind)
		require.Equal(t, recs[i].Client, r.Client)
		require.Equal(t, recs[i].Hashes, r.Hashes, "record %d", i)
	}
	r, err := d.Next()
	require.NoError(t, err)
	require.Nil(t, r)
}

func TestEncoderCountsRecords(t *testing.T) {
	var b bytes.Buffer
	e, err := NewEncoder(&b, Header{Records: 1})
	require.NoError(t, err)
	require.ErrorContains(t, e.Close(), "announced 1")
	e, err = NewEncoder(&b, Header{Records: 0})
	require.NoError(t, err)
	require.ErrorContains(t, e.Write(&master.Record{Kind: master.RecordTable}), "more than")
	_, err = NewEncoder(&b, Header{ClusterID: string(make([]byte, MaxClusterID+1))})
	require.Error(t, err)
}

// TestDecodeRefusesDamage: every torn prefix and every flipped byte of a
// body is refused with ErrCorruptBody (or, for a flip inside a record that
// still checks out, never silently: the checksums catch it).
func TestDecodeRefusesDamage(t *testing.T) {
	body := encode(t, scenario(t), Header{Seq: 5, Created: t0})
	drain := func(b []byte) error {
		d, err := NewDecoder(bytes.NewReader(b))
		if err != nil {
			return err
		}
		for {
			r, err := d.Next()
			if err != nil || r == nil {
				return err
			}
		}
	}
	require.NoError(t, drain(body))
	for n := 0; n < len(body); n += 1 + n/50 {
		require.ErrorIs(t, drain(body[:n]), ErrCorruptBody, "torn at %d of %d", n, len(body))
	}
	for i := 0; i < len(body); i += 1 + i/40 {
		b := bytes.Clone(body)
		b[i] ^= 0x20
		require.ErrorIs(t, drain(b), ErrCorruptBody, "byte %d of %d flipped", i, len(body))
	}
	require.ErrorIs(t, drain(append(bytes.Clone(body), 0)), ErrCorruptBody, "a byte after the trailer")
}

// TestDecodeBoundsFrames: a frame or list length far beyond the limits
// is refused before anything that size is allocated.
func TestDecodeBoundsFrames(t *testing.T) {
	var b bytes.Buffer
	e, err := NewEncoder(&b, Header{Records: 1})
	require.NoError(t, err)
	require.NoError(t, e.w.Flush()) // the header alone
	hdr := b.Bytes()[:headerFixed+4]
	frame := func(payload []byte, n uint32, records uint32) []byte {
		out := bytes.Clone(hdr)
		out = binary.LittleEndian.AppendUint32(out, n)
		out = binary.LittleEndian.AppendUint32(out, records)
		out = binary.LittleEndian.AppendUint32(out, crc32.Checksum(payload, bodyCRC))
		return append(out, payload...)
	}
	next := func(body []byte) error {
		d, err := NewDecoder(bytes.NewReader(body))
		require.NoError(t, err)
		_, err = d.Next()
		return err
	}
	require.ErrorContains(t, next(frame(nil, 1<<31, 1)), "frame of 2147483648 bytes")
	// A record announcing a 2^32-1 element list in a small frame.
	p := msgp.AppendMapHeader(nil, 2)
	p = msgp.AppendString(p, "k")
	p = msgp.AppendUint8(p, uint8(master.RecordObject))
	p = msgp.AppendString(p, "hashes")
	p = msgp.AppendArrayHeader(p, 1<<32-1)
	err = next(frame(p, uint32(len(p)), 1))
	require.ErrorIs(t, err, ErrCorruptBody)
	// The generated decoder checks the limit before allocating.
	var w record
	_, err = w.UnmarshalMsg(p)
	require.ErrorIs(t, err, msgp.ErrLimitExceeded)
	// An unknown field (a newer writer's) is refused, not skipped.
	p = msgp.AppendMapHeader(nil, 2)
	p = msgp.AppendString(p, "k")
	p = msgp.AppendUint8(p, uint8(master.RecordClient))
	p = msgp.AppendString(p, "future")
	p = msgp.AppendBool(p, true)
	require.ErrorContains(t, next(frame(p, uint32(len(p)), 1)), `unknown field "future"`)
}

// TestDecodeMissingFieldDefaults: a record written before a field existed
// (the reference's hard-pin case) decodes with the field's default.
func TestDecodeMissingFieldDefaults(t *testing.T) {
	full, err := toRecord(&master.Record{Kind: master.RecordObject, Key: "k", Size: 10, Complete: true, HardPin: true,
		SoftPin: true, Segs: []uint32{1}, Addrs: []uint64{64}})
	require.NoError(t, err)
	b, err := full.MarshalMsg(nil)
	require.NoError(t, err)
	// The same record without "hard", as a writer before it wrote it.
	old := msgp.AppendMapHeader(nil, 0)
	n, rest, err := msgp.ReadMapHeaderBytes(b)
	require.NoError(t, err)
	kept := uint32(0)
	for range n {
		var k []byte
		k, rest, err = msgp.ReadMapKeyZC(rest)
		require.NoError(t, err)
		v := rest
		rest, err = msgp.Skip(rest)
		require.NoError(t, err)
		if string(k) != "hard" {
			old = msgp.AppendString(old, string(k))
			old = append(old, v[:len(v)-len(rest)]...)
			kept++
		}
	}
	old = append(msgp.AppendMapHeader(nil, kept), old[1:]...)
	require.NoError(t, checkFields(old))
	var w record
	_, err = w.UnmarshalMsg(old)
	require.NoError(t, err)
	r, err := fromRecord(&w)
	require.NoError(t, err)
	require.False(t, r.HardPin)
	require.True(t, r.SoftPin)
	require.Equal(t, "k", r.Key)
	require.Equal(t, []uint64{64}, r.Addrs)
}

// TestGoldenV1 decodes the committed snapshot written by the first
// encoder and checks the state it restores. Regenerate (only when the
// scenario changes, never to paper over a format change) with
// go test -run TestGoldenV1 -update.
func TestGoldenV1(t *testing.T) {
	if *update {
		m := scenario(t)
		require.NoError(t, os.WriteFile("testdata/v1.snap", encode(t, m, Header{ClusterID: "golden", Seq: 1234, Term: 2, Created: t0}), 0o644))
		require.NoError(t, os.WriteFile("testdata/v1.state", []byte(dump(t, m)), 0o644))
	}
	body, err := os.ReadFile("testdata/v1.snap")
	require.NoError(t, err)
	want, err := os.ReadFile("testdata/v1.state")
	require.NoError(t, err)
	m, h, err := decodeInto(body)
	require.NoError(t, err)
	defer m.Close()
	require.Equal(t, string(want), dump(t, m))
	require.Equal(t, Header{Version: 1, ClusterID: "golden", Seq: 1234, Term: 2, Created: h.Created, Records: h.Records}, h)
	require.True(t, h.Created.Equal(t0))
	// Today's scenario still restores to the same state.
	require.Equal(t, string(want), dump(t, scenario(t)))
}

func FuzzDecode(f *testing.F) {
	f.Add(encode(f, scenario(f), Header{Seq: 9, Created: t0}))
	if b, err := os.ReadFile("testdata/v1.snap"); err == nil {
		f.Add(b)
	}
	f.Add([]byte(Magic))
	f.Fuzz(func(t *testing.T, b []byte) {
		m, _, err := decodeInto(b)
		if err == nil {
			m.Close()
		}
	})
}
