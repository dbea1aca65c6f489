package metadata

import (
	"bytes"
	"errors"
	"math"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// fullDesc is a valid descriptor using every transport's fields: two
// rdma NICs, then one efa domain, a CXL device and shm.
func fullDesc() *SegmentDesc {
	off := uint64(4096)
	return &SegmentDesc{
		Name: "10.0.0.1:15000", Protocol: "tcp", TCPDataPort: 16000, TCPProtoVersion: 2, TCPDataHost: "10.0.0.1",
		Devices: []Device{
			{Name: "mlx5_0", LID: 1, GID: "fe80:0000:0000:0000:0000:0000:0000:0001"},
			{Name: "mlx5_1", LID: 2, GID: "::ffff:10.0.0.1"},
			{Name: "efa_0-rdm", GID: "0a0b0c"},
		},
		Buffers: []Buffer{
			{Name: "cpu:0", Addr: 1 << 40, Length: 1 << 20, RKey: []uint64{1, 2, 3}, LKey: []uint64{1, 2, 3}, Offset: &off},
			{Name: "cpu:1", Addr: 1<<40 + 1<<20, Length: 1 << 20},
		},
		PriorityMatrix: map[string][2][]string{"cpu:0": {{"mlx5_0"}, {"mlx5_1"}}},
		CXLName:        "dax0.0",
		Crescent: &Extension{Version: 1, HostID: "boot", Protocols: []string{"shm", "rdma", "efa", "tcp"},
			ShmSocket: "@crescent-shm/1", ShmBuffers: []uint64{1 << 40},
			RDMA: &RDMAInfo{FirstDevice: 0, Devices: 2},
			EFA:  &EFAInfo{Provider: "efa", VirtAddr: true, FirstDevice: 2, Devices: 1}},
	}
}

func TestValidateFields(t *testing.T) {
	require.NoError(t, fullDesc().Validate())
	long := strings.Repeat("x", MaxFieldLen+1)
	cases := []struct {
		name   string
		mutate func(d *SegmentDesc)
		field  string
	}{
		{"efa first_device MaxInt", func(d *SegmentDesc) { d.Crescent.EFA.FirstDevice = math.MaxInt }, "crescent.efa.first_device"},
		{"efa first+count wraps", func(d *SegmentDesc) { d.Crescent.EFA.FirstDevice, d.Crescent.EFA.Devices = math.MaxInt-1, 2 }, "crescent.efa.first_device"},
		{"efa first negative", func(d *SegmentDesc) { d.Crescent.EFA.FirstDevice = -1 }, "crescent.efa.first_device"},
		{"efa past the end", func(d *SegmentDesc) { d.Crescent.EFA.FirstDevice = 3 }, "crescent.efa.first_device"},
		{"efa no devices", func(d *SegmentDesc) { d.Crescent.EFA.Devices = 0 }, "crescent.efa.devices"},
		{"efa count MaxInt", func(d *SegmentDesc) { d.Crescent.EFA.Devices = math.MaxInt }, "crescent.efa.devices"},
		{"efa gid not hex", func(d *SegmentDesc) { d.Devices[2].GID = "zz" }, "devices[2].gid"},
		{"efa provider long", func(d *SegmentDesc) { d.Crescent.EFA.Provider = long }, "crescent.efa.provider"},
		{"rdma first_device MaxInt", func(d *SegmentDesc) { d.Crescent.RDMA.FirstDevice = math.MaxInt }, "crescent.rdma.first_device"},
		{"rdma count negative", func(d *SegmentDesc) { d.Crescent.RDMA.Devices = -5 }, "crescent.rdma.devices"},
		{"rdma gid garbage", func(d *SegmentDesc) { d.Devices[1].GID = "not a gid" }, "devices[1].gid"},
		{"rdma gid empty", func(d *SegmentDesc) { d.Devices[0].GID = "" }, "devices[0].gid"},
		{"rdma duplicate device", func(d *SegmentDesc) { d.Devices[1].Name = "mlx5_0" }, "devices[1].name"},
		{"reference rdma gid garbage", func(d *SegmentDesc) { d.Protocol = "rdma"; d.Crescent = nil; d.Devices[2].GID = "g" }, "devices[2].gid"},
		{"too many devices", func(d *SegmentDesc) { d.Devices = make([]Device, MaxDevices+1) }, "devices"},
		{"device without name", func(d *SegmentDesc) { d.Devices[0].Name = "" }, "devices[0].name"},
		{"device name with @", func(d *SegmentDesc) { d.Devices[0].Name = "a@b" }, "devices[0].name"},
		{"device name long", func(d *SegmentDesc) { d.Devices[0].Name = long }, "devices[0].name"},
		{"gid long", func(d *SegmentDesc) { d.Devices[0].GID = strings.Repeat("0", MaxGIDLen+1) }, "devices[0].gid"},
		{"more rkeys than devices", func(d *SegmentDesc) { d.Buffers[0].RKey = make([]uint64, 4); d.Buffers[0].LKey = nil }, "buffers[0].rkey"},
		{"lkeys and rkeys differ", func(d *SegmentDesc) { d.Buffers[0].LKey = d.Buffers[0].LKey[:1] }, "buffers[0].lkey"},
		{"buffer wraps", func(d *SegmentDesc) { d.Buffers[1].Addr, d.Buffers[1].Length = math.MaxUint64-1, 3 }, "buffers[1].length"},
		{"buffer overlaps", func(d *SegmentDesc) { d.Buffers[1].Addr = 1<<40 + 4096 }, "buffers[1]"},
		{"buffer duplicate", func(d *SegmentDesc) { d.Buffers[1].Addr = d.Buffers[0].Addr }, "buffers[1]"},
		{"buffer name long", func(d *SegmentDesc) { d.Buffers[1].Name = long }, "buffers[1].name"},
		{"cxl offset wraps", func(d *SegmentDesc) { o := uint64(math.MaxUint64 - 10); d.Buffers[0].Offset = &o }, "buffers[0].offset"},
		{"cxl name long", func(d *SegmentDesc) { d.CXLName = long }, "cxl_name"},
		{"tcp port negative", func(d *SegmentDesc) { d.TCPDataPort = -1 }, "tcp_data_port"},
		{"tcp port too big", func(d *SegmentDesc) { d.TCPDataPort = 65536 }, "tcp_data_port"},
		{"tcp port MaxInt", func(d *SegmentDesc) { d.TCPDataPort = math.MaxInt }, "tcp_data_port"},
		{"tcp version negative", func(d *SegmentDesc) { d.TCPProtoVersion = -2 }, "tcp_proto_version"},
		{"tcp host with slash", func(d *SegmentDesc) { d.TCPDataHost = "evil/x" }, "tcp_data_host"},
		{"tcp host with brackets", func(d *SegmentDesc) { d.TCPDataHost = "[::1]:22" }, "tcp_data_host"},
		{"tcp host with space", func(d *SegmentDesc) { d.TCPDataHost = "a b" }, "tcp_data_host"},
		{"tcp host long", func(d *SegmentDesc) { d.TCPDataHost = long }, "tcp_data_host"},
		{"name long", func(d *SegmentDesc) { d.Name = strings.Repeat("n", MaxNameLen+1) }, "name"},
		{"protocol long", func(d *SegmentDesc) { d.Protocol = long }, "protocol"},
		{"shm socket long", func(d *SegmentDesc) { d.Crescent.ShmSocket = strings.Repeat("s", MaxSocketPath+1) }, "crescent.shm_socket"},
		{"shm socket NUL", func(d *SegmentDesc) { d.Crescent.ShmSocket = "/tmp/a\x00b" }, "crescent.shm_socket"},
		{"host id long", func(d *SegmentDesc) { d.Crescent.HostID = long }, "crescent.host_id"},
		{"too many protocols", func(d *SegmentDesc) { d.Crescent.Protocols = make([]string, MaxProtocols+1) }, "crescent.protocols"},
		{"matrix list long", func(d *SegmentDesc) {
			d.PriorityMatrix["cpu:0"] = [2][]string{make([]string, MaxDevices+1), nil}
		}, `priority_matrix["cpu:0"][0]`},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			d := fullDesc()
			tc.mutate(d)
			err := d.Validate()
			require.ErrorIs(t, err, ErrBadDescriptor)
			var de *DescError
			require.True(t, errors.As(err, &de), "%v is not a DescError", err)
			require.Equal(t, tc.field, de.Field, "error: %v", err)
			require.Contains(t, err.Error(), tc.field)
			// The same refusal through the decoder, as every source
			// (handshake, etcd, Redis, HTTP) decodes.
			b, merr := d.Marshal()
			require.NoError(t, merr)
			got, err := UnmarshalDesc(b)
			require.Nil(t, got)
			require.ErrorAs(t, err, &de)
			require.Equal(t, tc.field, de.Field)
		})
	}
}

