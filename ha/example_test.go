package ha_test

import (
	"bytes"
	"context"
	"fmt"
	"os"

	"github.com/crescent-kv/crescent/ha"
	"github.com/crescent-kv/crescent/ha/oplog"
	"github.com/crescent-kv/crescent/store/alloc"
	"github.com/crescent-kv/crescent/store/master"
)

// A standby replica follows a leader's log and is handed over.
func ExampleFollower() {
	ctx := context.Background()
	dir, _ := os.MkdirTemp("", "oplog")
	defer os.RemoveAll(dir)

	// The leader: a master logging to a local data directory.
	st, _ := oplog.OpenLocal(dir, oplog.LocalOptions{})
	defer st.Close()
	sink, _ := oplog.NewSink(ctx, st, oplog.SinkConfig{Term: 1})
	defer sink.Close()
	leader, _ := master.New(master.Config{OpLog: sink})
	defer leader.Close()

	// The standby: an empty, unstarted replica following the same log.
	replica, _ := master.New(master.Config{})
	defer replica.Close()
	f, _ := ha.NewFollower(st, replica, 0, ha.FollowerOptions{})
	defer f.Close()

	c := master.UUID{Hi: 1, Lo: 1}
	_ = leader.MountSegment(c, alloc.Segment{ID: master.UUID{Hi: 2, Lo: 1}, Name: "host1", Base: 1 << 40, Size: 1 << 20, Protocol: "tcp"})
	if _, err := leader.PutStart(c, "key", 4096, master.ReplicateConfig{}); err == nil {
		leader.PutEnd(c, "key", master.Memory, nil)
	}
	_ = sink.WaitDurable(ctx, sink.Appended()) // seqs 1-3: mount, put start, put end

	m, seq, err := f.Handover(ctx)
	if err != nil {
		fmt.Println(err)
		return
	}
	var a, b bytes.Buffer
	_ = leader.DumpState(&a)
	_ = m.DumpState(&b)
	fmt.Println("handed over at seq", seq, "same state:", a.String() == b.String())
	// Output: handed over at seq 3 same state: true
}
