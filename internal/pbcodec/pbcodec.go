package pbcodec

import (
	"fmt"

	"google.golang.org/protobuf/proto"
)

// fast is what protoc-gen-go-vtproto (features marshal, unmarshal, size)
// and protoc-gen-decodehelp generate for a message.
type fast interface {
	SizeVT() int
	MarshalToSizedBufferVT([]byte) (int, error)
	UnmarshalVT([]byte) error
	CheckUTF8() error
}

// presizer is what protoc-gen-decodehelp adds to a message with repeated
// strings, bytes or messages.
type presizer interface{ PresizeVT([]byte) }

// Size is m's encoded size.
func Size(m proto.Message) int {
	if f, ok := m.(fast); ok {
		return f.SizeVT()
	}
	return proto.Size(m)
}

// Append appends m's encoding to b.
func Append(b []byte, m proto.Message) ([]byte, error) {
	f, ok := m.(fast)
	if !ok {
		return proto.MarshalOptions{}.MarshalAppend(b, m)
	}
	return AppendSized(b, m, f.SizeVT())
}

// AppendSized is Append for a caller that has just taken Size(m) = n.
func AppendSized(b []byte, m proto.Message, n int) ([]byte, error) {
	f, ok := m.(fast)
	if !ok {
		return proto.MarshalOptions{UseCachedSize: true}.MarshalAppend(b, m)
	}
	off := len(b)
	if cap(b)-off < n {
		nb := make([]byte, off, off+n)
		copy(nb, b)
		b = nb
	}
	b = b[:off+n]
	// The generated code writes from the end of the buffer backwards.
	w, err := f.MarshalToSizedBufferVT(b[off:])
	if err != nil {
		return b[:off], err
	}
	if w != n {
		return b[:off], fmt.Errorf("pbcodec: %T encoded in %d bytes, sized %d", m, w, n)
	}
	return b, nil
}

// Marshal is m's encoding in a new slice.
func Marshal(m proto.Message) ([]byte, error) {
	if _, ok := m.(fast); !ok {
		return proto.Marshal(m)
	}
	return Append(nil, m)
}

// Unmarshal resets m and decodes b into it (see the package doc for how
// strings are checked).
func Unmarshal(b []byte, m proto.Message) error {
	f, ok := m.(fast)
	if !ok {
		return proto.Unmarshal(b, m)
	}
	proto.Reset(m)
	if p, ok := m.(presizer); ok {
		p.PresizeVT(b)
	}
	if err := f.UnmarshalVT(b); err != nil {
		return err
	}
	if err := f.CheckUTF8(); err != nil {
		proto.Reset(m) // as proto.Unmarshal leaves nothing half-decoded to use
		return err
	}
	return nil
}
