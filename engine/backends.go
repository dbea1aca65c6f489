package engine

// The metadata stores selectable by Config.MetadataServer: each package
// registers its connection-string schemes with engine/metadata.
import (
	_ "github.com/crescent-kv/crescent/engine/metadata/etcdmeta"  // etcd://h:p[,h2:p2] and bare h:p
	_ "github.com/crescent-kv/crescent/engine/metadata/httpmeta"  // http(s)://h:p/metadata
	_ "github.com/crescent-kv/crescent/engine/metadata/redismeta" // redis://[user:pass@]h:p[/db], rediss://
)
