package oplog

import (
	"bytes"
	"flag"
	"fmt"
	"os"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"github.com/tinylib/msgp/msgp"

	"github.com/crescent-kv/crescent/store/alloc"
	"github.com/crescent-kv/crescent/store/master"
)

var updateOpGolden = flag.Bool("update-op-golden", false, "rewrite testdata/ops.golden with the current encoder")

// TestOpKindsKnown: the codec knows every kind master has; a new kind
// makes this fail until maxKind (and doc.go) follow.
func TestOpKindsKnown(t *testing.T) {
	for k := master.OpPutStart; k <= maxKind; k++ {
		require.NotContains(t, k.String(), "OpKind(", "kind %d has no name", k)
		_, _, _, err := EncodeOp(&master.Op{Kind: k})
		require.NoError(t, err, "kind %v", k)
	}
	require.Equal(t, fmt.Sprintf("OpKind(%d)", maxKind+1), (maxKind + 1).String(),
		"master has an OpKind after %v: add it to the codec", maxKind)
}

// fillAll sets every field reachable from v to a non-zero value.
func fillAll(v reflect.Value, n *int) {
	*n++
	switch v.Kind() {
	case reflect.Bool:
		v.SetBool(true)
	case reflect.Int, reflect.Int8, reflect.Int16, reflect.Int32, reflect.Int64:
		v.SetInt(int64(*n) * 1000003)
	case reflect.Uint, reflect.Uint8, reflect.Uint16, reflect.Uint32, reflect.Uint64:
		v.SetUint(uint64(*n) * 1000003 % (1 << (v.Type().Bits() - 1)))
	case reflect.String:
		v.SetString(fmt.Sprintf("s%d", *n))
	case reflect.Slice:
		s := reflect.MakeSlice(v.Type(), 3, 3)
		for i := range 3 {
			fillAll(s.Index(i), n)
		}
		v.Set(s)
	case reflect.Pointer:
		p := reflect.New(v.Type().Elem())
		fillAll(p.Elem(), n)
		v.Set(p)
	case reflect.Struct:
		for i := range v.NumField() {
			fillAll(v.Field(i), n)
		}
	default:
		panic(fmt.Sprintf("fill: %v", v.Type()))
	}
}

// TestOpCodecEveryField: an op with every field (and every field of its
// Segment and Block) set comes back equal, for every kind: a field added
// to master.Op and not to the codec fails here.
func TestOpCodecEveryField(t *testing.T) {
	for k := master.OpPutStart; k <= maxKind; k++ {
		var op master.Op
		n := 0
		fillAll(reflect.ValueOf(&op).Elem(), &n)
		op.Kind = k
		e, err := FromOp(&op)
		require.NoError(t, err)
		require.Equal(t, uint8(k), e.Kind)
		require.Equal(t, op.Time, e.Time)
		require.Equal(t, op.Key, e.Key)
		got, err := DecodeOp(&e)
		require.NoError(t, err)
		require.Equal(t, &op, got)
		kind, key, payload, err := EncodeOp(&op)
		require.NoError(t, err)
		require.Equal(t, e.Kind, kind)
		require.Equal(t, e.Key, key)
		require.Equal(t, e.Payload, payload)
	}
}

// TestOpCodecZero: an op with only a kind has an empty payload map and
// decodes to zero values (nil lists and pointers).
func TestOpCodecZero(t *testing.T) {
	op := &master.Op{Kind: master.OpClientExpired}
	e, err := FromOp(op)
	require.NoError(t, err)
	require.Equal(t, []byte{0x80}, e.Payload)
	got, err := DecodeOp(&e)
	require.NoError(t, err)
	require.Equal(t, op, got)
}

