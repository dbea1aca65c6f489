package netx

import (
	"bufio"
	"crypto/tls"
	"io"
	"net"
	"net/http"
	"sync/atomic"
	"testing"
	"time"

	"github.com/crescent-kv/crescent/internal/testpki"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// httpTestServer serves "/" (answers ok) and "/block" (answers once
// release is closed; entered is signalled first).
func httpTestServer(t *testing.T, cfg Config, tlsCfg *tls.Config) (h *HTTP, entered chan struct{}, release chan struct{}) {
	t.Helper()
	entered, release = make(chan struct{}, 8), make(chan struct{})
	mux := http.NewServeMux()
	mux.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) { io.WriteString(w, "ok") })
	mux.HandleFunc("/block", func(w http.ResponseWriter, r *http.Request) {
		entered <- struct{}{}
		<-release
		io.WriteString(w, "released")
	})
	h = ServeHTTP(listen(t), cfg, &http.Server{Handler: mux, ReadHeaderTimeout: 5 * time.Second}, tlsCfg)
	t.Cleanup(func() { h.Close() })
	return h, entered, release
}

func waitEntered(t *testing.T, entered chan struct{}) {
	t.Helper()
	select {
	case <-entered:
	case <-time.After(10 * time.Second):
		t.Fatal("the request never reached its handler")
	}
}

// httpPeer is one keep-alive connection sending requests by hand, so the
// test knows which connection each request uses.
type httpPeer struct {
	c net.Conn
	r *bufio.Reader
}

func dialHTTP(t *testing.T, addr string, tlsCfg *tls.Config) *httpPeer {
	t.Helper()
	c, err := net.DialTimeout("tcp", addr, 2*time.Second)
	require.NoError(t, err)
	if tlsCfg != nil {
		c = tls.Client(c, tlsCfg)
	}
	t.Cleanup(func() { c.Close() })
	return &httpPeer{c: c, r: bufio.NewReader(c)}
}

func (p *httpPeer) send(path string) error {
	p.c.SetWriteDeadline(time.Now().Add(5 * time.Second))
	_, err := io.WriteString(p.c, "GET "+path+" HTTP/1.1\r\nHost: x\r\n\r\n")
	return err
}

