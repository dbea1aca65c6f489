package oplog

import (
	"context"
	"io"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/crescent-kv/crescent/store/master"
	"github.com/crescent-kv/crescent/store/master/admin"
	"github.com/crescent-kv/crescent/store/storepb"
)

// The admin pages that show state answer only once what they show is
// durable, like the RPCs: with the log's fsync held, a remove already
// hides its key, and /get_all_keys, /query_key and /get_all_segments do
// not answer before the remove is durable (a crash would bring the key
// back).
func TestAdminReadsWaitForDurability(t *testing.T) {
	leakCheck(t)
	ctx := context.Background()
	type answer struct {
		code    int
		body    string
		durable uint64
	}
	for _, path := range []string{"/get_all_keys", "/query_key?key=k", "/get_all_segments"} {
		t.Run(path, func(t *testing.T) {
			fs := newHoldFS() // holds once
			d, err := OpenDurable(ctx, t.TempDir(), master.Config{Shards: 4}, LocalOptions{FS: fs})
			require.NoError(t, err)
			t.Cleanup(func() { require.NoError(t, d.Close()) })
			mc, svc := serveDurable(t, d)
			t.Cleanup(fs.unhold)
			adminSrv := httptest.NewServer(admin.Handler(d.Master, svc, prometheus.NewRegistry(), nil))
			t.Cleanup(adminSrv.Close)
			_, err = mc.MountSegment(ctx, &storepb.MountSegmentRequest{ClientId: durClient, Session: durSession, Segment: durSeg})
			require.NoError(t, err)
			require.NoError(t, durPut(ctx, mc, "k"))

			fs.hold()
			require.NoError(t, d.Master.Remove("k", true)) // hidden at once, durable later
			<-fs.entered
			seq := d.Sink.Appended()
			got := make(chan answer, 1)
			go func() {
				resp, err := http.Get(adminSrv.URL + path)
				if !assert.NoError(t, err) {
					got <- answer{}
					return
				}
				b, _ := io.ReadAll(resp.Body)
				resp.Body.Close()
				got <- answer{resp.StatusCode, string(b), d.Sink.Durable()}
			}()
			select {
			case a := <-got:
				t.Fatalf("%s answered %d %q with seq %d not durable (durable %d)", path, a.code, a.body, seq, a.durable)
			case <-time.After(200 * time.Millisecond):
			}
			fs.unhold()
			a := <-got
			require.GreaterOrEqual(t, a.durable, seq, "%s answered before the remove was durable", path)
			switch path {
			case "/get_all_keys":
				assert.Equal(t, http.StatusOK, a.code)
				assert.Empty(t, a.body)
			case "/query_key?key=k":
				assert.Equal(t, http.StatusNotFound, a.code)
			default:
				assert.Equal(t, http.StatusOK, a.code)
			}
		})
	}
}
