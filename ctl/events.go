package ctl

import (
	"bufio"
	"context"
	"encoding/hex"
	"encoding/json"
	"flag"
	"fmt"
	"log/slog"
	"math"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/crescent-kv/crescent/event"
)

func init() {
	commands = append(commands, &command{
		name: "events", help: "tail a master's KV-event stream, decoded", nargs: [2]int{0, 0},
		setup: func(fs *flag.FlagSet) runFunc {
			var e eventsOpts
			fs.StringVar(&e.endpoint, "events", DefaultEvents, "the master's KV-event PUB endpoint (--kv_events_endpoint)")
			fs.StringVar(&e.replay, "replay", DefaultReplay, `its replay endpoint (--kv_events_replay_endpoint; "" = none: gaps are reported, not filled)`)
			fs.StringVar(&e.from, "replay-from", "", "first sequence number to print, caught up from the replay socket (default: the next live batch)")
			fs.StringVar(&e.topic, "topic", "", "subscription topic prefix")
			fs.IntVar(&e.count, "count", 0, "exit after this many batches (0: until interrupted)")
			return func(ctx context.Context, o *options, _ []string, stdio IO) error {
				if e.count < 0 {
					return usagef("events: --count %d: must not be negative", e.count)
				}
				if e.from != "" {
					v, err := strconv.ParseUint(e.from, 10, 64)
					if err != nil {
						return usagef("events: --replay-from %q: want a sequence number", e.from)
					}
					if e.replay == "" {
						return usagef("events: --replay-from needs --replay")
					}
					e.start = &v
				}
				return tail(ctx, o, e, stdio)
			}
		},
	})
}

type eventsOpts struct {
	endpoint, replay, from, topic string
	count                         int
	start                         *uint64
}

// tail prints batches until ctx ends or e.count were printed.
func tail(ctx context.Context, o *options, e eventsOpts, stdio IO) error {
	var (
		mu    sync.Mutex
		n     int
		werr  error
		done  = make(chan struct{})
		once  sync.Once
		w     = bufio.NewWriter(stdio.Stdout)
		ew    = stdio.Stderr
		stopF = func() { once.Do(func() { close(done) }) }
	)
	sub, err := event.Subscribe(event.SubscriberConfig{
		Sources: []event.Source{{Endpoint: e.endpoint, ReplayEndpoint: e.replay, Topic: e.topic, StartSeq: e.start}},
		OnBatch: func(d event.Delivery) {
			mu.Lock()
			defer mu.Unlock()
			if e.count > 0 && n >= e.count || werr != nil {
				return
			}
			n++
			if o.json() {
				werr = writeJSONLine(w, batchJSON(d))
			} else {
				writeBatchText(w, d)
			}
			if err := w.Flush(); err != nil && werr == nil {
				werr = err
			}
			if werr != nil || e.count > 0 && n >= e.count {
				stopF()
			}
		},
		OnGap: func(g event.Gap) {
			mu.Lock()
			defer mu.Unlock()
			fmt.Fprintf(ew, "%s: events %d..%d lost (not in the replay buffer)\n", name, g.From, g.To)
		},
		OnRestart: func(r event.Restart) {
			mu.Lock()
			defer mu.Unlock()
			fmt.Fprintf(ew, "%s: publisher restarted (seq %d after %d)\n", name, r.Seq, r.LastSeq)
		},
		OnError: func(_ string, err error) {
			if o.level <= slog.LevelWarn {
				mu.Lock()
				defer mu.Unlock()
				fmt.Fprintf(ew, "%s: events: %v\n", name, err)
			}
		},
	})
	if err != nil {
		return usagef("events: %v", err)
	}
	select {
	case <-ctx.Done():
	case <-done:
	}
	sub.Close()
	mu.Lock()
	defer mu.Unlock()
	return werr
}

type batchOut struct {
	Seq       uint64     `json:"seq"`
	Topic     string     `json:"topic,omitempty"`
	Replayed  bool       `json:"replayed,omitempty"`
	Timestamp float64    `json:"ts"`
	DPRank    *int       `json:"data_parallel_rank,omitempty"`
	Events    []eventOut `json:"events"`
	Skipped   int        `json:"skipped,omitempty"`
}

type eventOut struct {
	Type        string     `json:"type"`
	BlockHashes []string   `json:"block_hashes,omitempty"`
	Parent      string     `json:"parent_block_hash,omitempty"`
	TokenIDs    []uint32   `json:"token_ids,omitempty"`
	BlockSize   int        `json:"block_size,omitempty"`
	LoraID      *int       `json:"lora_id,omitempty"`
	LoraName    string     `json:"lora_name,omitempty"`
	Medium      string     `json:"medium,omitempty"`
	ObjectKey   string     `json:"object_key,omitempty"`
	Replicas    [][]string `json:"replicas,omitempty"`
	GroupIdx    *int       `json:"group_idx,omitempty"`
}