// opGoldenOps is one op of each kind, as the master logs them.
func opGoldenOps() []*master.Op {
	c := master.UUID{Hi: 0xc1, Lo: 2}
	t0 := time.Date(2026, 12, 1, 12, 0, 0, 0, time.UTC).UnixNano()
	seg := &alloc.Segment{ID: alloc.UUID{Hi: 0x5e, Lo: 1}, Name: "host1:12345", Base: 1 << 40, Size: 64 << 20,
		Client: c, Protocol: "tcp", TEEndpoint: "10.0.0.1:12345"}
	blk := &master.BlockMeta{BlockHashes: []uint64{0xdeadbeef, 42}, HasParent: true, ParentHash: 7,
		TokenIDs: []uint32{1, 2, 3}, BlockSize: 16, HasLora: true, LoraID: -3, LoraName: "adapter"}
	return []*master.Op{
		{Kind: master.OpMount, Time: t0, Client: c, Segments: []uint32{0}, Segment: seg},
		{Kind: master.OpPutStart, Time: t0 + 1, Key: "k1", Client: c, Size: 4096, SoftPin: true, SoftPinTTL: 30 * time.Second,
			HardPin: true, Segments: []uint32{0, 1}, Addrs: []uint64{1 << 40, 1<<41 + 4096}, Gen: 9},
		{Kind: master.OpPutEnd, Time: t0 + 2, Key: "k1", Client: c, Gen: 9, Block: blk},
		{Kind: master.OpPutRevoke, Time: t0 + 3, Key: "k2", Client: c, Gen: 10},
		{Kind: master.OpRemove, Time: t0 + 4, Key: "k1"},
		{Kind: master.OpEvict, Time: t0 + 5, Key: "k3"},
		{Kind: master.OpDiscard, Time: t0 + 6, Key: "k4"},
		{Kind: master.OpDiscardFree, Time: t0 + 7, Key: "k4", Segments: []uint32{0}, Addrs: []uint64{1<<40 + 8192}},
		{Kind: master.OpPutRelease, Time: t0 + 8, Key: "k5"},
		{Kind: master.OpDropReplica, Time: t0 + 9, Key: "k6", Segments: []uint32{1}},
		{Kind: master.OpUnmountStart, Time: t0 + 10, Client: c, Segments: []uint32{0}, Segment: seg},
		{Kind: master.OpUnmount, Time: t0 + 11, Segments: []uint32{0}},
		{Kind: master.OpClientExpired, Time: t0 + 12, Client: master.UUID{Hi: 0xc1, Lo: 3}},
		{Kind: master.OpReserve, Time: t0 + 13, Client: c, Size: 512, SoftPin: true, Segments: []uint32{2}, Addrs: []uint64{3 << 40}, ID: 5},
		{Kind: master.OpCommit, Time: t0 + 14, Key: "k7", Client: c, ID: 5, Block: &master.BlockMeta{BlockHashes: []uint64{1}}},
		{Kind: master.OpUnreserve, Time: t0 + 15, Client: c, ID: 6},
		{Kind: master.OpDropReserved, Time: t0 + 16, Segments: []uint32{2}, ID: 8},
		{Kind: master.OpClientLeft, Time: t0 + 17, Client: c},
	}
}

func opGoldenBytes(t *testing.T) []byte {
	t.Helper()
	var out []byte
	for i, op := range opGoldenOps() {
		e, err := FromOp(op)
		require.NoError(t, err)
		e.Seq, e.Term = uint64(i+1), 1
		e.Seal()
		out, err = e.MarshalMsg(out)
		require.NoError(t, err)
	}
	return out
}

// TestOpGolden decodes entries written by this format's first encoder
// (testdata/ops.golden, one per kind) and checks the encoder still writes
// the same bytes: a change of the persisted format fails here. An added
// field or kind: go test -run TestOpGolden -update-op-golden, and review.
func TestOpGolden(t *testing.T) {
	const path = "testdata/ops.golden"
	if *updateOpGolden {
		require.NoError(t, os.MkdirAll("testdata", 0o755))
		require.NoError(t, os.WriteFile(path, opGoldenBytes(t), 0o644))
	}
	b, err := os.ReadFile(path)
	require.NoError(t, err)
	want := opGoldenOps()
	kinds := map[master.OpKind]bool{}
	rest := b
	for i := 0; len(rest) > 0; i++ {
		var e Entry
		rest, err = e.UnmarshalMsg(rest)
		require.NoError(t, err)
		require.NoError(t, e.Verify())
		require.Equal(t, uint64(i+1), e.Seq)
		op, err := DecodeOp(&e)
		require.NoError(t, err)
		require.Less(t, i, len(want))
		require.Equal(t, want[i], op, "entry %d", i)
		kinds[op.Kind] = true
	}
	require.Len(t, kinds, int(maxKind), "the golden file covers every kind")
	require.True(t, bytes.Equal(b, opGoldenBytes(t)), "the encoder no longer writes %s (a format change: add fields, never change them)", path)
}

