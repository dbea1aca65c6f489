package event

import (
	"bytes"
	"encoding/hex"
	"encoding/json"
	"errors"
	"flag"
	"math"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"strings"
	"testing"

	"github.com/tinylib/msgp/msgp"
)

var update = flag.Bool("update", false, "rewrite testdata/golden from the encoder")

const goldenTS = 1700000000.5

var (
	longLora = "lora-adapter-with-a-name-longer-than-31"
	hash32   = func() []byte {
		b := make([]byte, 32)
		for i := range b {
			b[i] = byte(i)
		}
		return b
	}()
	hash8 = []byte{0xde, 0xad, 0xbe, 0xef, 0, 0, 0, 1}
)

func hashes(vs ...uint64) []Hash {
	out := make([]Hash, len(vs))
	for i, v := range vs {
		out[i] = HashOf(v)
	}
	return out
}

func tokens(lo, hi uint32) []uint32 {
	out := []uint32{}
	for t := lo; t < hi; t++ {
		out = append(out, t)
	}
	return out
}

// goldenCases mirrors testdata/msgspec_layout.py case by case.
func goldenCases() map[string]*EventBatch {
	return map[string]*EventBatch{
		"stored_minimal": {Timestamp: goldenTS, DataParallelRank: Ptr(0), Events: []Event{
			&BlockStored{BlockHashes: hashes(1), TokenIDs: []uint32{1, 2, 3}, BlockSize: 16, Medium: "GPU"},
		}},
		"stored_full": {Timestamp: goldenTS, Events: []Event{
			&BlockStored{
				BlockHashes:     hashes(math.MaxUint64, 200, 70000),
				ParentBlockHash: Ptr(HashOf(5)),
				TokenIDs:        []uint32{0, 127, 128, 255, 256, 65535, 65536, 151644},
				BlockSize:       16, LoraID: Ptr(3), Medium: "CPU", LoraName: longLora,
				ExtraKeys: [][]any{nil, {"tenant-a"},
					{"mm", 300, []byte{0, 1}, -200, 0.25, true, nil}},
				GroupIdx: Ptr(0), KVCacheSpecKind: "sliding_window", KVCacheSpecSlidingWindow: Ptr(4096),
			},
		}},
		"stored_bytes_hash": {Timestamp: goldenTS, DataParallelRank: Ptr(1), Events: []Event{
			&BlockStored{BlockHashes: []Hash{HashFromBytes(hash32)}, ParentBlockHash: Ptr(HashFromBytes(hash8)),
				TokenIDs: []uint32{}, BlockSize: 16},
		}},
		"stored_long_tokens": {Timestamp: goldenTS, DataParallelRank: Ptr(0), Events: []Event{
			&BlockStored{BlockHashes: hashes(42), ParentBlockHash: Ptr(HashOf(41)), TokenIDs: tokens(100, 117),
				BlockSize: 17, Medium: "GPU", LoraName: "a"},
		}},
		"removed": {Timestamp: goldenTS, DataParallelRank: Ptr(0), Events: []Event{
			&BlockRemoved{BlockHashes: hashes(1, 1<<63), Medium: "GPU"},
		}},
		"removed_group": {Timestamp: goldenTS, Events: []Event{
			&BlockRemoved{BlockHashes: hashes(7), GroupIdx: Ptr(2)},
		}},
		"cleared": {Timestamp: goldenTS, DataParallelRank: Ptr(0), Events: []Event{&AllBlocksCleared{}}},
		"update": {Timestamp: goldenTS, DataParallelRank: Ptr(0), Events: []Event{
			&BlockUpdate{BlockHashes: hashes(9), Medium: "CPU", ObjectKey: "obj/1",
				Replicas: []Replica{{"CPU", "tcp://10.0.0.1:7000"}, {"DISK", "file:///x"}}},
		}},
		"update_minimal": {Timestamp: goldenTS, Events: []Event{&BlockUpdate{BlockHashes: hashes(9)}}},
		"mixed": {Timestamp: 1.25, DataParallelRank: Ptr(3), Events: []Event{
			&BlockStored{BlockHashes: hashes(10, 11), ParentBlockHash: Ptr(HashOf(9)), TokenIDs: []uint32{5, 6},
				BlockSize: 1, Medium: "GPU"},
			&BlockRemoved{BlockHashes: hashes(10), Medium: "GPU"},
			&AllBlocksCleared{},
		}},
		"empty": {Timestamp: 0, Events: []Event{}},
		"vllm026_capture": {Timestamp: 1789095808.8378847, DataParallelRank: Ptr(0), Events: []Event{
			&BlockStored{BlockHashes: hashes(15760518052499183552), BlockSize: 16, Medium: "GPU",
				TokenIDs: []uint32{151644, 872, 198, 9064, 374, 279, 6722, 315, 5616, 30, 151645, 198,
					151644, 77091, 198, 151667},
				ExtraKeys: [][]any{nil}, GroupIdx: Ptr(0), KVCacheSpecKind: "full_attention"},
		}},
	}
}

