package auth

import (
	"io"
	"net"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

func writeFile(t *testing.T, body string, mode os.FileMode) string {
	p := filepath.Join(t.TempDir(), "token")
	require.NoError(t, os.WriteFile(p, []byte(body), mode))
	require.NoError(t, os.Chmod(p, mode))
	return p
}

func TestLoadToken(t *testing.T) {
	tok, err := LoadToken(writeFile(t, "  0123456789abcdef0123\n", 0o600))
	require.NoError(t, err)
	assert.Equal(t, "0123456789abcdef0123", string(tok))

	tok, err = LoadToken("")
	require.NoError(t, err)
	assert.Nil(t, tok)

	_, err = LoadToken(writeFile(t, "0123456789abcdef0123", 0o644))
	assert.ErrorContains(t, err, "chmod 600")
	_, err = LoadToken(writeFile(t, "short\n", 0o600))
	assert.ErrorContains(t, err, "at least 16")
	_, err = LoadToken(filepath.Join(t.TempDir(), "missing"))
	assert.ErrorContains(t, err, "token file")
	_, err = LoadToken(t.TempDir())
	assert.ErrorContains(t, err, "not a regular file")
}

func TestDecide(t *testing.T) {
	for _, c := range []struct {
		cred, insecure bool
		want           Mode
	}{{false, false, Protected}, {true, false, Authenticated}, {false, true, Insecure}} {
		m, err := Decide(c.cred, c.insecure)
		require.NoError(t, err)
		assert.Equal(t, c.want, m)
	}
	_, err := Decide(true, true)
	assert.ErrorIs(t, err, ErrInsecureWithCredential)
	assert.NotNil(t, Protected.Allow())
	assert.Nil(t, Authenticated.Allow())
	assert.Nil(t, Insecure.Allow())
}

func TestLoopbackOnly(t *testing.T) {
	for _, c := range []struct {
		a    net.Addr
		want bool
	}{
		{&net.TCPAddr{IP: net.ParseIP("127.0.0.1")}, true},
		{&net.TCPAddr{IP: net.ParseIP("127.8.9.1")}, true},
		{&net.TCPAddr{IP: net.ParseIP("::1")}, true},
		{&net.TCPAddr{IP: net.ParseIP("::ffff:127.0.0.1")}, true},
		{&net.TCPAddr{IP: net.ParseIP("10.0.0.1")}, false},
		{&net.TCPAddr{IP: net.ParseIP("0.0.0.0")}, false},
		{&net.TCPAddr{IP: net.ParseIP("fe80::1")}, false},
		{&net.UnixAddr{Name: "/tmp/s", Net: "unix"}, true},
		{nil, false},
	} {
		assert.Equal(t, c.want, LoopbackOnly(c.a), "%v", c.a)
	}
}

// pair is a real loopback TCP connection.
func pair(t *testing.T) (client, server net.Conn) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	defer ln.Close()
	ch := make(chan net.Conn, 1)
	go func() {
		c, _ := ln.Accept()
		ch <- c
	}()
	client, err = net.Dial("tcp", ln.Addr().String())
	require.NoError(t, err)
	server = <-ch
	require.NotNil(t, server)
	t.Cleanup(func() { client.Close(); server.Close() })
	return client, server
}

func run(t *testing.T, ctok, stok []byte, cp, sp Purpose) (cerr, serr error, client, server net.Conn) {
	client, server = pair(t)
	done := make(chan error, 1)
	go func() {
		err := Server(server, stok, sp, time.Second)
		if err != nil {
			server.Close()
		}
		done <- err
	}()
	cerr = Client(client, ctok, cp, time.Second)
	if cerr != nil {
		client.Close()
	}
	return cerr, <-done, client, server
}

func TestChallenge(t *testing.T) {
	tok := []byte("0123456789abcdef0123456789abcdef")
	cerr, serr, c, s := run(t, tok, tok, PurposeTCPLane, PurposeTCPLane)
	require.NoError(t, cerr)
	require.NoError(t, serr)
	// The connection then carries frames unchanged, with no deadline left.
	go func() { _, _ = c.Write([]byte("frame")) }()
	buf := make([]byte, 5)
	_, err := s.Read(buf)
	require.NoError(t, err)
	assert.Equal(t, "frame", string(buf))
}

func TestChallengeWrongToken(t *testing.T) {
	cerr, serr, _, _ := run(t, []byte("client-token-0123456789"), []byte("server-token-0123456789"), PurposeHandshake, PurposeHandshake)
	assert.ErrorIs(t, cerr, ErrRefused)
	assert.ErrorContains(t, serr, "read proof")
}

// A client without the token that answers anyway is refused with a
// non-zero verdict and the server reports it.
func TestChallengeForgedProof(t *testing.T) {
	c, s := pair(t)
	done := make(chan error, 1)
	go func() { done <- Server(s, []byte("0123456789abcdef0123"), PurposeTCPLane, time.Second) }()
	_, err := c.Write(header(PurposeTCPLane, make([]byte, nonceLen)))
	require.NoError(t, err)
	_, err = io.ReadFull(c, make([]byte, answerLen))
	require.NoError(t, err)
	_, err = c.Write(make([]byte, macLen))
	require.NoError(t, err)
	assert.ErrorIs(t, <-done, ErrRefused)
	v := make([]byte, 1)
	_, err = io.ReadFull(c, v)
	require.NoError(t, err)
	assert.Equal(t, byte(1), v[0])
}

func TestChallengeWrongPurpose(t *testing.T) {
	tok := []byte("0123456789abcdef0123456789abcdef")
	cerr, serr, _, _ := run(t, tok, tok, PurposeTCPLane, PurposeShmControl)
	assert.Error(t, cerr)
	assert.ErrorContains(t, serr, "purpose")
}

// A peer that speaks another protocol (a Mooncake handshake, a port scan
// sending text) is refused before anything is served.
func TestChallengeForeignPeer(t *testing.T) {
	c, s := pair(t)
	done := make(chan error, 1)
	go func() { done <- Server(s, []byte("0123456789abcdef0123"), PurposeHandshake, time.Second) }()
	_, err := c.Write([]byte(`{"local_nic_path":"x","peer_nic_path":"y"}`))
	require.NoError(t, err)
	assert.ErrorContains(t, <-done, "not a Crescent")
}

// A peer that connects and sends nothing is cut at the deadline.
func TestChallengeSilentPeer(t *testing.T) {
	_, s := pair(t)
	err := Server(s, []byte("0123456789abcdef0123"), PurposeHandshake, 50*time.Millisecond)
	var ne net.Error
	require.ErrorAs(t, err, &ne)
	assert.True(t, ne.Timeout())
}
