package bench

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"time"

	"github.com/crescent-kv/crescent/internal/etcdembed"
	"github.com/crescent-kv/crescent/store"
	_ "github.com/crescent-kv/crescent/store/haview" // etcd:// and redis:// master addresses
)

// HAConfig configures RunHA: a cluster of HA masters under put load whose
// leader is killed Kills times.
type HAConfig struct {
	// Backend is the leadership backend: etcd (default) or redis. The
	// log is on etcd either way.
	Backend string
	// Kills is how many times the leader is killed with SIGKILL
	// (default 10).
	Kills int
	// LeaseTTL is the leadership lease, whole seconds (default 2 s).
	LeaseTTL time.Duration
	// Masters is how many crescent-master processes (default 3).
	Masters int
	// MasterBin is the crescent-master binary (default FindMasterBin).
	MasterBin string
	// Etcd are external etcd endpoints; empty starts EtcdMembers
	// embedded members (default 1) with fsync on, in a temporary
	// directory.
	Etcd        []string
	EtcdMembers int
	// RedisBin is redis-server for Backend redis (default: $PATH).
	RedisBin string
	// Load is the put load kept up meanwhile.
	Load HALoadConfig
	// SegmentSize is the store client's segment (default 256 MiB; at
	// least Load.Rate * ValueSize * the run's seconds).
	SegmentSize int64
	// Settle is how long the cluster serves between a failover and the
	// next kill (default 1 s).
	Settle time.Duration
	// WarmupMs, when not empty, is the masters' --ha_warmup_ms.
	WarmupMs string
	// Progress receives one line per kill (nil: none).
	Progress io.Writer
	// Logger is the store client's (nil: discarded, not slog.Default():
	// the bench kills masters on purpose, and the client's warnings about
	// each failover are expected, not news).
	Logger *slog.Logger
}

// HAResult is one RunHA run.
type HAResult struct {
	Backend      string    `json:"backend"`
	WarmupMs     string    `json:"warmup_ms,omitempty"` // the masters' --ha_warmup_ms ("": their default)
	Masters      int       `json:"masters"`
	Kills        int       `json:"kills"`
	LeaseTTLS    float64   `json:"lease_ttl_s"`
	FailoverSMin float64   `json:"failover_s_min"`
	FailoverSMed float64   `json:"failover_s_median"`
	FailoverSMax float64   `json:"failover_s_max"`
	FailoversS   []float64 `json:"failover_s"`
	AckedPuts    int       `json:"acked_puts"`
	FailedPuts   int64     `json:"failed_puts"`
	LostAcks     int       `json:"lost_acks"`
	Gets         int64     `json:"gets"`       // readers' gets of acked keys with the right bytes
	GetErrors    int64     `json:"get_errors"` // that failed (allowed while nobody leads)
	BadGets      int64     `json:"bad_gets"`   // that returned other bytes (never allowed)
	LostKeys     []string  `json:"lost_keys,omitempty"`
	TermsSeen    []uint64  `json:"terms"`
	WithinTarget bool      `json:"within_target"` // failover_s_max <= 2 * lease_ttl_s and lost_acks == 0
	DurationS    float64   `json:"duration_s"`
	ValueSize    int       `json:"value_size"`
	PutRate      int       `json:"put_rate"`
}

