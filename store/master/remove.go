package master

import (
	"errors"
	"fmt"
	"regexp"
	"regexp/syntax"
	"strconv"
	"strings"
	"unicode/utf8"

	"github.com/crescent-kv/crescent/store/errcode"
)

// remove is Remove without the invalidation barrier.
func (m *Master) remove(key string, force bool) error {
	if err := m.checkKey(key); err != nil {
		return err
	}
	defer m.flushEvents() // after the unlock
	sh, h := m.locate(key)
	sh.mu.Lock()
	defer sh.unlock()
	o := sh.get(key, h)
	now := m.now()
	switch {
	case o == nil:
		return errcode.New(errcode.ObjectNotFound, "key %q", key)
	case !force && !o.complete():
		return errcode.New(errcode.ObjectReplicaBusy, "key %q is still being written", key)
	case !force && o.leased(now):
		return errcode.New(errcode.ObjectHasLease, "key %q is leased", key)
	}
	return m.apply(sh, h, &Op{Kind: OpRemove, Time: now, Key: key}, &applyArgs{})
}

// Remove deletes an object. A leased object is ErrObjectHasLease and an
// unfinished put ErrObjectReplicaBusy unless force; a hard pin does not
// protect from Remove. A forced removal of an unfinished put quarantines
// its space until the put's release time (its writer may still write),
// of a leased object until the lease ends (its readers may still read).
// Like every remove it answers once the subscribed hot caches dropped the
// object (or InvalidationTTL passed: see invBarrier).
func (m *Master) Remove(key string, force bool) error {
	err := m.remove(key, force)
	if err == nil {
		m.invBarrier()
	}
	return err
}

// BatchRemove is Remove for many keys.
func (m *Master) BatchRemove(keys []string, force bool) []error {
	out := make([]error, len(keys))
	removed := false
	for i, k := range keys {
		out[i] = m.remove(k, force)
		removed = removed || out[i] == nil
	}
	if removed {
		m.invBarrier()
	}
	return out
}

// Bounds of RemoveByRegex's expression: its length, and the size of the
// program it compiles to ((.*){1000} is 11 bytes but 4005 instructions,
// and matching costs instructions times key length per key).
const (
	MaxRegexLen   = 1024
	MaxRegexInsts = 2048
)

// RemoveByRegex removes the complete objects whose whole key matches the
// RE2 expression re, skipping leased ones unless force, and returns how
// many it removed. Unfinished puts are never touched. An expression that
// is invalid, longer than MaxRegexLen or compiling to more than
// MaxRegexInsts instructions is ErrInvalidParams (errors quote at most the
// first 64 bytes of it). Keys are matched outside the shard locks (a
// snapshot per shard; matches are re-checked under the lock before they
// go), and when the work exceeds Config.RegexBudget it stops with
// ErrRPCTimeout and the count removed so far. The next call starts at the
// shard where it stopped (wrapping around), so calling it again goes on
// instead of matching the same shards again.
func (m *Master) RemoveByRegex(re string, force bool) (uint64, error) {
	rx, err := compileKeyRegex(re)
	if err != nil {
		return 0, err
	}
	start := m.now()
	over := func() bool { return m.now()-start > int64(m.cfg.RegexBudget) }
	defer m.invBarrier()
	return m.removeMatching(rx.MatchString, force, over)
}

// compileKeyRegex compiles re to match whole keys, within the bounds.
func compileKeyRegex(re string) (*regexp.Regexp, error) {
	if len(re) > MaxRegexLen {
		return nil, errcode.New(errcode.InvalidParams, "regex of %d bytes exceeds %d: %s", len(re), MaxRegexLen, clip(re))
	}
	// Parse it alone first: wrapped, "a)|(b" would parse as something else.
	p, err := syntax.Parse(re, syntax.Perl)
	if err != nil {
		var se *syntax.Error
		if errors.As(err, &se) {
			return nil, errcode.New(errcode.InvalidParams, "regex: %s: %s", se.Code, clip(se.Expr))
		}
		return nil, errcode.New(errcode.InvalidParams, "regex %s does not parse", clip(re))
	}
	prog, err := syntax.Compile(p.Simplify())
	if err != nil {
		return nil, errcode.New(errcode.InvalidParams, "regex %s does not compile", clip(re))
	}
	if n := len(prog.Inst); n > MaxRegexInsts {
		return nil, errcode.New(errcode.InvalidParams, "regex %s compiles to %d instructions, more than %d", clip(re), n, MaxRegexInsts)
	}
	rx, err := regexp.Compile(`^(?:` + re + `)$`)
	if err != nil {
		return nil, errcode.New(errcode.InvalidParams, "regex %s does not compile", clip(re))
	}
	return rx, nil
}

