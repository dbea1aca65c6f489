package main

import (
	"sync"
	"sync/atomic"
)

// handleTable maps handles to objects. Handles count up from 1 and are
// never reused, so a stale handle cannot name a newer object.
type handleTable struct {
	next atomic.Uint64
	m    sync.Map // uint64 -> any
}

var handles handleTable

func (t *handleTable) add(v any) uint64 {
	h := t.next.Add(1)
	t.m.Store(h, v)
	return h
}

// lookup returns the object of kind T under h.
func lookup[T any](t *handleTable, h uint64) (T, bool) {
	v, ok := t.m.Load(h)
	if !ok {
		var zero T
		return zero, false
	}
	x, ok := v.(T)
	return x, ok
}

// take removes and returns the object of kind T under h; of two racing
// callers exactly one gets it.
func take[T any](t *handleTable, h uint64) (T, bool) {
	var zero T
	v, ok := t.m.Load(h)
	if !ok {
		return zero, false
	}
	x, ok := v.(T)
	if !ok {
		return zero, false
	}
	if !t.m.CompareAndDelete(h, v) {
		return zero, false
	}
	return x, true
}
