package rdma

import (
	"bytes"
	"encoding/json"
	"fmt"
	"strings"
)

// protocolName is the transport's name in descriptors and handshakes.
const protocolName = "rdma"

// hsMsg is the reference's Connection handshake body (HandShakeDesc).
// crescent_mtu is Crescent's: the sender's port MTU, so both sides agree
// on the smaller; reference peers ignore it, and when it is absent the
// local MTU and MaxMTU decide.
type hsMsg struct {
	Protocol     string   `json:"protocol"`
	LocalNICPath string   `json:"local_nic_path"`
	PeerNICPath  string   `json:"peer_nic_path"`
	QPNum        []uint32 `json:"qp_num"`
	LocalLID     uint16   `json:"local_lid"`
	LocalGID     string   `json:"local_gid"`
	ReplyMsg     string   `json:"reply_msg"`
	MTU          int      `json:"crescent_mtu,omitempty"`
}

func (m *hsMsg) encode() []byte {
	b, err := json.Marshal(m)
	if err != nil {
		panic(err) // only strings, numbers and slices of them
	}
	return append(b, '\n')
}

// decodeHandshake parses a handshake body. Field types are checked as the
// reference does (strings, unsigned numbers, an array of QP numbers);
// missing fields stay empty. Unknown fields are ignored.
func decodeHandshake(b []byte) (*hsMsg, error) {
	b = bytes.TrimSpace(b)
	if len(b) == 0 || b[0] != '{' {
		return nil, fmt.Errorf("%w: malformed transfer handshake: not a JSON object", ErrHandshake)
	}
	var m hsMsg
	if err := json.Unmarshal(b, &m); err != nil {
		return nil, fmt.Errorf("%w: malformed transfer handshake: %v", ErrHandshake, err)
	}
	if m.MTU < 0 || m.MTU > 1<<16 {
		return nil, fmt.Errorf("%w: malformed transfer handshake: crescent_mtu %d", ErrHandshake, m.MTU)
	}
	return &m, nil
}

// nicPath is the reference's "server@device".
func nicPath(server, device string) string { return server + "@" + device }

// splitNICPath splits "server@device" at the last '@' (device names hold
// none; server names might).
func splitNICPath(p string) (server, device string, ok bool) {
	i := strings.LastIndexByte(p, '@')
	if i <= 0 || i == len(p)-1 {
		return "", "", false
	}
	return p[:i], p[i+1:], true
}
