package metadata

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"strconv"
	"strings"
	"time"
)

// ClusterIDEnv names the environment variable the reference reads for
// the cluster id that namespaces metadata keys.
const ClusterIDEnv = "MC_METADATA_CLUSTER_ID"

var (
	// ErrBadConnString reports a metadata connection string that does not
	// parse.
	ErrBadConnString = errors.New("metadata: malformed metadata connection string")
	// ErrUnavailable reports a metadata store that did not answer within
	// the timeout.
	ErrUnavailable = errors.New("metadata: metadata server unavailable")
)

// Keys builds the reference's key names for one cluster id.
type Keys struct {
	// Prefix is "mooncake/" or "mooncake/<cluster id>/".
	Prefix string
}

// NewKeys returns the key names for clusterID ("" = none). As in the
// reference, a cluster id gets a trailing '/' when it lacks one.
func NewKeys(clusterID string) Keys {
	if clusterID != "" && !strings.HasSuffix(clusterID, "/") {
		clusterID += "/"
	}
	return Keys{Prefix: "mooncake/" + clusterID}
}

// Segment is the key of segment name's descriptor: Prefix+"ram/"+name, or
// Prefix+name when the name already holds a '/' (the reference's rule).
func (k Keys) Segment(name string) string {
	if strings.Contains(name, "/") {
		return k.Prefix + name
	}
	return k.Prefix + "ram/" + name
}

// RPCMeta is the key of segment name's handshake address.
func (k Keys) RPCMeta(name string) string { return k.Prefix + "rpc_meta/" + name }

// RPCMeta is the value stored under Keys.RPCMeta, as the reference writes
// it: {"ip_or_host_name":"10.0.0.1","rpc_port":15123}.
type RPCMeta struct {
	IPOrHostName string `json:"ip_or_host_name"`
	RPCPort      uint16 `json:"rpc_port"`
}

// EncodeRPCMeta encodes the handshake address addr ("host:port") as an
// rpc_meta value (compact JSON with a trailing newline).
func EncodeRPCMeta(addr string) ([]byte, error) {
	host, ps, err := net.SplitHostPort(addr)
	if err != nil {
		return nil, fmt.Errorf("metadata: rpc address %q: %w", addr, err)
	}
	port, err := strconv.ParseUint(ps, 10, 16)
	if err != nil || port == 0 || host == "" {
		return nil, fmt.Errorf("metadata: rpc address %q: bad host or port", addr)
	}
	b, err := json.Marshal(RPCMeta{IPOrHostName: host, RPCPort: uint16(port)})
	if err != nil {
		return nil, err
	}
	return append(b, '\n'), nil
}

// DecodeRPCMeta decodes an rpc_meta value into "host:port".
func DecodeRPCMeta(b []byte) (string, error) {
	var m RPCMeta
	if err := json.Unmarshal(b, &m); err != nil {
		return "", fmt.Errorf("%w: rpc_meta: %w", ErrBadReply, err)
	}
	if m.IPOrHostName == "" || m.RPCPort == 0 {
		return "", fmt.Errorf("%w: rpc_meta %q has no host or port", ErrBadReply, trimSpace(b))
	}
	return net.JoinHostPort(m.IPOrHostName, strconv.Itoa(int(m.RPCPort))), nil
}

// FillDataHost sets d.TCPDataHost from the segment's rpc_meta entry when
// the descriptor has none and its name is not "host:port" (reference
// peers in store mode name segments by host name only; their data port
// is reached on the rpc_meta host, as the reference does). lookup returns
// the segment's rpc_meta address.
func FillDataHost(d *SegmentDesc, lookup func() (string, error)) {
	if d.TCPDataHost != "" {
		return
	}
	if _, _, err := net.SplitHostPort(d.Name); err == nil {
		return
	}
	addr, err := lookup()
	if err != nil {
		return
	}
	if host, _, err := net.SplitHostPort(addr); err == nil {
		d.TCPDataHost = host
	}
}

// DialDiagnosis says, for each address, whether a TCP connection can be
// made: store clients often report only a deadline when a server does not
// answer, and the operator needs to know whether it refused or was
// silent.
func DialDiagnosis(addrs ...string) string {
	out := make([]string, 0, len(addrs))
	for _, a := range addrs {
		c, err := net.DialTimeout("tcp", a, time.Second)
		if err != nil {
			out = append(out, err.Error())
			continue
		}
		c.Close()
		out = append(out, a+" accepts TCP connections but does not answer")
	}
	return strings.Join(out, "; ")
}

// Entries returns what a store backend publishes for d: its descriptor
// under Segment(d.Name) and, when rpcAddr is set, the rpc_meta entry under
// RPCMeta(d.Name). The descriptor is validated first.
func (k Keys) Entries(d *SegmentDesc, rpcAddr string) (map[string][]byte, error) {
	if err := d.Validate(); err != nil {
		return nil, err
	}
	val, err := d.Marshal()
	if err != nil {
		return nil, err
	}
	kvs := map[string][]byte{k.Segment(d.Name): val}
	if rpcAddr != "" {
		rpc, err := EncodeRPCMeta(rpcAddr)
		if err != nil {
			return nil, err
		}
		kvs[k.RPCMeta(d.Name)] = rpc
	}
	return kvs, nil
}

// KVReader is how a store backend reads one key: the value, whether it
// exists, or an error.
type KVReader func(ctx context.Context, key string) ([]byte, bool, error)

// GetDesc reads segment name's descriptor through get (store says which
// store, for messages), filling tcp_data_host from its rpc_meta entry when
// the name carries no host.
func (k Keys) GetDesc(ctx context.Context, get KVReader, store, name string) (*SegmentDesc, error) {
	key := k.Segment(name)
	v, ok, err := get(ctx, key)
	if err != nil {
		return nil, err
	}
	if !ok {
		return nil, fmt.Errorf("%w: %q (no %s key %s)", ErrNotFound, name, store, key)
	}
	d, err := UnmarshalDesc(v)
	if err != nil {
		return nil, fmt.Errorf("%s key %s: %w", store, key, err)
	}
	FillDataHost(d, func() (string, error) { return k.GetRPCAddr(ctx, get, store, name) })
	return d, nil
}

// GetRPCAddr reads the handshake address published under rpc_meta/<name>.
func (k Keys) GetRPCAddr(ctx context.Context, get KVReader, store, name string) (string, error) {
	key := k.RPCMeta(name)
	v, ok, err := get(ctx, key)
	if err != nil {
		return "", err
	}
	if !ok {
		return "", fmt.Errorf("%w: %q has no rpc_meta entry (%s key %s)", ErrNotFound, name, store, key)
	}
	return DecodeRPCMeta(v)
}
