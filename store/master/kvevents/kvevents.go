package kvevents

import (
	"strconv"
	"strings"
	"sync/atomic"

	"github.com/crescent-kv/crescent/event"
	"github.com/crescent-kv/crescent/store/master"
)

// Bridge turns the master's events into vLLM-compatible KV events on a
// publisher: BlockStored at PutEnd, BlockRemoved at Remove, eviction and
// loss of the last replica, AllBlocksCleared at RemoveAll.
//
// The block hashes come from the BlockMeta the writer gave PutEnd (the
// inference engine's own hashes, parent, token ids, block size, lora), so
// an indexer can index pooled blocks exactly. Without one, the key itself
// is parsed as the reference does (a whole decimal u64, or 0x-prefixed
// hex); a key that parses to neither produces no event and is counted.
//
// Emit never waits under the DropOldest policy (the master's default):
// publishing never slows or fails a Put, and what a full queue drops is
// counted by the publisher. Under the Block policy the calls that emitted
// (a PutEnd, a Remove, an eviction round) wait for queue room, outside
// the master's shard locks, so Gets, PutStarts and other keys' work go on.
type Bridge struct {
	pub      *event.Publisher
	unparsed atomic.Uint64
	failed   atomic.Uint64
}

// New wires a publisher to the master (pass it as Config.Events).
func New(p *event.Publisher) *Bridge { return &Bridge{pub: p} }

// Unparsed counts objects without block metadata whose key is not a
// hash, for which no event was sent.
func (k *Bridge) Unparsed() uint64 { return k.unparsed.Load() }

// Failed counts events the publisher refused (closed, or invalid).
func (k *Bridge) Failed() uint64 { return k.failed.Load() }

// Emit implements master.EventSink.
func (k *Bridge) Emit(e *master.Event) {
	var ev event.Event
	switch e.Kind {
	case master.EventCleared:
		ev = &event.AllBlocksCleared{}
	case master.EventStored:
		hashes, ok := blockHashes(e)
		if !ok {
			k.unparsed.Add(1)
			return
		}
		st := &event.BlockStored{BlockHashes: hashes, Medium: medium(e.Replicas)}
		if b := e.Block; b != nil {
			st.TokenIDs = b.TokenIDs
			st.BlockSize = int(b.BlockSize)
			st.LoraName = b.LoraName
			if b.HasParent {
				h := event.HashOf(b.ParentHash)
				st.ParentBlockHash = &h
			}
			if b.HasLora {
				id := int(b.LoraID)
				st.LoraID = &id
			}
		}
		ev = st
	case master.EventRemoved:
		hashes, ok := blockHashes(e)
		if !ok {
			k.unparsed.Add(1)
			return
		}
		ev = &event.BlockRemoved{BlockHashes: hashes, Medium: medium(e.Replicas)}
	default:
		return
	}
	if err := k.pub.Publish(ev); err != nil {
		k.failed.Add(1)
	}
}

func blockHashes(e *master.Event) ([]event.Hash, bool) {
	if e.Block != nil && len(e.Block.BlockHashes) > 0 {
		out := make([]event.Hash, len(e.Block.BlockHashes))
		for i, h := range e.Block.BlockHashes {
			out[i] = event.HashOf(h)
		}
		return out, true
	}
	h, ok := ParseKeyHash(e.Key)
	if !ok {
		return nil, false
	}
	return []event.Hash{event.HashOf(h)}, true
}

// ParseKeyHash reads a block hash out of an object key the way the
// reference does: the whole key as a decimal u64, or as hex after 0x/0X.
func ParseKeyHash(key string) (uint64, bool) {
	if rest, ok := strings.CutPrefix(key, "0x"); ok {
		v, err := strconv.ParseUint(rest, 16, 64)
		return v, err == nil && rest != ""
	}
	if rest, ok := strings.CutPrefix(key, "0X"); ok {
		v, err := strconv.ParseUint(rest, 16, 64)
		return v, err == nil && rest != ""
	}
	if key == "" || key[0] == '+' || key[0] == '-' {
		return 0, false
	}
	v, err := strconv.ParseUint(key, 10, 64)
	return v, err == nil
}

// medium names where the replicas live, in vLLM's vocabulary: CPU for
// memory replicas, DISK when only disk replicas exist.
func medium(rs []master.Replica) string {
	for _, r := range rs {
		if r.Type == master.Memory {
			return "CPU"
		}
	}
	if len(rs) > 0 {
		return "DISK"
	}
	return "CPU"
}
