// Package etcdembed starts a single-member etcd server inside this
// process on loopback: the test services' etcd and crescent-bench's
// --oplog etcd. One starter, so both run etcd the same way.
package etcdembed

import (
	"cmp"
	"fmt"
	"net"
	"net/url"
	"strconv"
	"time"

	"go.etcd.io/etcd/server/v3/embed"
	"go.uber.org/zap"
)

// Config says how to start the member.
type Config struct {
	Name string // member name
	Dir  string // data directory
	// ClientPort and PeerPort on 127.0.0.1; 0 picks a free port.
	ClientPort, PeerPort int
	Logger               *zap.Logger // nil: discarded
	NoFsync              bool        // a throwaway data directory
}

// readyTimeout bounds the wait for a new member to serve.
const readyTimeout = 60 * time.Second

// Start starts the member and waits until it serves; it returns the
// server and its client endpoint (host:port).
func Start(c Config) (*embed.Etcd, string, error) {
	ports := []*int{&c.ClientPort, &c.PeerPort}
	for _, p := range ports {
		if *p != 0 {
			continue
		}
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			return nil, "", err
		}
		*p = l.Addr().(*net.TCPAddr).Port
		l.Close()
	}
	cfg := embed.NewConfig()
	cfg.Name = cmp.Or(c.Name, "crescent")
	cfg.Dir = c.Dir
	cfg.ZapLoggerBuilder = embed.NewZapLoggerBuilder(cmp.Or(c.Logger, zap.NewNop()))
	cfg.UnsafeNoFsync = c.NoFsync
	cu := url.URL{Scheme: "http", Host: net.JoinHostPort("127.0.0.1", strconv.Itoa(c.ClientPort))}
	pu := url.URL{Scheme: "http", Host: net.JoinHostPort("127.0.0.1", strconv.Itoa(c.PeerPort))}
	cfg.ListenClientUrls, cfg.AdvertiseClientUrls = []url.URL{cu}, []url.URL{cu}
	cfg.ListenPeerUrls, cfg.AdvertisePeerUrls = []url.URL{pu}, []url.URL{pu}
	cfg.InitialCluster = cfg.Name + "=" + pu.String()
	e, err := embed.StartEtcd(cfg)
	if err != nil {
		return nil, "", err
	}
	select {
	case <-e.Server.ReadyNotify():
	case err := <-e.Err():
		e.Close()
		return nil, "", err
	case <-time.After(readyTimeout):
		e.Close()
		return nil, "", fmt.Errorf("etcd on %s not ready after %v", cu.Host, readyTimeout)
	}
	return e, cu.Host, nil
}