// clip quotes at most the first 64 bytes of s, for error messages.
func clip(s string) string {
	const n = 64
	if len(s) <= n {
		return strconv.Quote(s)
	}
	cut := n
	for cut > 0 && !utf8.RuneStart(s[cut]) {
		cut--
	}
	return fmt.Sprintf("%s... (%d bytes)", strconv.Quote(s[:cut]), len(s))
}

// removeMatching removes, shard by shard, the complete objects whose key
// match accepts (not leased unless force). match runs outside the shard
// lock, on a snapshot of the shard's keys; a key it accepts is re-checked
// under the lock. over, when not nil, is asked every few keys whether to
// stop (ErrRPCTimeout); such a walk starts where the last one stopped.
func (m *Master) removeMatching(match func(string) bool, force bool, over func() bool) (uint64, error) {
	var n uint64
	var keys, hit []string
	from := 0
	if over != nil {
		from = int(m.regexFrom.Load()) % len(m.shards)
	}
	stop := func(i int) error {
		m.regexFrom.Store(uint32(i))
		return errcode.New(errcode.RPCTimeout, "stopped after removing %d keys: over the time budget of %v; run it again to go on", n, m.cfg.RegexBudget)
	}
	for x := range m.shards {
		i := (from + x) % len(m.shards)
		if over != nil && over() {
			return n, stop(i)
		}
		sh := &m.shards[i]
		keys = keys[:0]
		sh.mu.Lock()
		now := m.now()
		sh.each(func(k string, o *object) bool {
			if o.complete() && (force || !o.leased(now)) {
				keys = append(keys, k)
			}
			return true
		})
		sh.unlock()
		hit = hit[:0]
		for j, k := range keys {
			if over != nil && j%64 == 63 && over() {
				return n, stop(i)
			}
			if match(k) {
				hit = append(hit, strings.Clone(k)) // the op outlives the arena's chunk
			}
		}
		if len(hit) == 0 {
			continue
		}
		sh.mu.Lock()
		now = m.now()
		var err error
		for _, k := range hit {
			h := m.hash(k)
			if o := sh.get(k, h); o != nil && o.complete() && (force || !o.leased(now)) {
				if err = m.apply(sh, h, &Op{Kind: OpRemove, Time: now, Key: k}, &applyArgs{}); err != nil {
					break
				}
				n++
			}
		}
		sh.unlock()
		m.flushEvents()
		if err != nil {
			return n, err
		}
	}
	clear(keys[:cap(keys)])
	return n, nil
}

// RemoveAll removes every complete object (hard-pinned ones too) that is
// not leased, or all complete objects if force, and returns how many.
// Unfinished puts are not touched. When it will leave no complete object
// it holds every shard lock at once, so that it can emit one EventCleared
// that no concurrent put can precede; otherwise it removes shard by shard
// (as RemoveByRegex, without a budget), with EventRemoved per key.
func (m *Master) RemoveAll(force bool) (uint64, error) {
	defer m.invBarrier()
	defer m.flushEvents() // after the unlocks
	for i := range m.shards {
		m.shards[i].mu.Lock()
	}
	locked := true
	unlockAll := func() {
		if locked {
			for i := len(m.shards) - 1; i >= 0; i-- {
				m.shards[i].unlock()
			}
			locked = false
		}
	}
	defer unlockAll()
	now := m.now()
	all := true
	for i := range m.shards {
		m.shards[i].each(func(_ string, o *object) bool {
			all = !(o.complete() && !force && o.leased(now))
			return all
		})
		if !all {
			break
		}
	}
	if !all {
		unlockAll()
		return m.removeMatching(func(string) bool { return true }, force, nil)
	}
	var n uint64
	a := &applyArgs{quiet: true}
	for i := range m.shards {
		sh := &m.shards[i]
		var err error
		sh.each(func(k string, o *object) bool {
			if o.complete() {
				if err = m.apply(sh, m.hash(k), &Op{Kind: OpRemove, Time: now, Key: strings.Clone(k)}, a); err != nil {
					return false
				}
				n++
			}
			return true
		})
		if err != nil {
			return n, err
		}
	}
	if n > 0 {
		m.emit(&applyArgs{}, &Event{Kind: EventCleared})
	}
	return n, nil
}