// TestValidateKeepsReferenceDescriptors: what reference peers publish
// still passes.
func TestValidateKeepsReferenceDescriptors(t *testing.T) {
	for _, s := range []string{refTCPv2, refTCPv1, refRDMA, refMulti, refCXL} {
		_, err := UnmarshalDesc([]byte(s))
		require.NoError(t, err, s)
	}
}

// TestDecodeBoundsTypes: fields whose JSON type bounds them (lid is a
// u16, keys and addresses u64) refuse out-of-range numbers at decode.
func TestDecodeBoundsTypes(t *testing.T) {
	for _, s := range []string{
		`{"name":"h:1","protocol":"rdma","devices":[{"name":"m","lid":70000,"gid":"fe80::1"}]}`,
		`{"name":"h:1","protocol":"rdma","devices":[{"name":"m","lid":-1,"gid":"fe80::1"}]}`,
		`{"name":"h:1","protocol":"rdma","devices":[{"name":"m","gid":"fe80::1"}],"buffers":[{"name":"x","addr":1,"length":1,"rkey":[-1]}]}`,
		`{"name":"h:1","crescent":{"version":1,"efa":{"provider":"efa","first_device":9223372036854775808,"devices":1}}}`,
		`{"name":"h:1","crescent":{"version":1,"efa":{"provider":"efa","first_device":9223372036854775807,"devices":1}}}`,
		`{"name":"h:1","crescent":{"version":1,"rdma":{"first_device":"0","devices":1}}}`,
	} {
		d, err := UnmarshalDesc([]byte(s))
		require.Nil(t, d, s)
		require.ErrorIs(t, err, ErrBadDescriptor, s)
	}
}

