package engine_test

// The engine's data plane with a cluster token: the attacks of issue 13
// (read and overwrite a stored value straight off a TCP data port, fetch
// a descriptor, map shared buffers) from a peer without the token, and
// engines holding it transferring as before.

import (
	"bytes"
	"context"
	"encoding/binary"
	"encoding/json"
	"io"
	"net"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"

	"github.com/crescent-kv/crescent/engine"
	"github.com/crescent-kv/crescent/engine/metadata"
	"github.com/crescent-kv/crescent/engine/transport/rdma/soft"
	"github.com/crescent-kv/crescent/engine/transport/tcp"
	"github.com/crescent-kv/crescent/internal/auth"
	"github.com/crescent-kv/crescent/internal/testutil"
)

var (
	testToken  = []byte("0123456789abcdef0123456789abcdef")
	otherToken = []byte("fedcba9876543210fedcba9876543210")
)

// rawTCP is what an attacker without the token does on a data port: a v2
// READ of n bytes at addr, then a v2 WRITE of payload at addr. It returns
// what came back for the READ (nil when the connection closed first).
func rawTCP(t *testing.T, port int, addr uint64, payload []byte) (readBack []byte) {
	t.Helper()
	c, err := net.DialTimeout("tcp", net.JoinHostPort("127.0.0.1", strconv.Itoa(port)), 5*time.Second)
	require.NoError(t, err)
	defer c.Close()
	require.NoError(t, c.SetDeadline(time.Now().Add(10*time.Second)))
	var hdr [tcp.HeaderSize]byte
	tcp.Header{Size: uint64(len(payload)), Addr: addr, Opcode: tcp.OpRead | tcp.V2Flag}.Put(hdr[:])
	if _, err := c.Write(hdr[:]); err != nil {
		return nil
	}
	got := make([]byte, tcp.StatusSize+len(payload))
	if _, err := io.ReadFull(c, got); err != nil {
		return nil
	}
	if st, err := tcp.ParseStatus(got[:tcp.StatusSize]); err != nil || st != tcp.StatusOK {
		return nil
	}
	readBack = got[tcp.StatusSize:]
	tcp.Header{Size: uint64(len(payload)), Addr: addr, Opcode: tcp.OpWrite | tcp.V2Flag}.Put(hdr[:])
	if _, err := c.Write(append(hdr[:], payload...)); err != nil {
		return readBack
	}
	var st [tcp.StatusSize]byte
	io.ReadFull(c, st[:])
	return readBack
}

// rawTCPWrite sends only a WRITE (no READ first) and reads what comes back.
func rawTCPWrite(t *testing.T, port int, addr uint64, payload []byte) {
	t.Helper()
	c, err := net.DialTimeout("tcp", net.JoinHostPort("127.0.0.1", strconv.Itoa(port)), 5*time.Second)
	require.NoError(t, err)
	defer c.Close()
	require.NoError(t, c.SetDeadline(time.Now().Add(10*time.Second)))
	var hdr [tcp.HeaderSize]byte
	tcp.Header{Size: uint64(len(payload)), Addr: addr, Opcode: tcp.OpWrite | tcp.V2Flag}.Put(hdr[:])
	c.Write(append(hdr[:], payload...))
	var st [tcp.StatusSize]byte
	io.ReadFull(c, st[:]) // the status, or EOF when the server closes

}

func TestAuthDataPortRefusesUnauthenticatedReadWrite(t *testing.T) {
	for _, tc := range []struct {
		name  string
		token []byte
		harm  bool // the control: without a token the same frames do harm
	}{{"token", testToken, false}, {"no token (control)", nil, true}} {
		t.Run(tc.name, func(t *testing.T) {
			cfg := engine.Config{Protocols: []string{"tcp"}, Token: tc.token}
			cfg.TCP.DialTimeout = time.Second // bounds the server's wait for a hello
			victim := newNode(t, 1<<20, cfg)
			testutil.Fill(victim.buf, 7)
			before := bytes.Clone(victim.buf)
			port := victim.e.LocalDesc().TCPDataPort
			require.NotZero(t, port)
			evil := bytes.Repeat([]byte{0xEE}, 4096)

			got := rawTCP(t, port, victim.addr(4096), evil)
			rawTCPWrite(t, port, victim.addr(8192), evil)
			if tc.harm {
				require.Equal(t, before[4096:8192], got, "control: the raw READ should work without a token")
				require.Equal(t, evil, victim.buf[8192:8192+4096], "control: the raw WRITE should land without a token")
				return
			}
			assert.Nil(t, got, "an unauthenticated READ returned the victim's bytes")
			require.Equal(t, before, victim.buf, "an unauthenticated WRITE changed the victim's memory")
		})
	}
}

