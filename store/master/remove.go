package master

import (
	"regexp"

	"github.com/crescent-kv/crescent/store/errcode"
)

// Remove deletes an object. A leased object is ErrObjectHasLease and an
// unfinished put ErrObjectReplicaBusy unless force; a hard pin does not
// protect from Remove. A forced removal of an unfinished put quarantines
// its space until the put's release time (its writer may still write).
func (m *Master) Remove(key string, force bool) error {
	if err := m.checkKey(key); err != nil {
		return err
	}
	sh := m.shardOf(key)
	sh.mu.Lock()
	defer sh.unlock()
	o := sh.get(key)
	now := m.now()
	switch {
	case o == nil:
		return errcode.New(errcode.ObjectNotFound, "key %q", key)
	case !force && !o.complete():
		return errcode.New(errcode.ObjectReplicaBusy, "key %q is still being written", key)
	case !force && o.leased(now):
		return errcode.New(errcode.ObjectHasLease, "key %q is leased", key)
	}
	return m.apply(sh, &Op{Kind: OpRemove, Time: now, Key: key}, &applyArgs{})
}

// BatchRemove is Remove for many keys.
func (m *Master) BatchRemove(keys []string, force bool) []error {
	out := make([]error, len(keys))
	for i, k := range keys {
		out[i] = m.Remove(k, force)
	}
	return out
}

// RemoveByRegex removes the complete objects whose whole key matches the
// RE2 expression re, skipping leased ones unless force, and returns how
// many it removed. Unfinished puts are never touched. A bad expression is
// ErrInvalidParams. Shards are processed one at a time.
func (m *Master) RemoveByRegex(re string, force bool) (uint64, error) {
	rx, err := regexp.Compile(`^(?:` + re + `)$`)
	if err != nil {
		return 0, errcode.New(errcode.InvalidParams, "regex: %v", err)
	}
	var n uint64
	for i := range m.shards {
		sh := &m.shards[i]
		sh.mu.Lock()
		now := m.now()
		for k, i := range sh.index {
			if o := &sh.objs[i]; o.complete() && (force || !o.leased(now)) && rx.MatchString(k) {
				if err := m.apply(sh, &Op{Kind: OpRemove, Time: now, Key: k}, &applyArgs{}); err != nil {
					sh.unlock()
					return n, err
				}
				n++
			}
		}
		sh.unlock()
	}
	return n, nil
}

// RemoveAll removes every complete object (hard-pinned ones too) that is
// not leased, or all complete objects if force, and returns how many.
// Unfinished puts are not touched. It holds every shard lock at once so
// that, when no complete object is left, it emits one EventCleared that
// no concurrent put can precede; otherwise it emits EventRemoved per key.
func (m *Master) RemoveAll(force bool) (uint64, error) {
	for i := range m.shards {
		m.shards[i].mu.Lock()
	}
	defer func() {
		for i := len(m.shards) - 1; i >= 0; i-- {
			m.shards[i].unlock()
		}
	}()
	now := m.now()
	all := true
	for i := range m.shards {
		for _, j := range m.shards[i].index {
			if o := &m.shards[i].objs[j]; o.complete() && !force && o.leased(now) {
				all = false
				break
			}
		}
	}
	var n uint64
	a := &applyArgs{quiet: all}
	for i := range m.shards {
		sh := &m.shards[i]
		for k, j := range sh.index {
			if o := &sh.objs[j]; o.complete() && (force || !o.leased(now)) {
				if err := m.apply(sh, &Op{Kind: OpRemove, Time: now, Key: k}, a); err != nil {
					return n, err
				}
				n++
			}
		}
	}
	if all && n > 0 && m.ev != nil {
		m.ev.Emit(&Event{Kind: EventCleared})
	}
	return n, nil
}
