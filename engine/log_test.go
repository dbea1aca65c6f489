package engine_test

import (
	"errors"
	"fmt"
	"log/slog"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/crescent-kv/crescent/engine"
	"github.com/crescent-kv/crescent/engine/transport"
	"github.com/crescent-kv/crescent/internal/testlog"
)

// notStarting is a transport whose Start fails with err.
type notStarting struct {
	transport.Transport
	err error
}

func (n notStarting) Start(transport.Env) error { return n.err }

// An engine that skips transports says so in one line naming each and
// why, at info when each is merely absent here and at warn when one
// failed otherwise.
func TestSkippedTransportsOneLine(t *testing.T) {
	for _, tc := range []struct {
		name string
		errs map[string]error
		want slog.Level
	}{
		{"absent", map[string]error{
			"rdma": fmt.Errorf("%w: no RDMA device", transport.ErrNotSupported),
			"efa":  fmt.Errorf("%w: no EFA provider", transport.ErrNotSupported),
			"cxl":  fmt.Errorf("%w: no CXL device", transport.ErrNotSupported),
		}, slog.LevelInfo},
		{"failed", map[string]error{
			"rdma": fmt.Errorf("%w: no RDMA device", transport.ErrNotSupported),
			"efa":  errors.New("efa: endpoint refused"),
		}, slog.LevelWarn},
	} {
		t.Run(tc.name, func(t *testing.T) {
			restore := engine.SetTransportWrapper(func(tr transport.Transport) transport.Transport {
				if err := tc.errs[tr.Name()]; err != nil {
					return notStarting{tr, err}
				}
				return tr
			})
			defer restore()
			h := &testlog.Capture{}
			e, err := engine.New(engine.Config{LocalServerName: "127.0.0.1", Protocols: []string{"rdma", "efa", "cxl", "tcp"},
				Logger: slog.New(h)})
			require.NoError(t, err)
			defer e.Close()
			require.Equal(t, []string{"tcp"}, e.Transports()[len(e.Transports())-1:])

			lines := h.Mentioning("skipped")
			require.Len(t, lines, 1, "one line for all skipped transports")
			require.Equal(t, tc.want, lines[0].Level)
			var skipped string
			lines[0].Attrs(func(a slog.Attr) bool {
				if a.Key == "skipped" {
					skipped = a.Value.String()
				}
				return true
			})
			for p, err := range tc.errs {
				require.Contains(t, skipped, p+": "+err.Error())
			}
		})
	}
}
