// Package all registers every metadata backend Crescent ships, for
// programs that accept any connection string (the crescent binaries):
//
//	import _ "github.com/crescent-kv/crescent/engine/metadata/all"
//
// enables etcd:// and bare host:port (etcdmeta), redis:// and rediss://
// (redismeta), http:// and https:// (httpmeta) in engine.Config.
// MetadataServer and metadata.Open. It links etcd's client, go-redis and
// gRPC (etcd's client uses it); a program that needs one backend imports
// only that package, and one that uses the P2P handshake imports none.
package all

import (
	_ "github.com/crescent-kv/crescent/engine/metadata/etcdmeta"  // etcd://h:p[,h2:p2] and bare h:p
	_ "github.com/crescent-kv/crescent/engine/metadata/httpmeta"  // http(s)://h:p/metadata
	_ "github.com/crescent-kv/crescent/engine/metadata/redismeta" // redis://[user:pass@]h:p[/db], rediss://
)
