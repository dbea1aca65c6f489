package httpmeta

import (
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"sort"
	"strconv"
	"strings"
	"sync"

	"github.com/crescent-kv/crescent/internal/netx"
)

// StoreOptions bound what a Store accepts. Zero fields take the
// defaults.
type StoreOptions struct {
	MaxKeyBytes   int   // default 4 KiB
	MaxValueBytes int64 // default 16 MiB (a descriptor with many buffers)
	MaxKeys       int   // default 1,000,000
	MaxBytes      int64 // keys+values, default 1 GiB
}

func (o *StoreOptions) setDefaults() {
	if o.MaxKeyBytes <= 0 {
		o.MaxKeyBytes = 4 << 10
	}
	if o.MaxValueBytes <= 0 {
		o.MaxValueBytes = 16 << 20
	}
	if o.MaxKeys <= 0 {
		o.MaxKeys = 1_000_000
	}
	if o.MaxBytes <= 0 {
		o.MaxBytes = 1 << 30
	}
}

// Errors of Store.Put.
var (
	ErrKeyTooLong   = errors.New("httpmeta: key too long")
	ErrValueTooLong = errors.New("httpmeta: value too large")
	ErrStoreFull    = errors.New("httpmeta: metadata store full")
	ErrEmptyKey     = errors.New("httpmeta: empty key")
)

// Store is the in-memory map behind the HTTP metadata server. It is an
// http.Handler for GET/PUT/DELETE ?key=<key> (mount it at /metadata), and
// its methods give the embedding process (the store master) direct
// access. Safe for concurrent use.
type Store struct {
	opts  StoreOptions
	mu    sync.RWMutex
	m     map[string][]byte
	bytes int64
}

// NewStore returns an empty store.
func NewStore(opts StoreOptions) *Store {
	opts.setDefaults()
	return &Store{opts: opts, m: make(map[string][]byte)}
}

// Handler returns a new empty store with default limits, to be mounted at
// /metadata.
func Handler() http.Handler { return NewStore(StoreOptions{}) }

// Get returns key's value (shared: do not modify it).
func (s *Store) Get(key string) ([]byte, bool) {
	s.mu.RLock()
	defer s.mu.RUnlock()
	v, ok := s.m[key]
	return v, ok
}

// Put stores a copy of value under key.
func (s *Store) Put(key string, value []byte) error {
	switch {
	case key == "":
		return ErrEmptyKey
	case len(key) > s.opts.MaxKeyBytes:
		return fmt.Errorf("%w: %d bytes, limit %d", ErrKeyTooLong, len(key), s.opts.MaxKeyBytes)
	case int64(len(value)) > s.opts.MaxValueBytes:
		return fmt.Errorf("%w: %d bytes, limit %d", ErrValueTooLong, len(value), s.opts.MaxValueBytes)
	}
	v := append([]byte(nil), value...)
	s.mu.Lock()
	defer s.mu.Unlock()
	old, exists := s.m[key]
	delta := int64(len(v))
	if exists {
		delta -= int64(len(old))
	} else {
		delta += int64(len(key))
		if len(s.m) >= s.opts.MaxKeys {
			return fmt.Errorf("%w: %d keys", ErrStoreFull, len(s.m))
		}
	}
	if s.bytes+delta > s.opts.MaxBytes {
		return fmt.Errorf("%w: %d bytes", ErrStoreFull, s.bytes)
	}
	s.m[key] = v
	s.bytes += delta
	return nil
}

// Delete removes key and reports whether it was there.
func (s *Store) Delete(key string) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	old, ok := s.m[key]
	if ok {
		delete(s.m, key)
		s.bytes -= int64(len(key) + len(old))
	}
	return ok
}

// Keys lists the keys with the given prefix, sorted.
func (s *Store) Keys(prefix string) []string {
	s.mu.RLock()
	var out []string
	for k := range s.m {
		if strings.HasPrefix(k, prefix) {
			out = append(out, k)
		}
	}
	s.mu.RUnlock()
	sort.Strings(out)
	return out
}

// Len is the number of keys.
func (s *Store) Len() int {
	s.mu.RLock()
	defer s.mu.RUnlock()
	return len(s.m)
}

const jsonType = "application/json; charset=utf-8"

func reply(w http.ResponseWriter, code int, msg string) {
	w.Header().Set("Content-Type", jsonType)
	w.WriteHeader(code)
	io.WriteString(w, msg)
}

