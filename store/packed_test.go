package store

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"google.golang.org/grpc"
	"google.golang.org/protobuf/proto"

	"github.com/crescent-kv/crescent/internal/testutil"
	"github.com/crescent-kv/crescent/store/master"
	"github.com/crescent-kv/crescent/store/storepb"
)

// packedCounts counts, per RPC, the replies that came packed and those
// that did not.
type packedCounts struct {
	mu            sync.Mutex
	packed, plain map[string]int
}

func (p *packedCounts) note(name string, packed bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if packed {
		p.packed[name]++
	} else {
		p.plain[name]++
	}
}

// packedDialer dials the master and counts packed replies; with old it
// clears the packed flags of requests first, so the client sees what a
// master that predates the packed form answers.
func packedDialer(old bool, counts *packedCounts) func(*Config) {
	return func(c *Config) {
		c.MasterDialer = func(ctx context.Context, addr string, ic grpc.UnaryClientInterceptor) (MasterConn, error) {
			conn, _, err := DialMaster(ctx, addr, "crpc", func(ctx context.Context, method string, req, reply any, cc *grpc.ClientConn, invoker grpc.UnaryInvoker, opts ...grpc.CallOption) error {
				if old {
					switch r := req.(type) {
					case *storepb.BatchPutStartRequest:
						r = proto.Clone(r).(*storepb.BatchPutStartRequest)
						r.Packed, req = false, r
					case *storepb.BatchGetReplicaListRequest:
						r = proto.Clone(r).(*storepb.BatchGetReplicaListRequest)
						r.Packed, req = false, r
					case *storepb.ReservePutRequest:
						r = proto.Clone(r).(*storepb.ReservePutRequest)
						for _, s := range r.Specs {
							s.Packed = false
						}
						req = r
					case *storepb.CommitPutRequest:
						r = proto.Clone(r).(*storepb.CommitPutRequest)
						r.Packed = false
						for _, s := range r.Reserve {
							s.Packed = false
						}
						req = r
					case *storepb.BatchPutEndRequest:
						r = proto.Clone(r).(*storepb.BatchPutEndRequest)
						r.Packed, req = false, r
					}
				}
				err := ic(ctx, method, req, reply, cc, invoker, opts...)
				rpc := method[strings.LastIndex(method, "/")+1:]
				if err == nil {
					switch r := reply.(type) {
					case *storepb.BatchPutStartResponse:
						counts.note(rpc, r.Packed != nil)
						counts.note(rpc+"/results", r.PackedResults != nil)
					case *storepb.BatchGetReplicaListResponse:
						counts.note(rpc, r.Packed != nil)
						counts.note(rpc+"/results", r.PackedResults != nil)
					case *storepb.BatchPutEndResponse:
						counts.note(rpc+"/results", r.PackedResults != nil)
					// One reservation goes unpacked either way.
					case *storepb.ReservePutResponse:
						for _, x := range r.Results {
							if len(x.PackedIds)+len(x.Reservations) > 1 {
								counts.note(rpc, x.Packed != nil)
							}
						}
					case *storepb.CommitPutResponse:
						if len(r.Results) != 1 { // one item goes unpacked either way
							counts.note(rpc+"/results", r.PackedResults != nil)
						}
						for _, x := range r.Reserved {
							if len(x.PackedIds)+len(x.Reservations) > 1 {
								counts.note(rpc, x.Packed != nil)
							}
						}
					}
				}
				return err
			})
			return conn, err
		}
	}
}

// TestPackedReplicas: a client reads packed replies from the master (batch
// put starts, reservations ahead of puts, batch gets) and unpacked ones
// from a master that predates them, with the same values stored and read.
func TestPackedReplicas(t *testing.T) {
	tm := startMaster(t, master.Config{})
	for _, old := range []bool{false, true} {
		t.Run(fmt.Sprintf("old_master=%v", old), func(t *testing.T) {
			counts := &packedCounts{packed: map[string]int{}, plain: map[string]int{}}
			c := newTestClient(t, tm, 32<<20, func(c *Config) { c.PutAhead = 16 }, packedDialer(old, counts))
			ctx := tctx(t)
			var keys []string
			var vals [][]byte
			for r := range 4 {
				ks, vs := make([]string, 8), make([][]byte, 8)
				for i := range ks {
					ks[i] = fmt.Sprintf("packed-%v/%d/%d", old, r, i)
					vs[i] = testutil.Bytes(4<<10, uint64(100*r+i))
				}
				for i, err := range c.BatchPut(ctx, ks, vs, ReplicateConfig{}) {
					require.NoError(t, err, "round %d item %d", r, i)
				}
				keys, vals = append(keys, ks...), append(vals, vs...)
				// The next round takes reservations asked for by this one.
				eventually(t, "reservations ahead", func() bool { return c.ahead.held() > 0 })
			}
			got, errs := c.BatchGet(ctx, append(keys, "packed-none"))
			for i := range keys {
				require.NoError(t, errs[i], keys[i])
				assert.Equal(t, vals[i], got[i], keys[i])
			}
			assert.Error(t, errs[len(keys)], "a key never stored")
			assert.Positive(t, c.Stats().PutsAhead, "puts went through reservations")
			counts.mu.Lock()
			defer counts.mu.Unlock()
			for _, rpc := range []string{"BatchPutStart", "BatchGetReplicaList", "BatchPutStart/results", "BatchGetReplicaList/results", "BatchPutEnd/results", "CommitPut/results"} {
				if old {
					assert.Zero(t, counts.packed[rpc], rpc)
					assert.Positive(t, counts.plain[rpc], rpc)
				} else {
					assert.Positive(t, counts.packed[rpc], rpc)
					assert.Zero(t, counts.plain[rpc], rpc)
				}
			}
			reserved := counts.packed["ReservePut"] + counts.packed["CommitPut"]
			if old {
				assert.Zero(t, reserved)
				assert.Positive(t, counts.plain["ReservePut"]+counts.plain["CommitPut"])
			} else {
				assert.Positive(t, reserved)
				assert.Zero(t, counts.plain["ReservePut"]+counts.plain["CommitPut"])
			}
		})
	}
}
