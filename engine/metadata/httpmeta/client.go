package httpmeta

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"strings"
	"sync"

	"github.com/crescent-kv/crescent/engine/metadata"
)

// ErrClosed is returned by a closed backend.
var ErrClosed = errors.New("httpmeta: backend closed")

func init() {
	open := func(conn string, opts metadata.Options) (metadata.Backend, error) { return Open(conn, opts) }
	metadata.Register("http", open)
	metadata.Register("https", open)
}

// maxReply bounds a GET reply the client reads.
const maxReply = 64 << 20

// ParseURL checks a connection string "http(s)://host:port/path" (the
// reference uses path /metadata); keys are appended as "?key=".
func ParseURL(conn string) (*url.URL, error) {
	u, err := url.Parse(conn)
	if err != nil {
		// url.Error repeats the string, password included: keep only
		// the reason.
		var ue *url.Error
		if errors.As(err, &ue) {
			err = ue.Err
		}
		return nil, fmt.Errorf("%w: not a URL: %w", metadata.ErrBadConnString, err)
	}
	if u.Scheme != "http" && u.Scheme != "https" {
		return nil, fmt.Errorf("%w: %q: scheme is not http or https", metadata.ErrBadConnString, conn)
	}
	if u.Host == "" || u.Hostname() == "" {
		return nil, fmt.Errorf("%w: %q: no host", metadata.ErrBadConnString, conn)
	}
	if u.RawQuery != "" || u.Fragment != "" {
		return nil, fmt.Errorf("%w: %q: a query or fragment cannot take ?key=", metadata.ErrBadConnString, conn)
	}
	return u, nil
}

// Backend is the client of an HTTP metadata server. Plain HTTP has no
// leases: entries stay until removed, so a crashed owner's descriptor
// remains until someone deletes it (Close removes what it published).
type Backend struct {
	base string
	hc   *http.Client
	tr   *http.Transport
	opts metadata.Options
	keys metadata.Keys

	mu     sync.Mutex
	closed bool
	names  map[string]bool // published segments → rpc_meta written
}

// Open checks that conn answers the metadata protocol (a GET of an
// absent key gets 200 or 404) within opts.Timeout. Options are expected
// to carry metadata.Open's defaults.
func Open(conn string, opts metadata.Options) (*Backend, error) {
	u, err := ParseURL(conn)
	if err != nil {
		return nil, err
	}
	if opts.Timeout <= 0 || opts.Logger == nil {
		return nil, fmt.Errorf("httpmeta: options lack defaults (open through metadata.Open)")
	}
	tr := http.DefaultTransport.(*http.Transport).Clone()
	tr.Proxy = nil // metadata servers are local to the cluster
	tr.MaxIdleConnsPerHost = 16
	b := &Backend{
		base: u.String(), tr: tr, hc: &http.Client{Transport: tr, Timeout: opts.Timeout},
		opts: opts, keys: metadata.NewKeys(opts.ClusterID), names: map[string]bool{},
	}
	ctx, cancel := context.WithTimeout(context.Background(), opts.Timeout)
	defer cancel()
	if _, _, err := b.get(ctx, b.keys.Prefix+"probe"); err != nil {
		tr.CloseIdleConnections()
		return nil, err
	}
	return b, nil
}

// Keys returns the key names the backend uses.
func (b *Backend) Keys() metadata.Keys { return b.keys }

func (b *Backend) url(key string) string { return b.base + "?key=" + url.QueryEscape(key) }

func (b *Backend) wrap(op string, err error) error {
	var ne net.Error
	var oe *net.OpError
	if errors.Is(err, context.DeadlineExceeded) || errors.Is(err, context.Canceled) ||
		(errors.As(err, &ne) && ne.Timeout()) || (errors.As(err, &oe) && oe.Op == "dial") {
		return fmt.Errorf("httpmeta: %s (%s): %w: %w", op, b.base, metadata.ErrUnavailable, err)
	}
	return fmt.Errorf("httpmeta: %s (%s): %w", op, b.base, err)
}

// do sends one request and returns the status and up to maxReply bytes
// of body.
func (b *Backend) do(ctx context.Context, method, key string, body []byte) (int, []byte, error) {
	ctx, cancel := context.WithTimeout(ctx, b.opts.Timeout)
	defer cancel()
	var rd io.Reader
	if body != nil {
		rd = bytes.NewReader(body)
	}
	req, err := http.NewRequestWithContext(ctx, method, b.url(key), rd)
	if err != nil {
		return 0, nil, fmt.Errorf("httpmeta: %s %s: %w", method, key, err)
	}
	if body != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	resp, err := b.hc.Do(req)
	if err != nil {
		return 0, nil, b.wrap(method+" "+key, err)
	}
	defer resp.Body.Close()
	out, err := io.ReadAll(io.LimitReader(resp.Body, maxReply+1))
	if err != nil {
		return 0, nil, b.wrap(method+" "+key, err)
	}
	if len(out) > maxReply {
		return 0, nil, fmt.Errorf("httpmeta: %s %s: reply larger than %d bytes", method, key, maxReply)
	}
	return resp.StatusCode, out, nil
}