// TestOpMissingFields: a payload written before a field existed (here
// without "gen", "hard", "soft_ttl", the segment's "te" and the block's
// lora fields) decodes with zero values for them.
func TestOpMissingFields(t *testing.T) {
	p := msgp.AppendMapHeader(nil, 5)
	p = msgp.AppendString(p, "c_lo")
	p = msgp.AppendUint64(p, 2)
	p = msgp.AppendString(p, "size")
	p = msgp.AppendUint64(p, 4096)
	p = msgp.AppendString(p, "segs")
	p = msgp.AppendArrayHeader(p, 1)
	p = msgp.AppendUint32(p, 3)
	p = msgp.AppendString(p, "segment")
	p = msgp.AppendMapHeader(p, 2)
	p = msgp.AppendString(p, "name")
	p = msgp.AppendString(p, "host1")
	p = msgp.AppendString(p, "size")
	p = msgp.AppendUint64(p, 1<<20)
	p = msgp.AppendString(p, "block")
	p = msgp.AppendMapHeader(p, 1)
	p = msgp.AppendString(p, "hashes")
	p = msgp.AppendArrayHeader(p, 1)
	p = msgp.AppendUint64(p, 77)
	e := Entry{Seq: 1, Time: 5, Kind: uint8(master.OpMount), Key: "", Payload: p}
	op, err := DecodeOp(&e)
	require.NoError(t, err)
	require.Equal(t, &master.Op{Kind: master.OpMount, Time: 5, Client: master.UUID{Lo: 2}, Size: 4096, Segments: []uint32{3},
		Segment: &alloc.Segment{Name: "host1", Size: 1 << 20}, Block: &master.BlockMeta{BlockHashes: []uint64{77}}}, op)

	// Explicit nils (another encoder's way to say absent) are absent too.
	p = msgp.AppendMapHeader(nil, 2)
	p = msgp.AppendString(p, "segment")
	p = msgp.AppendNil(p)
	p = msgp.AppendString(p, "block")
	p = msgp.AppendNil(p)
	e.Payload = p
	op, err = DecodeOp(&e)
	require.NoError(t, err)
	require.Equal(t, &master.Op{Kind: master.OpMount, Time: 5}, op)
}

func TestDecodeOpErrors(t *testing.T) {
	m := func(kv ...any) []byte {
		p := msgp.AppendMapHeader(nil, uint32(len(kv)/2))
		for i := 0; i < len(kv); i += 2 {
			p = msgp.AppendString(p, kv[i].(string))
			var err error
			p, err = msgp.AppendIntf(p, kv[i+1])
			require.NoError(t, err)
		}
		return p
	}
	arr := func(n int) []byte { // an array of n zeros (one byte each)
		return append(msgp.AppendArrayHeader(nil, uint32(n)), make([]byte, n)...)
	}
	claim := func(n int) []byte { // an array header claiming n elements, and none
		return msgp.AppendArrayHeader(nil, uint32(n))
	}
	raw := func(name string, v []byte) []byte {
		p := msgp.AppendMapHeader(nil, 1)
		p = msgp.AppendString(p, name)
		return append(p, v...)
	}
	ok := m("size", uint64(1))
	for _, tc := range []struct {
		name    string
		kind    uint8
		key     string
		payload []byte
		want    error
		msg     string
	}{
		{"kind 0", 0, "", ok, ErrBadOp, "unknown kind 0"},
		{"kind past the last", uint8(maxKind) + 1, "", ok, ErrBadOp, "unknown kind"},
		{"kind 255", 255, "", ok, ErrBadOp, "unknown kind"},
		{"unknown field", 4, "k", m("size", uint64(1), "colour", "red"), ErrBadOp, `unknown field "colour"`},
		{"unknown segment field", 10, "", raw("segment", m("name", "x", "numa", int64(1))), ErrBadOp, `unknown field "numa"`},
		{"unknown block field", 2, "k", raw("block", m("hashes2", int64(1))), ErrBadOp, `unknown field "hashes2"`},
		{"too many segments", 1, "k", raw("segs", arr(MaxOpReplicas+1)), ErrBadOp, "limit"},
		{"huge address list", 1, "k", raw("addrs", claim(1<<31)), ErrBadOp, "too few bytes"},
		{"too many hashes", 2, "k", raw("block", raw("hashes", arr(MaxOpHashes+1))), ErrBadOp, "limit"},
		{"too many tokens", 2, "k", raw("block", raw("tokens", arr(MaxOpTokens+1))), ErrBadOp, "limit"},
		{"truncated list", 1, "k", raw("segs", claim(3)), ErrBadOp, "too few bytes"},
		{"wrong type", 4, "k", m("size", "big"), ErrBadOp, ""},
		{"not a map", 4, "k", msgp.AppendString(nil, "x"), ErrBadOp, ""},
		{"empty payload", 4, "k", nil, ErrBadOp, ""},
		{"trailing bytes", 4, "k", append(m("size", uint64(1)), 0xc0), ErrBadOp, "after the record"},
		{"key too long", 4, strings.Repeat("k", MaxKey+1), ok, ErrTooLarge, ""},
		{"payload too long", 4, "k", make([]byte, MaxPayload+1), ErrTooLarge, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := DecodeOp(&Entry{Seq: 9, Kind: tc.kind, Key: tc.key, Payload: tc.payload})
			require.ErrorIs(t, err, tc.want)
			require.ErrorContains(t, err, tc.msg)
		})
	}
	_, err := DecodeOp(nil)
	require.ErrorIs(t, err, ErrBadOp)
}

