package main

// Every metadata backend, so --metadata_server takes etcd://, bare
// host:port, redis(s):// and http(s):// strings; the engine links none.
import _ "github.com/crescent-kv/crescent/engine/metadata/all"

// etcd:// and redis:// --master_server_address: masters in HA.
import _ "github.com/crescent-kv/crescent/store/haview"
