package metadata

import (
	"encoding/json"
	"errors"
	"fmt"
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

// Validate applies the reference decoder's rules: a name, and buffers with
// a non-empty name, a non-zero address (except CXL) and length, and no
// address overflow.
func (d *SegmentDesc) Validate() error {
	if d.Name == "" {
		return fmt.Errorf("%w: no name", ErrBadDescriptor)
	}
	for i, b := range d.Buffers {
		if b.Name == "" || b.Length == 0 {
			return fmt.Errorf("%w: buffer %d has no name or length", ErrBadDescriptor, i)
		}
		if d.Protocol != "cxl" && b.Addr == 0 {
			return fmt.Errorf("%w: buffer %d has address 0", ErrBadDescriptor, i)
		}
		if b.Addr+b.Length < b.Addr {
			return fmt.Errorf("%w: buffer %d wraps the address space", ErrBadDescriptor, i)
		}
		if len(b.RKey) != len(b.LKey) && len(b.LKey) != 0 {
			return fmt.Errorf("%w: buffer %d has %d rkeys and %d lkeys", ErrBadDescriptor, i, len(b.RKey), len(b.LKey))
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
