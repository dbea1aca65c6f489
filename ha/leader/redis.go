package leader

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"strconv"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"
)

// Redis is the Redis Coordinator (leadership only: Redis replication is
// asynchronous, so the log lives elsewhere).
type Redis struct {
	cli       redis.UniversalClient
	clusterID string
	view      string // {<prefix>:<cluster>}:master_view
	term      string // {<prefix>:<cluster>}:term
	ttl       time.Duration
	renew     time.Duration
	poll      time.Duration
	minTerm   uint64
	reg       registry
}

var _ Coordinator = (*Redis)(nil)

// maxLuaTerm: Lua numbers are doubles, exact up to 2^53.
const maxLuaTerm = 1 << 53

// NewRedis returns a coordinator on cli for clusterID. cli stays the
// caller's to close, after the coordinator.
func NewRedis(cli redis.UniversalClient, clusterID string, opts ...Option) (*Redis, error) {
	if cli == nil {
		return nil, fmt.Errorf("%w: nil redis client", ErrInvalid)
	}
	o, err := buildOptions(clusterID, opts)
	if err != nil {
		return nil, err
	}
	if o.ttl < 3*minRenewInterval {
		return nil, fmt.Errorf("%w: redis ttl %v below %v (renewals every ttl/3, at least %v)", ErrInvalid, o.ttl, 3*minRenewInterval, minRenewInterval)
	}
	if o.minTerm >= maxLuaTerm {
		return nil, fmt.Errorf("%w: min term %d not below 2^53", ErrInvalid, o.minTerm)
	}
	tag := "{" + o.prefix + ":" + clusterID + "}"
	return &Redis{cli: cli, clusterID: clusterID, view: tag + ":master_view", term: tag + ":term", ttl: o.ttl,
		renew: max(o.ttl/3, minRenewInterval), poll: o.poll, minTerm: o.minTerm}, nil
}

// RedisKeys returns the view hash and term counter keys.
func RedisKeys(prefix, clusterID string) (view, term string) {
	tag := "{" + prefix + ":" + clusterID + "}"
	return tag + ":master_view", tag + ":term"
}

// KEYS[1] view hash, KEYS[2] term; ARGV: address, token, ttl ms, min term,
// MaxAddrLen+1 (a view read back is cut there, so an oversized one is
// refused without being sent whole). Returns {1, address, term} acquired
// or {0, address, version} contended.
var acquireScript = redis.NewScript(`
if redis.call('EXISTS', KEYS[1]) == 1 then
  local v = redis.call('HMGET', KEYS[1], 'leader_address', 'view_version')
  return {0, string.sub(v[1] or '', 1, ARGV[5]), string.sub(v[2] or '0', 1, 32)}
end
local t = redis.call('INCR', KEYS[2])
local m = tonumber(ARGV[4])
if t <= m then
  t = m + 1
  redis.call('SET', KEYS[2], string.format('%.0f', t))
end
local ts = string.format('%.0f', t)
redis.call('HSET', KEYS[1], 'leader_address', ARGV[1], 'view_version', ts, 'owner_token', ARGV[2])
redis.call('PEXPIRE', KEYS[1], ARGV[3])
return {1, ARGV[1], ts}
`)

// KEYS[1] view hash; ARGV: token, ttl ms. 1 renewed, 0 not ours.
var renewScript = redis.NewScript(`
if redis.call('HGET', KEYS[1], 'owner_token') == ARGV[1] then
  redis.call('PEXPIRE', KEYS[1], ARGV[2])
  return 1
end
return 0
`)

// KEYS[1] view hash; ARGV: token. 1 deleted, 0 not ours.
var releaseScript = redis.NewScript(`
if redis.call('HGET', KEYS[1], 'owner_token') == ARGV[1] then
  redis.call('DEL', KEYS[1])
  return 1
end
return 0
`)

// KEYS[1] view hash; ARGV: MaxAddrLen+1. Returns {} when there is no
// view, else {address, version}, each cut short: anyone who can write the
// hash could otherwise make every reader take a value of any size.
var viewScript = redis.NewScript(`
local v = redis.call('HMGET', KEYS[1], 'leader_address', 'view_version')
if not v[1] then return {} end
return {string.sub(v[1], 1, ARGV[1]), string.sub(v[2] or '', 1, 32)}
`)

// View reads the hash.
func (c *Redis) View(ctx context.Context) (View, error) {
	vals, err := viewScript.Run(ctx, c.cli, []string{c.view}, MaxAddrLen+1).Slice()
	if err != nil {
		return View{}, fmt.Errorf("leader: redis read view: %w", err)
	}
	if len(vals) != 2 {
		return View{}, nil
	}
	return parseView(vals[0], vals[1])
}

func parseView(addr, version any) (View, error) {
	a, _ := addr.(string)
	if err := checkView(len(a)); err != nil {
		return View{}, err
	}
	vs, _ := version.(string)
	n, err := strconv.ParseUint(vs, 10, 64)
	if err != nil {
		return View{}, fmt.Errorf("%w: redis view_version %q: %v", ErrBadView, vs, err)
	}
	return View{Leader: a, Version: n}, nil
}

