package bench

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"hash/fnv"
	"math/rand/v2"
	"sort"
	"sync"
	"sync/atomic"
	"time"

	"github.com/crescent-kv/crescent/store"
	"github.com/crescent-kv/crescent/store/errcode"
)

// HALoadConfig is the put/get load an HA run keeps up while masters fail.
type HALoadConfig struct {
	Writers   int           // concurrent putters (default 4)
	Readers   int           // concurrent getters of acknowledged keys, each at most Rate/2 gets per second (default 2; negative: none)
	Rate      int           // puts per second across writers (default 200; bounds the memory the acked keys hold)
	ValueSize int           // bytes (default 4096)
	Timeout   time.Duration // per put, retries inside included (default 30 s)
	Prefix    string        // key prefix (default "ha")
}

// HALoad puts fresh keys at a steady rate and remembers every put that
// was acknowledged, with when it started and ended; its readers get
// acknowledged keys meanwhile and check their bytes.
type HALoad struct {
	cfg     HALoadConfig
	cancel  context.CancelFunc
	wg      sync.WaitGroup
	failed  atomic.Int64
	lastErr atomic.Pointer[error]

	reads, readErrs atomic.Int64
	badReads        atomic.Int64 // a value with other bytes: never allowed
	badKey          atomic.Pointer[string]

	mu    sync.Mutex
	acked []HAAck
	wake  chan struct{} // closed and replaced at each ack
}

// HAAck is one acknowledged put.
type HAAck struct {
	Key        string
	Start, End time.Time
}

// HAValue is the value an HA load puts under key: size bytes derived from
// the key, so a reader can check them without a copy.
func HAValue(key string, size int) []byte {
	h := fnv.New64a()
	h.Write([]byte(key))
	r := rand.New(rand.NewPCG(h.Sum64(), uint64(size)))
	v := make([]byte, size)
	for i := 0; i+8 <= size; i += 8 {
		x := r.Uint64()
		for j := range 8 {
			v[i+j] = byte(x >> (8 * j))
		}
	}
	for i := size &^ 7; i < size; i++ {
		v[i] = byte(r.Uint32())
	}
	return v
}

// StartHALoad starts the writers on c.
func StartHALoad(c *store.Client, cfg HALoadConfig) *HALoad {
	if cfg.Writers <= 0 {
		cfg.Writers = 4
	}
	if cfg.Rate <= 0 {
		cfg.Rate = 200
	}
	if cfg.ValueSize <= 0 {
		cfg.ValueSize = 4096
	}
	if cfg.Timeout <= 0 {
		cfg.Timeout = 30 * time.Second
	}
	if cfg.Prefix == "" {
		cfg.Prefix = "ha"
	}
	if cfg.Readers == 0 {
		cfg.Readers = 2
	}
	ctx, cancel := context.WithCancel(context.Background())
	l := &HALoad{cfg: cfg, cancel: cancel, wake: make(chan struct{})}
	tokens := make(chan struct{})
	l.wg.Add(1)
	go func() { // one ticker paces every writer
		defer l.wg.Done()
		t := time.NewTicker(time.Second / time.Duration(cfg.Rate))
		defer t.Stop()
		for {
			select {
			case <-ctx.Done():
				return
			case <-t.C:
				select {
				case tokens <- struct{}{}:
				default: // every writer busy: the rate is a ceiling
				}
			}
		}
	}()
	for w := range cfg.Writers {
		l.wg.Add(1)
		go func() {
			defer l.wg.Done()
			for i := 0; ; i++ {
				select {
				case <-ctx.Done():
					return
				case <-tokens:
				}
				key := fmt.Sprintf("%s/%d/%d", cfg.Prefix, w, i)
				start := time.Now()
				pctx, cancel := context.WithTimeout(ctx, cfg.Timeout)
				err := c.Put(pctx, key, HAValue(key, cfg.ValueSize), store.ReplicateConfig{})
				cancel()
				if err != nil {
					l.failed.Add(1)
					l.lastErr.Store(&err)
					continue
				}
				l.Record(HAAck{Key: key, Start: start, End: time.Now()})
			}
		}()
	}
	for r := range max(cfg.Readers, 0) {
		l.wg.Add(1)
		go func() {
			defer l.wg.Done()
			rng := rand.New(rand.NewPCG(uint64(r), 7))
			pace := time.NewTicker(2 * time.Second / time.Duration(cfg.Rate))
			defer pace.Stop()
			for ctx.Err() == nil {
				select {
				case <-ctx.Done():
					return
				case <-pace.C:
				}
				l.mu.Lock()
				n := len(l.acked)
				var key string
				if n > 0 {
					key = l.acked[rng.IntN(n)].Key
				}
				wake := l.wake
				l.mu.Unlock()
				if key == "" {
					select {
					case <-ctx.Done():
						return
					case <-wake:
					}
					continue
				}
				gctx, cancel := context.WithTimeout(ctx, cfg.Timeout)
				v, err := c.Get(gctx, key)
				cancel()
				switch {
				case err != nil:
					if ctx.Err() == nil {
						l.readErrs.Add(1)
					}
				case !bytes.Equal(v, HAValue(key, cfg.ValueSize)):
					l.badReads.Add(1)
					l.badKey.Store(&key)
				default:
					l.reads.Add(1)
				}
			}
		}()
	}
	return l
}

