package event_test

import (
	"context"
	"fmt"
	"time"

	"github.com/crescent-kv/crescent/event"
)

func Example() {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()

	pub, err := event.NewPublisher(event.PublisherConfig{
		Endpoint:       "tcp://127.0.0.1:0", // port 0: any free port
		Mode:           event.ModeBind,
		ReplayEndpoint: "tcp://127.0.0.1:0",
		Topic:          "kv@pod-1@qwen",
		Overflow:       event.DropOldest, // never make the caller wait
	})
	if err != nil {
		panic(err)
	}
	defer pub.Close(ctx)

	got := make(chan event.Delivery, 1)
	sub, err := event.Subscribe(event.SubscriberConfig{
		Sources: []event.Source{{
			ID:             "pod-1",
			Endpoint:       pub.Endpoint(),
			ReplayEndpoint: pub.ReplayEndpoint(),
			StartSeq:       event.Ptr(uint64(0)), // catch up from the first batch
		}},
		OnBatch: func(d event.Delivery) { got <- d },
		OnGap:   func(g event.Gap) { fmt.Println("lost", g.From, "to", g.To) },
	})
	if err != nil {
		panic(err)
	}
	defer sub.Close()

	if err := pub.Publish(&event.BlockStored{
		BlockHashes: []event.Hash{event.HashOf(42)},
		TokenIDs:    []uint32{1, 2, 3, 4},
		BlockSize:   4,
		Medium:      "CPU",
	}); err != nil {
		panic(err)
	}
	d := <-got
	ev := d.Batch.Events[0].(*event.BlockStored)
	fmt.Println(d.Publisher, d.Topic, d.Seq, ev.Kind(), ev.BlockHashes[0].Value, ev.Medium)
	// Output: pod-1 kv@pod-1@qwen 0 BlockStored 42 CPU
}

func ExampleEncodeBatch() {
	b := &event.EventBatch{
		Timestamp:        1.5,
		DataParallelRank: event.Ptr(0),
		Events:           []event.Event{&event.BlockRemoved{BlockHashes: []event.Hash{event.HashOf(7)}, Medium: "GPU"}},
	}
	legacy, _ := event.EncodeBatch(b, event.EncodingArray)
	fmt.Printf("%x\n", legacy)
	// Output: 93cb3ff80000000000009194ac426c6f636b52656d6f7665649107a3475055c000
}
