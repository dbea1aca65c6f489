package mastertest

import (
	"context"
	"crypto/sha256"
	"encoding/binary"
	"sync"

	"google.golang.org/grpc"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"

	"github.com/crescent-kv/crescent/internal/auth"
	"github.com/crescent-kv/crescent/store/master"
	"github.com/crescent-kv/crescent/store/storepb"
)

var sessions sync.Map // master.UUID -> []byte

// Session is client n's session secret; Client(n) is the id it proves.
func Session(n uint64) []byte {
	var b [8]byte
	binary.BigEndian.PutUint64(b[:], n)
	s := sha256.Sum256(append([]byte("mastertest session "), b[:]...))
	return s[:]
}

// Client is test client n's id, derived from Session(n) as the master
// checks (auth.ClientID).
func Client(n uint64) master.UUID {
	s := Session(n)
	hi, lo, _ := auth.ClientID(s)
	id := master.UUID{Hi: hi, Lo: lo}
	sessions.Store(id, s)
	return id
}

type bound interface{ GetClientId() *storepb.UUID }

// Sign is a client interceptor that puts the session of each Client(n)
// id into the requests that act as it (a store.Client does this
// itself); other requests go as they are.
func Sign(ctx context.Context, method string, req, reply any, cc *grpc.ClientConn, invoke grpc.UnaryInvoker, opts ...grpc.CallOption) error {
	if b, ok := req.(bound); ok && b.GetClientId() != nil {
		id := master.UUID{Hi: b.GetClientId().High, Lo: b.GetClientId().Low}
		if s, ok := sessions.Load(id); ok {
			m := req.(proto.Message).ProtoReflect()
			if fd := m.Descriptor().Fields().ByName("session"); fd != nil && len(m.Get(fd).Bytes()) == 0 {
				m = proto.Clone(req.(proto.Message)).ProtoReflect()
				m.Set(fd, protoreflect.ValueOfBytes(s.([]byte)))
				req = m.Interface()
			}
		}
	}
	return invoke(ctx, method, req, reply, cc, opts...)
}