// recv reads one response and returns its body.
func (p *httpPeer) recv() (string, error) {
	p.c.SetReadDeadline(time.Now().Add(10 * time.Second))
	resp, err := http.ReadResponse(p.r, nil)
	if err != nil {
		return "", err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	return string(b), err
}

func (p *httpPeer) get(path string) (string, error) {
	if err := p.send(path); err != nil {
		return "", err
	}
	return p.recv()
}

// At the cap, an idle keep-alive connection is closed to serve a new
// peer, and the server keeps no more connections than the cap.
func TestHTTPEvictsIdlestAtCap(t *testing.T) {
	h, _, _ := httpTestServer(t, Config{MaxConns: 2}, nil)
	addr := h.Addr().String()
	a, b := dialHTTP(t, addr, nil), dialHTTP(t, addr, nil)
	for _, p := range []*httpPeer{a, b} {
		body, err := p.get("/")
		require.NoError(t, err)
		require.Equal(t, "ok", body)
	}
	c := dialHTTP(t, addr, nil)
	body, err := c.get("/")
	require.NoError(t, err)
	assert.Equal(t, "ok", body)
	// One idle connection was closed to make room: a, idle longest, or
	// b when the server marked a idle after b (it does so after writing
	// a response, late on a loaded host).
	_, errA := a.get("/")
	_, errB := b.get("/")
	require.True(t, (errA == nil) != (errB == nil), "a: %v, b: %v", errA, errB)
	assert.LessOrEqual(t, h.Loop().Len(), 2)
	body, err = c.get("/")
	require.NoError(t, err)
	assert.Equal(t, "ok", body)
}

// A connection whose request is being served is busy: a new peer waits
// for it instead of evicting it, over plain TCP and over TLS (where the
// server sees a *tls.Conn around the Loop's connection).
func TestHTTPBusyNotEvicted(t *testing.T) {
	pki := testpki.New(t)
	for _, tc := range []struct {
		name     string
		srv, cli *tls.Config
	}{{"plain", nil, nil}, {"tls", pki.ServerTLS(), pki.ClientTLS(true)}} {
		if tc.cli != nil {
			tc.cli.ServerName = "127.0.0.1"
		}
		t.Run(tc.name, func(t *testing.T) {
			h, entered, release := httpTestServer(t, Config{MaxConns: 1}, tc.srv)
			addr := h.Addr().String()
			a := dialHTTP(t, addr, tc.cli)
			require.NoError(t, a.send("/block"))
			waitEntered(t, entered)
			c := dialHTTP(t, addr, tc.cli)
			cDone := make(chan error, 1)
			go func() {
				body, err := c.get("/")
				if err == nil && body != "ok" {
					err = io.ErrUnexpectedEOF
				}
				cDone <- err
			}()
			// Give the Loop time to take c from the backlog: were a not
			// busy, it would be closed now.
			time.Sleep(200 * time.Millisecond)
			close(release)
			body, err := a.recv()
			require.NoError(t, err, "the busy connection was closed for a newcomer")
			assert.Equal(t, "released", body)
			select {
			case err := <-cDone:
				require.NoError(t, err)
			case <-time.After(20 * time.Second):
				t.Fatal("the newcomer was not served once the connection went idle")
			}
		})
	}
}

// The per-host cap refuses a newcomer when every connection of its host
// is busy.
func TestHTTPPerHostCap(t *testing.T) {
	h, entered, release := httpTestServer(t, Config{MaxConns: 8, MaxConnsPerHost: 1}, nil)
	addr := h.Addr().String()
	a := dialHTTP(t, addr, nil)
	require.NoError(t, a.send("/block"))
	waitEntered(t, entered)
	c := dialHTTP(t, addr, nil)
	_, err := c.get("/")
	require.Error(t, err, "a second connection from the host was served past the per-host cap")
	close(release)
	body, err := a.recv()
	require.NoError(t, err)
	assert.Equal(t, "released", body)
}

// Allow turns peers away before the server sees them.
func TestHTTPAllow(t *testing.T) {
	var refused atomic.Int32
	h, _, _ := httpTestServer(t, Config{Allow: func(net.Addr) bool { return false },
		OnRefuse: func(net.Addr) { refused.Add(1) }}, nil)
	_, err := dialHTTP(t, h.Addr().String(), nil).get("/")
	require.Error(t, err)
	// Counted just after the peer is closed.
	require.Eventually(t, func() bool { return refused.Load() == 1 }, 10*time.Second, time.Millisecond)
	assert.EqualValues(t, 1, h.Loop().Refused())
}

// A peer that connected while the process had no fd left is served once
// fds are back.
func TestHTTPSurvivesFDExhaustion(t *testing.T) {
	h, _, _ := httpTestServer(t, Config{}, nil)
	finish := StarveWithPeer(t, h.Addr().String())
	time.Sleep(50 * time.Millisecond) // accept fails with EMFILE meanwhile
	c := finish()
	p := &httpPeer{c: c, r: bufio.NewReader(c)}
	body, err := p.get("/")
	require.NoError(t, err)
	assert.Equal(t, "ok", body)
}

// Shutdown waits for a request in flight, and the server's Serve ends
// with http.ErrServerClosed.
func TestHTTPShutdown(t *testing.T) {
	h, entered, release := httpTestServer(t, Config{}, nil)
	a := dialHTTP(t, h.Addr().String(), nil)
	require.NoError(t, a.send("/block"))
	waitEntered(t, entered)
	done := make(chan error, 1)
	go func() { done <- h.Shutdown(t.Context()) }()
	close(release)
	body, err := a.recv()
	require.NoError(t, err)
	assert.Equal(t, "released", body)
	require.NoError(t, <-done)
	assert.ErrorIs(t, h.Err(), http.ErrServerClosed)
	assert.Zero(t, h.Loop().Len())
}

// TestHTTPStalledReaderLetGo: a peer that asks for a large response and
// stops reading loses it at the write timeout; the handler returns.
func TestHTTPStalledReaderLetGo(t *testing.T) {
	old := httpWriteTimeout
	httpWriteTimeout = 300 * time.Millisecond
	t.Cleanup(func() { httpWriteTimeout = old })
	done := make(chan error, 1)
	mux := http.NewServeMux()
	mux.HandleFunc("/big", func(w http.ResponseWriter, r *http.Request) {
		chunk := make([]byte, 64<<10)
		var err error
		for i := 0; i < 1024 && err == nil; i++ { // 64 MiB: far past the socket buffers
			_, err = w.Write(chunk)
		}
		done <- err
	})
	h := ServeHTTP(listen(t), Config{}, NewHTTPServer(mux), nil)
	t.Cleanup(func() { h.Close() })
	p := dialHTTP(t, h.Addr().String(), nil)
	require.NoError(t, p.send("/big"))
	select {
	case err := <-done:
		require.Error(t, err, "the handler wrote 64 MiB to a peer that reads nothing")
	case <-time.After(20 * time.Second):
		t.Fatal("the handler is still writing to a peer that stopped reading")
	}
	// The connection is closed: reading drains what was sent, then ends.
	require.NoError(t, p.c.SetReadDeadline(time.Now().Add(10*time.Second)))
	_, err := io.Copy(io.Discard, p.c)
	require.NoError(t, err)
}
