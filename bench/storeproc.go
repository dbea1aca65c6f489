package bench

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"os/exec"
	"runtime"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/crescent-kv/crescent/internal/syncbuf"
	"github.com/crescent-kv/crescent/store"
)

// Client processes speak JSON lines: the parent sends a clientMsg per
// command on the child's stdin (init, prepare, run) and the child answers
// each with one clientMsg on stdout. The child exits when stdin closes.
type clientMsg struct {
	Cmd     string        `json:"cmd,omitempty"`
	Config  *StoreConfig  `json:"config,omitempty"`
	Index   int           `json:"index,omitempty"`
	Master  string        `json:"master,omitempty"`
	Plan    *storePlan    `json:"plan,omitempty"`
	Dur     time.Duration `json:"dur,omitempty"`
	Segment string        `json:"segment,omitempty"`
	BufAddr uint64        `json:"buf_addr,omitempty"`
	Proto   string        `json:"proto,omitempty"`
	Stats   *statsWire    `json:"stats,omitempty"`
	Error   string        `json:"error,omitempty"`
}

type statsWire struct {
	Ops, Gets, Puts, Bytes int64
	Elapsed                time.Duration
	Hist                   histWire
	Stored                 []uint64 `json:"stored,omitempty"` // roundStats.Stored
	AllPuts                uint64   `json:"all_puts,omitempty"`
	AheadPuts              uint64   `json:"ahead_puts,omitempty"`
	LocHits                uint64   `json:"loc_hits,omitempty"`
	LocMisses              uint64   `json:"loc_misses,omitempty"`
}

// histWire is a Histogram's non-empty buckets as [index, count] pairs.
type histWire struct {
	N       uint64      `json:"n"`
	Max     int64       `json:"max_ns"`
	Buckets [][2]uint64 `json:"buckets"`
}

func (h *Histogram) wire() histWire {
	w := histWire{N: h.n, Max: int64(h.max)}
	for i, c := range h.counts {
		if c != 0 {
			w.Buckets = append(w.Buckets, [2]uint64{uint64(i), c})
		}
	}
	return w
}

func (w histWire) histogram() (Histogram, error) {
	var h Histogram
	var n uint64
	for _, b := range w.Buckets {
		if b[0] >= uint64(len(h.counts)) {
			return h, fmt.Errorf("bench: histogram bucket %d out of range", b[0])
		}
		h.counts[b[0]] += b[1]
		n += b[1]
	}
	if n != w.N || w.Max < 0 {
		return h, fmt.Errorf("bench: histogram of %d observations claims %d", n, w.N)
	}
	h.n, h.max = n, time.Duration(w.Max)
	return h, nil
}

