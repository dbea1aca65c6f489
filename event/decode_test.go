package event

import (
	"errors"
	"math"
	"os"
	"path/filepath"
	"reflect"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"github.com/tinylib/msgp/msgp"

	"github.com/crescent-kv/crescent/internal/testutil"
)

// mp builds msgpack by hand for decoder inputs that our encoder never
// writes (other producers' layouts).
type mp []byte

func (m mp) arr(n uint32) mp  { return msgp.AppendArrayHeader(m, n) }
func (m mp) mapn(n uint32) mp { return msgp.AppendMapHeader(m, n) }
func (m mp) str(s string) mp  { return msgp.AppendString(m, s) }
func (m mp) u(v uint64) mp    { return msgp.AppendUint64(m, v) }
func (m mp) i(v int64) mp     { return msgp.AppendInt64(m, v) } // signed formats, as some producers do
func (m mp) f(v float64) mp   { return msgp.AppendFloat64(m, v) }
func (m mp) f32(v float32) mp { return msgp.AppendFloat32(m, v) }
func (m mp) nil() mp          { return msgp.AppendNil(m) }
func (m mp) bin(b []byte) mp  { return msgp.AppendBytes(m, b) }
func (m mp) raw(b ...byte) mp { return append(m, b...) }
func (m mp) kv(k string) mp   { return m.str(k) }
func (m mp) uints(vs ...uint64) mp {
	m = m.arr(uint32(len(vs)))
	for _, v := range vs {
		m = m.u(v)
	}
	return m
}

func TestDecodeLenient(t *testing.T) {
	cases := []struct {
		name    string
		in      mp
		want    *EventBatch
		skipped int
	}{
		{
			name: "vLLM 0.8 batch: two elements, 6-field BlockStored (no medium)",
			in: mp{}.arr(2).f(2.5).arr(1).
				arr(6).str("BlockStored").uints(1, 2).nil().uints(7, 8).u(16).nil(),
			want: &EventBatch{Timestamp: 2.5, Events: []Event{
				&BlockStored{BlockHashes: hashes(1, 2), TokenIDs: []uint32{7, 8}, BlockSize: 16}}},
		},
		{
			name: "8-element legacy array with signed ints and dp rank",
			in: mp{}.arr(3).f(1).arr(2).
				arr(8).str("BlockStored").arr(1).i(300).i(299).arr(1).i(5).i(16).nil().str("GPU").nil().
				arr(3).str("BlockRemoved").arr(1).i(300).str("GPU").
				i(2),
			want: &EventBatch{Timestamp: 1, DataParallelRank: Ptr(2), Events: []Event{
				&BlockStored{BlockHashes: hashes(300), ParentBlockHash: Ptr(HashOf(299)), TokenIDs: []uint32{5},
					BlockSize: 16, Medium: "GPU"},
				&BlockRemoved{BlockHashes: hashes(300), Medium: "GPU"}}},
		},
		{
			name: "map batch, float32 ts, map events in odd key order with unknown keys",
			in: mp{}.mapn(3).kv("events").arr(1).
				mapn(6).kv("medium").str("CPU").kv("locality").str("LOCAL").kv("block_hashes").uints(9).
				kv("type").str("BlockRemoved").kv("group_idx").u(1).kv("event_version").u(1).
				kv("data_parallel_rank").u(4).kv("ts").f32(0.5),
			want: &EventBatch{Timestamp: 0.5, DataParallelRank: Ptr(4), Events: []Event{
				&BlockRemoved{BlockHashes: hashes(9), Medium: "CPU", GroupIdx: Ptr(1)}}},
		},
		{
			name: "hash forms: negative int, short bytes, string, extra trailing batch element",
			in: mp{}.arr(4).f(1).arr(1).
				arr(2).str("BlockRemoved").arr(3).i(-1).bin([]byte{1, 2, 3}).str("ab").
				nil().str("future"),
			want: &EventBatch{Timestamp: 1, Events: []Event{
				&BlockRemoved{BlockHashes: []Hash{HashOf(math.MaxUint64), {Value: 0x010203, Bytes: []byte{1, 2, 3}},
					{Value: 0x6162, Bytes: []byte("ab")}}}}},
		},
		{
			name: "unknown tags and shapes are skipped",
			in: mp{}.arr(3).f(1).arr(6).
				arr(3).str("BlockMoved").u(1).arr(1).u(2).
				mapn(2).kv("type").str("Future").kv("x").arr(0).
				mapn(1).kv("event_type").str("migrated").
				u(7).
				arr(0).
				arr(1).str("AllBlocksCleared").
				u(0),
			want:    &EventBatch{Timestamp: 1, DataParallelRank: Ptr(0), Events: []Event{&AllBlocksCleared{}}},
			skipped: 5,
		},
		{
			name: "Mooncake RFC 1527 map events, integer ms timestamp",
			in: mp{}.arr(3).i(1700000000123).arr(3).
				mapn(19).kv("event_id").u(41).kv("timestamp").i(1700000000123).kv("event_type").str("stored").
				kv("type").str("BlockStored").kv("model_name").str("qwen").kv("block_size").u(16).
				kv("additional_salt").nil().kv("lora_name").nil().kv("tenant_id").str("default").
				kv("backend_id").str("mc-1").kv("medium").str("cpu").kv("dp_rank").u(0).
				kv("group_id").nil().kv("object_key").str("k/1").kv("seq_hashes").uints(5, 6).
				kv("block_hashes").arr(0).kv("base_block_idx").nil().kv("parent_hash").u(4).
				kv("token_ids").nil().
				mapn(5).kv("event_type").str("removed").kv("medium").str("disk").kv("block_hashes").uints(5).
				kv("object_key").str("k/1").kv("event_id").u(42).
				mapn(2).kv("event_type").str("cleared").kv("tenant_id").str("t").
				u(0),
			want: &EventBatch{Timestamp: 1700000000.123, DataParallelRank: Ptr(0), Events: []Event{
				&BlockStored{BlockHashes: hashes(5, 6), ParentBlockHash: Ptr(HashOf(4)), BlockSize: 16, Medium: "cpu",
					RFC: &RFCInfo{EventID: 41, TimestampMs: 1700000000123, ModelName: "qwen", TenantID: "default",
						BackendID: "mc-1", ObjectKey: "k/1", DPRank: Ptr(0)}},
				&BlockRemoved{BlockHashes: hashes(5), Medium: "disk", RFC: &RFCInfo{EventID: 42, ObjectKey: "k/1"}},
				&AllBlocksCleared{RFC: &RFCInfo{TenantID: "t"}},
			}},
		},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			got, err := DecodeBatch(c.in)
			if err != nil {
				t.Fatal(err)
			}
			if got.Skipped != c.skipped {
				t.Errorf("Skipped = %d, want %d", got.Skipped, c.skipped)
			}
			got.Skipped = 0
			if !reflect.DeepEqual(got, c.want) {
				t.Errorf("\n got %s\nwant %s", dump(got), dump(c.want))
			}
		})
	}
}

