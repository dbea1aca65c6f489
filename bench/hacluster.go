package bench

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/crescent-kv/crescent/internal/portpick"
)

// HAClusterConfig says how to run a cluster of crescent-master processes
// in HA mode: one operation log on etcd, leadership on etcd or Redis.
type HAClusterConfig struct {
	// MasterBin is the crescent-master binary (default: FindMasterBin).
	MasterBin string
	// Masters is how many processes (default 3).
	Masters int
	// Backend is the leadership backend: "etcd" (default) or "redis".
	Backend string
	// Etcd are the etcd endpoints (host:port) holding the log, and the
	// leadership with Backend "etcd".
	Etcd []string
	// Redis is the redis-server (host:port) with Backend "redis".
	Redis string
	// ClusterID names the cluster (default "crescent-bench-ha").
	ClusterID string
	// LeaseTTL is the leadership lease, whole seconds (default 2 s).
	LeaseTTL time.Duration
	// Dir receives each process's log file (default: a temporary
	// directory, removed by Close).
	Dir string
	// Args are extra crescent-master flags for every process.
	Args []string
	// Env is added to every process's environment (a test binary that
	// runs the master when a variable is set is a MasterBin too).
	Env []string
	// Standby, when set, starts only the first process and waits for it
	// to lead; Add starts the others later.
	Standby bool
	// Via, when set, gives process i its own etcd endpoints and Redis
	// address in place of Etcd and Redis (a proxy per process, so a test
	// can cut one off); clients still use Etcd and Redis.
	Via func(i int) (etcd []string, redis string)
}

// HARole is a master's GET /role answer.
type HARole struct {
	Role       string `json:"role"` // leader, standby, candidate or warmup
	Term       uint64 `json:"term"`
	Leader     string `json:"leader"`
	AppliedSeq uint64 `json:"applied_seq"`
}

// HAMaster is one crescent-master process of an HACluster. Its ports stay
// the same across restarts.
type HAMaster struct {
	Index     int
	RPCAddr   string // host:port, the address it advertises
	AdminAddr string // host:port of /role, /health, /metrics

	mu      sync.Mutex
	cmd     *exec.Cmd
	done    chan struct{} // closed when the process exited
	waitErr error         // its exit status, once done
	log     string        // its stderr file
}

// HACluster is a running set of HA masters.
type HACluster struct {
	cfg     HAClusterConfig
	Masters []*HAMaster
	tmp     string
	http    *http.Client
}

// FindMasterBin returns the crescent-master beside this executable, else
// the one on $PATH.
func FindMasterBin() (string, error) {
	if exe, err := os.Executable(); err == nil {
		p := filepath.Join(filepath.Dir(exe), "crescent-master")
		if st, err := os.Stat(p); err == nil && !st.IsDir() {
			return p, nil
		}
	}
	p, err := exec.LookPath("crescent-master")
	if err != nil {
		return "", fmt.Errorf("bench: crescent-master not found beside %s or on $PATH (build it: make build, or pass --master_bin)", os.Args[0])
	}
	return p, nil
}

// StartHACluster starts cfg.Masters processes and waits until one leads.
func StartHACluster(ctx context.Context, cfg HAClusterConfig) (*HACluster, error) {
	if cfg.Masters == 0 {
		cfg.Masters = 3
	}
	if cfg.Backend == "" {
		cfg.Backend = "etcd"
	}
	if cfg.ClusterID == "" {
		cfg.ClusterID = "crescent-bench-ha"
	}
	if cfg.LeaseTTL == 0 {
		cfg.LeaseTTL = 2 * time.Second
	}
	switch {
	case cfg.Masters < 1:
		return nil, fmt.Errorf("bench: ha: %d masters", cfg.Masters)
	case cfg.LeaseTTL%time.Second != 0:
		return nil, fmt.Errorf("bench: ha: lease TTL %v is not whole seconds", cfg.LeaseTTL)
	case len(cfg.Etcd) == 0:
		return nil, errors.New("bench: ha: no etcd endpoints for the log")
	case cfg.Backend == "redis" && cfg.Redis == "":
		return nil, errors.New("bench: ha: backend redis without a redis address")
	case cfg.Backend != "etcd" && cfg.Backend != "redis":
		return nil, fmt.Errorf("bench: ha: backend %q: want etcd or redis", cfg.Backend)
	}
	if cfg.MasterBin == "" {
		bin, err := FindMasterBin()
		if err != nil {
			return nil, err
		}
		cfg.MasterBin = bin
	}
	c := &HACluster{cfg: cfg, http: &http.Client{Timeout: 2 * time.Second}}
	if c.cfg.Dir == "" {
		dir, err := os.MkdirTemp("", "crescent-ha-*")
		if err != nil {
			return nil, err
		}
		c.tmp, c.cfg.Dir = dir, dir
	}
	n := cfg.Masters
	if cfg.Standby {
		n = 1
	}
	for range n {
		if _, err := c.Add(); err != nil {
			c.Close()
			return nil, err
		}
	}
	if _, _, err := c.WaitLeader(ctx, -1); err != nil {
		c.Close()
		return nil, err
	}
	return c, nil
}

