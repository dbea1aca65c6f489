package store

import (
	"bytes"
	"context"
	"errors"
	"net"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/crescent-kv/crescent/internal/testutil"
	"github.com/crescent-kv/crescent/store/errcode"
	"github.com/crescent-kv/crescent/store/master"
)

// TestMasterProtocol: against a master serving both, clients use crpc
// unless told gRPC; against a gRPC-only one, auto falls back to gRPC and
// crpc is refused. Both carry the same service: a value put over one is
// read over the other, and errors keep their store codes.
func TestMasterProtocol(t *testing.T) {
	tm := startMaster(t, master.Config{})
	ctx := tctx(t)
	a := newTestClient(t, tm, 16<<20)
	g := newTestClient(t, tm, 16<<20, func(c *Config) { c.MasterProtocol = "grpc" })
	if a.MasterProtocol() != "crpc" || g.MasterProtocol() != "grpc" {
		t.Fatalf("protocols %s, %s", a.MasterProtocol(), g.MasterProtocol())
	}
	v := testutil.Bytes(100<<10, 3)
	if err := a.Put(ctx, "k", v, ReplicateConfig{}); err != nil {
		t.Fatal(err)
	}
	if got, err := g.Get(ctx, "k"); err != nil || !bytes.Equal(got, v) {
		t.Fatalf("get over gRPC: %v", err)
	}
	for _, c := range []*Client{a, g} {
		if err := c.Put(ctx, "k", v, ReplicateConfig{}); !errors.Is(err, errcode.ErrObjectAlreadyExists) {
			t.Fatalf("%s: duplicate put: %v", c.MasterProtocol(), err)
		}
	}

	m, err := master.New(master.Config{})
	if err != nil {
		t.Fatal(err)
	}
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	stop, _ := serveMaster(t, m, lis, true)
	t.Cleanup(stop)
	old := &testMaster{m: m, addr: lis.Addr().String()}
	fb := newTestClient(t, old, 16<<20)
	if fb.MasterProtocol() != "grpc" {
		t.Fatalf("against a gRPC-only master: %s", fb.MasterProtocol())
	}
	if err := fb.Put(ctx, "k", v, ReplicateConfig{}); err != nil {
		t.Fatal(err)
	}
	cfg := Config{MasterAddr: old.addr, LocalHostname: "127.0.0.1", Logger: quiet, MasterProtocol: "crpc"}
	if c, err := New(ctx, cfg); err == nil {
		c.Close()
		t.Fatal("crpc against a gRPC-only master succeeded")
	}
	cfg.MasterProtocol = "http"
	if _, err := New(context.Background(), cfg); !errors.Is(err, ErrInvalidConfig) {
		t.Fatalf("bad protocol: %v", err)
	}
}

// Config.MasterPollWait reaches the crpc options of every master dial
// (the security loaded from files included) and calls work with it; a
// negative one is refused.
func TestMasterPollWait(t *testing.T) {
	tm := startMaster(t, master.Config{})
	ctx := tctx(t)
	c := newTestClient(t, tm, 16<<20, func(c *Config) { c.MasterPollWait = 150 * time.Microsecond })
	require.Equal(t, "crpc", c.MasterProtocol())
	require.Equal(t, 150*time.Microsecond, c.cfg.Security.pollWait)
	require.Len(t, c.cfg.Security.crpcOptions(), 1, "the poll wait option")
	v := testutil.Bytes(64<<10, 5)
	require.NoError(t, c.Put(ctx, "pw", v, ReplicateConfig{}))
	got, err := c.Get(ctx, "pw")
	require.NoError(t, err)
	require.Equal(t, v, got)
	require.Empty(t, Security{}.crpcOptions())

	_, err = New(ctx, Config{MasterAddr: tm.addr, LocalHostname: "127.0.0.1", Logger: quiet, MasterPollWait: -1})
	require.ErrorIs(t, err, ErrInvalidConfig)
}
