package bench

import (
	"bufio"
	"bytes"
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
)

// ErrNoRedis: redis-server is not installed (make deps installs it).
var ErrNoRedis = errors.New("bench: redis-server not found")

// RedisServer is a redis-server process started by the bench on a free
// 127.0.0.1 port, with persistence off, in a temporary directory.
type RedisServer struct {
	Addr string // 127.0.0.1:port
	cmd  *exec.Cmd
	dir  string
	out  *lockedBuffer
	done chan struct{}
	once sync.Once
}

// RedisAvailable reports whether bin (or redis-server on $PATH when bin
// is empty) can be run.
func RedisAvailable(bin string) bool {
	_, err := redisPath(bin)
	return err == nil
}

func redisPath(bin string) (string, error) {
	if bin == "" {
		bin = "redis-server"
	}
	p, err := exec.LookPath(bin)
	if err != nil {
		return "", fmt.Errorf("%w (%v); run `make deps`", ErrNoRedis, err)
	}
	return p, nil
}

// StartRedis starts redis-server (bin, or the one on $PATH when empty)
// and waits until it answers PING. A port taken between choosing and
// binding it is retried with another.
func StartRedis(bin string) (*RedisServer, error) {
	path, err := redisPath(bin)
	if err != nil {
		return nil, err
	}
	dir, err := os.MkdirTemp("", "crescent-bench-redis-*")
	if err != nil {
		return nil, err
	}
	var lastErr error
	for range 5 {
		port, err := freePort()
		if err != nil {
			lastErr = err
			continue
		}
		r, err := startRedis(path, dir, port)
		if err == nil {
			return r, nil
		}
		lastErr = err
	}
	os.RemoveAll(dir)
	return nil, fmt.Errorf("bench: redis-server did not start: %w", lastErr)
}

// freePort returns a loopback TCP port that was free a moment ago.
func freePort() (int, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	defer ln.Close()
	return ln.Addr().(*net.TCPAddr).Port, nil
}

func startRedis(path, dir string, port int) (*RedisServer, error) {
	r := &RedisServer{Addr: net.JoinHostPort("127.0.0.1", strconv.Itoa(port)), dir: dir, out: &lockedBuffer{}, done: make(chan struct{})}
	r.cmd = exec.Command(path,
		"--port", strconv.Itoa(port), "--bind", "127.0.0.1",
		"--save", "", "--appendonly", "no", "--dir", dir,
		"--daemonize", "no", "--logfile", "", "--protected-mode", "yes")
	r.cmd.Stdout, r.cmd.Stderr = r.out, r.out
	// Its own process group: a Ctrl-C at the terminal stops the bench,
	// which then stops the server, rather than the server dying mid-round.
	// It dies with the bench if the bench is killed.
	r.cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGTERM}
	if err := r.cmd.Start(); err != nil {
		return nil, err
	}
	go func() { r.cmd.Wait(); close(r.done) }()
	deadline := time.Now().Add(20 * time.Second)
	for {
		if err := redisPing(r.Addr); err == nil {
			return r, nil
		}
		select {
		case <-r.done:
			return nil, fmt.Errorf("redis-server on port %d exited: %s", port, strings.TrimSpace(r.out.String()))
		case <-time.After(20 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			r.stop()
			return nil, fmt.Errorf("redis-server on %s not answering PING: %s", r.Addr, strings.TrimSpace(r.out.String()))
		}
	}
}

// redisPing sends an inline PING and expects +PONG.
func redisPing(addr string) error {
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
	if !strings.HasPrefix(line, "+PONG") {
		return fmt.Errorf("PING answered %q", line)
	}
	return nil
}

// stop terminates the server (SIGTERM, SIGKILL after 10 s) and waits.
func (r *RedisServer) stop() {
	r.once.Do(func() {
		r.cmd.Process.Signal(syscall.SIGTERM)
		select {
		case <-r.done:
		case <-time.After(10 * time.Second):
			r.cmd.Process.Kill()
			<-r.done
		}
	})
}

// Close stops the server and removes its directory. Safe to call twice.
func (r *RedisServer) Close() error {
	r.stop()
	return os.RemoveAll(r.dir)
}

// Output is what the server printed.
func (r *RedisServer) Output() string { return r.out.String() }

// lockedBuffer collects a child's output.
type lockedBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *lockedBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *lockedBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}