// Add starts one more process, on new ports, and returns its index; it
// does not wait for a role.
func (c *HACluster) Add() (int, error) {
	ports, err := portpick.Ports(2)
	if err != nil {
		return -1, err
	}
	i := len(c.Masters)
	c.Masters = append(c.Masters, &HAMaster{Index: i,
		RPCAddr:   net.JoinHostPort("127.0.0.1", strconv.Itoa(ports[0])),
		AdminAddr: net.JoinHostPort("127.0.0.1", strconv.Itoa(ports[1])),
		log:       filepath.Join(c.cfg.Dir, fmt.Sprintf("master-%d.log", i))})
	return i, c.Start(i)
}

// ClientAddr is the master address clients use: etcd://... or redis://...
func (c *HACluster) ClientAddr() string {
	if c.cfg.Backend == "redis" {
		return "redis://" + c.cfg.Redis
	}
	return "etcd://" + strings.Join(c.cfg.Etcd, ",")
}

// ClusterID is the cluster's id (clients need it to find the view).
func (c *HACluster) ClusterID() string { return c.cfg.ClusterID }

// LeaseTTL is the leadership lease.
func (c *HACluster) LeaseTTL() time.Duration { return c.cfg.LeaseTTL }

func (c *HACluster) args(m *HAMaster) []string {
	host, rpcPort, _ := net.SplitHostPort(m.RPCAddr)
	_, adminPort, _ := net.SplitHostPort(m.AdminAddr)
	etcd, rds := c.cfg.Etcd, c.cfg.Redis
	if c.cfg.Via != nil {
		etcd, rds = c.cfg.Via(m.Index)
	}
	haEndpoints := strings.Join(etcd, ",")
	if c.cfg.Backend == "redis" {
		haEndpoints = rds
	}
	return append([]string{
		"--rpc_address", host, "--rpc_port", rpcPort, "--metrics_port", adminPort,
		"--advertise_address", m.RPCAddr,
		"--oplog", "etcd://" + strings.Join(etcd, ","), "--cluster_id", c.cfg.ClusterID,
		"--ha_backend", c.cfg.Backend, "--ha_endpoints", haEndpoints,
		"--ha_lease_ttl_sec", strconv.Itoa(int(c.cfg.LeaseTTL / time.Second)),
	}, c.cfg.Args...)
}

// Start starts process i (again, after it exited); it does not wait for
// a role.
func (c *HACluster) Start(i int) error {
	m := c.Masters[i]
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.cmd != nil {
		select {
		case <-m.done:
		default:
			return fmt.Errorf("bench: ha: master %d is running", i)
		}
	}
	f, err := os.OpenFile(m.log, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return err
	}
	fmt.Fprintf(f, "=== start %s\n", time.Now().Format(time.RFC3339Nano))
	cmd := exec.Command(c.cfg.MasterBin, c.args(m)...)
	cmd.Stdout, cmd.Stderr = f, f
	if len(c.cfg.Env) > 0 {
		cmd.Env = append(os.Environ(), c.cfg.Env...)
	}
	// Dies with the bench; its own group so a Ctrl-C reaches only us.
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		f.Close()
		return fmt.Errorf("bench: ha: start %s: %w", c.cfg.MasterBin, err)
	}
	done := make(chan struct{})
	go func() {
		err := cmd.Wait()
		f.Close()
		m.mu.Lock()
		m.waitErr = err
		m.mu.Unlock()
		close(done)
	}()
	m.cmd, m.done = cmd, done
	return nil
}

// Signal sends sig to process i.
func (c *HACluster) Signal(i int, sig syscall.Signal) error {
	m := c.Masters[i]
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.cmd == nil {
		return fmt.Errorf("bench: ha: master %d never started", i)
	}
	return m.cmd.Process.Signal(sig)
}

// Kill kills process i with SIGKILL and waits until it is gone.
func (c *HACluster) Kill(i int) error {
	if err := c.Signal(i, syscall.SIGKILL); err != nil {
		return err
	}
	<-c.done(i)
	return nil
}

// Done is closed once process i exited.
func (c *HACluster) Done(i int) <-chan struct{} { return c.done(i) }

// ExitErr is process i's exit status (nil: exited 0) once Done is closed.
func (c *HACluster) ExitErr(i int) error {
	m := c.Masters[i]
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.waitErr
}

