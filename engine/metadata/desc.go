package metadata

import (
	"encoding/json"
	"errors"
	"fmt"
	"sort"
	"strings"
	"time"
)

// SegmentDesc is a segment descriptor, in the reference's JSON schema plus
// a "crescent" object that reference peers ignore.
type SegmentDesc struct {
	Name            string `json:"name"`
	Protocol        string `json:"protocol"`
	TCPDataPort     int    `json:"tcp_data_port"`
	TCPProtoVersion int    `json:"tcp_proto_version,omitempty"`
	TCPDataHost     string `json:"tcp_data_host,omitempty"`
	Timestamp       string `json:"timestamp,omitempty"`
	RDMAServerName  string `json:"rdma_server_name,omitempty"`

	Devices        []Device               `json:"devices,omitempty"`
	Buffers        []Buffer               `json:"buffers"`
	PriorityMatrix map[string][2][]string `json:"priority_matrix,omitempty"`
	CXLName        string                 `json:"cxl_name,omitempty"`
	CXLBaseAddr    uint64                 `json:"cxl_base_addr,omitempty"`
	Crescent       *Extension             `json:"crescent,omitempty"`
}

// Device is an RDMA/EFA NIC of a segment.
type Device struct {
	Name string `json:"name"`
	LID  uint16 `json:"lid"`
	GID  string `json:"gid"`
}

// Buffer is a registered range of a segment. Offset, when set, is the
// buffer's offset in the segment's CXL device (cxl_name): peers sharing
// that device reach the buffer there.
type Buffer struct {
	Name   string   `json:"name"`
	Addr   uint64   `json:"addr"`
	Length uint64   `json:"length"`
	Offset *uint64  `json:"offset,omitempty"`
	RKey   []uint64 `json:"rkey,omitempty"`
	LKey   []uint64 `json:"lkey,omitempty"`
}

// Extension carries what Crescent peers use beyond the reference schema.
type Extension struct {
	Version int `json:"version"`
	// HostID is the boot id of the segment's kernel: equal ids mean the
	// peers can share memory.
	HostID string `json:"host_id,omitempty"`
	// Protocols lists the transports the segment serves.
	Protocols []string `json:"protocols,omitempty"`
	// ShmSocket is the Unix socket that hands out memfds of shared
	// buffers.
	ShmSocket string `json:"shm_socket,omitempty"`
	// ShmBuffers lists the addresses of buffers that can be mapped.
	ShmBuffers []uint64 `json:"shm_buffers,omitempty"`
	// EFA describes the segment's libfabric endpoints (the efa transport).
	EFA *EFAInfo `json:"efa,omitempty"`
	// RDMA locates the rdma transport's NICs in devices.
	RDMA *RDMAInfo `json:"rdma,omitempty"`
}

// RDMAInfo locates a segment's RDMA NICs in its descriptor:
// devices[FirstDevice:FirstDevice+Devices] are the NICs, and a buffer's
// rkey[i]/lkey[i] are its keys on devices[i]. A descriptor with protocol
// "rdma" and no RDMAInfo (a reference peer) means every device.
type RDMAInfo struct {
	FirstDevice int `json:"first_device"`
	Devices     int `json:"devices"`
}

// EFAInfo locates a segment's libfabric domains in its descriptor:
// devices[FirstDevice:FirstDevice+Devices] are the domains, and a
// buffer's rkey[i] is its key on devices[i]. A descriptor with protocol
// "efa" and no EFAInfo (a reference peer) means provider "efa", virtual
// addressing, every device.
type EFAInfo struct {
	// Provider is the libfabric provider ("efa", "tcp;ofi_rxm", ...);
	// only peers using the same provider can reach the segment.
	Provider string `json:"provider"`
	// VirtAddr is set when remote addresses are virtual addresses
	// (FI_MR_VIRT_ADDR); otherwise they are offsets into the buffer.
	VirtAddr    bool `json:"virt_addr"`
	FirstDevice int  `json:"first_device"`
	Devices     int  `json:"devices"`
}

// TimestampLayout is the reference's descriptor timestamp (local time).
const TimestampLayout = "2006-01-02 15:04:05.000000"