// ServeStoreClient is the main of a client process (StoreConfig.
// ClientProcesses): it answers the parent's commands on in with lines on
// out until in closes or ctx ends.
func ServeStoreClient(ctx context.Context, in io.Reader, out io.Writer) error {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel() // lets the reader go if it is waiting to hand over a line
	lines := make(chan []byte)
	readErr := make(chan error, 1)
	go func() {
		sc := bufio.NewScanner(in)
		sc.Buffer(make([]byte, 64<<10), 64<<20)
		for sc.Scan() {
			select {
			case lines <- append([]byte(nil), sc.Bytes()...):
			case <-ctx.Done():
				return
			}
		}
		readErr <- sc.Err()
	}()
	enc := json.NewEncoder(out)
	var lc *localClient
	defer func() {
		if lc != nil {
			lc.close()
		}
	}()
	for {
		var line []byte
		select {
		case <-ctx.Done():
			return ctx.Err()
		case err := <-readErr:
			return err
		case line = <-lines:
		}
		var m clientMsg
		if err := json.Unmarshal(line, &m); err != nil {
			return fmt.Errorf("bench: client command: %w", err)
		}
		var reply clientMsg
		var err error
		switch {
		case m.Cmd == "init" && lc == nil && m.Config != nil:
			cfg := *m.Config
			cfg.ClientProcesses, cfg.Progress = false, nil
			if err = cfg.setDefaults(); err == nil {
				lc, err = newLocalClient(ctx, &cfg, m.Index, m.Master)
			}
			if err == nil {
				reply.Segment, reply.Proto, reply.BufAddr = lc.segment(), lc.masterProtocol(), lc.bufAddr()
			}
		case m.Cmd == "prepare" && lc != nil && m.Plan != nil:
			err = lc.prepare(ctx, m.Plan)
		case (m.Cmd == "run" || m.Cmd == "engine") && lc != nil:
			run := lc.run
			if m.Cmd == "engine" {
				run = lc.runEngine
			}
			var s *roundStats
			if s, err = run(ctx, m.Dur); err == nil {
				reply.Stats = &statsWire{Ops: s.Ops, Gets: s.Gets, Puts: s.Puts, Bytes: s.Bytes, Elapsed: s.Elapsed, Hist: s.Hist.wire(), Stored: s.Stored, AllPuts: s.AllPuts, AheadPuts: s.AheadPuts, LocHits: s.LocHits, LocMisses: s.LocMisses}
			}
		default:
			err = fmt.Errorf("bench: unexpected client command %q", m.Cmd)
		}
		if err != nil {
			reply.Error = err.Error()
		}
		if werr := enc.Encode(&reply); werr != nil {
			return werr
		}
	}
}

// childEnv is a client process's environment: base plus extra and,
// unless either sets GOMAXPROCS, the child's share of the CPUs (at least
// one). The children and the master share the host; a child whose
// runtime counts every core as its own wakes idle threads (futex) that
// then wait for a core the others hold.
func childEnv(base, extra []string, clients, cpus int) []string {
	env := append(append([]string(nil), base...), extra...)
	for _, kv := range env {
		if v, ok := strings.CutPrefix(kv, "GOMAXPROCS="); ok && v != "" {
			return env
		}
	}
	return append(env, fmt.Sprintf("GOMAXPROCS=%d", max(1, cpus/max(1, clients))))
}

// remoteClient is a client process driven over its stdin and stdout.
type remoteClient struct {
	index   int
	cmd     *exec.Cmd
	stdin   io.WriteCloser
	replies chan []byte
	stderr  *syncbuf.Buffer
	exited  chan struct{}
	seg     string
	bufs    uint64
	proto   string
	once    sync.Once
}

func startRemoteClient(ctx context.Context, cfg *StoreConfig, index int, masterAddr string) (*remoteClient, error) {
	rc := &remoteClient{index: index, replies: make(chan []byte, 1), stderr: &syncbuf.Buffer{}, exited: make(chan struct{})}
	rc.cmd = exec.Command(cfg.ClientCommand[0], cfg.ClientCommand[1:]...)
	rc.cmd.Env = childEnv(os.Environ(), cfg.ClientEnv, cfg.Clients, runtime.NumCPU())
	rc.cmd.Stderr = rc.stderr
	// The child dies with us rather than keep its memory.
	rc.cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	var err error
	if rc.stdin, err = rc.cmd.StdinPipe(); err != nil {
		return nil, err
	}
	stdout, err := rc.cmd.StdoutPipe()
	if err != nil {
		return nil, err
	}
	if err := rc.cmd.Start(); err != nil {
		return nil, fmt.Errorf("bench: start client process: %w", err)
	}
	go func() {
		sc := bufio.NewScanner(stdout)
		sc.Buffer(make([]byte, 64<<10), 64<<20)
		for sc.Scan() {
			rc.replies <- append([]byte(nil), sc.Bytes()...)
		}
		rc.cmd.Wait()
		close(rc.exited)
	}()
	reply, err := rc.call(ctx, &clientMsg{Cmd: "init", Config: cfg, Index: index, Master: masterAddr})
	if err != nil {
		rc.close()
		return nil, err
	}
	rc.seg, rc.proto, rc.bufs = reply.Segment, reply.Proto, reply.BufAddr
	return rc, nil
}

