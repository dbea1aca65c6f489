package bench

import (
	"cmp"
	"context"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.etcd.io/etcd/server/v3/embed"

	"github.com/crescent-kv/crescent/ha/oplog"
	"github.com/crescent-kv/crescent/internal/etcdembed"
	"github.com/crescent-kv/crescent/store/master"
	"github.com/crescent-kv/crescent/store/master/service"
)

// Oplog backends of StoreConfig.Oplog.
const (
	OplogOff   = "off"
	OplogLocal = "local"
	OplogEtcd  = "etcd"
)

// BaselineOplogOff is the baseline of a run with the log on: the same
// workload against a second in-process master with the log off.
const BaselineOplogOff = "oplog_off"

// oplogKind is off, local or etcd (etcd://... is etcd).
func (c *StoreConfig) oplogKind() string {
	if strings.HasPrefix(c.Oplog, "etcd://") {
		return OplogEtcd
	}
	return c.Oplog
}

func (c *StoreConfig) checkOplog() error {
	bad := func(f string, a ...any) error { return fmt.Errorf("%w: %s", ErrStoreConfig, fmt.Sprintf(f, a...)) }
	if c.Oplog == "" {
		c.Oplog = OplogOff
	}
	switch k := c.oplogKind(); {
	case k == OplogOff, k == OplogLocal:
	case k == OplogEtcd && c.Oplog != OplogEtcd:
		if _, err := oplog.ParseEtcdURL(c.Oplog); err != nil {
			return bad("--oplog: %v", err)
		}
	case k == OplogEtcd:
	default:
		return bad("--oplog must be off, local, etcd or etcd://host:port, not %q", c.Oplog)
	}
	if c.Oplog != OplogOff && c.MasterAddr != "" {
		return bad("--oplog is the in-process master's log; it cannot be used with --master")
	}
	if c.OplogDir != "" && c.Oplog != OplogLocal && c.Oplog != OplogEtcd {
		return bad("--oplog_dir needs --oplog local or etcd (the embedded one's data)")
	}
	return nil
}

// newMaster starts an in-process master with the log c.Oplog ("off" or
// empty: none). A temporary directory it made (the local log, the
// embedded etcd's data) is removed by close.
func newMaster(ctx context.Context, c *StoreConfig, log string) (*inProcessMaster, error) {
	im := &inProcessMaster{oplog: cmp.Or(log, OplogOff)}
	var opts []service.Option
	fail := func(err error) (*inProcessMaster, error) {
		im.closeLog()
		return nil, err
	}
	switch im.oplog {
	case OplogOff:
		m, err := master.New(master.Config{})
		if err != nil {
			return nil, err
		}
		im.m = m
	case OplogLocal:
		dir := c.OplogDir
		if dir == "" {
			// The work tree's disk, where a master's --data_dir would be.
			tmp, err := os.MkdirTemp(".", ".crescent-bench-oplog-")
			if err != nil {
				return nil, fmt.Errorf("bench: oplog dir: %w", err)
			}
			dir, im.tmp = tmp, append(im.tmp, tmp)
		}
		d, err := oplog.OpenDurable(ctx, dir, master.Config{}, oplog.LocalOptions{})
		if err != nil {
			return fail(err)
		}
		im.d, im.m, im.dir = d, d.Master, dir
		opts = append(opts, d.ServiceOption())
	default: // etcd
		im.etcdDir = c.OplogDir
		eps, err := im.etcdEndpoints(c.Oplog)
		if err != nil {
			return fail(err)
		}
		cli, err := clientv3.New(oplog.EtcdClientConfig(eps))
		if err != nil {
			return fail(fmt.Errorf("bench: etcd client: %w", err))
		}
		im.cli = cli
		st, err := oplog.OpenEtcd(ctx, cli, oplog.EtcdOptions{ClusterID: "crescent-bench-" + runID()})
		if err != nil {
			return fail(fmt.Errorf("bench: etcd oplog: %w", err))
		}
		d, err := oplog.Open(ctx, st, master.Config{})
		if err != nil {
			return fail(err)
		}
		im.d, im.m = d, d.Master
		opts = append(opts, d.ServiceOption())
	}
	if err := im.m.Start(); err != nil {
		im.closeMaster()
		return fail(err)
	}
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		im.closeMaster()
		return fail(err)
	}
	sctx, cancel := context.WithCancel(context.Background())
	im.addr, im.cancel, im.done = lis.Addr().String(), cancel, make(chan error, 1)
	if c.tls != nil {
		opts = append(opts, service.WithTransportSecurity(c.tls.server, nil, nil))
	}
	svc := service.New(im.m, opts...)
	im.svc = svc
	if c.MasterProtocol == LayerDRPC {
		// drpc on its own port: the clients' master address.
		addr, ddone, err := serveDRPC(sctx, svc)
		if err != nil {
			cancel()
			lis.Close()
			im.closeMaster()
			return fail(err)
		}
		im.addr, im.drpcDone = addr, ddone
	}
	gopts := grpcServerOptions(c.MasterProtocol)
	go func() { im.done <- svc.Serve(sctx, lis, gopts...) }()
	return im, nil
}