// Timestamp formats t as the reference does.
func Timestamp(t time.Time) string { return t.Format(TimestampLayout) }

// ErrBadDescriptor reports a descriptor that peers would reject.
var ErrBadDescriptor = errors.New("metadata: corrupted segment descriptor")

// DescError is a descriptor refused by Validate: Field names the field
// (as in the JSON, with indexes: "buffers[3].rkey"). It matches
// ErrBadDescriptor with errors.Is.
type DescError struct {
	Field  string
	Reason string
}

func (e *DescError) Error() string {
	return ErrBadDescriptor.Error() + ": " + e.Field + ": " + e.Reason
}

// Is reports whether target is ErrBadDescriptor.
func (e *DescError) Is(target error) bool { return target == ErrBadDescriptor }

func bad(field, format string, args ...any) error {
	return &DescError{Field: field, Reason: fmt.Sprintf(format, args...)}
}

// badAt is bad for field sub of element i of list ("buffers[3].rkey"),
// so the name is built only on failure.
func badAt(list string, i int, sub, format string, args ...any) error {
	return bad(fmt.Sprintf("%s[%d]%s", list, i, sub), format, args...)
}

// Bounds of a valid descriptor. Descriptors come from the network (a
// peer's handshake reply, a store anyone with access can write), and
// transports index, allocate and dial by their fields.
const (
	MaxNameLen    = 1024    // segment name, rdma_server_name
	MaxFieldLen   = 256     // buffer, device, location, provider, host and cxl names, host id
	MaxBuffers    = 1 << 20 // buffers of one segment
	MaxDevices    = 1024    // devices (NICs, domains) of one segment
	MaxProtocols  = 16
	MaxGIDLen     = 512 // an rdma GID or a hex libfabric address
	MaxSocketPath = 107 // a Unix socket path (sun_path less its NUL)
	// MaxDescBytes bounds a descriptor's JSON (DefaultReplyMax, the
	// largest handshake reply; a metadata store's value too).
	MaxDescBytes = DefaultReplyMax
	// maxDescMembers bounds the top-level members of a descriptor and
	// maxDescDepth its nesting.
	maxDescMembers = 1024
	maxDescDepth   = 16
)

// checkShape bounds what decoding data would build, before anything is
// built: a descriptor's JSON may hold at most maxDescMembers top-level
// members, MaxBuffers objects or arrays in one of their values (buffers,
// priority_matrix entries) and MaxDevices in anything deeper (a buffer's
// keys). Each "{}" of three bytes becomes a struct of a hundred or more,
// so the bounds Validate checks come too late. Malformed JSON passes:
// the decoder reports it.
func checkShape(data []byte) error {
	if len(data) > MaxDescBytes {
		return fmt.Errorf("%w: %d bytes (max %d)", ErrBadDescriptor, len(data), MaxDescBytes)
	}
	var open [maxDescDepth]int // composite elements of each open container
	depth, members := 0, 0
	inStr, esc := false, false
	for _, c := range data {
		if inStr {
			switch {
			case esc:
				esc = false
			case c == '\\':
				esc = true
			case c == '"':
				inStr = false
			}
			continue
		}
		switch c {
		case '"':
			inStr = true
		case '{', '[':
			if depth > 0 {
				open[depth-1]++
				n, lim, what := open[depth-1], MaxDevices, "elements nested"
				switch depth {
				case 1:
					lim, what = maxDescMembers, "top-level members"
				case 2:
					lim, what = MaxBuffers, "elements in one member"
				}
				if n > lim {
					return fmt.Errorf("%w: more than %d %s", ErrBadDescriptor, lim, what)
				}
			}
			if depth == maxDescDepth {
				return fmt.Errorf("%w: nested deeper than %d", ErrBadDescriptor, maxDescDepth)
			}
			open[depth] = 0
			depth++
		case '}', ']':
			depth = max(depth-1, 0)
		case ',':
			if depth == 1 {
				if members++; members >= maxDescMembers {
					return fmt.Errorf("%w: more than %d top-level members", ErrBadDescriptor, maxDescMembers)
				}
			}
		}
	}
	return nil
}

