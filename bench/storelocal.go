package bench

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"sync"
	"time"

	"github.com/crescent-kv/crescent/engine/mempool"
	"github.com/crescent-kv/crescent/store"
	"github.com/crescent-kv/crescent/store/local"
)

// LocalConfig configures the dummy-client benchmark (RunStoreLocal):
// one real client serving a local socket, Dummies dummy clients on it,
// a second client whose segment holds the "remote" replicas, and an
// in-process master.
type LocalConfig struct {
	Dummies   int           `json:"dummies"`    // default 1
	ValueSize int           `json:"value_size"` // default 1 MiB
	Duration  time.Duration `json:"duration"`   // per phase (default 2 s)
	// HotOnly measures only the hot-cache hit (and its memcpy baseline).
	HotOnly bool `json:"hot_only"`
}

// LocalPhase is one measured path.
type LocalPhase struct {
	Ops   int64   `json:"ops"`
	GBps  float64 `json:"gbps"`
	P50us float64 `json:"p50_us"`
	P99us float64 `json:"p99_us"`
}

// LocalResult is RunStoreLocal's outcome. Throughputs are GB/s (1e9
// bytes) summed over the dummies. Baseline, BaselineGBps and Ratio refer
// to the hot-cache hit: memcpy of ValueSize bytes by as many threads as
// dummies, in the same run.
type LocalResult struct {
	Dummies      int         `json:"dummies"`
	ValueSize    int         `json:"value_size"`
	Hot          LocalPhase  `json:"hot"`
	Baseline     string      `json:"baseline"`
	BaselineGBps float64     `json:"baseline_gbps"`
	Ratio        float64     `json:"ratio"`
	LocalReplica *LocalPhase `json:"local_replica,omitempty"`
	Remote       *LocalPhase `json:"remote_replica,omitempty"`
	Put          *LocalPhase `json:"put,omitempty"`
	IPCp50us     float64     `json:"ipc_p50_us,omitempty"`
	IPCp99us     float64     `json:"ipc_p99_us,omitempty"`
	HotHits      uint64      `json:"hot_hits"`
}