func statusErr(method, key string, code int, body []byte) error {
	if len(body) > 200 {
		body = body[:200]
	}
	return fmt.Errorf("httpmeta: %s %s: HTTP %d: %s", method, key, code, strings.TrimSpace(string(body)))
}

func (b *Backend) get(ctx context.Context, key string) ([]byte, bool, error) {
	code, body, err := b.do(ctx, http.MethodGet, key, nil)
	switch {
	case err != nil:
		return nil, false, err
	case code == http.StatusOK:
		return body, true, nil
	case code == http.StatusNotFound:
		return nil, false, nil
	}
	return nil, false, statusErr("GET", key, code, body)
}

func (b *Backend) put(ctx context.Context, key string, val []byte) error {
	code, body, err := b.do(ctx, http.MethodPut, key, val)
	if err != nil {
		return err
	}
	if code != http.StatusOK {
		return statusErr("PUT", key, code, body)
	}
	return nil
}

func (b *Backend) del(ctx context.Context, key string) error {
	code, body, err := b.do(ctx, http.MethodDelete, key, nil)
	if err != nil {
		return err
	}
	if code != http.StatusOK && code != http.StatusNotFound {
		return statusErr("DELETE", key, code, body)
	}
	return nil
}

// Publish PUTs the rpc_meta entry (once per segment, when
// Options.RPCAddr is set), then the descriptor. Values are compact JSON.
func (b *Backend) Publish(ctx context.Context, d *metadata.SegmentDesc) error {
	kvs, err := b.keys.Entries(d, b.opts.RPCAddr)
	if err != nil {
		return err
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.closed {
		return ErrClosed
	}
	if rpc, ok := kvs[b.keys.RPCMeta(d.Name)]; ok && !b.names[d.Name] {
		if err := b.putRPCMeta(ctx, d.Name, bytes.TrimSuffix(rpc, []byte("\n"))); err != nil {
			return err
		}
	}
	if err := b.put(ctx, b.keys.Segment(d.Name), bytes.TrimSuffix(kvs[b.keys.Segment(d.Name)], []byte("\n"))); err != nil {
		return err
	}
	b.names[d.Name] = true
	return nil
}

// putRPCMeta writes the rpc_meta entry. The reference's store master
// refuses to overwrite an rpc_meta key (400); an existing entry with the
// same address is accepted.
func (b *Backend) putRPCMeta(ctx context.Context, name string, val []byte) error {
	key := b.keys.RPCMeta(name)
	err := b.put(ctx, key, val)
	if err == nil {
		return nil
	}
	if old, ok, gerr := b.get(ctx, key); gerr == nil && ok {
		got, derr := metadata.DecodeRPCMeta(old)
		if derr == nil && got == b.opts.RPCAddr {
			return nil
		}
	}
	return err
}

// Get returns segment name's descriptor, or an error matching
// metadata.ErrNotFound when there is none.
func (b *Backend) Get(ctx context.Context, name string) (*metadata.SegmentDesc, error) {
	return b.keys.GetDesc(ctx, b.get, "metadata server "+b.base, name)
}

// RPCAddr returns the handshake address published under
// rpc_meta/<name>.
func (b *Backend) RPCAddr(ctx context.Context, name string) (string, error) {
	return b.keys.GetRPCAddr(ctx, b.get, "metadata server "+b.base, name)
}

// Remove DELETEs segment name's descriptor and rpc_meta entry; absent
// keys are not an error.
func (b *Backend) Remove(ctx context.Context, name string) error {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.closed {
		return ErrClosed
	}
	return b.removeLocked(ctx, name)
}

func (b *Backend) removeLocked(ctx context.Context, name string) error {
	delete(b.names, name)
	return errors.Join(b.del(ctx, b.keys.Segment(name)), b.del(ctx, b.keys.RPCMeta(name)))
}

// Close removes the segments this backend published and still holds,
// then drops idle connections.
func (b *Backend) Close() error {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.closed {
		return nil
	}
	b.closed = true
	var errs []error
	ctx, cancel := context.WithTimeout(context.Background(), b.opts.Timeout)
	defer cancel()
	for name := range b.names {
		errs = append(errs, b.removeLocked(ctx, name))
	}
	b.tr.CloseIdleConnections()
	return errors.Join(errs...)
}