// fetchRaw asks addr for its descriptor without a token, with a body long
// enough that a server expecting a hello sees it at once.
func fetchRaw(ctx context.Context, addr string) error {
	body, _ := json.Marshal(map[string]string{"pad": strings.Repeat("x", 64)})
	_, err := metadata.Exchange(ctx, addr, metadata.Metadata, append(body, '\n'))
	return err
}

func TestAuthHandshake(t *testing.T) {
	cfg := engine.Config{Protocols: []string{"tcp"}, Token: testToken}
	cfg.Handshake.Timeout = time.Second // bounds the wait for a hello that never comes
	target := newNode(t, 1<<20, cfg)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()

	t.Run("unauthenticated peer refused", func(t *testing.T) {
		require.ErrorIs(t, fetchRaw(ctx, target.e.Name()), metadata.ErrNoReply)
		_, err := metadata.FetchDesc(ctx, target.e.Name(), nil)
		require.Error(t, err)
		require.Error(t, metadata.SendProbe(ctx, target.e.Name()))
		// The reference's untyped old protocol too.
		c, err := net.Dial("tcp", target.e.Name())
		require.NoError(t, err)
		defer c.Close()
		c.SetDeadline(time.Now().Add(10 * time.Second))
		msg := []byte(`{"local_nic_path":"` + strings.Repeat("y", 64) + `"}` + "\n")
		var hdr [8]byte
		binary.LittleEndian.PutUint64(hdr[:], uint64(len(msg)))
		c.Write(append(hdr[:], msg...))
		n, err := io.Copy(io.Discard, c)
		if err != nil {
			require.ErrorIs(t, err, syscall.ECONNRESET, "the server should close, not time out")
		}
		require.Zero(t, n, "the server answered an unauthenticated peer")
	})
	t.Run("wrong token refused", func(t *testing.T) {
		_, err := metadata.Client{Token: otherToken}.FetchDesc(ctx, target.e.Name(), nil)
		require.ErrorIs(t, err, auth.ErrRefused)
		other := newNode(t, 1<<20, engine.Config{Protocols: []string{"tcp"}, Token: otherToken})
		_, err = other.e.OpenSegment(ctx, target.e.Name())
		require.ErrorIs(t, err, auth.ErrRefused)
		unauth := newNode(t, 1<<20, engine.Config{Protocols: []string{"tcp"}})
		_, err = unauth.e.OpenSegment(ctx, target.e.Name())
		require.Error(t, err)
	})
	t.Run("right token served", func(t *testing.T) {
		d, err := metadata.Client{Token: testToken}.FetchDesc(ctx, target.e.Name(), nil)
		require.NoError(t, err)
		require.Equal(t, target.e.Name(), d.Name)
		require.NoError(t, metadata.Client{Token: testToken}.SendProbe(ctx, target.e.Name()))
	})
}

// A peer of the same uid without the token cannot list (and so map) the
// target's shared buffers.
func TestAuthShmControlSocketRefusesUnauthenticated(t *testing.T) {
	for _, tc := range []struct {
		name  string
		token []byte
	}{{"token", testToken}, {"no token (control)", nil}} {
		t.Run(tc.name, func(t *testing.T) {
			target := newNode(t, 1<<20, engine.Config{Protocols: []string{"shm"}, Token: tc.token})
			d := target.e.LocalDesc()
			require.NotNil(t, d.Crescent)
			c, err := net.DialUnix("unixpacket", nil, &net.UnixAddr{Name: d.Crescent.ShmSocket, Net: "unixpacket"})
			require.NoError(t, err)
			defer c.Close()
			c.SetDeadline(time.Now().Add(10 * time.Second))
			_, err = c.Write([]byte(`{"op":"list","id":1}`))
			require.NoError(t, err)
			buf := make([]byte, 64<<10)
			oob := make([]byte, 4096)
			n, oobn, _, _, err := c.ReadMsgUnix(buf, oob)
			if tc.token == nil {
				require.NoError(t, err)
				require.Contains(t, string(buf[:n]), `"regions"`, "control: the list should be answered without a token")
				require.NotZero(t, oobn, "control: memfds should come with the list")
				closeRights(t, oob[:oobn])
				return
			}
			require.True(t, err != nil || n == 0, "an unauthenticated peer got %q", buf[:n])
			require.Zero(t, oobn, "an unauthenticated peer got file descriptors")
		})
	}
}

