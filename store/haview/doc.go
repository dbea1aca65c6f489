// Package haview lets store clients follow masters in high availability:
// importing it registers the master address schemes
//
//	etcd://host:port[,host2:port2...]        (';' also separates)
//	redis://[user:password@]host[:port][/db]  (rediss:// for TLS)
//
// for store.Config.MasterAddr. The client reads the leader view that
// crescent-master --ha_backend etcd|redis publishes (package ha/leader,
// prefix leader.DefaultPrefix, cluster id store.Config.ClusterID) through
// a leader.Coordinator, used read-only: View and WaitChange, never
// TryAcquire. The etcd client is built from leader.EtcdClientConfig (dial
// keep-alives, so a hung member is left for another); the Redis client
// from the URL as engine/metadata/redismeta parses it (credentials
// missing from it come from MC_REDIS_USERNAME / MC_REDIS_PASSWORD).
// OpenEtcd and OpenRedis are the registered openers. It links etcd's client and go-redis, which
// the store package itself does not.
package haview
