package bench

import (
	"github.com/crescent-kv/crescent/engine"
	"github.com/crescent-kv/crescent/internal/fabric"
)

// FabricCalls counts crossings into libfabric per batch (protocol efa),
// for the whole process: in loopback mode the target engine's progress
// calls are included.
type FabricCalls struct {
	PerBatch float64 `json:"per_batch"` // every crossing
	Progress float64 `json:"progress"`  // progress calls: post a batch and/or read completions
	Post     float64 `json:"post"`      // progress calls that posted operations
}

func (c *TransferConfig) efaConfig(ec *engine.Config) {
	ec.EFA.Provider = c.FabricProvider
}

// streamBaseline reports whether the run compares with a raw TCP stream
// (network transports) rather than with memcpy.
func (c *TransferConfig) streamBaseline() bool {
	return c.Protocol == "tcp" || c.Protocol == "efa"
}

func (c *TransferConfig) fabricStats() fabric.Stats {
	if c.Protocol != "efa" {
		return fabric.Stats{}
	}
	return fabric.ReadStats()
}

func fabricPerBatch(c *TransferConfig, before, after fabric.Stats, batches int64) *FabricCalls {
	if c.Protocol != "efa" || batches == 0 {
		return nil
	}
	d, n := after.Sub(before), float64(batches)
	return &FabricCalls{PerBatch: float64(d.Calls) / n, Progress: float64(d.ProgressCalls) / n, Post: float64(d.PostCalls) / n}
}
