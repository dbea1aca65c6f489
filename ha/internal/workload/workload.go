// Package workload drives a master through a random mix of every kind of
// operation, for the tests of the ha packages (replay, snapshots, the
// follower): one workload, so that what they cover stays the same.
package workload

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"

	"github.com/crescent-kv/crescent/internal/clock"
	"github.com/crescent-kv/crescent/store/alloc"
	"github.com/crescent-kv/crescent/store/errcode"
	"github.com/crescent-kv/crescent/store/master"
)

// Drive runs a random mix of every kind of operation through m's public
// API: puts finished, revoked, abandoned and taken over, removes of every
// kind, eviction, reservations, mounts, unmounts, expiry and remounts,
// with the fake clock moving. Worker w uses its own clients, segments and
// keys, so several workers can run at once on one master. Failures are
// reported with assert (Drive may run off the test goroutine) and end the
// run. checkpoint, when set, runs every 500 steps.
func Drive(t testing.TB, m *master.Master, clk *clock.Fake, w, seed uint64, steps int, checkpoint func()) {
	r := rand.New(rand.NewPCG(seed, seed+1))
	cl := func(n uint64) master.UUID { return master.UUID{Hi: 0xc1 + w, Lo: n} }
	clients := []master.UUID{cl(1), cl(2), cl(3), cl(4)}
	segsOf := map[master.UUID][]alloc.Segment{}
	alive := map[master.UUID]bool{}
	nseg := 0
	mount := func(c master.UUID) bool {
		nseg++
		s := alloc.Segment{ID: master.UUID{Hi: 0x5e00 + w, Lo: uint64(nseg)}, Name: fmt.Sprintf("w%d-host%d", w, c.Lo),
			Base: uint64(nseg) << 40, Size: uint64(256+r.IntN(768)) << 10, Protocol: "tcp", TEEndpoint: fmt.Sprintf("10.0.%d.%d:1", w, c.Lo)}
		if !assert.NoError(t, m.MountSegment(c, s)) {
			return false
		}
		s.Client = c
		segsOf[c] = append(segsOf[c], s)
		alive[c] = true
		return true
	}
	for _, c := range clients[:3] {
		if !mount(c) {
			return
		}
	}
	key := func() string { return fmt.Sprintf("w%d-k%03d", w, r.IntN(300)) }
	type put struct {
		c   master.UUID
		k   string
		gen uint64
	}
	var pending []put
	config := func() master.ReplicateConfig {
		rc := master.ReplicateConfig{Replicas: 1 + r.IntN(3)}
		switch r.IntN(10) {
		case 0:
			rc.SoftPin = true
			if r.IntN(2) == 0 {
				rc.SoftPinTTL = time.Duration(1+r.IntN(60)) * time.Second
			}
		case 1:
			rc.HardPin = true
		case 2:
			rc.Preferred = []string{fmt.Sprintf("w%d-host%d", w, 1+r.IntN(4))}
		}
		return rc
	}
	block := func() *master.BlockMeta {
		b := &master.BlockMeta{BlockHashes: []uint64{r.Uint64()}}
		if r.IntN(3) == 0 {
			b.HasParent, b.ParentHash, b.TokenIDs, b.BlockSize = true, r.Uint64(), []uint32{r.Uint32(), r.Uint32()}, 16
		}
		if r.IntN(5) == 0 {
			b.HasLora, b.LoraID, b.LoraName = true, r.Int64(), "lora"
		}
		return b
	}
	type held struct {
		c  master.UUID
		id uint64
	}
	var resv []held
	for step := range steps {
		if checkpoint != nil && step%500 == 0 {
			checkpoint()
		}
		c := clients[r.IntN(len(clients))]
		if r.IntN(100) < 12 {
			switch x := r.IntN(5); {
			case x < 2:
				res := m.Reserve(c, master.ReserveSpec{Size: uint64(1 + r.IntN(16<<10)), Config: config(), Count: 1 + r.IntN(3)})
				for _, rv := range res.Reservations {
					resv = append(resv, held{c, rv.ID})
				}
			case x < 4 && len(resv) > 0:
				i := r.IntN(len(resv))
				h := resv[i]
				by := h.c
				if r.IntN(10) == 0 {
					by = clients[r.IntN(len(clients))]
				}
				err := m.Commit(by, []master.CommitItem{{Key: key(), ID: h.id, Block: block()}})[0]
				if err == nil || errors.Is(err, errcode.ErrReplicaIsGone) {
					resv = slices.Delete(resv, i, i+1)
				}
			case len(resv) > 0:
				i := r.IntN(len(resv))
				m.Unreserve(resv[i].c, []uint64{resv[i].id})
				resv = slices.Delete(resv, i, i+1)
			}
			continue
		}
		switch n := r.IntN(100); {
		case n < 25:
			k := key()
			if _, gen, err := m.PutStartGen(c, k, uint64(1+r.IntN(16<<10)), config()); err == nil {
				pending = append(pending, put{c, k, gen})
			}
		case n < 50:
			if len(pending) > 0 {
				i := r.IntN(len(pending))
				p := pending[i]
				pending = slices.Delete(pending, i, i+1)
				gen := p.gen
				switch r.IntN(6) {
				case 0:
					gen = 0
				case 1:
					gen = p.gen + 1
				}
				if r.IntN(8) == 0 {
					m.PutRevokeGen(p.c, p.k, gen, master.Memory)
				} else if r.IntN(10) != 0 {
					m.PutEndGen(p.c, p.k, gen, master.Memory, block())
				}
			}
		case n < 60:
			m.GetReplicaList(key())
		case n < 65:
			m.ExistKey(key(), r.IntN(2) == 0)
		case n < 72:
			m.Remove(key(), r.IntN(3) == 0)
		case n < 73:
			m.BatchRemove([]string{key(), key()}, false)
		case n < 74:
			m.RemoveByRegex(fmt.Sprintf("w%d-k%d.*", w, r.IntN(3)), r.IntN(2) == 0)
		case n < 75:
			if r.IntN(4) == 0 {
				m.RemoveAll(r.IntN(2) == 0)
			}
		case n < 78:
			m.Evict()
		case n < 80:
			if len(segsOf[c]) < 3 && !mount(c) {
				return
			}
		case n < 82:
			if ss := segsOf[c]; len(ss) > 0 {
				i := r.IntN(len(ss))
				err := m.UnmountSegment(c, ss[i].ID)
				if err == nil {
					segsOf[c] = slices.Delete(ss, i, i+1)
				}
			}
		case n < 84:
			if !alive[c] || r.IntN(4) == 0 {
				alive[c] = !alive[c]
			}
		case n < 86:
			if _, st := m.Ping(c); st == master.ClientNeedRemount && alive[c] {
				var keep []alloc.Segment
				for _, s := range segsOf[c] {
					if _, err := m.QuerySegmentStatus(s.ID); err != nil {
						s.ID.Lo += 1000
					}
					keep = append(keep, s)
				}
				if !assert.NoError(t, m.ReMountSegment(c, keep)) {
					return
				}
				segsOf[c] = keep
			}
		default:
			clk.Advance(time.Duration(r.IntN(3000)) * time.Millisecond)
			if r.IntN(40) == 0 {
				clk.Advance(time.Duration(r.IntN(700)) * time.Second)
			}
			for _, c := range clients {
				if alive[c] {
					m.Ping(c)
				}
			}
			m.Tick()
		}
	}
}
