//go:build !amd64

package cxl

import "sync/atomic"

var fenceWord atomic.Uint64

// fence is a full barrier: Go's atomics are sequentially consistent.
func fence() { fenceWord.Add(1) }

const canFlush = false

func flushRange([]byte) {}