// RunStoreLocal measures reads and writes through dummy clients: a get
// that hits the shared hot cache (a view into shared memory, no copy)
// against memcpy of the same size; a get of a replica in the real
// client's own segment and of one in another client's segment (into a
// pool the dummy registered); the IPC round trip; a put from a
// registered pool.
func RunStoreLocal(ctx context.Context, c LocalConfig) (res *LocalResult, err error) {
	c.Dummies = max(c.Dummies, 1)
	if c.ValueSize <= 0 {
		c.ValueSize = 1 << 20
	}
	if c.Duration <= 0 {
		c.Duration = 2 * time.Second
	}
	if c.Dummies > 64 || c.ValueSize > 64<<20 {
		return nil, fmt.Errorf("%w: --dummy %d (at most 64), --value_size %d (at most 64 MiB)", ErrStoreConfig, c.Dummies, c.ValueSize)
	}
	sc := StoreConfig{}
	if err := sc.setDefaults(); err != nil {
		return nil, err
	}
	im, err := newMaster(ctx, &sc, OplogOff)
	if err != nil {
		return nil, err
	}
	defer func() { err = errors.Join(err, im.close()) }()
	keys := 4 * c.Dummies
	seg := int64(keys*4*c.ValueSize + 64<<20)
	newClient := func() (*store.Client, error) {
		return store.New(ctx, store.Config{MasterAddr: im.addr, LocalHostname: "127.0.0.1", GlobalSegmentSize: seg,
			LocalBufferSize: 64 << 20, Logger: sc.Logger})
	}
	real, err := newClient()
	if err != nil {
		return nil, err
	}
	defer func() { err = errors.Join(err, real.Close()) }()
	other, err := newClient()
	if err != nil {
		return nil, err
	}
	defer func() { err = errors.Join(err, other.Close()) }()
	dir, err := os.MkdirTemp("", "crescent-bench-local-")
	if err != nil {
		return nil, err
	}
	defer os.RemoveAll(dir)
	block := int64(c.ValueSize+4095) / 4096 * 4096
	hotSrv, err := local.Serve(real, filepath.Join(dir, "hot.sock"), local.Options{CacheSize: block * int64(keys+c.Dummies), BlockSize: block, Shm: true})
	if err != nil {
		return nil, err
	}
	defer hotSrv.Close()
	plainSrv, err := local.Serve(real, filepath.Join(dir, "plain.sock"), local.Options{})
	if err != nil {
		return nil, err
	}
	defer plainSrv.Close()

	type dummy struct {
		hot, plain *local.Dummy
		pool       *mempool.Pool
		buf        []byte
	}
	ds := make([]*dummy, c.Dummies)
	defer func() {
		for _, d := range ds {
			if d != nil {
				d.hot.Close()
				d.plain.Close()
				d.pool.Close()
			}
		}
	}()
	for i := range ds {
		d := &dummy{}
		if d.hot, err = local.Dial(ctx, hotSrv.Path()); err != nil {
			return nil, err
		}
		if d.plain, err = local.Dial(ctx, plainSrv.Path()); err != nil {
			d.hot.Close()
			return nil, err
		}
		if d.pool, err = mempool.New(mempool.Options{Size: 2 * block, Name: "bench-dummy"}); err != nil {
			d.hot.Close()
			d.plain.Close()
			return nil, err
		}
		ds[i] = d
		if d.buf, err = d.pool.Alloc(c.ValueSize); err != nil {
			return nil, err
		}
		if err := d.plain.RegisterPool(ctx, d.pool); err != nil {
			return nil, err
		}
	}
	val := make([]byte, c.ValueSize)
	for i := range val {
		val[i] = byte(i * 13)
	}
	run := runIDShort()
	key := func(kind string, i int) string { return "bench-local/" + run + "/" + kind + "/" + strconv.Itoa(i) }
	for i := range keys {
		if err := real.Put(ctx, key("hot", i), val, store.ReplicateConfig{Preferred: []string{real.SegmentName()}}); err != nil {
			return nil, err
		}
		if err := real.Put(ctx, key("local", i), val, store.ReplicateConfig{Preferred: []string{real.SegmentName()}}); err != nil {
			return nil, err
		}
		if err := other.Put(ctx, key("remote", i), val, store.ReplicateConfig{Preferred: []string{other.SegmentName()}}); err != nil {
			return nil, err
		}
	}
	for i := range keys { // admit the hot keys
		for range 3 {
			b, err := ds[0].hot.GetBuffer(ctx, key("hot", i))
			if err != nil {
				return nil, err
			}
			b.Release()
		}
	}

	res = &LocalResult{Dummies: c.Dummies, ValueSize: c.ValueSize, Baseline: "memcpy"}
	phase := func(step func(d *dummy, i int) error) (LocalPhase, *Histogram, error) {
		hs := make([]*Histogram, len(ds))
		errs := make([]error, len(ds))
		var wg sync.WaitGroup
		start := time.Now()
		for w, d := range ds {
			hs[w] = &Histogram{}
			wg.Add(1)
			go func() {
				defer wg.Done()
				for i := 0; time.Since(start) < c.Duration && ctx.Err() == nil; i++ {
					t0 := time.Now()
					if err := step(d, w+i*len(ds)); err != nil {
						errs[w] = err
						return
					}
					hs[w].Record(time.Since(t0))
				}
			}()
		}
		wg.Wait()
		el := time.Since(start)
		h := &Histogram{}
		for _, x := range hs {
			h.Merge(x)
		}
		p := LocalPhase{Ops: int64(h.Count())}
		p.GBps = float64(p.Ops) * float64(c.ValueSize) / el.Seconds() / 1e9
		p.P50us, p.P99us, _ = percentiles(h)
		return p, h, errors.Join(errs...)
	}
	hotStep := func(d *dummy, i int) error {
		b, err := d.hot.GetBuffer(ctx, key("hot", i%keys))
		if err != nil {
			return err
		}
		if !b.Shared() {
			b.Release()
			return fmt.Errorf("bench: hot get of %d bytes was not a shared view", c.ValueSize)
		}
		b.Release()
		return nil
	}
	if res.Hot, _, err = phase(hotStep); err != nil {
		return nil, err
	}
	res.BaselineGBps = memcpyGBps(c.Dummies, c.ValueSize, c.Duration)
	if res.BaselineGBps > 0 {
		res.Ratio = res.Hot.GBps / res.BaselineGBps
	}
	res.HotHits = hotSrv.Stats().Hits
	if c.HotOnly {
		return res, nil
	}
	getInto := func(kind string) func(d *dummy, i int) error {
		return func(d *dummy, i int) error {
			_, err := d.plain.GetInto(ctx, key(kind, i%keys), d.buf)
			return err
		}
	}
	lp, _, err := phase(getInto("local"))
	if err != nil {
		return nil, err
	}
	rp, _, err := phase(getInto("remote"))
	if err != nil {
		return nil, err
	}
	_, ih, err := phase(func(d *dummy, i int) error { return d.plain.Ping(ctx) })
	if err != nil {
		return nil, err
	}
	res.IPCp50us, res.IPCp99us, _ = percentiles(ih)
	copy(ds[0].buf, val)
	for _, d := range ds {
		copy(d.buf, val)
	}
	pp, _, err := phase(func(d *dummy, i int) error {
		k := key("put", i)
		if err := d.plain.PutFrom(ctx, k, d.buf, store.ReplicateConfig{}); err != nil {
			return err
		}
		return d.plain.Remove(ctx, k, false)
	})
	if err != nil {
		return nil, err
	}
	res.LocalReplica, res.Remote, res.Put = &lp, &rp, &pp
	return res, nil
}

// memcpyGBps copies n bytes between two buffers of each of threads
// goroutines for d: the physical limit of a read of shared memory.
func memcpyGBps(threads, n int, d time.Duration) float64 {
	var mu sync.Mutex
	var total int64
	var wg sync.WaitGroup
	start := time.Now()
	for range threads {
		wg.Add(1)
		go func() {
			defer wg.Done()
			src, dst := make([]byte, n), make([]byte, n)
			for i := range src {
				src[i] = byte(i)
			}
			var done int64
			for time.Since(start) < d {
				copy(dst, src)
				done += int64(n)
			}
			mu.Lock()
			total += done
			mu.Unlock()
		}()
	}
	wg.Wait()
	return float64(total) / time.Since(start).Seconds() / 1e9
}

func runIDShort() string { return strconv.FormatInt(time.Now().UnixNano(), 36) }