// etcdEndpoints are the endpoints of an external etcd (etcd://...) or of
// one the bench starts: a single member, data on disk in the work tree,
// fsync on.
func (im *inProcessMaster) etcdEndpoints(spec string) ([]string, error) {
	if spec != OplogEtcd {
		return oplog.ParseEtcdURL(spec)
	}
	parent := cmp.Or(im.etcdDir, ".")
	if err := os.MkdirAll(parent, 0o755); err != nil { // as --oplog local creates its directory
		return nil, fmt.Errorf("bench: etcd dir: %w", err)
	}
	dir, err := os.MkdirTemp(parent, ".crescent-bench-etcd-")
	if err != nil {
		return nil, fmt.Errorf("bench: etcd dir: %w", err)
	}
	im.tmp = append(im.tmp, dir)
	var lastErr error
	for range 3 { // a port taken between picking and binding
		e, ep, err := startEtcd(filepath.Join(dir, "member"))
		if err == nil {
			im.etcd = e
			return []string{ep}, nil
		}
		lastErr = err
		os.RemoveAll(filepath.Join(dir, "member"))
	}
	return nil, fmt.Errorf("bench: embedded etcd: %w", lastErr)
}

func startEtcd(dir string) (*embed.Etcd, string, error) {
	return etcdembed.Start(etcdembed.Config{Name: "crescent-bench", Dir: dir})
}

// closeMaster closes the master and its log.
func (im *inProcessMaster) closeMaster() error {
	if im.d != nil {
		return im.d.Close()
	}
	if im.m != nil {
		return im.m.Close()
	}
	return nil
}

// closeLog closes what holds the log up (etcd client and server) and
// removes the temporary directories.
func (im *inProcessMaster) closeLog() {
	if im.cli != nil {
		im.cli.Close()
	}
	if im.etcd != nil {
		im.etcd.Close()
	}
	for _, d := range im.tmp {
		os.RemoveAll(d)
	}
}

// logStats are the log's counters: record bytes (local only), group
// commits, entries, fsyncs and their total time (local only).
// waits and waitNanos are the master's answers that waited for the log
// and their total wait.
type logStats struct {
	bytes, batches, entries, fsyncs, fsyncNanos, waits, waitNanos uint64
	byRPC                                                         map[string][2]uint64 // RPC -> waits, wait nanoseconds
}

func (im *inProcessMaster) logStats() logStats {
	if im == nil || im.d == nil {
		return logStats{}
	}
	var st logStats
	if l, ok := im.d.Store.(*oplog.Local); ok {
		s := l.Stats()
		st = logStats{bytes: s.Bytes, batches: s.Batches, entries: s.Entries, fsyncs: s.Fsyncs, fsyncNanos: s.FsyncNanos}
	}
	if e, ok := im.d.Store.(*oplog.Etcd); ok {
		s := e.Stats()
		st = logStats{batches: s.Batches, entries: s.Entries}
	}
	if im.svc != nil {
		st.byRPC = map[string][2]uint64{}
		for _, r := range im.svc.Counts() {
			st.waits += r.DurableWaits
			st.waitNanos += r.DurableWaitNanos
			if r.DurableWaits > 0 {
				st.byRPC[r.Name] = [2]uint64{r.DurableWaits, r.DurableWaitNanos}
			}
		}
	}
	return st
}

// describeLog records what the log did since before in res.
func (im *inProcessMaster) describeLog(res *StoreResult, before logStats, puts int64, elapsed time.Duration) {
	after := im.logStats()
	if after.bytes > before.bytes && puts > 0 {
		res.OplogBytesPerPut = float64(after.bytes-before.bytes) / float64(puts)
	}
	if n := after.batches - before.batches; n > 0 {
		res.OplogCommitsPerSec = float64(n) / elapsed.Seconds()
		res.OplogEntriesPerCommit = float64(after.entries-before.entries) / float64(n)
	}
	if n := after.fsyncs - before.fsyncs; n > 0 {
		res.OplogFsyncUs = float64(after.fsyncNanos-before.fsyncNanos) / float64(n) / 1e3
	}
	if n := after.waits - before.waits; n > 0 {
		res.OplogDurableWaitUs = float64(after.waitNanos-before.waitNanos) / float64(n) / 1e3
	}
	for name, a := range after.byRPC {
		b := before.byRPC[name]
		if n := a[0] - b[0]; n > 0 {
			res.OplogWaits = append(res.OplogWaits, OplogWait{RPC: name, Answers: n, WaitUs: float64(a[1]-b[1]) / float64(n) / 1e3})
		}
	}
	// The RPCs that waited most in total first.
	slices.SortFunc(res.OplogWaits, func(x, y OplogWait) int {
		return cmp.Or(cmp.Compare(y.WaitUs*float64(y.Answers), x.WaitUs*float64(x.Answers)), strings.Compare(x.RPC, y.RPC))
	})
}
