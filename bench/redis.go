package bench

import "github.com/crescent-kv/crescent/internal/redisproc"

// ErrNoRedis: redis-server is not installed (make deps installs it).
var ErrNoRedis = redisproc.ErrNotInstalled

// RedisServer is a redis-server process started by the bench on a free
// 127.0.0.1 port, with persistence off, in a temporary directory.
type RedisServer = redisproc.Server

// RedisAvailable reports whether bin (or redis-server on $PATH when bin
// is empty) can be run.
func RedisAvailable(bin string) bool {
	_, err := redisproc.Path(bin)
	return err == nil
}

// StartRedis starts redis-server (bin, or the one on $PATH when empty)
// and waits until it answers PING.
func StartRedis(bin string) (*RedisServer, error) { return redisproc.Start(bin) }
