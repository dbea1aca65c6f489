package ctl

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"os"
	"regexp"
	"strings"

	"github.com/crescent-kv/crescent/store"
	"github.com/crescent-kv/crescent/store/errcode"
)

func init() {
	commands = append(commands,
		&command{
			name: "put", args: "KEY FILE|-", help: "store FILE's bytes (- = stdin) under KEY", nargs: [2]int{2, 2},
			setup: func(fs *flag.FlagSet) runFunc {
				replicas := fs.Int("replicas", 1, "replicas to place")
				softPin := fs.Bool("soft_pin", false, "soft-pin the object (kept out of the first eviction pass)")
				hardPin := fs.Bool("hard_pin", false, "hard-pin the object (never evicted)")
				return func(ctx context.Context, o *options, pos []string, stdio IO) error {
					if *replicas < 1 {
						return usagef("put: --replicas %d: must be at least 1", *replicas)
					}
					return put(ctx, o, pos[0], pos[1], store.ReplicateConfig{Replicas: *replicas, SoftPin: *softPin, HardPin: *hardPin}, stdio)
				}
			},
		},
		&command{
			name: "get", args: "KEY", help: "write KEY's value to stdout (or --file F)", nargs: [2]int{1, 1},
			setup: func(fs *flag.FlagSet) runFunc {
				file := fs.String("file", "", "write the value to this file instead of stdout")
				return func(ctx context.Context, o *options, pos []string, stdio IO) error {
					return get(ctx, o, pos[0], *file, stdio)
				}
			},
		},
		&command{
			name: "rm", args: "KEY | --regex RE", help: "remove KEY, or every key matching RE", nargs: [2]int{0, 1},
			setup: func(fs *flag.FlagSet) runFunc {
				regex := fs.String("regex", "", "remove every key this regular expression matches whole (RE2 syntax: \"doc/.*\")")
				force := fs.Bool("force", false, "remove even objects with a read lease or a put in progress")
				return func(ctx context.Context, o *options, pos []string, stdio IO) error {
					switch {
					case *regex != "" && len(pos) > 0:
						return usagef("rm: give KEY or --regex, not both")
					case *regex == "" && len(pos) == 0:
						return usagef("rm: missing KEY (or --regex RE)")
					case *regex != "":
						if _, err := regexp.Compile(*regex); err != nil {
							return usagef("rm: --regex: %v", err)
						}
					}
					return remove(ctx, o, pos, *regex, *force, stdio)
				}
			},
		},
	)
}

// withClient runs f with a pure store client (no segment of its own).
func withClient(ctx context.Context, o *options, stdio IO, f func(ctx context.Context, c *store.Client) error) error {
	if err := checkMaster(o.master); err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(ctx, o.timeout)
	defer cancel()
	cfg := store.Config{
		MasterAddr: o.master, ClusterID: o.clusterID, MasterProtocol: o.masterProtocol, LocalHostname: o.localHostname,
		LocalBufferSize: o.buffer, MetadataServer: o.metadata, PutAhead: -1, RPCTimeout: o.timeout,
		Logger: o.logger,
	}
	sec, err := o.sec.load()
	if err != nil {
		return err
	}
	cfg.Security = sec
	if o.protocols != "" {
		for _, p := range strings.Split(o.protocols, ",") {
			cfg.Protocols = append(cfg.Protocols, strings.TrimSpace(p))
		}
	}
	c, err := store.New(ctx, cfg)
	if err != nil {
		if errors.Is(err, store.ErrInvalidConfig) {
			return usagef("%v", err)
		}
		return fmt.Errorf("--master %s: %w", o.master, err)
	}
	ferr := f(ctx, c)
	if err := c.Close(); err != nil && ferr == nil {
		ferr = err
	}
	return ferr
}

// checkMaster gives a plain host:port master address that does not
// resolve a clear error, before the RPC layer turns it into resolver
// jargon. Other forms (etcd://, redis://) are the store client's.
func checkMaster(addr string) error {
	if strings.Contains(addr, "://") {
		return nil
	}
	host, _, err := net.SplitHostPort(addr)
	if err != nil {
		return usagef("--master %q: want host:port", addr)
	}
	if host == "" || net.ParseIP(host) != nil {
		return nil
	}
	if _, err := net.LookupHost(host); err != nil {
		return fmt.Errorf("--master %q: host %q does not resolve: %w", addr, host, err)
	}
	return nil
}

func put(ctx context.Context, o *options, key, file string, rc store.ReplicateConfig, stdio IO) error {
	var (
		val []byte
		err error
	)
	if file == "-" {
		val, err = io.ReadAll(stdio.Stdin)
	} else {
		val, err = os.ReadFile(file)
	}
	if err != nil {
		return fmt.Errorf("put: %w", err)
	}
	if len(val) == 0 {
		return fmt.Errorf("put: %s is empty: the store holds no empty values", file)
	}
	return withClient(ctx, o, stdio, func(ctx context.Context, c *store.Client) error {
		if err := c.Put(ctx, key, val, rc); err != nil {
			return fmt.Errorf("put %q: %w", key, err)
		}
		if o.json() {
			return writeJSON(stdio.Stdout, map[string]any{"key": key, "size": len(val)})
		}
		_, err := fmt.Fprintln(stdio.Stdout, "OK")
		return err
	})
}

func get(ctx context.Context, o *options, key, file string, stdio IO) error {
	return withClient(ctx, o, stdio, func(ctx context.Context, c *store.Client) error {
		v, err := c.Get(ctx, key)
		if errors.Is(err, errcode.ErrObjectNotFound) {
			return fmt.Errorf("get %q: %w", key, errNotFound)
		}
		if err != nil {
			return fmt.Errorf("get %q: %w", key, err)
		}
		if file == "" {
			_, err = stdio.Stdout.Write(v)
			return err
		}
		if err := os.WriteFile(file, v, 0o644); err != nil {
			return fmt.Errorf("get: %w", err)
		}
		if o.json() {
			return writeJSON(stdio.Stdout, map[string]any{"key": key, "size": len(v), "file": file})
		}
		return nil
	})
}

func remove(ctx context.Context, o *options, pos []string, regex string, force bool, stdio IO) error {
	return withClient(ctx, o, stdio, func(ctx context.Context, c *store.Client) error {
		if regex != "" {
			n, err := c.RemoveByRegex(ctx, regex, force)
			if err != nil {
				return fmt.Errorf("rm --regex %q: %w", regex, err)
			}
			if o.json() {
				return writeJSON(stdio.Stdout, map[string]any{"removed": n})
			}
			_, err = fmt.Fprintf(stdio.Stdout, "removed %d\n", n)
			return err
		}
		err := c.Remove(ctx, pos[0], force)
		if errors.Is(err, errcode.ErrObjectNotFound) {
			return fmt.Errorf("rm %q: %w", pos[0], errNotFound)
		}
		if errors.Is(err, errcode.ErrObjectHasLease) || errors.Is(err, errcode.ErrObjectReplicaBusy) {
			return fmt.Errorf("rm %q: %w (--force removes it anyway)", pos[0], err)
		}
		if err != nil {
			return fmt.Errorf("rm %q: %w", pos[0], err)
		}
		if o.json() {
			return writeJSON(stdio.Stdout, map[string]any{"removed": 1})
		}
		_, err = fmt.Fprintln(stdio.Stdout, "OK")
		return err
	})
}

func writeJSON(w io.Writer, v any) error {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	return enc.Encode(v)
}