// Validate checks every field that a transport indexes with, dials or
// trusts, so a hostile or corrupt descriptor is refused here, naming the
// field, and never reaches a transport. Beyond the reference decoder's
// rules (a name; buffers with a name, a non-zero address except CXL, a
// length, no wrap) it bounds names and counts, and checks ports, the
// rdma/efa device ranges and GIDs, key counts against the devices,
// overlapping buffers, CXL offsets and the shm socket path.
func (d *SegmentDesc) Validate() error {
	if d.Name == "" {
		return bad("name", "empty")
	}
	if len(d.Name) > MaxNameLen {
		return bad("name", "%d bytes (max %d)", len(d.Name), MaxNameLen)
	}
	if len(d.Protocol) > MaxFieldLen {
		return bad("protocol", "%d bytes", len(d.Protocol))
	}
	if d.TCPDataPort < 0 || d.TCPDataPort > 65535 {
		return bad("tcp_data_port", "%d is not a port", d.TCPDataPort)
	}
	if d.TCPProtoVersion < 0 {
		return bad("tcp_proto_version", "%d", d.TCPProtoVersion)
	}
	if err := checkHost(d.TCPDataHost); err != nil {
		return bad("tcp_data_host", "%v", err)
	}
	if len(d.Timestamp) > MaxFieldLen {
		return bad("timestamp", "%d bytes", len(d.Timestamp))
	}
	if len(d.RDMAServerName) > MaxNameLen {
		return bad("rdma_server_name", "%d bytes", len(d.RDMAServerName))
	}
	if len(d.CXLName) > MaxFieldLen {
		return bad("cxl_name", "%d bytes", len(d.CXLName))
	}
	if err := d.validateDevices(); err != nil {
		return err
	}
	if err := d.validateBuffers(); err != nil {
		return err
	}
	if len(d.PriorityMatrix) > MaxBuffers {
		return bad("priority_matrix", "%d locations", len(d.PriorityMatrix))
	}
	for loc, lists := range d.PriorityMatrix {
		if len(loc) > MaxFieldLen {
			return bad("priority_matrix", "location of %d bytes", len(loc))
		}
		for k, list := range lists {
			if len(list) > MaxDevices {
				return bad(fmt.Sprintf("priority_matrix[%q][%d]", loc, k), "%d devices (max %d)", len(list), MaxDevices)
			}
		}
	}
	return d.validateExtension()
}

func (d *SegmentDesc) validateDevices() error {
	if len(d.Devices) > MaxDevices {
		return bad("devices", "%d devices (max %d)", len(d.Devices), MaxDevices)
	}
	for i, dev := range d.Devices {
		switch {
		case dev.Name == "":
			return badAt("devices", i, ".name", "empty")
		case len(dev.Name) > MaxFieldLen:
			return badAt("devices", i, ".name", "%d bytes", len(dev.Name))
		case strings.ContainsAny(dev.Name, "@\x00"):
			// "segment@device" is a NIC path in handshakes.
			return badAt("devices", i, ".name", "%q holds '@' or NUL", dev.Name)
		case len(dev.GID) > MaxGIDLen:
			return badAt("devices", i, ".gid", "%d bytes", len(dev.GID))
		}
	}
	return nil
}

