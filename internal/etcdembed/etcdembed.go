// Package etcdembed starts an etcd server (one member, or a cluster of
// several) inside this process on loopback: the test services' etcd and crescent-bench's
// --oplog etcd. One starter, so both run etcd the same way.
package etcdembed

import (
	"cmp"
	"fmt"
	"net"
	"net/url"
	"strconv"
	"strings"
	"time"

	"go.etcd.io/etcd/server/v3/embed"
	"go.uber.org/zap"

	"github.com/crescent-kv/crescent/internal/logx"
	"github.com/crescent-kv/crescent/internal/portpick"
)

// Config says how to start the member.
type Config struct {
	Name string // member name
	Dir  string // data directory
	// ClientPort and PeerPort on 127.0.0.1; 0 picks a free port.
	ClientPort, PeerPort int
	Logger               *zap.Logger // nil: slog.Default(), one level quieter (logx.ZapQuiet)
	NoFsync              bool        // a throwaway data directory
	// MaxRequestBytes bounds a client request (0: etcd's 1.5 MiB).
	MaxRequestBytes uint
}

// readyTimeout bounds the wait for a new member to serve.
const readyTimeout = 60 * time.Second

// Start starts the member and waits until it serves; it returns the
// server and its client endpoint (host:port).
func Start(c Config) (*embed.Etcd, string, error) {
	es, hosts, err := StartCluster([]Config{c})
	if err != nil {
		return nil, "", err
	}
	return es[0], hosts[0], nil
}

// StartCluster starts one cluster of len(cs) members (names must differ)
// and waits until every member serves; it returns the servers and their
// client endpoints, in cs's order. On error nothing is left running.
func StartCluster(cs []Config) ([]*embed.Etcd, []string, error) {
	cfgs := make([]*embed.Config, len(cs))
	var initial []string
	for i, c := range cs {
		for _, p := range []*int{&c.ClientPort, &c.PeerPort} {
			if *p != 0 {
				continue
			}
			v, err := portpick.Port()
			if err != nil {
				return nil, nil, err
			}
			*p = v
		}
		cfg := embed.NewConfig()
		cfg.Name = cmp.Or(c.Name, "crescent")
		cfg.Dir = c.Dir
		cfg.ZapLoggerBuilder = embed.NewZapLoggerBuilder(cmp.Or(c.Logger, logx.ZapQuiet(nil, "etcd")))
		cfg.UnsafeNoFsync = c.NoFsync
		if c.MaxRequestBytes > 0 {
			cfg.MaxRequestBytes = c.MaxRequestBytes
		}
		cu := url.URL{Scheme: "http", Host: net.JoinHostPort("127.0.0.1", strconv.Itoa(c.ClientPort))}
		pu := url.URL{Scheme: "http", Host: net.JoinHostPort("127.0.0.1", strconv.Itoa(c.PeerPort))}
		cfg.ListenClientUrls, cfg.AdvertiseClientUrls = []url.URL{cu}, []url.URL{cu}
		cfg.ListenPeerUrls, cfg.AdvertisePeerUrls = []url.URL{pu}, []url.URL{pu}
		initial = append(initial, cfg.Name+"="+pu.String())
		cfgs[i] = cfg
	}
	var es []*embed.Etcd
	var hosts []string
	closeAll := func() {
		for _, e := range es {
			e.Close()
		}
	}
	// Every member starts before any is waited for: a member of a
	// cluster serves only once a quorum has joined.
	for _, cfg := range cfgs {
		cfg.InitialCluster = strings.Join(initial, ",")
		e, err := embed.StartEtcd(cfg)
		if err != nil {
			closeAll()
			return nil, nil, err
		}
		es = append(es, e)
		hosts = append(hosts, cfg.ListenClientUrls[0].Host)
	}
	deadline := time.After(readyTimeout)
	for i, e := range es {
		select {
		case <-e.Server.ReadyNotify():
		case err := <-e.Err():
			closeAll()
			return nil, nil, err
		case <-deadline:
			closeAll()
			return nil, nil, fmt.Errorf("etcd on %s not ready after %v", hosts[i], readyTimeout)
		}
	}
	return es, hosts, nil
}
