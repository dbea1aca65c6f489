package redisproc

import (
	"bufio"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/crescent-kv/crescent/internal/portpick"
	"github.com/crescent-kv/crescent/internal/syncbuf"
)

// ErrNotInstalled means redis-server is not on the machine (make deps
// installs it).
var ErrNotInstalled = errors.New("redisproc: redis-server not found")

// Server is a running redis-server.
type Server struct {
	Addr string // 127.0.0.1:port
	path string
	args []string
	port int
	dir  string
	out  *syncbuf.Buffer

	mu   sync.Mutex // guards the process fields below across Restart
	cmd  *exec.Cmd
	done chan struct{}
	once *sync.Once
}

// Path resolves bin (redis-server on $PATH when empty).
func Path(bin string) (string, error) {
	if bin == "" {
		bin = "redis-server"
	}
	p, err := exec.LookPath(bin)
	if err != nil {
		return "", fmt.Errorf("%w (%v); run `make deps`", ErrNotInstalled, err)
	}
	return p, nil
}

// Start runs redis-server (bin, or the one on $PATH) with extra arguments
// and waits until it answers PING. A port taken between choosing and
// binding it is retried with another.
func Start(bin string, args ...string) (*Server, error) {
	path, err := Path(bin)
	if err != nil {
		return nil, err
	}
	dir, err := os.MkdirTemp("", "crescent-redis-*")
	if err != nil {
		return nil, err
	}
	var lastErr error
	for range 5 {
		port, err := portpick.Port()
		if err != nil {
			lastErr = err
			continue
		}
		s, err := start(path, dir, port, args)
		if err == nil {
			return s, nil
		}
		lastErr = err
	}
	os.RemoveAll(dir)
	return nil, fmt.Errorf("redisproc: redis-server did not start: %w", lastErr)
}

func start(path, dir string, port int, args []string) (*Server, error) {
	s := &Server{Addr: net.JoinHostPort("127.0.0.1", strconv.Itoa(port)), path: path, args: args, port: port, dir: dir, out: &syncbuf.Buffer{}}
	if err := s.launch(); err != nil {
		return nil, err
	}
	return s, nil
}

// launch starts the process on s's port and waits until it answers PING.
func (s *Server) launch() error {
	argv := append([]string{
		"--port", strconv.Itoa(s.port), "--bind", "127.0.0.1",
		"--save", "", "--appendonly", "no", "--dir", s.dir,
		"--daemonize", "no", "--logfile", "", "--protected-mode", "yes",
	}, s.args...)
	cmd := exec.Command(s.path, argv...)
	cmd.Stdout, cmd.Stderr = s.out, s.out
	// Its own process group, so a Ctrl-C at the terminal reaches the
	// parent, which stops the server; it dies with the parent.
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGTERM}
	if err := cmd.Start(); err != nil {
		return err
	}
	done := make(chan struct{})
	go func() { cmd.Wait(); close(done) }()
	s.mu.Lock()
	s.cmd, s.done, s.once = cmd, done, &sync.Once{}
	s.mu.Unlock()
	deadline := time.Now().Add(20 * time.Second)
	for {
		if err := Ping(s.Addr); err == nil {
			return nil
		}
		select {
		case <-done:
			return fmt.Errorf("redis-server on port %d exited: %s", s.port, strings.TrimSpace(s.out.String()))
		case <-time.After(20 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			s.stop()
			return fmt.Errorf("redis-server on %s not answering PING: %s", s.Addr, strings.TrimSpace(s.out.String()))
		}
	}
}

// Restart stops the server and starts a new one on the same address
// (empty: persistence is off), as an operator's restart would.
func (s *Server) Restart() error {
	s.stop()
	var err error
	for range 50 { // the old socket may linger for a moment
		if err = s.launch(); err == nil {
			return nil
		}
		time.Sleep(100 * time.Millisecond)
	}
	return fmt.Errorf("redisproc: restart on %s: %w", s.Addr, err)
}

// Ping sends an inline PING and expects +PONG (or -NOAUTH: up, with a
// password).
func Ping(addr string) error {
	c, err := net.DialTimeout("tcp", addr, time.Second)
	if err != nil {
		return err
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(2 * time.Second))
	if _, err := c.Write([]byte("PING\r\n")); err != nil {
		return err
	}
	line, err := bufio.NewReader(c).ReadString('\n')
	if err != nil {
		return err
	}
	if !strings.HasPrefix(line, "+PONG") && !strings.HasPrefix(line, "-NOAUTH") {
		return fmt.Errorf("PING answered %q", line)
	}
	return nil
}

func (s *Server) stop() {
	s.mu.Lock()
	cmd, done, once := s.cmd, s.done, s.once
	s.mu.Unlock()
	once.Do(func() {
		cmd.Process.Signal(syscall.SIGTERM)
		select {
		case <-done:
		case <-time.After(10 * time.Second):
			cmd.Process.Kill()
			<-done
		}
	})
}

// Close stops the server (SIGTERM, SIGKILL after 10 s), waits for it and
// removes its directory. Safe to call twice.
func (s *Server) Close() error {
	s.stop()
	return os.RemoveAll(s.dir)
}

// Output is what the server printed so far.
func (s *Server) Output() string { return s.out.String() }