// ServeHTTP answers the reference's metadata protocol:
//
//	GET    ?key=K        200 value | 404 "metadata not found"
//	PUT    ?key=K  body  200 "metadata updated"
//	DELETE ?key=K        200 "metadata deleted" | 404 "metadata not found"
//
// A missing key parameter gets 400, an oversize key 400, an oversize body
// 413, a full store 507, any other method 405.
func (s *Store) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	key := r.URL.Query().Get("key")
	if r.Method != http.MethodGet && r.Method != http.MethodHead && r.Method != http.MethodPut && r.Method != http.MethodDelete {
		w.Header().Set("Allow", "GET, HEAD, PUT, DELETE")
		reply(w, http.StatusMethodNotAllowed, "method not allowed")
		return
	}
	if key == "" {
		reply(w, http.StatusBadRequest, "Missing key parameter")
		return
	}
	if len(key) > s.opts.MaxKeyBytes {
		reply(w, http.StatusBadRequest, "key too long")
		return
	}
	switch r.Method {
	case http.MethodGet, http.MethodHead:
		v, ok := s.Get(key)
		if !ok {
			reply(w, http.StatusNotFound, "metadata not found")
			return
		}
		w.Header().Set("Content-Type", jsonType)
		w.Header().Set("Content-Length", strconv.Itoa(len(v)))
		if r.Method == http.MethodHead {
			w.WriteHeader(http.StatusOK)
			return
		}
		w.Write(v)
	case http.MethodPut:
		if r.ContentLength > s.opts.MaxValueBytes {
			reply(w, http.StatusRequestEntityTooLarge, "value too large")
			return
		}
		body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, s.opts.MaxValueBytes))
		if err != nil {
			var mbe *http.MaxBytesError
			if errors.As(err, &mbe) {
				reply(w, http.StatusRequestEntityTooLarge, "value too large")
				return
			}
			reply(w, http.StatusBadRequest, "invalid request")
			return
		}
		if err := s.Put(key, body); err != nil {
			code := http.StatusBadRequest
			switch {
			case errors.Is(err, ErrStoreFull):
				code = http.StatusInsufficientStorage
			case errors.Is(err, ErrValueTooLong):
				code = http.StatusRequestEntityTooLarge
			}
			reply(w, code, err.Error())
			return
		}
		reply(w, http.StatusOK, "metadata updated")
	case http.MethodDelete:
		if !s.Delete(key) {
			reply(w, http.StatusNotFound, "metadata not found")
			return
		}
		reply(w, http.StatusOK, "metadata deleted")
	}
}

// Server is a standalone HTTP metadata server: the Store at /metadata and
// "OK" at /health.
type Server struct {
	store *Store
	h     *netx.HTTP
}

// Connection caps of an HTTP metadata server (this one and
// crescent-master's): every engine of a cluster keeps a few keep-alive
// connections to it.
const (
	DefaultMaxConns        = 4096
	DefaultMaxConnsPerHost = 256
)

// Serve listens on addr ("host:port"; port 0 picks one) and serves a new
// store with default limits.
func Serve(addr string) (*Server, error) { return NewServer(addr, NewStore(StoreOptions{})) }

// NewServer listens on addr and serves st through netx's accept loop
// (capped connections, idle ones evicted first, fd exhaustion survived).
func NewServer(addr string, st *Store) (*Server, error) {
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("httpmeta: listen %s: %w", addr, err)
	}
	mux := http.NewServeMux()
	mux.Handle("/metadata", st)
	mux.HandleFunc("/health", func(w http.ResponseWriter, r *http.Request) { io.WriteString(w, "OK") })
	srv := netx.NewHTTPServer(mux)
	h := netx.ServeHTTP(ln, netx.Config{MaxConns: DefaultMaxConns, MaxConnsPerHost: DefaultMaxConnsPerHost, Name: "http metadata server"}, srv, nil)
	return &Server{store: st, h: h}, nil
}

// Addr is the listening address.
func (s *Server) Addr() string { return s.h.Addr().String() }

// URL is the connection string engines use: "http://<addr>/metadata".
func (s *Server) URL() string { return "http://" + s.Addr() + "/metadata" }

// Store is the served store.
func (s *Server) Store() *Store { return s.store }

// Close stops the server at once, dropping open connections.
func (s *Server) Close() error { return s.h.Close() }