// Reads counts the readers' gets: right bytes, errors (allowed while
// nobody leads), and wrong bytes with the last such key (never allowed:
// an acknowledged value read back changed).
func (l *HALoad) Reads() (ok, errs, bad int64, badKey string) {
	if k := l.badKey.Load(); k != nil {
		badKey = *k
	}
	return l.reads.Load(), l.readErrs.Load(), l.badReads.Load(), badKey
}

// Record adds an acknowledged put (another client's, for example).
func (l *HALoad) Record(a HAAck) {
	l.mu.Lock()
	l.acked = append(l.acked, a)
	close(l.wake)
	l.wake = make(chan struct{})
	l.mu.Unlock()
}

// WaitAckAfter waits for the first put that started after t to be
// acknowledged and returns how long after t that was.
func (l *HALoad) WaitAckAfter(ctx context.Context, t time.Time) (time.Duration, error) {
	for {
		l.mu.Lock()
		wake := l.wake
		var first time.Time
		for i := len(l.acked) - 1; i >= 0; i-- {
			a := l.acked[i]
			if a.End.Before(t) {
				break // acks are appended in End order, near enough
			}
			if a.Start.After(t) && (first.IsZero() || a.End.Before(first)) {
				first = a.End
			}
		}
		l.mu.Unlock()
		if !first.IsZero() {
			return first.Sub(t), nil
		}
		select {
		case <-ctx.Done():
			return 0, fmt.Errorf("bench: ha: no put acknowledged since %s: %w", t.Format(time.TimeOnly), ctx.Err())
		case <-wake:
		}
	}
}

// Acked is a copy of the acknowledged puts so far.
func (l *HALoad) Acked() []HAAck {
	l.mu.Lock()
	defer l.mu.Unlock()
	return append([]HAAck(nil), l.acked...)
}

// Failed is how many puts returned an error (not acknowledged: allowed).
func (l *HALoad) Failed() int64 { return l.failed.Load() }

// LastErr is the last error a put returned (nil: none).
func (l *HALoad) LastErr() error {
	if e := l.lastErr.Load(); e != nil {
		return *e
	}
	return nil
}

// Stop stops the writers and waits for them.
func (l *HALoad) Stop() {
	l.cancel()
	l.wg.Wait()
}

// VerifyAcked reads every acknowledged key through c and returns those
// missing or with other bytes: acknowledged writes the cluster lost. A
// read that fails for another reason is retried until ctx ends.
func VerifyAcked(ctx context.Context, c *store.Client, acked []HAAck, size int) (lost []string, err error) {
	sort.Slice(acked, func(i, j int) bool { return acked[i].Key < acked[j].Key })
	for _, a := range acked {
		for {
			v, gerr := c.Get(ctx, a.Key)
			if gerr == nil {
				if !bytes.Equal(v, HAValue(a.Key, size)) {
					lost = append(lost, a.Key)
				}
				break
			}
			if errors.Is(gerr, errcode.ErrObjectNotFound) {
				lost = append(lost, a.Key)
				break
			}
			if ctx.Err() != nil {
				return lost, fmt.Errorf("bench: ha: read %s: %w", a.Key, gerr)
			}
			time.Sleep(50 * time.Millisecond)
		}
	}
	return lost, nil
}
