package event

import (
	"bytes"
	"encoding/json"
	"fmt"
	"os/exec"
	"path/filepath"
	"reflect"
	"testing"
)

type pyEvent struct {
	Tag       string   `json:"tag"`
	Hashes    []uint64 `json:"hashes"`
	Parent    *uint64  `json:"parent"`
	Tokens    []uint32 `json:"tokens"`
	BlockSize int      `json:"block_size"`
	Medium    *string  `json:"medium"`
	LoraName  *string  `json:"lora_name"`
	GroupIdx  *int     `json:"group_idx"`
}

type pyResult struct {
	Seqs     []uint64  `json:"seqs"`
	Events   []pyEvent `json:"events"`
	Rejected int       `json:"rejected"`
	DP       []*int    `json:"dp"`
	Topics   []string  `json:"topics"`
	Error    string    `json:"error"`
	Replay   struct {
		Seqs   []uint64 `json:"seqs"`
		Topics []string `json:"topics"`
		End    bool     `json:"end"`
	} `json:"replay"`
}

// TestPythonConsumer runs testdata/consumer.py, a consumer written the way
// vLLM's tests and llm-d's indexer decode the stream, against a real
// publisher, in both encodings.
func TestPythonConsumer(t *testing.T) {
	py := python(t)
	for _, enc := range []Encoding{EncodingMap, EncodingArray} {
		t.Run(enc.String(), func(t *testing.T) {
			ctx := testCtx(t)
			p := newPub(t, PublisherConfig{Endpoint: "tcp://127.0.0.1:0", ReplayEndpoint: "tcp://127.0.0.1:0",
				Topic: "kv@pod-7@qwen", Encoding: enc, MaxBatchEvents: 4, DataParallelRank: Ptr(0)})
			cmd := exec.CommandContext(ctx, py, filepath.Join("testdata", "consumer.py"),
				p.Endpoint(), p.ReplayEndpoint(), "kv@")
			var stdout, stderr bytes.Buffer
			cmd.Stdout, cmd.Stderr = &stdout, &stderr
			if err := cmd.Start(); err != nil {
				t.Fatal(err)
			}
			if err := p.WaitSubscribers(ctx, 1); err != nil {
				_ = cmd.Process.Kill()
				_ = cmd.Wait()
				t.Fatal(err)
			}
			var want []pyEvent
			var evs []Event
			for i := range 10 {
				h := HashOf(uint64(1) << (i * 6))
				if i%3 == 0 {
					h = HashFromBytes(bytes.Repeat([]byte{byte(i + 1)}, 32))
				}
				s := &BlockStored{BlockHashes: []Hash{h}, TokenIDs: tokens(uint32(i*16), uint32(i*16+16)),
					BlockSize: 16, Medium: "CPU", GroupIdx: Ptr(0)}
				if i > 0 {
					s.ParentBlockHash = &evs[len(evs)-1].(*BlockStored).BlockHashes[0]
				}
				if i == 4 {
					s.LoraName = "adapter"
					s.ExtraKeys = [][]any{{"salt", 1}}
				}
				evs = append(evs, s)
				pe := pyEvent{Tag: TagBlockStored, Hashes: []uint64{h.Value}, Tokens: s.TokenIDs, BlockSize: 16,
					Medium: Ptr("CPU"), GroupIdx: Ptr(0)}
				if s.ParentBlockHash != nil {
					pe.Parent = &s.ParentBlockHash.Value
				}
				if s.LoraName != "" {
					pe.LoraName = &s.LoraName
				}
				want = append(want, pe)
			}
			// Placement updates: isolated in their own batch, which an
			// llm-d-style consumer rejects without losing anything else.
			evs = append(evs, &BlockUpdate{BlockHashes: hashes(1), Medium: "DISK"},
				&BlockUpdate{BlockHashes: hashes(64), Medium: "DISK"})
			evs = append(evs, &BlockRemoved{BlockHashes: hashes(1, 64), Medium: "CPU"}, &AllBlocksCleared{})
			want = append(want, pyEvent{Tag: TagBlockRemoved, Hashes: []uint64{1, 64}, Medium: Ptr("CPU")},
				pyEvent{Tag: TagAllBlocksCleared})
			if err := p.Publish(evs...); err != nil {
				t.Fatal(err)
			}
			if err := cmd.Wait(); err != nil {
				t.Fatalf("consumer.py: %v\n%s", err, stderr.String())
			}
			var got pyResult
			if err := json.Unmarshal(stdout.Bytes(), &got); err != nil {
				t.Fatalf("%v: %s\n%s", err, stdout.String(), stderr.String())
			}
			if got.Error != "" {
				t.Fatalf("consumer: %s", got.Error)
			}
			for i := range got.Events {
				got.Events[i].Tokens = append([]uint32{}, got.Events[i].Tokens...)
				if got.Events[i].Tag != TagBlockStored {
					got.Events[i].Tokens = nil
				}
			}
			for i := range want {
				if want[i].Tag == TagBlockStored && want[i].Tokens == nil {
					want[i].Tokens = []uint32{}
				}
			}
			if !reflect.DeepEqual(got.Events, want) {
				gj, _ := json.Marshal(got.Events)
				wj, _ := json.Marshal(want)
				t.Fatalf("events\n got %s\nwant %s", gj, wj)
			}
			if got.Rejected != 1 {
				t.Errorf("rejected batches = %d, want 1 (the BlockUpdate batch)", got.Rejected)
			}
			n := uint64(len(got.Seqs))
			if fmt.Sprint(got.Seqs) != fmt.Sprint(seqRange(0, n)) {
				t.Errorf("live seqs %v", got.Seqs)
			}
			if fmt.Sprint(got.Replay.Seqs) != fmt.Sprint(seqRange(0, n)) || !got.Replay.End {
				t.Errorf("replay %+v", got.Replay)
			}
			for _, topic := range append(got.Topics, got.Replay.Topics...) {
				if topic != "kv@pod-7@qwen" {
					t.Errorf("topic %q", topic)
				}
			}
			for _, dp := range got.DP {
				if dp == nil || *dp != 0 {
					t.Errorf("dp rank %v", dp)
				}
			}
		})
	}
}

