package efa

import (
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
)

// Protocol is the transport's name in descriptors and handshakes.
const Protocol = "efa"

// maxAddrLen bounds an endpoint address in a handshake (libfabric
// addresses are at most a few dozen bytes; EFA's are 32).
const maxAddrLen = 256

// ErrBadHandshake reports a Connection message this transport cannot use.
var ErrBadHandshake = errors.New("efa: malformed transfer handshake")

// handshakeMsg is the reference's Connection JSON (HandShakeDesc), with
// the fields an EFA endpoint uses. Encoded with every field, as the
// reference's encoder does; decoded leniently (missing fields are empty).
type handshakeMsg struct {
	Protocol     string   `json:"protocol"`
	Payload      string   `json:"payload"`
	LocalNicPath string   `json:"local_nic_path"`
	LocalLID     uint16   `json:"local_lid"`
	LocalGID     string   `json:"local_gid"`
	PeerNicPath  string   `json:"peer_nic_path"`
	QPNum        []uint32 `json:"qp_num"`
	ReplyMsg     string   `json:"reply_msg"`
	EFAAddr      string   `json:"efa_addr"`
}

func (m *handshakeMsg) encode() []byte {
	if m.QPNum == nil {
		m.QPNum = []uint32{}
	}
	b, _ := json.Marshal(m) // only strings and numbers: cannot fail
	return b
}

// decodeHandshake parses a Connection message: a JSON object whose known
// fields have the reference's types.
func decodeHandshake(b []byte) (*handshakeMsg, error) {
	var m handshakeMsg
	if err := json.Unmarshal(b, &m); err != nil {
		return nil, fmt.Errorf("%w: %v", ErrBadHandshake, err)
	}
	return &m, nil
}

// addr decodes efa_addr: lower- or upper-case hex of the endpoint name.
func (m *handshakeMsg) addr() ([]byte, error) {
	if m.EFAAddr == "" {
		return nil, fmt.Errorf("%w: no efa_addr", ErrBadHandshake)
	}
	if len(m.EFAAddr) > 2*maxAddrLen {
		return nil, fmt.Errorf("%w: efa_addr of %d characters", ErrBadHandshake, len(m.EFAAddr))
	}
	a, err := hex.DecodeString(m.EFAAddr)
	if err != nil {
		return nil, fmt.Errorf("%w: efa_addr: %v", ErrBadHandshake, err)
	}
	return a, nil
}

// nicPath is the reference's "server@nic".
func nicPath(server, nic string) string { return server + "@" + nic }

// splitNicPath splits "server@nic" at the last '@'.
func splitNicPath(p string) (server, nic string, ok bool) {
	i := strings.LastIndexByte(p, '@')
	if i <= 0 || i == len(p)-1 {
		return "", "", false
	}
	return p[:i], p[i+1:], true
}