func TestDecodeErrors(t *testing.T) {
	valid, err := EncodeBatch(goldenCases()["mixed"], EncodingArray)
	if err != nil {
		t.Fatal(err)
	}
	cases := []struct {
		name string
		in   []byte
	}{
		{"empty", nil},
		{"not an array", mp{}.u(1)},
		{"one element", mp{}.arr(1).f(1)},
		{"string timestamp", mp{}.arr(2).str("x").arr(0)},
		{"events not an array", mp{}.arr(2).f(1).u(3)},
		{"truncated", valid[:len(valid)-3]},
		{"trailing bytes", append(append([]byte{}, valid...), 0xc0)},
		{"huge array header", mp{}.arr(2).f(1).raw(0xdd, 0xff, 0xff, 0xff, 0xff).u(1)},
		{"huge token list", mp{}.arr(2).f(1).arr(1).arr(5).str("BlockStored").arr(0).nil().raw(0xdd, 0xff, 0xff, 0xff, 0xff).u(1)},
		{"short BlockStored", mp{}.arr(2).f(1).arr(1).arr(4).str("BlockStored").arr(0).nil().arr(0)},
		{"negative token", mp{}.arr(2).f(1).arr(1).arr(5).str("BlockStored").arr(0).nil().arr(1).i(-3).u(16)},
		{"token over uint32", mp{}.arr(2).f(1).arr(1).arr(5).str("BlockStored").arr(0).nil().arr(1).u(1 << 33).u(16)},
		{"hash is a map", mp{}.arr(2).f(1).arr(1).arr(2).str("BlockRemoved").arr(1).mapn(0)},
		{"map BlockStored without hashes", mp{}.arr(2).f(1).arr(1).mapn(1).kv("type").str("BlockStored")},
		{"medium is an int", mp{}.arr(2).f(1).arr(1).arr(3).str("BlockRemoved").arr(0).u(1)},
		{"map batch without events", mp{}.mapn(1).kv("ts").f(1)},
	}
	for _, c := range cases {
		if _, err := DecodeBatch(c.in); !errors.Is(err, ErrMalformed) {
			t.Errorf("%s: err = %v, want ErrMalformed", c.name, err)
		}
	}
}