func goldenPath(name string, enc Encoding) string {
	return filepath.Join("testdata", "golden", name+"."+enc.String()+".msgpack")
}

func TestGoldenFiles(t *testing.T) {
	for name, b := range goldenCases() {
		for _, enc := range []Encoding{EncodingMap, EncodingArray} {
			got, err := EncodeBatch(b, enc)
			if err != nil {
				t.Fatalf("%s/%s: %v", name, enc, err)
			}
			path := goldenPath(name, enc)
			if *update {
				if err := os.WriteFile(path, got, 0o644); err != nil {
					t.Fatal(err)
				}
				continue
			}
			want, err := os.ReadFile(path)
			if err != nil {
				t.Fatalf("%s (run go test -run TestGoldenFiles -update): %v", path, err)
			}
			if !bytes.Equal(got, want) {
				t.Errorf("%s/%s:\n got %x\nwant %x", name, enc, got, want)
			}
		}
	}
}

// TestGoldenMatchesPython checks every golden file against bytes that
// python3-msgpack packs from hand-written msgspec layouts (see
// testdata/msgspec_layout.py): the golden bytes are not only what our
// encoder happens to write.
func TestGoldenMatchesPython(t *testing.T) {
	py := python(t)
	out, err := exec.Command(py, filepath.Join("testdata", "msgspec_layout.py")).Output()
	if err != nil {
		t.Fatalf("msgspec_layout.py: %v", err)
	}
	var want map[string]string
	if err := json.Unmarshal(out, &want); err != nil {
		t.Fatal(err)
	}
	cases := goldenCases()
	if len(want) != 2*len(cases) {
		t.Fatalf("python has %d cases, Go %d", len(want), 2*len(cases))
	}
	for key, hexBytes := range want {
		name, encName, _ := strings.Cut(key, ".")
		enc, err := ParseEncoding(encName)
		if err != nil {
			t.Fatal(err)
		}
		file, err := os.ReadFile(goldenPath(name, enc))
		if err != nil {
			t.Fatal(err)
		}
		if hex.EncodeToString(file) != hexBytes {
			t.Errorf("%s: golden %x\n python %s", key, file, hexBytes)
		}
	}
}

// TestHandAssembled spells out a few payloads byte by byte.
func TestHandAssembled(t *testing.T) {
	ts := []byte{0xcb, 0x41, 0xd9, 0x54, 0xfc, 0x40, 0x20, 0x00, 0x00} // float64 1700000000.5
	if math.Float64frombits(0x41d954fc40200000) != goldenTS {
		t.Fatal("timestamp bits")
	}
	cat := func(parts ...[]byte) []byte { return bytes.Join(parts, nil) }
	str := func(s string) []byte { return append([]byte{0xa0 | byte(len(s))}, s...) }
	cases := []struct {
		name string
		enc  Encoding
		want []byte
	}{
		{"cleared", EncodingArray, cat([]byte{0x93}, ts, []byte{0x91, 0x91}, str("AllBlocksCleared"), []byte{0x00})},
		{"cleared", EncodingMap, cat([]byte{0x93}, ts, []byte{0x91, 0x81}, str("type"), str("AllBlocksCleared"), []byte{0x00})},
		{"stored_minimal", EncodingArray, cat([]byte{0x93}, ts, []byte{0x91, 0x9c}, str("BlockStored"),
			[]byte{0x91, 0x01, 0xc0, 0x93, 0x01, 0x02, 0x03, 0x10, 0xc0}, str("GPU"),
			[]byte{0xc0, 0xc0, 0xc0, 0xc0, 0xc0, 0x00})},
		{"stored_minimal", EncodingMap, cat([]byte{0x93}, ts, []byte{0x91, 0x88},
			str("type"), str("BlockStored"), str("block_hashes"), []byte{0x91, 0x01},
			str("parent_block_hash"), []byte{0xc0}, str("token_ids"), []byte{0x93, 0x01, 0x02, 0x03},
			str("block_size"), []byte{0x10}, str("lora_id"), []byte{0xc0}, str("medium"), str("GPU"),
			str("lora_name"), []byte{0xc0}, []byte{0x00})},
		{"removed", EncodingArray, cat([]byte{0x93}, ts, []byte{0x91, 0x94}, str("BlockRemoved"),
			[]byte{0x92, 0x01, 0xcf, 0x80, 0, 0, 0, 0, 0, 0, 0}, str("GPU"), []byte{0xc0, 0x00})},
	}
	golden := goldenCases()
	for _, c := range cases {
		got, err := EncodeBatch(golden[c.name], c.enc)
		if err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(got, c.want) {
			t.Errorf("%s/%s:\n got %x\nwant %x", c.name, c.enc, got, c.want)
		}
	}
}