func seqRange(from, to uint64) []uint64 {
	var out []uint64
	for s := from; s < to; s++ {
		out = append(out, s)
	}
	return out
}

// TestSubscriberAgainstPythonPublisher follows a vLLM-like publisher built
// on libzmq (testdata/vllm_publisher.py): catch-up from replay, live
// delivery, and a live message lost on purpose, filled from replay.
func TestSubscriberAgainstPythonPublisher(t *testing.T) {
	py := python(t)
	for _, array := range []bool{false, true} {
		t.Run(fmt.Sprint("array=", array), func(t *testing.T) {
			ctx := testCtx(t)
			args := []string{filepath.Join("testdata", "vllm_publisher.py")}
			if array {
				args = append(args, "--array")
			}
			cmd := exec.CommandContext(ctx, py, args...)
			stdin, err := cmd.StdinPipe()
			if err != nil {
				t.Fatal(err)
			}
			stdout, err := cmd.StdoutPipe()
			if err != nil {
				t.Fatal(err)
			}
			var stderr bytes.Buffer
			cmd.Stderr = &stderr
			if err := cmd.Start(); err != nil {
				t.Fatal(err)
			}
			defer func() {
				_ = stdin.Close()
				if err := cmd.Wait(); err != nil {
					t.Errorf("vllm_publisher.py: %v\n%s", err, stderr.String())
				}
			}()
			var eps struct{ Pub, Replay string }
			if err := json.NewDecoder(stdout).Decode(&eps); err != nil {
				t.Fatalf("%v\n%s", err, stderr.String())
			}
			c := newCollect()
			subscribe(t, c.config(Source{ID: "py", Endpoint: eps.Pub, ReplayEndpoint: eps.Replay,
				StartSeq: Ptr(uint64(0))}))
			c.waitFor(t, ctx, "the first 5 batches", func(c *collect) bool { return len(c.got) == 5 })
			// 20 more; the 4th of them is never sent live.
			if _, err := fmt.Fprintln(stdin, "more 20 3"); err != nil {
				t.Fatal(err)
			}
			c.waitFor(t, ctx, "25 batches", func(c *collect) bool { return len(c.got) == 25 })
			c.mu.Lock()
			defer c.mu.Unlock()
			checkSeqs(t, c.got, 0)
			for _, d := range c.got {
				s := d.Batch.Events[0].(*BlockStored)
				if s.BlockHashes[0].Value != 1000+d.Seq || d.Topic != "kv@py@model" || s.Medium != "GPU" ||
					*d.Batch.DataParallelRank != 0 {
					t.Fatalf("seq %d: %+v %s", d.Seq, d, dump(d.Batch))
				}
				if d.Seq == 8 && !d.Replayed {
					t.Errorf("seq 8 was never sent live but is not marked replayed")
				}
			}
			if len(c.gaps) != 0 {
				t.Errorf("gaps %v", c.gaps)
			}
			_, _ = fmt.Fprintln(stdin, "quit")
		})
	}
}