func TestDecodeAllocs(t *testing.T) {
	b := &EventBatch{Timestamp: 1, DataParallelRank: Ptr(0)}
	for i := range 64 {
		b.Events = append(b.Events, &BlockStored{BlockHashes: hashes(uint64(i) + 1000), ParentBlockHash: Ptr(HashOf(uint64(i))),
			TokenIDs: tokens(1000, 1016), BlockSize: 16, Medium: "GPU"})
	}
	payload, err := EncodeBatch(b, EncodingMap)
	if err != nil {
		t.Fatal(err)
	}
	allocs := testing.AllocsPerRun(50, func() {
		if _, err := DecodeBatch(payload); err != nil {
			t.Fatal(err)
		}
	})
	// batch, events slice, BlockStored slab, hash slab, token slab, int slab.
	if allocs > 8 {
		t.Fatalf("DecodeBatch of 64 events allocates %.0f times, want <= 8", allocs)
	}
}

func FuzzDecodeBatch(f *testing.F) {
	files, _ := filepath.Glob(filepath.Join("testdata", "golden", "*.msgpack"))
	for _, path := range files {
		b, err := os.ReadFile(path)
		if err != nil {
			f.Fatal(err)
		}
		f.Add(b)
	}
	f.Add([]byte(mp{}.arr(3).i(1700000000123).arr(1).mapn(2).kv("event_type").str("stored").kv("seq_hashes").uints(1).u(0)))
	f.Add([]byte(mp{}.mapn(2).kv("ts").f(1).kv("events").arr(1).arr(2).str("BlockRemoved").arr(1).bin([]byte{1})))
	f.Fuzz(func(t *testing.T, in []byte) {
		b, err := DecodeBatch(in)
		if err != nil {
			if !errors.Is(err, ErrMalformed) {
				t.Fatalf("error does not wrap ErrMalformed: %v", err)
			}
			return
		}
		for _, enc := range []Encoding{EncodingMap, EncodingArray} {
			enc1, err := EncodeBatch(b, enc)
			if err != nil {
				// Generic extra-key values (extensions, timestamps) have
				// no encoding here; anything else must encode.
				if !errors.Is(err, ErrUnencodable) {
					t.Fatal(err)
				}
				continue
			}
			b2, err := DecodeBatch(enc1)
			if err != nil {
				t.Fatalf("re-decode of our own encoding: %v", err)
			}
			enc2, err := EncodeBatch(b2, enc)
			if err != nil || string(enc1) != string(enc2) {
				t.Fatalf("encode/decode not stable (%v):\n%x\n%x", err, enc1, enc2)
			}
		}
	})
}

// TestDecodeExpansionBounded: a batch announcing a million events, one
// BlockStored and the rest one-byte nils (skipped), decodes without
// sizing anything by the announced count (which made 160 bytes of slab
// per byte of message); and a list of one-byte hashes (32 bytes each
// decoded) past the decode budget is refused before it is allocated.
func TestDecodeExpansionBounded(t *testing.T) {
	const n = 1 << 20
	in := mp{}.arr(2).f(1).arr(n).arr(5).str("BlockStored").arr(0).nil().arr(0).u(16)
	for range n - 1 {
		in = in.nil()
	}
	var b *EventBatch
	var err error
	alloc := testutil.Allocated(func() { b, err = DecodeBatch(in) })
	require.NoError(t, err)
	require.Len(t, b.Events, 1)
	require.Equal(t, n-1, b.Skipped)
	assert.Less(t, alloc, uint64(2*len(in)), "%d bytes decoded with %d allocated", len(in), alloc)

	const h = 4 << 20 // 128 MB of Hash for 4 MB of message
	in = mp{}.arr(2).f(1).arr(1).arr(2).str("BlockRemoved").arr(h)
	for range h {
		in = in.u(1)
	}
	alloc = testutil.Allocated(func() { _, err = DecodeBatch(in) })
	require.ErrorIs(t, err, ErrMalformed)
	require.ErrorContains(t, err, "times its size")
	assert.Less(t, alloc, uint64(len(in)), "%d bytes refused with %d allocated", len(in), alloc)
}