// normalize makes decoded and source batches comparable: the decoder
// returns ints from extra keys as int64/uint64.
func normalize(b *EventBatch) *EventBatch {
	for _, ev := range b.Events {
		if s, ok := ev.(*BlockStored); ok {
			for _, k := range s.ExtraKeys {
				for i, v := range k {
					switch x := v.(type) {
					case int:
						k[i] = int64(x)
					case int64:
						if x >= 0 {
							k[i] = uint64(x)
						}
					}
					if x, ok := k[i].(int64); ok && x >= 0 {
						k[i] = uint64(x)
					}
				}
			}
		}
	}
	return b
}

func TestRoundTrip(t *testing.T) {
	for name, b := range goldenCases() {
		for _, enc := range []Encoding{EncodingMap, EncodingArray} {
			payload, err := EncodeBatch(b, enc)
			if err != nil {
				t.Fatal(err)
			}
			got, err := DecodeBatch(payload)
			if err != nil {
				t.Fatalf("%s/%s: %v", name, enc, err)
			}
			want := normalize(goldenCases()[name])
			normalize(got)
			if !reflect.DeepEqual(got, want) {
				t.Errorf("%s/%s:\n got %s\nwant %s", name, enc, dump(got), dump(want))
			}
			again, err := EncodeBatch(got, enc)
			if err != nil || !bytes.Equal(again, payload) {
				t.Errorf("%s/%s: re-encode differs (%v)", name, enc, err)
			}
		}
	}
}

func dump(b *EventBatch) string {
	s, _ := json.Marshal(b)
	var evs []string
	for _, e := range b.Events {
		j, _ := json.Marshal(e)
		evs = append(evs, e.Kind().String()+string(j))
	}
	return string(s) + " " + strings.Join(evs, " ")
}

func TestEncodeErrors(t *testing.T) {
	cases := []struct {
		name string
		b    *EventBatch
		enc  Encoding
	}{
		{"nil batch", nil, EncodingMap},
		{"bad encoding", &EventBatch{}, Encoding(9)},
		{"nil event", &EventBatch{Events: []Event{nil}}, EncodingMap},
		{"nil pointer event", &EventBatch{Events: []Event{(*BlockStored)(nil)}}, EncodingArray},
		{"bad extra key", &EventBatch{Events: []Event{&BlockStored{ExtraKeys: [][]any{{struct{}{}}}}}}, EncodingMap},
		{"empty raw", &EventBatch{Events: []Event{&BlockStored{ExtraKeys: [][]any{{msgp.Raw{}}}}}}, EncodingArray},
	}
	for _, c := range cases {
		dst := []byte("prefix")
		out, err := AppendBatch(dst, c.b, c.enc)
		if !errors.Is(err, ErrUnencodable) {
			t.Errorf("%s: err = %v, want ErrUnencodable", c.name, err)
		}
		if string(out) != "prefix" {
			t.Errorf("%s: dst modified: %q", c.name, out)
		}
	}
}

func TestEncodeAllocs(t *testing.T) {
	b := goldenCases()["mixed"]
	buf := make([]byte, 0, 4096)
	allocs := testing.AllocsPerRun(100, func() {
		var err error
		if buf, err = AppendBatch(buf[:0], b, EncodingMap); err != nil {
			t.Fatal(err)
		}
	})
	if allocs != 0 {
		t.Fatalf("AppendBatch allocates %.1f times per batch, want 0", allocs)
	}
}