// call sends one command and waits for its answer.
func (rc *remoteClient) call(ctx context.Context, m *clientMsg) (*clientMsg, error) {
	b, err := json.Marshal(m)
	if err != nil {
		return nil, err
	}
	if _, err := rc.stdin.Write(append(b, '\n')); err != nil {
		return nil, fmt.Errorf("bench: client process %d: %w: %s", rc.index, err, rc.stderrTail())
	}
	var line []byte
	select {
	case line = <-rc.replies:
	case <-rc.exited:
		return nil, fmt.Errorf("bench: client process %d exited: %s", rc.index, rc.stderrTail())
	case <-ctx.Done():
		return nil, ctx.Err()
	}
	var reply clientMsg
	if err := json.Unmarshal(line, &reply); err != nil {
		return nil, fmt.Errorf("bench: client process %d answered %q: %w", rc.index, line, err)
	}
	if reply.Error != "" {
		return nil, fmt.Errorf("bench: client process %d: %s", rc.index, reply.Error)
	}
	return &reply, nil
}

func (rc *remoteClient) stderrTail() string {
	s := strings.TrimSpace(rc.stderr.String())
	if len(s) > 2000 {
		s = "..." + s[len(s)-2000:]
	}
	return s
}

func (rc *remoteClient) segment() string { return rc.seg }

func (rc *remoteClient) masterProtocol() string { return rc.proto }

func (rc *remoteClient) prepare(ctx context.Context, p *storePlan) error {
	_, err := rc.call(ctx, &clientMsg{Cmd: "prepare", Plan: p})
	return err
}

func (rc *remoteClient) bufAddr() uint64 { return rc.bufs }

func (rc *remoteClient) run(ctx context.Context, d time.Duration) (*roundStats, error) {
	return rc.round(ctx, "run", d)
}

func (rc *remoteClient) runEngine(ctx context.Context, d time.Duration) (*roundStats, error) {
	return rc.round(ctx, "engine", d)
}

func (rc *remoteClient) round(ctx context.Context, cmd string, d time.Duration) (*roundStats, error) {
	reply, err := rc.call(ctx, &clientMsg{Cmd: cmd, Dur: d})
	if err != nil {
		return nil, err
	}
	if reply.Stats == nil {
		return nil, fmt.Errorf("bench: client process %d sent no stats", rc.index)
	}
	h, err := reply.Stats.Hist.histogram()
	if err != nil {
		return nil, err
	}
	s := reply.Stats
	if len(s.Stored) > store.MaxCountedReplicas+1 {
		return nil, fmt.Errorf("bench: client process %d sent %d replica counts", rc.index, len(s.Stored))
	}
	if s.AheadPuts > s.AllPuts {
		return nil, fmt.Errorf("bench: client process %d sent %d puts ahead of %d puts", rc.index, s.AheadPuts, s.AllPuts)
	}
	return &roundStats{Ops: s.Ops, Gets: s.Gets, Puts: s.Puts, Bytes: s.Bytes, Elapsed: s.Elapsed, Hist: h, Stored: s.Stored, AllPuts: s.AllPuts, AheadPuts: s.AheadPuts, LocHits: s.LocHits, LocMisses: s.LocMisses}, nil
}

// close ends the child: stdin closes (it closes its client and exits);
// after 30 s it is killed.
func (rc *remoteClient) close() error {
	var err error
	rc.once.Do(func() {
		rc.stdin.Close()
		kill := time.After(30 * time.Second)
		for exited := false; !exited; {
			select {
			case <-rc.replies: // drain, so the reader reaches Wait
			case <-rc.exited:
				exited = true
			case <-kill:
				rc.cmd.Process.Kill()
				err = fmt.Errorf("bench: client process %d did not exit; killed", rc.index)
				kill = nil
			}
		}
		if err == nil && !rc.cmd.ProcessState.Success() {
			err = fmt.Errorf("bench: client process %d: %s: %s", rc.index, rc.cmd.ProcessState, rc.stderrTail())
		}
	})
	return err
}
