package store

import (
	"context"
	"testing"

	"github.com/crescent-kv/crescent/store/master"
)

// Hooks for the external tests (package store_test), which import
// store/haview and so cannot live in package store.

// TestMaster is a master served on loopback (helpers_test.go).
type TestMaster = testMaster

// StartTestMaster is startMaster.
func StartTestMaster(t testing.TB, cfg master.Config) *TestMaster { return startMaster(t, cfg) }

func (tm *testMaster) Addr() string           { return tm.addr }
func (tm *testMaster) Stop()                  { tm.stop() }
func (tm *testMaster) Master() *master.Master { return tm.m }

// Heartbeating reports whether the heartbeat loop runs.
func (c *Client) Heartbeating() bool { return c.heartbeating() }

// SwitchLeader offers v to the client's one switch path.
func (c *Client) SwitchLeader(ctx context.Context, v LeaderView) (bool, error) {
	return c.ha.switchLeader(ctx, v)
}

// QuietLogger discards logs.
var QuietLogger = quiet

// SelfTimed reports whether the master connection bounds each call by
// RPCTimeout itself (rpcCtx adds no context).
func (c *Client) SelfTimed() bool { return c.selfTimed() }