// hashString is a hash as indexers print it: the integer, or the bytes
// in hex.
func hashString(h event.Hash) string {
	if h.Bytes != nil {
		return "0x" + hex.EncodeToString(h.Bytes)
	}
	return "0x" + strconv.FormatUint(h.Value, 16)
}

func hashes(hs []event.Hash) []string {
	out := make([]string, len(hs))
	for i, h := range hs {
		out[i] = hashString(h)
	}
	return out
}

func eventJSON(ev event.Event) eventOut {
	out := eventOut{Type: ev.Kind().String()}
	switch e := ev.(type) {
	case *event.BlockStored:
		out.BlockHashes, out.TokenIDs, out.BlockSize = hashes(e.BlockHashes), e.TokenIDs, e.BlockSize
		out.LoraID, out.LoraName, out.Medium, out.GroupIdx = e.LoraID, e.LoraName, e.Medium, e.GroupIdx
		if e.ParentBlockHash != nil {
			out.Parent = hashString(*e.ParentBlockHash)
		}
	case *event.BlockRemoved:
		out.BlockHashes, out.Medium, out.GroupIdx = hashes(e.BlockHashes), e.Medium, e.GroupIdx
	case *event.BlockUpdate:
		out.BlockHashes, out.Medium, out.ObjectKey, out.GroupIdx = hashes(e.BlockHashes), e.Medium, e.ObjectKey, e.GroupIdx
		for _, r := range e.Replicas {
			out.Replicas = append(out.Replicas, []string{r.Medium, r.Endpoint})
		}
	}
	return out
}

func batchJSON(d event.Delivery) batchOut {
	b := batchOut{Seq: d.Seq, Topic: d.Topic, Replayed: d.Replayed, Events: []eventOut{}}
	if d.Batch != nil {
		b.Timestamp, b.DPRank, b.Skipped = d.Batch.Timestamp, d.Batch.DataParallelRank, d.Batch.Skipped
		for _, ev := range d.Batch.Events {
			b.Events = append(b.Events, eventJSON(ev))
		}
	}
	return b
}

// writeBatchText prints one line per event:
//
//	seq 3 2026-12-01T22:40:01.123Z BlockStored hashes=[0x1f] medium=cpu block_size=16 tokens=16
func writeBatchText(w *bufio.Writer, d event.Delivery) {
	b := batchJSON(d)
	ts := ""
	if sec, frac := math.Modf(b.Timestamp); b.Timestamp > 0 {
		ts = " " + time.Unix(int64(sec), int64(frac*1e9)).UTC().Format("2006-01-02T15:04:05.000Z")
	}
	head := fmt.Sprintf("seq %d%s", b.Seq, ts)
	if b.Replayed {
		head += " (replayed)"
	}
	if len(b.Events) == 0 {
		fmt.Fprintf(w, "%s (no events)\n", head)
	}
	for _, e := range b.Events {
		var f []string
		if len(e.BlockHashes) > 0 {
			f = append(f, "hashes=["+strings.Join(e.BlockHashes, " ")+"]")
		}
		if e.Parent != "" {
			f = append(f, "parent="+e.Parent)
		}
		if e.Medium != "" {
			f = append(f, "medium="+e.Medium)
		}
		if e.ObjectKey != "" {
			f = append(f, "key="+strconv.Quote(e.ObjectKey))
		}
		if e.BlockSize != 0 {
			f = append(f, "block_size="+strconv.Itoa(e.BlockSize))
		}
		if len(e.TokenIDs) > 0 {
			f = append(f, "tokens="+strconv.Itoa(len(e.TokenIDs)))
		}
		if e.LoraName != "" {
			f = append(f, "lora="+e.LoraName)
		}
		for _, r := range e.Replicas {
			f = append(f, "replica="+r[0]+"@"+r[1])
		}
		fmt.Fprintf(w, "%s %s %s\n", head, e.Type, strings.Join(f, " "))
	}
	if b.Skipped > 0 {
		fmt.Fprintf(w, "%s skipped %d events of unknown types\n", head, b.Skipped)
	}
}

func writeJSONLine(w *bufio.Writer, v any) error {
	b, err := json.Marshal(v)
	if err != nil {
		return err
	}
	w.Write(b)
	return w.WriteByte('\n')
}
