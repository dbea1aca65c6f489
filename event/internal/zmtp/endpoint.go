package zmtp

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"strings"
	"time"
)

// ErrEndpoint reports an endpoint that cannot be parsed or used.
var ErrEndpoint = errors.New("zmtp: invalid endpoint")

// Endpoint is a parsed ZeroMQ endpoint.
type Endpoint struct {
	Raw     string // as given
	Scheme  string // "tcp" or "ipc"
	Network string // "tcp" or "unix"
	Addr    string // host:port (wildcard "*" mapped to "") or socket path
}

// Parse accepts tcp://host:port (host may be *, an IP, [v6] or a name) and
// ipc://path. inproc:// is not supported: it only exists inside one
// libzmq context.
func Parse(ep string) (Endpoint, error) {
	scheme, rest, ok := strings.Cut(ep, "://")
	if !ok || rest == "" {
		return Endpoint{}, fmt.Errorf("%w: %q: want tcp://host:port or ipc://path", ErrEndpoint, ep)
	}
	switch scheme {
	case "tcp":
		host, port, err := net.SplitHostPort(rest)
		if err != nil {
			return Endpoint{}, fmt.Errorf("%w: %q: %v", ErrEndpoint, ep, err)
		}
		if host == "*" {
			host = ""
		}
		return Endpoint{Raw: ep, Scheme: "tcp", Network: "tcp", Addr: net.JoinHostPort(host, port)}, nil
	case "ipc":
		return Endpoint{Raw: ep, Scheme: "ipc", Network: "unix", Addr: rest}, nil
	case "inproc":
		return Endpoint{}, fmt.Errorf("%w: %q: inproc is not supported (use ipc:// or tcp://)", ErrEndpoint, ep)
	}
	return Endpoint{}, fmt.Errorf("%w: %q: unknown transport %q", ErrEndpoint, ep, scheme)
}

// ShouldBind is vLLM's rule for its PUB socket: bind when the endpoint has
// a wildcard ("*" or "::") or is ipc:// or inproc://, otherwise connect.
func ShouldBind(ep string) bool {
	return strings.Contains(ep, "*") || strings.Contains(ep, "::") ||
		strings.HasPrefix(ep, "ipc://") || strings.HasPrefix(ep, "inproc://")
}

// Listen binds e. For ipc it removes a stale socket file first, as libzmq
// does.
func Listen(e Endpoint) (net.Listener, error) {
	if e.Network == "unix" {
		if fi, err := os.Lstat(e.Addr); err == nil && fi.Mode()&os.ModeSocket != 0 {
			_ = os.Remove(e.Addr)
		}
	}
	l, err := net.Listen(e.Network, e.Addr)
	if err != nil {
		return nil, fmt.Errorf("zmtp: bind %s: %w", e.Raw, err)
	}
	if ul, ok := l.(*net.UnixListener); ok {
		ul.SetUnlinkOnClose(true)
	}
	return l, nil
}

// Dial connects to e once.
func Dial(ctx context.Context, e Endpoint) (net.Conn, error) {
	var d net.Dialer
	c, err := d.DialContext(ctx, e.Network, e.Addr)
	if err != nil {
		return nil, fmt.Errorf("zmtp: connect %s: %w", e.Raw, err)
	}
	if tc, ok := c.(*net.TCPConn); ok {
		_ = tc.SetNoDelay(true)
	}
	return c, nil
}

// BoundEndpoint returns a dialable endpoint for listener l bound from e:
// the chosen port for port 0, the loopback address for a wildcard host.
func BoundEndpoint(l net.Listener, e Endpoint) string {
	if e.Network == "unix" {
		return e.Raw
	}
	ta, ok := l.Addr().(*net.TCPAddr)
	if !ok {
		return e.Raw
	}
	ip := ta.IP
	if ip.IsUnspecified() {
		if ip.To4() == nil && strings.Contains(e.Raw, "::") {
			ip = net.IPv6loopback
		} else {
			ip = net.IPv4(127, 0, 0, 1)
		}
	}
	return "tcp://" + net.JoinHostPort(ip.String(), fmt.Sprint(ta.Port))
}

// backoff returns the delay before reconnect attempt n (0-based).
func backoff(n int) time.Duration {
	d := 10 * time.Millisecond << min(n, 7)
	return min(d, time.Second)
}