func (d *SegmentDesc) validateBuffers() error {
	if len(d.Buffers) > MaxBuffers {
		return bad("buffers", "%d buffers (max %d)", len(d.Buffers), MaxBuffers)
	}
	type span struct {
		addr, end uint64
		i         int
	}
	spans := make([]span, 0, len(d.Buffers))
	for i, b := range d.Buffers {
		switch {
		case b.Name == "":
			return badAt("buffers", i, ".name", "empty")
		case len(b.Name) > MaxFieldLen:
			return badAt("buffers", i, ".name", "%d bytes", len(b.Name))
		case b.Length == 0:
			return badAt("buffers", i, ".length", "zero")
		case d.Protocol != "cxl" && b.Addr == 0:
			return badAt("buffers", i, ".addr", "zero")
		case b.Addr+b.Length < b.Addr:
			return badAt("buffers", i, ".length", "[%#x,+%#x) wraps the address space", b.Addr, b.Length)
		case b.Offset != nil && *b.Offset+b.Length < *b.Offset:
			return badAt("buffers", i, ".offset", "[%#x,+%#x) wraps", *b.Offset, b.Length)
		case len(b.RKey) > len(d.Devices):
			// Keys are per device, in device order.
			return badAt("buffers", i, ".rkey", "%d keys for %d devices", len(b.RKey), len(d.Devices))
		case len(b.LKey) != 0 && len(b.LKey) != len(b.RKey):
			return badAt("buffers", i, ".lkey", "%d lkeys and %d rkeys", len(b.LKey), len(b.RKey))
		}
		spans = append(spans, span{b.Addr, b.Addr + b.Length, i})
	}
	// Transports look a range up in one buffer: overlapping ones would
	// make that ambiguous (and no registry hands them out).
	sort.Slice(spans, func(i, j int) bool { return spans[i].addr < spans[j].addr })
	for k := 1; k < len(spans); k++ {
		if p, c := spans[k-1], spans[k]; c.addr < p.end {
			if p.i > c.i {
				p, c = c, p // name the later one
			}
			return badAt("buffers", c.i, "", "[%#x,%#x) overlaps buffers[%d] [%#x,%#x)", c.addr, c.end, p.i, p.addr, p.end)
		}
	}
	return nil
}

func (d *SegmentDesc) validateExtension() error {
	// A reference rdma segment's devices are all rdma NICs.
	if d.Crescent == nil || d.Crescent.RDMA == nil {
		if d.Protocol == "rdma" {
			return d.validateGIDs("devices", 0, len(d.Devices), isGIDChar)
		}
	}
	x := d.Crescent
	if x == nil {
		return nil
	}
	switch {
	case x.Version < 0:
		return bad("crescent.version", "%d", x.Version)
	case len(x.HostID) > MaxFieldLen:
		return bad("crescent.host_id", "%d bytes", len(x.HostID))
	case len(x.Protocols) > MaxProtocols:
		return bad("crescent.protocols", "%d entries (max %d)", len(x.Protocols), MaxProtocols)
	case len(x.ShmSocket) > MaxSocketPath:
		return bad("crescent.shm_socket", "%d bytes (max %d)", len(x.ShmSocket), MaxSocketPath)
	case strings.IndexByte(x.ShmSocket, 0) >= 0:
		return bad("crescent.shm_socket", "holds NUL")
	case len(x.ShmBuffers) > MaxBuffers:
		// Entries name buffers; one that names none is only not mapped.
		return bad("crescent.shm_buffers", "%d entries (max %d)", len(x.ShmBuffers), MaxBuffers)
	}
	for i, p := range x.Protocols {
		if len(p) > MaxFieldLen {
			return bad(fmt.Sprintf("crescent.protocols[%d]", i), "%d bytes", len(p))
		}
	}
	if r := x.RDMA; r != nil {
		if err := checkRange("crescent.rdma", r.FirstDevice, r.Devices, len(d.Devices)); err != nil {
			return err
		}
		if err := d.validateGIDs("devices", r.FirstDevice, r.Devices, isGIDChar); err != nil {
			return err
		}
	}
	if e := x.EFA; e != nil {
		if len(e.Provider) > MaxFieldLen {
			return bad("crescent.efa.provider", "%d bytes", len(e.Provider))
		}
		if err := checkRange("crescent.efa", e.FirstDevice, e.Devices, len(d.Devices)); err != nil {
			return err
		}
		// An efa device's gid is the hex of its endpoint address.
		if err := d.validateGIDs("devices", e.FirstDevice, e.Devices, isHexChar); err != nil {
			return err
		}
	}
	return nil
}

// checkRange checks that devices[first:first+count] exists, in a form
// that cannot overflow.
func checkRange(field string, first, count, devices int) error {
	if count <= 0 || count > devices {
		return bad(field+".devices", "%d of %d devices", count, devices)
	}
	if first < 0 || first > devices-count {
		return bad(field+".first_device", "%d: devices [%d,+%d) of %d", first, first, count, devices)
	}
	return nil
}