func TestAuthSameTokenTransfers(t *testing.T) {
	for _, proto := range protocols {
		t.Run(proto, func(t *testing.T) {
			cfg := engine.Config{Protocols: []string{proto}, Token: testToken}
			a := newNode(t, 4<<20, cfg)
			b := newNode(t, 4<<20, cfg)
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			seg, err := a.e.OpenSegment(ctx, b.e.Name())
			require.NoError(t, err)
			defer a.e.CloseSegment(seg)
			testutil.Fill(a.buf[:2<<20], 3)
			run := func(op engine.OpCode, local []byte, off int) {
				batch, err := a.e.AllocateBatch(1)
				require.NoError(t, err)
				require.NoError(t, a.e.Submit(batch, []engine.Request{{Op: op, Local: local, Target: seg, TargetAddr: b.addr(off)}}))
				st := wait(t, a.e, batch)
				require.Equal(t, engine.Completed, st.Status, "%+v", st)
				require.NoError(t, a.e.FreeBatch(batch))
			}
			run(engine.Write, a.buf[:2<<20], 4096)
			require.Equal(t, a.buf[:2<<20], b.buf[4096:4096+2<<20])
			run(engine.Read, a.buf[2<<20:], 4096)
			require.Equal(t, a.buf[:2<<20], a.buf[2<<20:])
			if proto == "tcp" {
				require.Zero(t, tcpStats(t, b.e).AuthFailed)
			}
		})
	}
}

func TestAuthConfigErrors(t *testing.T) {
	_, err := engine.New(engine.Config{LocalServerName: "127.0.0.1", Protocols: []string{"tcp"}, Token: testToken, MooncakeCompat: true})
	require.ErrorIs(t, err, engine.ErrInvalidConfig)
	require.ErrorContains(t, err, "MooncakeCompat")
	require.ErrorContains(t, err, "Token")

	_, err = engine.New(engine.Config{LocalServerName: "127.0.0.1", Protocols: []string{"tcp"}, Token: testToken, Insecure: true})
	require.ErrorIs(t, err, engine.ErrInvalidConfig)
	require.ErrorIs(t, err, auth.ErrInsecureWithCredential)

	_, err = engine.New(engine.Config{LocalServerName: "127.0.0.1", Protocols: []string{"tcp"}, Token: []byte("short")})
	require.ErrorIs(t, err, engine.ErrInvalidConfig)

	for _, tc := range []struct {
		cfg  engine.Config
		want string
	}{
		{engine.Config{}, "loopback peers only"},
		{engine.Config{Insecure: true}, "--insecure"},
		{engine.Config{MooncakeCompat: true}, "--mooncake_compat"},
		{engine.Config{Token: testToken}, "authentication on"},
	} {
		assert.Contains(t, tc.cfg.AuthLogLine(), tc.want)
	}
}

func tcpStats(t *testing.T, e *engine.Engine) tcp.Stats {
	t.Helper()
	var st tcp.Stats
	ok := engine.ForTransport(e, func(tr any) bool {
		if x, ok := tr.(*tcp.Transport); ok {
			st = x.Stats()
			return true
		}
		return false
	})
	require.True(t, ok, "no tcp transport")
	return st
}

// closeRights closes the descriptors an SCM_RIGHTS message carried.
func closeRights(t *testing.T, oob []byte) {
	t.Helper()
	msgs, err := unix.ParseSocketControlMessage(oob)
	require.NoError(t, err)
	for _, m := range msgs {
		fds, err := unix.ParseUnixRights(&m)
		require.NoError(t, err)
		for _, fd := range fds {
			unix.Close(fd)
		}
	}
}

// rdma (on the software device) exchanges endpoints over the handshake's
// Connection frames: with a token they ride the authenticated handshake.
func TestAuthSameTokenRDMAEndpointExchange(t *testing.T) {
	f := soft.NewFabric()
	mk := func(name string) *node {
		cfg := engine.Config{Protocols: []string{"rdma"}, Token: testToken}
		d := f.NewDevice(name+"_mlx5_0", soft.Options{})
		t.Cleanup(func() { d.Close() })
		cfg.RDMA.Devices = append(cfg.RDMA.Devices, d)
		return newNode(t, 2<<20, cfg)
	}
	a, b := mk("a"), mk("b")
	require.Equal(t, []string{"rdma"}, a.e.Transports())
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	seg, err := a.e.OpenSegment(ctx, b.e.Name())
	require.NoError(t, err)
	defer a.e.CloseSegment(seg)
	testutil.Fill(a.buf[:1<<20], 9)
	id, err := a.e.AllocateBatch(1)
	require.NoError(t, err)
	require.NoError(t, a.e.Submit(id, []engine.Request{{Op: engine.Write, Local: a.buf[:1<<20], Target: seg, TargetAddr: b.addr(4096)}}))
	st := wait(t, a.e, id)
	require.Equal(t, engine.Completed, st.Status, "%+v", st)
	require.NoError(t, a.e.FreeBatch(id))
	require.Equal(t, a.buf[:1<<20], b.buf[4096:4096+1<<20])
}