// TestUnmarshalDescShapeBounded: a descriptor whose JSON holds more
// elements than a valid one may is refused before it is decoded: more
// buffers than MaxBuffers written as "{}" (3 bytes each, 100+ bytes each
// once decoded), too many top-level members, nesting too deep, more than
// MaxDescBytes. Each refusal allocates little, whatever the input claims.
func TestUnmarshalDescShapeBounded(t *testing.T) {
	many := func(prefix, elem, suffix string, n int) []byte {
		var b bytes.Buffer
		b.WriteString(prefix)
		for i := range n {
			if i > 0 {
				b.WriteByte(',')
			}
			b.WriteString(elem)
		}
		b.WriteString(suffix)
		return b.Bytes()
	}
	cases := map[string]struct {
		data []byte
		want string
	}{
		"buffers":   {many(`{"name":"h:1","protocol":"tcp","buffers":[`, `{}`, `]}`, MaxBuffers+1), "more than 1048576 elements in one member"},
		"members":   {many(`{`, `"x":{}`, `}`, maxDescMembers+1), "top-level members"},
		"scalars":   {many(`{`, `"x":0`, `}`, maxDescMembers+1), "top-level members"},
		"keys":      {many(`{"name":"h:1","protocol":"tcp","buffers":[{"name":"b","addr":1,"length":1,"rkey":[`, `[]`, `]}]}`, MaxDevices+1), "elements nested"},
		"nesting":   {[]byte(`{"x":` + strings.Repeat("[", maxDescDepth) + strings.Repeat("]", maxDescDepth) + `}`), "nested deeper"},
		"too large": {append(append([]byte(`{"name":"`), bytes.Repeat([]byte("a"), MaxDescBytes)...), `"}`...), "bytes (max"},
	}
	for name, c := range cases {
		t.Run(name, func(t *testing.T) {
			var err error
			n := allocated(func() { _, err = UnmarshalDesc(c.data) })
			require.ErrorIs(t, err, ErrBadDescriptor)
			assert.Contains(t, err.Error(), c.want)
			assert.Less(t, n, uint64(1<<20), "refusing %d bytes allocated %d", len(c.data), n)
		})
	}
	// Strings may hold the brackets and commas the shape counts.
	d := testDesc("h:1")
	d.Buffers[0].Name = strings.Repeat(`[{,\"`, 50)
	b, err := d.Marshal()
	require.NoError(t, err)
	got, err := UnmarshalDesc(b)
	require.NoError(t, err)
	require.Equal(t, d.Buffers[0].Name, got.Buffers[0].Name)
}
