package metadata

import (
	"context"
	"encoding/json"
	"errors"
	"strings"
	"testing"
)

// Connection requests with a "protocol" field go to that protocol's
// handler; others to the default one.
func TestServerHandleProtocol(t *testing.T) {
	s := startServer(t, ServerConfig{})
	ctx, cancel := context.WithTimeout(context.Background(), wait)
	defer cancel()
	reply := func(tag string) func(json.RawMessage) (json.RawMessage, error) {
		return func(json.RawMessage) (json.RawMessage, error) { return json.RawMessage(`{"by":"` + tag + `"}`), nil }
	}
	s.HandleConnection(reply("default"))
	s.HandleProtocol("rdma", reply("rdma"))
	s.HandleProtocol("efa", func(json.RawMessage) (json.RawMessage, error) { return nil, errors.New("no such qp") })
	for _, c := range []struct{ req, want, err string }{
		{`{"qp_num":[1]}`, "default", ""},
		{`{"protocol":"rdma","qp_num":[1]}`, "rdma", ""},
		{`{"protocol":"efa"}`, "", "no such qp"},
		{`{"protocol":"carrier-pigeon"}`, "", "Unsupported handshake protocol: carrier-pigeon"},
	} {
		out, err := Exchange(ctx, s.Addr(), Connection, []byte(c.req))
		if c.err != "" {
			if !errors.Is(err, ErrRejected) || !strings.Contains(err.Error(), c.err) {
				t.Fatalf("%s: %v", c.req, err)
			}
			continue
		}
		var r struct{ By string }
		if err != nil || json.Unmarshal(out, &r) != nil || r.By != c.want {
			t.Fatalf("%s: %q %v", c.req, out, err)
		}
	}
	s.HandleProtocol("rdma", nil)
	if _, err := Exchange(ctx, s.Addr(), Connection, []byte(`{"protocol":"rdma"}`)); !errors.Is(err, ErrRejected) {
		t.Fatalf("removed handler: %v", err)
	}
}
