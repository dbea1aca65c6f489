// Package portpick hands out TCP port numbers for servers that must be
// told their port before they bind it: a crescent-master, redis-server or
// etcd process started by a test or a bench.
//
// Asking the kernel for port 0 and closing the listener races with every
// outgoing connection on the host, because the kernel takes connections'
// local ports from the same ephemeral range
// (/proc/sys/net/ipv4/ip_local_port_range) and may hand the port out
// again before the server binds it. Port picks therefore come from the
// 12,000 ports just below that range, where the kernel never allocates on
// its own. A port is returned only if it could be bound on every address
// at that moment, and never twice by one process, so a server that
// restarts on its port keeps it against the rest of the process. Two
// processes picking at once collide only if their random draws meet.
//
// portpick owns no wire or file format.
package portpick