func (c *HACluster) done(i int) <-chan struct{} {
	m := c.Masters[i]
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.done
}

// Running reports whether process i runs (stopped by SIGSTOP counts).
func (c *HACluster) Running(i int) bool {
	select {
	case <-c.done(i):
		return false
	default:
		return true
	}
}

// Log is what process i printed so far.
func (c *HACluster) Log(i int) string {
	b, _ := os.ReadFile(c.Masters[i].log)
	return string(b)
}

// Role asks process i for its role.
func (c *HACluster) Role(ctx context.Context, i int) (HARole, error) {
	var r HARole
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+c.Masters[i].AdminAddr+"/role", nil)
	if err != nil {
		return r, err
	}
	resp, err := c.http.Do(req)
	if err != nil {
		return r, err
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(io.LimitReader(resp.Body, 1<<16))
	if err != nil {
		return r, err
	}
	if resp.StatusCode != http.StatusOK {
		return r, fmt.Errorf("bench: ha: master %d /role: %s: %s", i, resp.Status, strings.TrimSpace(string(body)))
	}
	if err := json.Unmarshal(body, &r); err != nil {
		return r, fmt.Errorf("bench: ha: master %d /role: %w", i, err)
	}
	return r, nil
}

// Serving reports whether process i leads and its /health answers 200
// (a leader in warm-up, or whose log failed, does not).
func (c *HACluster) Serving(ctx context.Context, i int) bool {
	r, err := c.Role(ctx, i)
	if err != nil || r.Role != "leader" {
		return false
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+c.Masters[i].AdminAddr+"/health", nil)
	if err != nil {
		return false
	}
	resp, err := c.http.Do(req)
	if err != nil {
		return false
	}
	resp.Body.Close()
	return resp.StatusCode == http.StatusOK
}

// ErrSplitBrain is two processes claiming leadership of one term.
var ErrSplitBrain = errors.New("bench: ha: two masters lead one term")

// WaitLeader polls every running process except skip until one says it
// leads, and returns the one with the highest term (a deposed leader may
// still say so until it notices; its log appends are fenced). Two leaders
// of one term fail with ErrSplitBrain.
func (c *HACluster) WaitLeader(ctx context.Context, skip int) (int, HARole, error) {
	deadline := time.Now().Add(10*c.cfg.LeaseTTL + 30*time.Second)
	for {
		leader, role := -1, HARole{}
		for i := range c.Masters {
			if i == skip || !c.Running(i) {
				continue
			}
			r, err := c.Role(ctx, i)
			if err != nil || r.Role != "leader" {
				continue
			}
			if leader >= 0 && r.Term == role.Term {
				return -1, HARole{}, fmt.Errorf("%w: masters %d and %d, term %d", ErrSplitBrain, leader, i, r.Term)
			}
			if leader < 0 || r.Term > role.Term {
				leader, role = i, r
			}
		}
		if leader >= 0 {
			return leader, role, nil
		}
		if time.Now().After(deadline) {
			return -1, HARole{}, fmt.Errorf("bench: ha: no leader after %v", 10*c.cfg.LeaseTTL+30*time.Second)
		}
		select {
		case <-ctx.Done():
			return -1, HARole{}, ctx.Err()
		case <-time.After(20 * time.Millisecond):
		}
	}
}

// WaitRole polls process i until its role is role.
func (c *HACluster) WaitRole(ctx context.Context, i int, role string) (HARole, error) {
	deadline := time.Now().Add(10*c.cfg.LeaseTTL + 30*time.Second)
	var last HARole
	var lastErr error
	for time.Now().Before(deadline) {
		r, err := c.Role(ctx, i)
		if err == nil && r.Role == role {
			return r, nil
		}
		last, lastErr = r, err
		select {
		case <-ctx.Done():
			return r, ctx.Err()
		case <-c.done(i):
			return r, fmt.Errorf("bench: ha: master %d exited waiting for role %s", i, role)
		case <-time.After(20 * time.Millisecond):
		}
	}
	return last, fmt.Errorf("bench: ha: master %d not %s (last %+v, %v)", i, role, last, lastErr)
}

// Close stops every process (SIGTERM, then SIGKILL after 10 s; a stopped
// one is continued first) and removes the temporary directory.
func (c *HACluster) Close() error {
	var wg sync.WaitGroup
	for i, m := range c.Masters {
		m.mu.Lock()
		started := m.cmd != nil
		m.mu.Unlock()
		if !started {
			continue
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			c.Signal(i, syscall.SIGCONT)
			c.Signal(i, syscall.SIGTERM)
			select {
			case <-c.done(i):
			case <-time.After(10 * time.Second):
				c.Kill(i)
			}
		}()
	}
	wg.Wait()
	if c.tmp != "" {
		return os.RemoveAll(c.tmp)
	}
	return nil
}