// RunHA runs the failover scenario: Masters HA masters on one etcd log,
// a store client putting fresh keys at Load.Rate through the HA address,
// and Kills times: kill -9 the leader, time until the first put started
// after the kill is acknowledged (the failover), restart the killed
// process as a standby, let the cluster serve for Settle. Then every
// acknowledged put is read back: one missing or changed is a lost ack.
func RunHA(ctx context.Context, c HAConfig) (*HAResult, error) {
	if c.Kills <= 0 {
		c.Kills = 10
	}
	if c.LeaseTTL == 0 {
		c.LeaseTTL = 2 * time.Second
	}
	if c.Backend == "" {
		c.Backend = "etcd"
	}
	if c.SegmentSize == 0 {
		c.SegmentSize = 256 << 20
	}
	if c.Settle == 0 {
		c.Settle = time.Second
	}
	if c.Logger == nil {
		c.Logger = slog.New(slog.DiscardHandler)
	}
	progress := c.Progress
	if progress == nil {
		progress = io.Discard
	}
	began := time.Now()

	eps := c.Etcd
	if len(eps) == 0 {
		dir, err := os.MkdirTemp("", "crescent-ha-etcd-*")
		if err != nil {
			return nil, err
		}
		defer os.RemoveAll(dir)
		n := max(c.EtcdMembers, 1)
		var cfgs []etcdembed.Config
		for i := range n {
			cfgs = append(cfgs, etcdembed.Config{Name: fmt.Sprintf("ha%d", i), Dir: filepath.Join(dir, fmt.Sprintf("m%d", i))})
		}
		members, hosts, err := etcdembed.StartCluster(cfgs)
		if err != nil {
			return nil, fmt.Errorf("bench: ha: embedded etcd: %w", err)
		}
		defer func() {
			for _, m := range members {
				m.Close()
			}
		}()
		eps = hosts
	}
	var redisAddr string
	if c.Backend == "redis" {
		rs, err := StartRedis(c.RedisBin)
		if err != nil {
			return nil, err
		}
		defer rs.Close()
		redisAddr = rs.Addr
	}
	var args []string
	if c.WarmupMs != "" {
		args = []string{"--ha_warmup_ms", c.WarmupMs}
	}
	cl, err := StartHACluster(ctx, HAClusterConfig{MasterBin: c.MasterBin, Masters: c.Masters, Backend: c.Backend,
		Etcd: eps, Redis: redisAddr, LeaseTTL: c.LeaseTTL, Args: args})
	if err != nil {
		return nil, err
	}
	defer cl.Close()
	fmt.Fprintf(progress, "ha: %d masters on %s, lease %v, leader up\n", len(cl.Masters), cl.ClientAddr(), c.LeaseTTL)

	cli, err := store.New(ctx, store.Config{MasterAddr: cl.ClientAddr(), ClusterID: cl.ClusterID(),
		GlobalSegmentSize: c.SegmentSize, LocalBufferSize: 64 << 20, Logger: c.Logger})
	if err != nil {
		return nil, fmt.Errorf("bench: ha: client: %w", err)
	}
	defer cli.Close()
	load := StartHALoad(cli, c.Load)
	stopped := false
	defer func() {
		if !stopped {
			load.Stop()
		}
	}()

	res := &HAResult{Backend: c.Backend, WarmupMs: c.WarmupMs, Masters: len(cl.Masters), Kills: c.Kills, LeaseTTLS: c.LeaseTTL.Seconds(),
		ValueSize: load.cfg.ValueSize, PutRate: load.cfg.Rate}
	wait := 10*c.LeaseTTL + 30*time.Second
	for k := range c.Kills {
		wctx, cancel := context.WithTimeout(ctx, wait)
		_, err := load.WaitAckAfter(wctx, time.Now()) // the cluster serves
		cancel()
		if err != nil {
			return res, err
		}
		select {
		case <-ctx.Done():
			return res, ctx.Err()
		case <-time.After(c.Settle):
		}
		leader, role, err := cl.WaitLeader(ctx, -1)
		if err != nil {
			return res, err
		}
		res.TermsSeen = append(res.TermsSeen, role.Term)
		t0 := time.Now()
		if err := cl.Kill(leader); err != nil {
			return res, err
		}
		wctx, cancel = context.WithTimeout(ctx, wait)
		d, err := load.WaitAckAfter(wctx, t0)
		cancel()
		if err != nil {
			return res, fmt.Errorf("kill %d: %w", k+1, err)
		}
		next, nrole, err := cl.WaitLeader(ctx, leader)
		if err != nil {
			return res, err
		}
		if nrole.Term <= role.Term {
			return res, fmt.Errorf("bench: ha: kill %d: new leader %d has term %d, not above %d", k+1, next, nrole.Term, role.Term)
		}
		res.FailoversS = append(res.FailoversS, d.Seconds())
		fmt.Fprintf(progress, "ha: kill %d/%d: master %d (term %d) killed, master %d (term %d) serving, failover %.2f s, %d puts acked\n",
			k+1, c.Kills, leader, role.Term, next, nrole.Term, d.Seconds(), len(load.Acked()))
		if err := cl.Start(leader); err != nil {
			return res, err
		}
		if _, err := cl.WaitRole(ctx, leader, "standby"); err != nil {
			return res, err
		}
	}
	load.Stop()
	stopped = true
	acked := load.Acked()
	res.AckedPuts, res.FailedPuts = len(acked), load.Failed()
	res.Gets, res.GetErrors, res.BadGets, _ = load.Reads()
	vctx, cancel := context.WithTimeout(ctx, wait)
	defer cancel()
	lost, err := VerifyAcked(vctx, cli, acked, load.cfg.ValueSize)
	if err != nil {
		return res, err
	}
	res.LostAcks = len(lost)
	if len(lost) > 20 {
		lost = lost[:20]
	}
	res.LostKeys = lost
	s := slices.Clone(res.FailoversS)
	slices.Sort(s)
	res.FailoverSMin, res.FailoverSMax, res.FailoverSMed = s[0], s[len(s)-1], s[len(s)/2]
	if len(s)%2 == 0 {
		res.FailoverSMed = (s[len(s)/2-1] + s[len(s)/2]) / 2
	}
	res.WithinTarget = res.FailoverSMax <= 2*res.LeaseTTLS && res.LostAcks == 0 && res.BadGets == 0
	res.DurationS = time.Since(began).Seconds()
	return res, nil
}
