package main

import (
	"cmp"
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"os"
	"strings"
	"time"

	"github.com/crescent-kv/crescent/bench"
)

// haMain is crescent-bench ha: kill the leader of HA masters under put
// load and report failover times and lost acknowledgements (bench.RunHA).
func haMain(ctx context.Context, args []string, out io.Writer) error {
	fs := flag.NewFlagSet("ha", flag.ContinueOnError)
	backend := fs.String("ha_backend", "etcd", "leadership backend: etcd or redis (the operation log is on etcd either way)")
	kills := fs.Int("kills", 10, "times the leader is killed with SIGKILL")
	ttl := fs.Int("lease_ttl_sec", 2, "leadership lease TTL, seconds")
	masters := fs.Int("masters", 3, "crescent-master processes")
	masterBin := fs.String("master_bin", "", "crescent-master binary (default: beside crescent-bench, else on $PATH)")
	etcd := fs.String("etcd", "", "external etcd endpoints host:port[,host:port] (default: embedded members)")
	members := fs.Int("etcd_members", 1, "embedded etcd members when --etcd is empty")
	writers := fs.Int("writers", 4, "concurrent putters")
	rate := fs.Int("rate", 200, "puts per second across putters (each acknowledged key is kept and read back at the end)")
	valueSize := fs.Int("value_size", 4096, "bytes per value")
	settle := fs.Float64("settle", 1, "seconds the cluster serves between a failover and the next kill")
	warmup := fs.String("ha_warmup_ms", "", "the masters' --ha_warmup_ms (-1: one full lease TTL; default: the masters' default)")
	asJSON := fs.Bool("json", false, "print the result as one JSON object")
	if err := parseFlags(fs, args); err != nil {
		return err
	}
	if *backend != "etcd" && *backend != "redis" {
		return usagef("--ha_backend %q: want etcd or redis", *backend)
	}
	if *masters < 2 {
		return usagef("--masters %d: a failover needs at least 2", *masters)
	}
	if err := firstErr(positive("kills", *kills), positive("lease_ttl_sec", *ttl), positive("etcd_members", *members),
		positive("writers", *writers), positive("rate", *rate), positive("value_size", *valueSize),
		checkSeconds("settle", *settle, false)); err != nil {
		return err
	}
	c := bench.HAConfig{Backend: *backend, Kills: *kills, LeaseTTL: time.Duration(*ttl) * time.Second, Masters: *masters,
		MasterBin: *masterBin, WarmupMs: *warmup, EtcdMembers: *members, Settle: time.Duration(*settle * float64(time.Second)),
		Load: bench.HALoadConfig{Writers: *writers, Rate: *rate, ValueSize: *valueSize}, Progress: os.Stderr}
	if *etcd != "" {
		c.Etcd = strings.Split(*etcd, ",")
	}
	res, err := bench.RunHA(ctx, c)
	if err != nil {
		return err
	}
	if *asJSON {
		enc := json.NewEncoder(out)
		enc.SetIndent("", "  ")
		return enc.Encode(res)
	}
	fmt.Fprintf(out, "backend %s, %d masters, lease TTL %.0f s, warm-up %s ms, %d kills\n", res.Backend, res.Masters, res.LeaseTTLS, cmp.Or(res.WarmupMs, "default"), res.Kills)
	fmt.Fprintf(out, "failover s: min %.2f  median %.2f  max %.2f  (target <= %.0f)\n", res.FailoverSMin, res.FailoverSMed, res.FailoverSMax, 2*res.LeaseTTLS)
	fmt.Fprintf(out, "acked puts %d, failed puts %d, lost acks %d; gets %d, failed gets %d, gets with wrong bytes %d\n",
		res.AckedPuts, res.FailedPuts, res.LostAcks, res.Gets, res.GetErrors, res.BadGets)
	if res.BadGets > 0 {
		return fmt.Errorf("%d gets returned other bytes than acknowledged", res.BadGets)
	}
	if res.LostAcks > 0 {
		return fmt.Errorf("%d acknowledged puts lost (first: %v)", res.LostAcks, res.LostKeys)
	}
	return nil
}