// validateGIDs checks the gids of devices[first:first+count] (a range
// checkRange accepted) against the characters their transport parses,
// and that their names are distinct: NIC paths and priority matrices
// name devices.
func (d *SegmentDesc) validateGIDs(field string, first, count int, ok func(rune) bool) error {
	seen := make(map[string]int, count)
	for i := first; i < first+count; i++ {
		dev := d.Devices[i]
		if dev.GID == "" || strings.IndexFunc(dev.GID, func(r rune) bool { return !ok(r) }) >= 0 {
			return bad(fmt.Sprintf("%s[%d].gid", field, i), "%q is not a GID or address", dev.GID)
		}
		if j, dup := seen[dev.Name]; dup {
			return bad(fmt.Sprintf("%s[%d].name", field, i), "%q repeats devices[%d]", dev.Name, j)
		}
		seen[dev.Name] = i
	}
	return nil
}

func isHexChar(r rune) bool {
	return r >= '0' && r <= '9' || r >= 'a' && r <= 'f' || r >= 'A' && r <= 'F'
}

// isGIDChar accepts the characters of both GID forms: 16 hex bytes
// joined by ':' and IPv6 text (possibly IPv4-mapped).
func isGIDChar(r rune) bool { return isHexChar(r) || r == ':' || r == '.' }

// checkHost accepts an empty host, a DNS name or an IP address (IPv6
// with an optional zone), and nothing that would change what
// net.JoinHostPort builds or a resolver is asked.
func checkHost(h string) error {
	if len(h) > MaxFieldLen {
		return fmt.Errorf("%d bytes", len(h))
	}
	for _, r := range h {
		if !(r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' || strings.ContainsRune(".-_:%", r)) {
			return fmt.Errorf("%q holds %q", h, r)
		}
	}
	return nil
}

// Marshal encodes d compactly, with the trailing newline the reference's
// writer adds.
func (d *SegmentDesc) Marshal() ([]byte, error) {
	b, err := json.Marshal(d)
	if err != nil {
		return nil, err
	}
	return append(b, '\n'), nil
}

// UnmarshalDesc decodes and validates a descriptor. "protocol" may be a
// string or (multi-protocol reference builds) an array of strings.
func UnmarshalDesc(data []byte) (*SegmentDesc, error) {
	if err := checkShape(data); err != nil {
		return nil, err
	}
	var raw map[string]json.RawMessage
	if err := json.Unmarshal(data, &raw); err != nil {
		return nil, fmt.Errorf("%w: %w", ErrBadDescriptor, err)
	}
	if raw == nil {
		return nil, fmt.Errorf("%w: null", ErrBadDescriptor)
	}
	var protos []string
	if p, ok := raw["protocol"]; ok && len(p) > 0 && p[0] == '[' {
		if err := json.Unmarshal(p, &protos); err != nil {
			return nil, fmt.Errorf("%w: protocol: %w", ErrBadDescriptor, err)
		}
		delete(raw, "protocol")
	}
	d := &SegmentDesc{}
	if err := json.Unmarshal(data, &struct {
		*SegmentDesc
		Protocol json.RawMessage `json:"protocol"`
	}{SegmentDesc: d}); err != nil {
		return nil, fmt.Errorf("%w: %w", ErrBadDescriptor, err)
	}
	switch {
	case len(protos) > 0:
		d.Protocol = protos[0]
	default:
		if p, ok := raw["protocol"]; ok {
			if err := json.Unmarshal(p, &d.Protocol); err != nil {
				return nil, fmt.Errorf("%w: protocol: %w", ErrBadDescriptor, err)
			}
		}
	}
	if d.TCPProtoVersion == 0 {
		d.TCPProtoVersion = 1
	}
	// A reference CXL segment addresses buffers by device offset only;
	// requests to it name that offset, so it doubles as the address.
	if d.Protocol == "cxl" {
		for i := range d.Buffers {
			if b := &d.Buffers[i]; b.Addr == 0 && b.Offset != nil {
				b.Addr = *b.Offset
			}
		}
	}
	if err := d.Validate(); err != nil {
		return nil, err
	}
	return d, nil
}

// HasProtocol reports whether the segment says it serves protocol p.
func (d *SegmentDesc) HasProtocol(p string) bool {
	if d.Protocol == p {
		return true
	}
	if d.Crescent != nil {
		for _, q := range d.Crescent.Protocols {
			if q == p {
				return true
			}
		}
	}
	return false
}