func TestEncodeOpErrors(t *testing.T) {
	for _, tc := range []struct {
		name string
		op   *master.Op
		want error
	}{
		{"nil", nil, ErrBadOp},
		{"kind 0", &master.Op{}, ErrBadOp},
		{"kind past the last", &master.Op{Kind: maxKind + 1}, ErrBadOp},
		{"key", &master.Op{Kind: master.OpRemove, Key: strings.Repeat("k", MaxKey+1)}, ErrTooLarge},
		{"segments", &master.Op{Kind: master.OpPutStart, Segments: make([]uint32, MaxOpReplicas+1)}, ErrTooLarge},
		{"addrs", &master.Op{Kind: master.OpPutStart, Addrs: make([]uint64, MaxOpReplicas+1)}, ErrTooLarge},
		{"hashes", &master.Op{Kind: master.OpPutEnd, Block: &master.BlockMeta{BlockHashes: make([]uint64, MaxOpHashes+1)}}, ErrTooLarge},
		{"tokens", &master.Op{Kind: master.OpPutEnd, Block: &master.BlockMeta{TokenIDs: make([]uint32, MaxOpTokens+1)}}, ErrTooLarge},
		{"payload", &master.Op{Kind: master.OpPutEnd, Block: &master.BlockMeta{LoraName: strings.Repeat("x", MaxPayload)}}, ErrTooLarge},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, _, _, err := EncodeOp(tc.op)
			require.ErrorIs(t, err, tc.want)
			_, err = FromOp(tc.op)
			require.ErrorIs(t, err, tc.want)
		})
	}
	// At the limits it encodes and decodes.
	op := &master.Op{Kind: master.OpPutStart, Key: strings.Repeat("k", MaxKey), Segments: make([]uint32, MaxOpReplicas),
		Addrs: make([]uint64, MaxOpReplicas)}
	e, err := FromOp(op)
	require.NoError(t, err)
	got, err := DecodeOp(&e)
	require.NoError(t, err)
	require.Equal(t, op, got)
}

// TestOpHoldUntil: a forced remove's hold survives the log (the field
// added after the golden file, which still decodes with a zero hold).
func TestOpHoldUntil(t *testing.T) {
	op := &master.Op{Kind: master.OpRemove, Time: 100, Key: "k", HoldUntil: 5_000_000_123}
	e, err := FromOp(op)
	require.NoError(t, err)
	got, err := DecodeOp(&e)
	require.NoError(t, err)
	assert.Equal(t, op, got)
	assert.Contains(t, string(e.Payload), "hold")
}