// TryAcquire runs the acquire script with a fresh owner token.
func (c *Redis) TryAcquire(ctx context.Context, addr string) (Session, View, error) {
	if err := checkAddr(addr); err != nil {
		return nil, View{}, err
	}
	if c.reg.isClosed() {
		return nil, View{}, ErrClosed
	}
	var tok [16]byte
	rand.Read(tok[:])
	token := hex.EncodeToString(tok[:])
	start := time.Now()
	res, err := acquireScript.Run(ctx, c.cli, []string{c.view, c.term},
		addr, token, c.ttl.Milliseconds(), c.minTerm, MaxAddrLen+1).Slice()
	if err != nil {
		return nil, View{}, fmt.Errorf("leader: redis acquire: %w", err)
	}
	if len(res) != 3 {
		return nil, View{}, fmt.Errorf("leader: redis acquire: reply %v", res)
	}
	v, err := parseView(res[1], res[2])
	if err != nil {
		return nil, View{}, err
	}
	if n, _ := res[0].(int64); n != 1 {
		return nil, v, nil
	}
	s := &redisSession{c: c, ending: newEnding(), token: token, term: v.Version,
		stop: make(chan struct{}), done: make(chan struct{})}
	s.extend(start.Add(c.ttl)) // PEXPIRE counted from when Redis ran the script
	if !c.reg.add(s) {
		releaseScript.Run(context.Background(), c.cli, []string{c.view}, token)
		return nil, View{}, ErrClosed
	}
	go s.run()
	return s, v, nil
}

// WaitChange polls the view every poll interval: keyspace notifications
// are off by default on redis-server.
func (c *Redis) WaitChange(ctx context.Context, after uint64) (View, error) {
	t := time.NewTicker(c.poll)
	defer t.Stop()
	for {
		v, err := c.View(ctx)
		if err == nil && v.Version != after {
			return v, nil
		}
		select {
		case <-ctx.Done():
			return View{}, ctx.Err()
		case <-t.C:
		}
	}
}

// Close ends every live session with ErrClosed.
func (c *Redis) Close() error {
	c.reg.closeAll()
	return nil
}

type redisSession struct {
	c *Redis
	ending
	token string
	term  uint64
	leaseClock

	stop     chan struct{}
	stopOnce sync.Once
	done     chan struct{}
	rel      sync.Once
}

func (s *redisSession) Term() uint64 { return s.term }

func (s *redisSession) run() {
	defer close(s.done)
	defer s.c.reg.remove(s)
	t := time.NewTicker(s.c.renew)
	defer t.Stop()
	expire := time.NewTimer(time.Until(s.Deadline()))
	defer expire.Stop()
	// A renewal runs beside this loop, so the deadline ends the session
	// on time even when a call hangs past its context (go-redis bounds a
	// blocked read by ReadTimeout, not by the context, unless the client
	// sets ContextTimeoutEnabled). One at a time; the loop waits for the
	// last before it returns, its context cancelled.
	ctx, cancel := context.WithCancel(context.Background())
	renewed := make(chan struct{}, 1)
	renewing := false
	defer func() {
		cancel()
		if renewing {
			<-renewed
		}
	}()
	for {
		select {
		case <-s.stop:
			return
		case <-s.Lost():
			return
		case <-expire.C:
			if d := time.Until(s.Deadline()); d > 0 { // renewed meanwhile
				expire.Reset(d)
				continue
			}
			s.end(fmt.Errorf("%w: no renewal confirmed within the lease TTL (%v)", ErrRenew, s.c.ttl))
			return
		case <-renewed:
			renewing = false
		case <-t.C:
			if renewing {
				continue
			}
			renewing = true
			go func() {
				rctx, rcancel := context.WithDeadline(ctx, minTime(time.Now().Add(s.c.renew), s.Deadline()))
				s.renew(rctx)
				rcancel()
				renewed <- struct{}{}
			}()
		}
	}
}

// renew runs the renew script once. Another owner ends the session at
// once; errors leave it to the deadline (run's timer).
func (s *redisSession) renew(ctx context.Context) error {
	start := time.Now()
	n, err := renewScript.Run(ctx, s.c.cli, []string{s.c.view}, s.token, s.c.ttl.Milliseconds()).Int()
	if err == nil && n != 1 {
		err = fmt.Errorf("%w: view no longer holds our owner token", ErrLeadershipLost)
		s.end(err)
		return err
	}
	if err != nil {
		return fmt.Errorf("%w: %v", ErrRenew, err)
	}
	if s.Err() == nil { // an answer that came after the end moves nothing
		s.extend(start.Add(s.c.ttl))
	}
	return nil
}

// Renew renews once now.
func (s *redisSession) Renew(ctx context.Context) error {
	if err := s.Err(); err != nil {
		return err
	}
	return s.renew(ctx)
}

func (s *redisSession) close() {
	s.end(ErrClosed)
	s.stopOnce.Do(func() { close(s.stop) })
	<-s.done
}

// Release ends the session and deletes the hash if it is still ours.
func (s *redisSession) Release(ctx context.Context) error {
	s.close()
	var err error
	s.rel.Do(func() {
		if _, rerr := releaseScript.Run(ctx, s.c.cli, []string{s.c.view}, s.token).Int(); rerr != nil && !errors.Is(rerr, redis.Nil) {
			err = fmt.Errorf("leader: redis release: %w", rerr)
		}
	})
	return err
}

func minTime(a, b time.Time) time.Time {
	if a.Before(b) {
		return a
	}
	return b
}
