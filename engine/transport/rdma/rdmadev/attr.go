package rdmadev

import (
	"fmt"
	"net"
	"strconv"
	"strings"
)

// MTU is an IB path MTU in bytes: 256, 512, 1024, 2048 or 4096.
type MTU int

// Path MTUs.
const (
	MTU256  MTU = 256
	MTU512  MTU = 512
	MTU1024 MTU = 1024
	MTU2048 MTU = 2048
	MTU4096 MTU = 4096
)

// MTUFromEnum converts an ibv_mtu (1 = 256 ... 5 = 4096); 0 for others.
func MTUFromEnum(e int) MTU {
	if e < 1 || e > 5 {
		return 0
	}
	return MTU(128 << e)
}

// Enum is the ibv_mtu value of m (0 if m is not a path MTU).
func (m MTU) Enum() int {
	switch m {
	case MTU256:
		return 1
	case MTU512:
		return 2
	case MTU1024:
		return 3
	case MTU2048:
		return 4
	case MTU4096:
		return 5
	}
	return 0
}

// Valid reports whether m is one of the five path MTUs.
func (m MTU) Valid() bool { return m.Enum() != 0 }

// Floor rounds m down to a path MTU; 0 below 256.
func (m MTU) Floor() MTU {
	for v := MTU4096; v >= MTU256; v >>= 1 {
		if m >= v {
			return v
		}
	}
	return 0
}

// NegotiateMTU returns the path MTU both sides support: the smallest of
// the non-zero arguments, rounded down to a path MTU (0 when all are 0
// or the smallest is below 256). Callers pass the local port's active
// MTU, the peer's (when it told it) and the configured cap (4096 in the
// reference).
func NegotiateMTU(mtus ...MTU) MTU {
	var m MTU
	for _, v := range mtus {
		if v > 0 && (m == 0 || v < m) {
			m = v
		}
	}
	return m.Floor()
}

// GID is a 128-bit port GID.
type GID [16]byte

// String formats g as the reference does: 16 two-digit lowercase hex
// bytes joined by ':' ("fe:80:00:...").
func (g GID) String() string {
	var b strings.Builder
	b.Grow(47)
	const hex = "0123456789abcdef"
	for i, v := range g {
		if i > 0 {
			b.WriteByte(':')
		}
		b.WriteByte(hex[v>>4])
		b.WriteByte(hex[v&15])
	}
	return b.String()
}

// IsZero reports an all-zero (unset) GID.
func (g GID) IsZero() bool { return g == GID{} }

// IPv4Mapped reports a RoCE v2 GID derived from an IPv4 address
// (::ffff:a.b.c.d).
func (g GID) IPv4Mapped() bool {
	return net.IP(g[:]).To4() != nil && !g.IsZero()
}

// ParseGID reads the reference's format (16 hex bytes separated by ':').
// It also accepts an IPv6 address ("fe80::1", "::ffff:10.0.0.1").
func ParseGID(s string) (GID, error) {
	var g GID
	parts := strings.Split(s, ":")
	if len(parts) == 16 {
		for i, p := range parts {
			if len(p) == 0 || len(p) > 2 {
				return GID{}, fmt.Errorf("%w: GID %q: byte %d", ErrInvalid, s, i)
			}
			v, err := strconv.ParseUint(p, 16, 8)
			if err != nil {
				return GID{}, fmt.Errorf("%w: GID %q: byte %d", ErrInvalid, s, i)
			}
			g[i] = byte(v)
		}
		return g, nil
	}
	ip := net.ParseIP(s)
	if ip == nil || strings.Count(s, ":") < 2 {
		return GID{}, fmt.Errorf("%w: GID %q", ErrInvalid, s)
	}
	copy(g[:], ip.To16())
	return g, nil
}
